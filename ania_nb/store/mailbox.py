"""The durable inbox and outbox of chat front ends, and the *effects* other steps write with them.

**Inbox.** Every message a durable front end (the chat runner) accepts is one ``inbox`` row,
keyed ``(source, account, message_key)`` — e.g. ``("onebot", <bot id>, <message id>)`` — and
unique: a re-sent event finds its key taken and is ignored. A row is ``pending`` (accepted, no
run yet), ``running`` (a run answers it: ``run_id``), then final: ``answered`` (its reply is an
outbox row), ``notified`` (its run died in a crash and the chat was told), ``ignored`` (stored
only: an unaddressed group message) or ``dropped`` (a full queue or ``/stop``).

**Outbox.** Every message a durable front end sends is one ``outbox`` row holding a neutral
delivery (JSON; the front end renders it at send time). A row goes ``pending`` → ``sending``
(committed before the frame is written) → ``sent``; ``uncertain`` when it may have been written
but was never confirmed (never sent again); ``failed`` when the platform refused it.

**Effects** are the writes that ride in another step's transaction (a run's begin and finish):
`InboxState`, `OutboxRow`, `InboxRow`. `apply_effects` turns them into SQL on the store thread.
Final rows older than the window (``runner.inbox_window``) are pruned by `prune`.
"""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ania_nb.errors import UsageError

from .db import clean_text, to_json, transaction
from .owner import Owner, liveness

if TYPE_CHECKING:
    from .db import Conn, Database

InboxStateName = Literal["pending", "running", "answered", "notified", "ignored", "dropped"]
OutboxStateName = Literal["pending", "sending", "sent", "uncertain", "failed"]

INBOX_STATES = frozenset({"pending", "running", "answered", "notified", "ignored", "dropped"})
INBOX_FINAL = ("answered", "notified", "ignored", "dropped")
OUTBOX_STATES = frozenset({"pending", "sending", "sent", "uncertain", "failed"})
OUTBOX_FINAL = ("sent", "uncertain", "failed")
PRUNE_BATCH = 5000  # rows deleted per prune statement, so a prune never holds the lock long

_INBOX_COLUMNS = (
    "id, source, account, message_key, session, sender, kind, payload, received_at, state, run_id"
)
_OUTBOX_COLUMNS = (
    "id, session, kind, payload, state, created_at, updated_at, attempts, error, run_id"
)


# ------------------------------------------------------------------ rows


@dataclass(frozen=True)
class InboxEntry:
    """One stored inbox row."""

    id: int
    source: str
    account: str
    message_key: str
    session: str
    sender: str | None
    kind: str
    payload: dict[str, Any]
    received_at: float
    state: str
    run_id: int | None


@dataclass(frozen=True)
class OutboxEntry:
    """One stored outbox row (``payload`` is the neutral delivery the front end renders)."""

    id: int
    session: str
    kind: str
    payload: dict[str, Any]
    state: str
    created_at: float
    updated_at: float
    attempts: int
    error: str | None
    run_id: int | None


# ------------------------------------------------------------------ effects


@dataclass(frozen=True)
class InboxRow:
    """Effect: insert an inbox row (ignored when its key is taken)."""

    source: str
    account: str
    message_key: str
    session: str
    sender: str | None
    payload: dict[str, Any]
    kind: str = "message"
    state: InboxStateName = "pending"


@dataclass(frozen=True)
class InboxState:
    """Effect: move inbox rows ``ids`` to ``state``; ``run_id`` None means the step's own run.

    Rows already in a final state keep it (a late step never reopens an answered message).
    """

    ids: tuple[int, ...]
    state: InboxStateName
    run_id: int | None = None


@dataclass(frozen=True)
class OutboxRow:
    """Effect: insert an outbox row; ``run_id`` None means the step's own run (if any).

    ``claimed``: inserted ``sending`` — the step's front end writes it right after the commit
    (`OutboxLog.entry` is the row it sends), instead of claiming it in a transaction of its own.
    """

    session: str
    kind: str
    payload: dict[str, Any] = field(default_factory=dict)
    run_id: int | None = None
    claimed: bool = False


Effect = InboxRow | InboxState | OutboxRow


def check_effects(effects: Sequence[Effect]) -> list[Effect]:
    """Validate effects before they reach the store thread (a clear error, nothing written)."""
    checked: list[Effect] = []
    for effect in effects:
        if isinstance(effect, InboxState):
            if effect.state not in INBOX_STATES:
                raise UsageError(
                    f"inbox state must be one of {sorted(INBOX_STATES)}, got {effect.state!r}"
                )
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in effect.ids):
                raise UsageError(f"inbox ids must be integers, got {effect.ids!r}")
        elif isinstance(effect, OutboxRow | InboxRow):
            if not isinstance(effect.session, str) or not effect.session:
                raise UsageError(
                    f"an {type(effect).__name__} needs a session, got {effect.session!r}"
                )
            if not isinstance(effect.payload, dict):
                raise UsageError(f"an {type(effect).__name__} payload must be a dict")
        else:
            raise UsageError(f"not a store effect: {effect!r}")
        checked.append(effect)
    return checked


async def apply_effects(
    conn: Conn, effects: Sequence[Effect], run_id: int | None, now: float
) -> list[int]:
    """Write ``effects`` inside the caller's transaction; returns the new outbox row ids."""
    outbox_ids: list[int] = []
    for effect in effects:
        if isinstance(effect, InboxState):
            await _set_inbox_state(conn, effect.ids, effect.state, effect.run_id or run_id, now)
        elif isinstance(effect, OutboxRow):
            outbox_ids.append(await _insert_outbox(conn, effect, effect.run_id or run_id, now))
        else:
            await _insert_inbox(conn, effect, now)
    return outbox_ids


# ------------------------------------------------------------------ the inbox


class Inbox:
    """The durable inbox (see the module docstring); every call runs on the store thread."""

    def __init__(self, db: Database, outbox: OutboxLog | None = None) -> None:
        """Read and write the ``inbox`` table of ``db``.

        ``outbox``'s rows confirmed sent are marked in the next accept's transaction.
        """
        self._db = db
        self._outbox = outbox

    async def accept(self, row: InboxRow, effects: Sequence[Effect] = ()) -> int | None:
        """Insert ``row`` (and ``effects``) in one transaction; None when its key is taken.

        A duplicate writes nothing, its effects neither. The outbox rows confirmed sent since
        the last transaction that marked them are marked ``sent`` in it too (no commit of
        their own: `OutboxLog.confirm`).
        """
        check_effects([row, *effects])
        sent = self._outbox.take_confirmed() if self._outbox is not None else []
        try:
            return await self._db.run(_accept, row, list(effects), time.time(), sent)
        except BaseException:
            if self._outbox is not None:  # marked by a later transaction (idempotent)
                self._outbox.confirm(*sent)
            raise

    async def update(self, effects: Sequence[Effect]) -> list[int]:
        """Write ``effects`` in one transaction; returns the new outbox row ids."""
        checked = check_effects(effects)
        return await self._db.run(_update, checked, time.time())

    async def settle(self, ids: Sequence[int], reply: OutboxRow) -> int | None:
        """Answer rows ``ids`` that are still open (``pending``/``running``) with ``reply``.

        One transaction: when none is open any more (their run's finish step answered them)
        nothing is written and None returned; else the reply row's id.
        """
        check_effects([reply])
        return await self._db.run(_settle, tuple(ids), reply, time.time())

    async def orphans(self) -> builtins.list[tuple[InboxEntry, bool]]:
        """``running`` rows whose run is not running any more (a crash cut it off).

        Each with whether a tool with side effects had started in that run. Call after the
        store marked orphaned runs ``interrupted`` (opening it does).
        """
        return await self._db.run(_orphans)

    async def resume(
        self,
        ids: Sequence[int],
        run_ids: Sequence[int],
        how: Literal["rerun", "notified"],
        notice: OutboxRow | None = None,
    ) -> None:
        """Resolve orphaned rows: ``rerun`` makes them ``pending`` again, ``notified`` final.

        The runs' records note ``how`` (column ``resumed``); ``notice`` is the chat's notice
        row, written in the same transaction.
        """
        if notice is not None:
            check_effects([notice])
        await self._db.run(_resume, tuple(ids), tuple(run_ids), how, notice, time.time())

    async def get(self, inbox_id: int) -> InboxEntry | None:
        """One row by id."""
        return await self._db.run(_get_inbox, inbox_id)

    async def sessions_waiting(self, older_than: float) -> builtins.list[str]:
        """Sessions with ``pending`` or ``running`` rows unchanged for ``older_than`` seconds.

        The replicas' sweep: a session nobody answers any more (its replica died) has some.
        """
        return await self._db.run(_sessions_waiting, time.time() - older_than)

    async def list(
        self, *, states: Sequence[str] = (), session: str | None = None, limit: int = 10_000
    ) -> builtins.list[InboxEntry]:
        """Rows in ``states`` (all when empty), optionally of one session, oldest first."""
        for state in states:
            if state not in INBOX_STATES:
                raise UsageError(
                    f"inbox state must be one of {sorted(INBOX_STATES)}, got {state!r}"
                )
        return await self._db.run(_list_inbox, tuple(states), session, limit)

    async def prune(self, window: float) -> int:
        """Delete final rows received more than ``window`` seconds ago; returns how many."""
        return await self._db.run(_prune, "inbox", "received_at", INBOX_FINAL, time.time() - window)


class OutboxLog:
    """The durable outbox (see the module docstring); every call runs on the store thread."""

    def __init__(self, db: Database) -> None:
        """Read and write the ``outbox`` table of ``db``."""
        self._db = db
        self._confirmed: builtins.list[int] = []

    def confirm(self, *row_ids: int) -> None:
        """Rows ``row_ids`` (``sending``) were sent: the next accept or `mark_sent` marks them.

        Until then they are ``sending`` in the store (``uncertain`` after a crash: written,
        and never written again).
        """
        self._confirmed.extend(row_ids)

    def take_confirmed(self) -> builtins.list[int]:
        """The rows confirmed and not marked yet (the caller marks them)."""
        taken, self._confirmed = self._confirmed, []
        return taken

    async def add(self, row: OutboxRow, effects: Sequence[Effect] = ()) -> int:
        """Insert ``row`` (with ``effects``) in one transaction; returns its id."""
        check_effects([row, *effects])
        return (await self._db.run(_update, [row, *effects], time.time()))[0]

    async def claim(self, session: str) -> OutboxEntry | None:
        """The session's oldest ``pending`` row, now ``sending`` (committed); None when none."""
        return await self._db.run(_claim, session, time.time())

    async def mark(
        self,
        row_id: int,
        state: OutboxStateName,
        error: str | None = None,
        *,
        claim_next: str | None = None,
    ) -> OutboxEntry | None:
        """Move a ``sending`` row to ``state`` (``pending`` again: it was provably not sent).

        With ``claim_next`` (a session), the same transaction claims that session's next
        pending row (see `claim`) and returns it: one store round trip per row sent.
        """
        if state not in OUTBOX_STATES:
            raise UsageError(f"outbox state must be one of {sorted(OUTBOX_STATES)}, got {state!r}")
        return await self._db.run(_mark, row_id, state, error, time.time(), claim_next)

    async def mark_sent(self, row_ids: Sequence[int]) -> None:
        """Mark ``sending`` rows ``sent``, all in one transaction (the deliverer's batch)."""
        if row_ids:
            await self._db.run(_mark_sent, tuple(row_ids), time.time())

    @staticmethod
    def entry(row: OutboxRow, row_id: int) -> OutboxEntry:
        """The stored entry of a ``claimed`` row its step wrote as ``row_id``."""
        if not row.claimed:
            raise UsageError("only a claimed outbox row is written as an entry to send")
        now = time.time()
        return OutboxEntry(
            row_id, row.session, row.kind, row.payload, "sending", now, now, 1, None, row.run_id
        )

    async def recover(self) -> builtins.list[OutboxEntry]:
        """Rows a dead process was sending become ``uncertain`` (never sent again); returns them.

        Rows a live process (a replica of this one) is sending are left to it.
        """
        return await self._db.run(_recover, time.time())

    async def sessions_pending(self, *, older_than: float = 0.0) -> builtins.list[str]:
        """Sessions that have ``pending`` rows, by their oldest row.

        ``older_than``: only rows unchanged for that many seconds (the sweep's, for rows
        nobody is sending).
        """
        before = time.time() - older_than if older_than else None
        return await self._db.run(_sessions_pending, before)

    async def get(self, row_id: int) -> OutboxEntry | None:
        """One row by id."""
        return await self._db.run(_get_outbox, row_id)

    async def list(
        self, *, states: Sequence[str] = (), session: str | None = None, limit: int = 10_000
    ) -> builtins.list[OutboxEntry]:
        """Rows in ``states`` (all when empty), optionally of one session, oldest first."""
        for state in states:
            if state not in OUTBOX_STATES:
                raise UsageError(
                    f"outbox state must be one of {sorted(OUTBOX_STATES)}, got {state!r}"
                )
        return await self._db.run(_list_outbox, tuple(states), session, limit)

    async def prune(self, window: float) -> int:
        """Delete final rows created more than ``window`` seconds ago; returns how many."""
        return await self._db.run(
            _prune, "outbox", "created_at", OUTBOX_FINAL, time.time() - window
        )


# ------------------------------------------------------------------ store-thread functions


def _payload(payload: dict[str, Any]) -> str:
    try:
        return to_json(payload)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"a mailbox payload must be JSON-serialisable: {exc}") from exc


async def _insert_inbox(conn: Conn, row: InboxRow, now: float) -> int | None:
    inserted = await conn.fetchone(
        "INSERT INTO inbox (source, account, message_key, session, sender, kind, "
        "payload, received_at, state, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (source, account, message_key) DO NOTHING RETURNING id",
        (
            clean_text(row.source),
            clean_text(row.account),
            clean_text(row.message_key),
            clean_text(row.session),
            None if row.sender is None else clean_text(row.sender),
            row.kind,
            _payload(row.payload),
            now,
            row.state,
            now,
        ),
    )
    return None if inserted is None else int(inserted[0])


async def _set_inbox_state(
    conn: Conn, ids: Sequence[int], state: str, run_id: int | None, now: float
) -> None:
    if not ids:
        return
    marks = ",".join("?" * len(ids))
    final = ",".join("?" * len(INBOX_FINAL))
    await conn.defer(
        f"UPDATE inbox SET state = ?, run_id = coalesce(?, run_id), updated_at = ? "
        f"WHERE id IN ({marks}) AND state NOT IN ({final})",
        (state, run_id, now, *ids, *INBOX_FINAL),
    )


async def _insert_outbox(conn: Conn, row: OutboxRow, run_id: int | None, now: float) -> int:
    state, attempts = ("sending", 1) if row.claimed else ("pending", 0)
    inserted = await conn.fetchone(
        "INSERT INTO outbox (session, kind, payload, state, created_at, updated_at, attempts, "
        "run_id, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        (
            clean_text(row.session),
            row.kind,
            _payload(row.payload),
            state,
            now,
            now,
            attempts,
            run_id,
            owner_text(conn.owner) if row.claimed else None,
        ),
    )
    assert inserted is not None  # an INSERT … RETURNING always returns its row
    return int(inserted[0])


async def _accept(
    conn: Conn, row: InboxRow, effects: list[Effect], now: float, sent: list[int]
) -> int | None:
    async with transaction(conn):
        if sent:
            await _set_sent(conn, sent, now)
        inbox_id = await _insert_inbox(conn, row, now)
        if inbox_id is not None and effects:
            await apply_effects(conn, _bound(effects, inbox_id), None, now)
    return inbox_id


def _bound(effects: list[Effect], inbox_id: int) -> list[Effect]:
    """Effects of an accept: an `InboxState` without ids means the accepted row."""
    return [
        InboxState((inbox_id,), e.state, e.run_id) if isinstance(e, InboxState) and not e.ids else e
        for e in effects
    ]


async def _update(conn: Conn, effects: list[Effect], now: float) -> list[int]:
    async with transaction(conn):
        return await apply_effects(conn, effects, None, now)


async def _settle(conn: Conn, ids: tuple[int, ...], reply: OutboxRow, now: float) -> int | None:
    if not ids:
        return None
    marks = ",".join("?" * len(ids))
    async with transaction(conn):
        changed = await conn.execute(
            f"UPDATE inbox SET state = 'answered', updated_at = ? "
            f"WHERE id IN ({marks}) AND state IN ('pending', 'running')",
            (now, *ids),
        )
        if changed == 0:
            return None
        return await _insert_outbox(conn, reply, reply.run_id, now)


async def _orphans(conn: Conn) -> list[tuple[InboxEntry, bool]]:
    columns = ", ".join(f"i.{c.strip()}" for c in _INBOX_COLUMNS.split(","))
    rows = await conn.fetchall(
        f"SELECT {columns}, coalesce(r.side_effects_started, 0) FROM inbox i "
        "LEFT JOIN runs r ON r.id = i.run_id "
        "WHERE i.state = 'running' AND (r.id IS NULL OR r.status != 'running') ORDER BY i.id"
    )
    return [(_inbox_entry(r[:-1]), bool(r[-1])) for r in rows]


async def _resume(
    conn: Conn,
    ids: tuple[int, ...],
    run_ids: tuple[int, ...],
    how: str,
    notice: OutboxRow | None,
    now: float,
) -> None:
    state = "pending" if how == "rerun" else "notified"
    async with transaction(conn):
        if ids:
            await conn.execute(
                f"UPDATE inbox SET state = ?, updated_at = ? "
                f"WHERE id IN ({','.join('?' * len(ids))}) AND state = 'running'",
                (state, now, *ids),
            )
        if run_ids:
            await conn.execute(
                f"UPDATE runs SET resumed = ? WHERE id IN ({','.join('?' * len(run_ids))})",
                (how, *run_ids),
            )
        if notice is not None:
            await _insert_outbox(conn, notice, notice.run_id, now)


def _inbox_entry(row: tuple[Any, ...]) -> InboxEntry:
    values = list(row)
    values[7] = json.loads(values[7])
    return InboxEntry(*values)


def _outbox_entry(row: tuple[Any, ...]) -> OutboxEntry:
    values = list(row)
    values[3] = json.loads(values[3])
    return OutboxEntry(*values)


async def _get_inbox(conn: Conn, inbox_id: int) -> InboxEntry | None:
    row = await conn.fetchone(f"SELECT {_INBOX_COLUMNS} FROM inbox WHERE id = ?", (inbox_id,))
    return None if row is None else _inbox_entry(row)


def _where(states: tuple[str, ...], session: str | None) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if states:
        clauses.append(f"state IN ({','.join('?' * len(states))})")
        params.extend(states)
    if session is not None:
        clauses.append("session = ?")
        params.append(session)
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), params


async def _list_inbox(
    conn: Conn, states: tuple[str, ...], session: str | None, limit: int
) -> list[InboxEntry]:
    where, params = _where(states, session)
    rows = await conn.fetchall(
        f"SELECT {_INBOX_COLUMNS} FROM inbox {where} ORDER BY id LIMIT ?", (*params, limit)
    )
    return [_inbox_entry(r) for r in rows]


async def _get_outbox(conn: Conn, row_id: int) -> OutboxEntry | None:
    row = await conn.fetchone(f"SELECT {_OUTBOX_COLUMNS} FROM outbox WHERE id = ?", (row_id,))
    return None if row is None else _outbox_entry(row)


async def _list_outbox(
    conn: Conn, states: tuple[str, ...], session: str | None, limit: int
) -> list[OutboxEntry]:
    where, params = _where(states, session)
    rows = await conn.fetchall(
        f"SELECT {_OUTBOX_COLUMNS} FROM outbox {where} ORDER BY id LIMIT ?", (*params, limit)
    )
    return [_outbox_entry(r) for r in rows]


async def _claim_row(conn: Conn, session: str, now: float) -> OutboxEntry | None:
    # Several processes may deliver one chat (replicas on PostgreSQL): a row is claimed only
    # while no other process is sending one of its session, so that the chat gets its rows in
    # order (this process's own are in order already: one worker per chat, and rows confirmed
    # sent stay `sending` until their mark rides the next transaction). A dead claimer's row
    # blocks the chat until the sweep makes it uncertain (`recover`).
    me = owner_text(conn.owner)
    row = await conn.fetchone(
        # The outer state check: on PostgreSQL two claimers may pick the same id; the second
        # then finds it claimed (the row is re-checked after the first commits) and gets none.
        f"UPDATE outbox SET state = 'sending', attempts = attempts + 1, updated_at = ?, "
        f"owner = ? WHERE id = (SELECT id FROM outbox WHERE session = ? AND state = 'pending' "
        f"AND NOT EXISTS (SELECT 1 FROM outbox WHERE session = ? AND state = 'sending' "
        f"AND owner IS DISTINCT FROM ?) "
        f"ORDER BY id LIMIT 1) AND state = 'pending' RETURNING {_OUTBOX_COLUMNS}",
        (now, me, session, session, me),
    )
    return None if row is None else _outbox_entry(row)


async def _claim(conn: Conn, session: str, now: float) -> OutboxEntry | None:
    return await _claim_row(conn, session, now)  # one statement: atomic without BEGIN


async def _mark(
    conn: Conn,
    row_id: int,
    state: str,
    error: str | None,
    now: float,
    claim_next: str | None,
) -> OutboxEntry | None:
    async with transaction(conn):
        await conn.execute(
            "UPDATE outbox SET state = ?, error = ?, updated_at = ? WHERE id = ?",
            (state, None if error is None else clean_text(error), now, row_id),
        )
        return await _claim_row(conn, claim_next, now) if claim_next is not None else None


async def _mark_sent(conn: Conn, row_ids: tuple[int, ...], now: float) -> None:
    await _set_sent(conn, row_ids, now)  # one statement: atomic without BEGIN


async def _set_sent(conn: Conn, row_ids: Sequence[int], now: float) -> None:
    await conn.defer(
        f"UPDATE outbox SET state = 'sent', error = NULL, updated_at = ? "
        f"WHERE id IN ({','.join('?' * len(row_ids))}) AND state = 'sending'",
        (now, *row_ids),
    )


async def _recover(conn: Conn, now: float) -> list[OutboxEntry]:
    claimers = await conn.fetchall(
        "SELECT DISTINCT owner FROM outbox WHERE state = 'sending' AND owner IS NOT NULL"
    )
    owners = {text: owner_of(text) for (text,) in claimers}
    alive = await liveness(conn, [o for o in owners.values() if o is not None])
    # Gone, or unknowable from here (another host's plain process: it cannot be live on one
    # SQLite file, and replicas are always knowable): their rows become uncertain.
    dead = [text for text, o in owners.items() if o is None or alive.get(o) is not True]
    rows: list[tuple[Any, ...]] = []
    async with transaction(conn):
        where = "owner IS NULL"
        if dead:
            where = f"(owner IS NULL OR owner IN ({','.join('?' * len(dead))}))"
        rows = await conn.fetchall(
            f"UPDATE outbox SET state = 'uncertain', updated_at = ?, "
            f"error = 'the process ended while it was being sent' "
            f"WHERE state = 'sending' AND {where} RETURNING {_OUTBOX_COLUMNS}",
            (now, *dead),
        )
    return sorted((_outbox_entry(r) for r in rows), key=lambda e: e.id)


def owner_text(owner: Owner) -> str:
    """An owner as one text column (host, pid and start token, tab-separated)."""
    return f"{owner.host}\t{owner.pid}\t{owner.start or ''}"


def owner_of(text: str | None) -> Owner | None:
    """The owner `owner_text` wrote, or None for an unreadable one."""
    parts = (text or "").split("\t")
    if len(parts) != 3 or not parts[1].lstrip("-").isdigit():
        return None
    return Owner(parts[0], int(parts[1]), parts[2] or None)


async def _sessions_pending(conn: Conn, before: float | None) -> list[str]:
    rows = await conn.fetchall(
        "SELECT session, min(id) AS first FROM outbox WHERE state = 'pending' "
        "AND updated_at < ? GROUP BY session ORDER BY first",
        (float("inf") if before is None else before,),
    )
    return [r[0] for r in rows]


async def _sessions_waiting(conn: Conn, before: float) -> list[str]:
    rows = await conn.fetchall(
        "SELECT session, min(id) AS first FROM inbox WHERE state IN ('pending', 'running') "
        "AND updated_at < ? GROUP BY session ORDER BY first",
        (before,),
    )
    return [r[0] for r in rows]


async def _prune(conn: Conn, table: str, column: str, final: tuple[str, ...], before: float) -> int:
    removed = 0
    marks = ",".join("?" * len(final))
    while True:
        async with transaction(conn):
            deleted = await conn.execute(
                f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} "
                f"WHERE {column} < ? AND state IN ({marks}) LIMIT ?)",
                (before, *final, PRUNE_BATCH),
            )
        removed += deleted
        if deleted < PRUNE_BATCH:
            return removed
