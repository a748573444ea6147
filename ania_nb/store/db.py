"""The SQLite database: one connection on one dedicated thread, the schema, statement helpers.

Every statement runs on the ``ania-store`` thread (`Database.run`), so SQLite never blocks the
event loop and statements are serialised without locks. The schema lives in one migration list
(`MIGRATIONS`) keyed on ``PRAGMA user_version``. Code that keeps its own tables in the store
(the clock, saved teams) writes them with `Database.run`, `transaction`, `clean_text` and
`to_json`, like the store's own modules do.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from os import PathLike
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from ania_nb.errors import StoreError

__all__ = [
    "BUSY_TIMEOUT_S",
    "DB_FILENAME",
    "MIGRATIONS",
    "Database",
    "clean_text",
    "to_json",
    "transaction",
]

P = ParamSpec("P")
T = TypeVar("T")

DB_FILENAME = "ania.db"

# Each entry upgrades the schema by one version; append, never change what a released step does
# (``IF NOT EXISTS`` was added to the first two later: it changes nothing on a fresh file).
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE IF NOT EXISTS kv (
            ns TEXT NOT NULL,
            key TEXT NOT NULL,
            value TEXT NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (ns, key)
        )""",
        """CREATE TABLE IF NOT EXISTS chat_history (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session TEXT NOT NULL,
            message TEXT NOT NULL,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS chat_history_session ON chat_history (session, id)",
        """CREATE TABLE IF NOT EXISTS runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session TEXT NOT NULL,
            sender TEXT,
            input TEXT NOT NULL,
            status TEXT NOT NULL,
            started_at REAL NOT NULL,
            finished_at REAL,
            duration_ms INTEGER,
            iterations INTEGER NOT NULL DEFAULT 0,
            prompt_tokens INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            total_tokens INTEGER NOT NULL DEFAULT 0,
            cached_tokens INTEGER NOT NULL DEFAULT 0,
            tool_calls TEXT NOT NULL DEFAULT '[]',
            tool_calls_total INTEGER NOT NULL DEFAULT 0,
            reply TEXT,
            error TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS runs_session ON runs (session, id)",
        "CREATE INDEX IF NOT EXISTS runs_status ON runs (status)",
        "CREATE INDEX IF NOT EXISTS runs_started_at ON runs (started_at)",
    ),
    (
        """CREATE TABLE IF NOT EXISTS oplog (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at REAL NOT NULL,
            category TEXT NOT NULL,
            action TEXT NOT NULL,
            actor TEXT,
            session TEXT,
            detail TEXT NOT NULL DEFAULT ''
        )""",
    ),
    # Who started each run (see `store.owner`), so that opening a store marks only orphaned runs.
    (
        "ALTER TABLE runs ADD COLUMN owner_host TEXT",
        "ALTER TABLE runs ADD COLUMN owner_pid INTEGER",
        "ALTER TABLE runs ADD COLUMN owner_start TEXT",
    ),
    # The clock (ania_nb.clock.store): tasks in creation order, their run log and two counters
    # (``seq`` makes task ids, ``rev`` counts task edits so the scheduler's poll is one read).
    (
        """CREATE TABLE IF NOT EXISTS clock_tasks (
            id TEXT PRIMARY KEY,
            seq INTEGER NOT NULL UNIQUE,
            cron TEXT NOT NULL,
            title TEXT NOT NULL,
            content TEXT NOT NULL,
            target TEXT NOT NULL,
            enabled INTEGER NOT NULL,
            run_once INTEGER NOT NULL,
            timeout REAL NOT NULL DEFAULT 0,
            created_by TEXT NOT NULL DEFAULT '',
            creator TEXT NOT NULL DEFAULT '',
            updater TEXT NOT NULL DEFAULT '',
            note TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            last_run_at REAL,
            next_run_at REAL,
            last_status TEXT,
            rev INTEGER NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS clock_tasks_target ON clock_tasks (target, seq)",
        "CREATE INDEX IF NOT EXISTS clock_tasks_rev ON clock_tasks (rev)",
        """CREATE TABLE IF NOT EXISTS clock_log (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            task_id TEXT NOT NULL,
            title TEXT NOT NULL,
            target TEXT NOT NULL,
            trigger TEXT NOT NULL,
            status TEXT NOT NULL,
            started_at REAL NOT NULL,
            finished_at REAL,
            duration_ms INTEGER,
            manual INTEGER NOT NULL DEFAULT 0,
            scheduled_at REAL,
            iterations INTEGER NOT NULL DEFAULT 0,
            prompt_tokens INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            total_tokens INTEGER NOT NULL DEFAULT 0,
            cached_tokens INTEGER NOT NULL DEFAULT 0,
            tool_calls TEXT NOT NULL DEFAULT '[]',
            tool_calls_total INTEGER NOT NULL DEFAULT 0,
            reply TEXT,
            error TEXT,
            owner_host TEXT,
            owner_pid INTEGER,
            owner_start TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS clock_log_task ON clock_log (task_id, id)",
        "CREATE INDEX IF NOT EXISTS clock_log_target ON clock_log (target, id)",
        "CREATE INDEX IF NOT EXISTS clock_log_status ON clock_log (status)",
        """CREATE TABLE IF NOT EXISTS clock_meta (
            key TEXT PRIMARY KEY,
            value INTEGER NOT NULL
        )""",
    ),
    # Usage accounting (``usage.py``): per-session counters of each quota day (reset and pruned),
    # daily totals per model (kept for history), and what each run record counted on which day.
    (
        "ALTER TABLE runs ADD COLUMN counted_tokens INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE runs ADD COLUMN usage_day TEXT",
        """CREATE TABLE IF NOT EXISTS usage_counters (
            day TEXT NOT NULL,
            session TEXT NOT NULL,
            prompt_tokens INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            cached_tokens INTEGER NOT NULL DEFAULT 0,
            total_tokens INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (day, session)
        )""",
        """CREATE TABLE IF NOT EXISTS usage_daily (
            day TEXT NOT NULL,
            model TEXT NOT NULL,
            prompt_tokens INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            cached_tokens INTEGER NOT NULL DEFAULT 0,
            total_tokens INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (day, model)
        )""",
    ),
    # The usage ledger (``usage.py``): one row per answered model call, written with the step
    # that stores the call's result; the counters above become its materialisation. A store
    # counted before the ledger existed gets one ``carried`` row per counter, so that
    # ``SUM(usage_ledger) == usage_counters`` holds for the days it already has.
    (
        """CREATE TABLE IF NOT EXISTS usage_ledger (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            day TEXT NOT NULL,
            session TEXT NOT NULL,
            run_id INTEGER,
            model TEXT NOT NULL DEFAULT '',
            kind TEXT NOT NULL DEFAULT 'call',
            prompt_tokens INTEGER NOT NULL DEFAULT 0,
            completion_tokens INTEGER NOT NULL DEFAULT 0,
            cached_tokens INTEGER NOT NULL DEFAULT 0,
            total_tokens INTEGER NOT NULL DEFAULT 0,
            at REAL NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS usage_ledger_day ON usage_ledger (day, session)",
        """INSERT INTO usage_ledger (day, session, model, kind, prompt_tokens, completion_tokens,
            cached_tokens, total_tokens, at)
            SELECT day, session, '', 'carried', prompt_tokens, completion_tokens, cached_tokens,
            total_tokens, CAST(strftime('%s', 'now') AS REAL) FROM usage_counters
            ORDER BY day, session""",
    ),
    # The durable inbox and outbox of chat front ends (``mailbox.py``), and what a run's
    # recovery needs to know: whether a tool with side effects had started, how it was resumed.
    (
        """CREATE TABLE IF NOT EXISTS inbox (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            source TEXT NOT NULL,
            account TEXT NOT NULL,
            message_key TEXT NOT NULL,
            session TEXT NOT NULL,
            sender TEXT,
            kind TEXT NOT NULL,
            payload TEXT NOT NULL,
            received_at REAL NOT NULL,
            state TEXT NOT NULL,
            run_id INTEGER,
            updated_at REAL NOT NULL,
            UNIQUE (source, account, message_key)
        )""",
        "CREATE INDEX IF NOT EXISTS inbox_session ON inbox (session, state, id)",
        "CREATE INDEX IF NOT EXISTS inbox_state ON inbox (state, received_at)",
        """CREATE TABLE IF NOT EXISTS outbox (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session TEXT NOT NULL,
            kind TEXT NOT NULL,
            payload TEXT NOT NULL,
            state TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            error TEXT,
            run_id INTEGER
        )""",
        "CREATE INDEX IF NOT EXISTS outbox_state ON outbox (state, session, id)",
        "ALTER TABLE runs ADD COLUMN side_effects_started INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE runs ADD COLUMN resumed TEXT",
    ),
    # Pending tool approvals with the run's state at that point (``approvals.py``), so that a
    # restart can post the question again and continue the run from the pending call.
    (
        """CREATE TABLE IF NOT EXISTS approvals (
            id TEXT PRIMARY KEY,
            session TEXT NOT NULL,
            run_id INTEGER,
            state TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            deadline REAL NOT NULL,
            request TEXT NOT NULL,
            checkpoint TEXT NOT NULL,
            reason TEXT,
            approver TEXT,
            resent INTEGER NOT NULL DEFAULT 0,
            owner_host TEXT,
            owner_pid INTEGER,
            owner_start TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS approvals_state ON approvals (state, created_at)",
    ),
    # Subagents from launch to end (``children.py``): the ids users see (never reused: a
    # background result's inbox key is ``bg:<id>``), and who runs each, so that a restart can
    # tell the chat about a background task a kill -9 cut off.
    (
        """CREATE TABLE IF NOT EXISTS children (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session TEXT NOT NULL,
            task TEXT NOT NULL,
            role TEXT NOT NULL,
            background INTEGER NOT NULL,
            state TEXT NOT NULL,
            outcome TEXT,
            started_at REAL NOT NULL,
            ended_at REAL,
            owner_host TEXT,
            owner_pid INTEGER,
            owner_start TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS children_state ON children (state, id)",
    ),
    # A verdict given for a suspended approval while the runner shuts down (``approvals.py``):
    # kept on the row and applied when the run resumes after the restart, without a new card.
    ("ALTER TABLE approvals ADD COLUMN verdict TEXT",),
)

# Several processes may open one directory at once; a writer waits this long for the lock.
BUSY_TIMEOUT_S = 30.0

_OWN_TABLES = frozenset(
    {
        "kv",
        "chat_history",
        "runs",
        "oplog",
        "sqlite_sequence",
        "clock_tasks",
        "clock_log",
        "clock_meta",
        "usage_counters",
        "usage_daily",
        "usage_ledger",
        "inbox",
        "outbox",
        "approvals",
        "children",
    }
)


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Run the block in one write transaction: commit on success, roll back on any error."""
    # IMMEDIATE takes the write lock up front, so another process cannot make us fail halfway.
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (which UTF-8, hence SQLite, cannot hold) replaced by U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def to_json(value: Any) -> str:
    """JSON text SQLite can store: non-ASCII kept as is, lone surrogates as JSON escapes.

    Raises ``TypeError``/``ValueError`` like ``json.dumps`` (non-serialisable value, NaN).
    """
    raw = json.dumps(value, ensure_ascii=False, allow_nan=False)
    if _SURROGATE.search(raw):
        # Escaped, the surrogate survives the round trip: json.loads gives back the same str.
        raw = json.dumps(value, ensure_ascii=True, allow_nan=False)
    return raw


class Database:
    """An open ania-nb SQLite file whose every statement runs on a private store thread."""

    def __init__(self, path: Path, executor: ThreadPoolExecutor, conn: sqlite3.Connection) -> None:
        """Wrap an already-open connection; use :meth:`open` instead."""
        self._path = path
        self._executor = executor
        self._conn = conn
        self._closed = False
        self._close_future: asyncio.Future[None] | None = None

    @property
    def path(self) -> Path:
        """Where the database file lives."""
        return self._path

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    @classmethod
    async def open(cls, path: str | PathLike[str]) -> Database:
        """Open (creating if needed) the database at ``path`` and bring its schema up to date."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ania-store")
        loop = asyncio.get_running_loop()
        try:
            db_path, conn = await loop.run_in_executor(executor, _connect, Path(path))
        except BaseException:
            await asyncio.to_thread(executor.shutdown, wait=True)
            raise
        return cls(db_path, executor, conn)

    async def run(
        self, fn: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run ``fn(conn, *args)`` on the store thread and return its result."""
        if self._closed:
            raise StoreError(
                f"the store at {self._path} is closed; open it again before using it "
                f"(operation {_op_name(fn)!r})"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, _call, self, fn, args, kwargs)

    async def close(self) -> None:
        """Close the connection on its thread and stop the thread; calling again is a no-op."""
        if self._close_future is None:
            self._closed = True
            self._close_future = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._close_future)

    async def _shutdown(self) -> None:
        """Close the connection after already-queued statements, then release the thread."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._conn.close)
        except sqlite3.Error as exc:
            raise StoreError(f"closing the store at {self._path} failed: {exc}") from exc
        finally:
            await asyncio.to_thread(self._executor.shutdown, wait=True)

    def __repr__(self) -> str:
        """Show the file and whether it is open."""
        state = "closed" if self._closed else "open"
        return f"<Database {str(self._path)!r} {state}>"


def _op_name(fn: Callable[..., Any]) -> str:
    """Name a store operation readably for error messages."""
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _call(db: Database, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    """Store-thread side of :meth:`Database.run`: run ``fn`` and explain SQLite failures."""
    try:
        return fn(db._conn, *args, **kwargs)
    except sqlite3.Error as exc:
        raise StoreError(f"store operation {_op_name(fn)!r} failed on {db.path}: {exc}") from exc


def _connect(path: Path) -> tuple[Path, sqlite3.Connection]:
    """Store-thread side of :meth:`Database.open`: connect, configure, migrate."""
    try:
        path = path.expanduser().absolute()
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the directory for the store at {path}: {exc}") from exc
    try:
        # Autocommit mode: transactions are explicit (see ``transaction``), never implicit.
        # ``timeout`` installs the busy handler before the first statement: another process
        # may be creating or migrating the same file right now.
        conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the store at {path}: {exc}") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        _check_is_database(conn, path)
        _set_wal(conn, path)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        _migrate(conn, path)
    except BaseException:
        conn.close()
        raise
    return path, conn


def _set_wal(conn: sqlite3.Connection, path: Path) -> None:
    """Switch to WAL; a fresh file opened by many processes at once may need a few tries."""
    # Changing the journal mode needs an exclusive lock and does not always wait on the busy
    # handler, so a concurrent opener can get "database is locked" here: wait and retry.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise StoreError(f"cannot switch the store at {path} to WAL mode: {exc}") from exc
            time.sleep(0.01)
            continue
        if str(mode).lower() != "wal":
            raise StoreError(
                f"the store at {path} cannot use WAL mode (journal mode is {mode!r}); is it on "
                "a network file system? Put the data directory on a local disk"
            )
        return


def _check_is_database(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse, without writing anything, a file that is not an ania-nb database."""
    not_ours = (
        f"{path} is not an ania-nb database; it was left untouched. Move it away or point "
        "the data directory somewhere else."
    )
    try:
        # Reading the header is the first real I/O; a foreign or corrupt file fails here. Both
        # reads see one snapshot: another process may be migrating the file right now.
        conn.execute("BEGIN")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            tables = {row[0] for row in rows}
        finally:
            conn.execute("COMMIT")
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{not_ours} (SQLite says: {exc})") from exc
    if version == 0 and {t for t in tables if not t.startswith("sqlite_")} - _OWN_TABLES:
        raise StoreError(f"{not_ours} (it is an SQLite file holding other tables)")
    if version > len(MIGRATIONS):
        raise StoreError(
            f"the store at {path} has schema version {version}, newer than this ania-nb "
            f"understands ({len(MIGRATIONS)}); upgrade ania-nb"
        )


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Apply every migration step past ``PRAGMA user_version`` in one write transaction.

    The version is read again after taking the write lock: another process opening the same
    directory may have migrated it while this one waited.
    """
    if conn.execute("PRAGMA user_version").fetchone()[0] >= len(MIGRATIONS):
        return  # up to date: no write lock, so parallel opens of a migrated file never queue
    number = 0
    try:
        with transaction(conn):
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise StoreError(
                    f"the store at {path} has schema version {version}, newer than this "
                    f"ania-nb understands ({len(MIGRATIONS)}); upgrade ania-nb"
                )
            for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
                for statement in step:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {number}")
    except sqlite3.Error as exc:
        raise StoreError(
            f"migrating the store at {path} to schema version {number or '?'} failed: {exc}"
        ) from exc
