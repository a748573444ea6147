"""The store's schema: one list of versioned migration steps for every backend.

A step is a tuple of statements written in SQLite's DDL; `statement_for` turns one into the
backend's own: on PostgreSQL ids become identity columns, ``REAL`` ``DOUBLE PRECISION``,
``INTEGER`` ``BIGINT`` (token counts outgrow 32 bits) and ``TEXT`` ``TEXT COLLATE "C"`` (so text
sorts by code point, the same order as SQLite's ``BINARY``), and ``{now}`` the current Unix time.
SQLite keeps its version in ``PRAGMA user_version``, PostgreSQL in the ``schema_version`` table.
"""

from __future__ import annotations

import re

from .db import Dialect

__all__ = ["MIGRATIONS", "OWN_TABLES", "SCHEMA_VERSION", "TABLES", "statement_for"]

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
            total_tokens, {now} FROM usage_counters
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
    # Replicas of one bot sharing a PostgreSQL store (``replicas.py``): who serves, for
    # ``ania-nb status``; and who claimed each outbox row being sent, so that only the rows of
    # a dead claimer become ``uncertain``.
    (
        """CREATE TABLE IF NOT EXISTS replicas (
            id TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            started_at REAL NOT NULL,
            seen_at REAL NOT NULL,
            version TEXT NOT NULL DEFAULT ''
        )""",
        "ALTER TABLE outbox ADD COLUMN owner TEXT",
    ),
    # The clock's fencing (``clock/store.py``): a scheduled fire is recorded under its
    # ``(task, planned time)`` key before it runs, so two leaders in a hand-over gap cannot both
    # fire one slot (manual runs have no planned time: not a slot). ``missed_from``: the oldest
    # planned time a row also stands for (slots coalesced into one late fire, or skipped while
    # no process held the clock). A duplicate recorded before the key existed keeps its row,
    # its planned time moved into its error text.
    (
        "ALTER TABLE clock_log ADD COLUMN missed_from REAL",
        """UPDATE clock_log SET error = coalesce(error || ' ', '')
            || '[a second fire of planned time ' || scheduled_at || ', from before slots were '
            || 'fenced]', scheduled_at = NULL
            WHERE manual = 0 AND scheduled_at IS NOT NULL AND EXISTS (
                SELECT 1 FROM clock_log earlier WHERE earlier.task_id = clock_log.task_id
                AND earlier.scheduled_at = clock_log.scheduled_at AND earlier.manual = 0
                AND earlier.id < clock_log.id)""",
        "CREATE UNIQUE INDEX IF NOT EXISTS clock_log_slot ON clock_log (task_id, scheduled_at) "
        "WHERE manual = 0",
    ),
)

# ania-nb's tables in the order their migration steps create them (the order `ania-nb store
# migrate` copies them in; no foreign keys tie them).
TABLES = (
    "kv",
    "chat_history",
    "runs",
    "oplog",
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
    "replicas",
)
OWN_TABLES = frozenset(TABLES)


SCHEMA_VERSION = len(MIGRATIONS)

_NOW = {"sqlite": "CAST(strftime('%s', 'now') AS REAL)", "postgres": "extract(epoch FROM now())"}
_POSTGRES_TYPES = (
    (
        re.compile(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b"),
        "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
    ),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bTEXT\b"), 'TEXT COLLATE "C"'),
)


def statement_for(statement: str, dialect: Dialect) -> str:
    """One migration statement in ``dialect``'s SQL."""
    statement = statement.replace("{now}", _NOW[dialect.name])
    if dialect.name == "postgres":
        for pattern, replacement in _POSTGRES_TYPES:
            statement = pattern.sub(replacement, statement)
    return statement
