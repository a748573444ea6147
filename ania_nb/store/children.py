"""Subagents that survive a restart: one ``children`` row per child, from launch to its end.

A row is written when a subagent starts (`ChildLog.start`, before ``subagent_run`` answers
with its id): the row's id *is* the id users see, unique across restarts. It stays ``running``
while its owner (the process that started it, `ania_nb.store.owner`) runs the child, then
ends exactly once (`ChildLog.end`):

- ``finished``: the child returned (``outcome`` is its status: success, timeout, error); a
  background child's result is queued for its session in the same transaction (an `InboxRow`);
- ``stopped``: cancelled (``outcome``: ``cancel`` by subagent_cancel, ``stop`` by /stop,
  ``restart`` by a shutdown — then with the chat's notice, an `OutboxRow`, in the transaction);
- ``interrupted``: its owner died (a kill -9); the next start finds it (`ChildLog.orphans`)
  and ends it, again with the notice in the same transaction.

The end is conditional on the row still being ``running``, so two processes recovering at once
never both notify. Ids are never reused (AUTOINCREMENT; PostgreSQL: an identity column): a
background result's inbox key (``bg:<id>``) must never meet an older one's. Final rows older
than the prune window are deleted (`ChildLog.prune`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ania_nb.errors import UsageError

from .db import clean_text, transaction
from .mailbox import Effect, InboxRow, apply_effects, check_effects
from .owner import Owner, liveness

if TYPE_CHECKING:
    from .db import Conn, Database

ChildState = Literal["running", "finished", "stopped", "interrupted"]
CHILD_STATES: frozenset[str] = frozenset({"running", "finished", "stopped", "interrupted"})
END_STATES: tuple[str, ...] = ("finished", "stopped", "interrupted")

_COLUMNS = (
    "id, session, task, role, background, state, outcome, started_at, ended_at, "
    "owner_host, owner_pid, owner_start"
)


@dataclass(frozen=True)
class ChildRow:
    """One stored subagent (see the module docstring)."""

    id: int
    session: str
    task: str
    role: str
    background: bool
    state: str
    outcome: str | None
    started_at: float
    ended_at: float | None
    owner: Owner | None


class ChildLog:
    """The ``children`` table; every call runs on the store thread."""

    def __init__(self, db: Database) -> None:
        """Read and write the ``children`` table of ``db``."""
        self._db = db

    async def start(self, session: str, task: str, role: str, *, background: bool) -> int:
        """Store a new ``running`` child owned by this process; returns its id."""
        if not isinstance(session, str) or not session:
            raise UsageError(f"a child needs a session, got {session!r}")
        if not isinstance(task, str):
            raise UsageError(f"a child's task must be a string, got {type(task).__name__}")
        return await self._db.run(
            _start, session, task, role, background, self._db.owner, time.time()
        )

    async def end(
        self,
        child_id: int,
        state: ChildState,
        outcome: str | None = None,
        effects: Sequence[Effect] = (),
    ) -> bool:
        """End a ``running`` child with ``effects`` in one transaction.

        False (nothing written, the effects neither) when the row is not running any more.
        """
        _check_end(state)
        checked = check_effects(effects)
        ended = await self._db.run(_end, child_id, state, outcome, checked, time.time())
        return ended is not None

    async def finish(
        self, child_id: int, outcome: str, result: InboxRow, effects: Sequence[Effect] = ()
    ) -> int | None:
        """End a running background child ``finished``, queueing ``result`` in the same step.

        Returns the result's inbox row id; None when the row was not running any more (or the
        result's key was taken), and then nothing is written.
        """
        checked = check_effects([result, *effects])
        return await self._db.run(_end, child_id, "finished", outcome, checked, time.time())

    async def orphans(self) -> list[ChildRow]:
        """``running`` rows whose owner is provably gone (same host; see `ania_nb.store.owner`).

        Another host's rows are left alone: this process cannot look at its processes.
        """
        return await self._db.run(_orphans)

    async def get(self, child_id: int) -> ChildRow | None:
        """One row by id."""
        return await self._db.run(_get, child_id)

    async def list(
        self, *, states: Sequence[str] = (), session: str | None = None, limit: int = 1000
    ) -> list[ChildRow]:
        """Rows in ``states`` (all when empty), optionally of one session, oldest first."""
        for state in states:
            if state not in CHILD_STATES:
                raise UsageError(
                    f"child state must be one of {sorted(CHILD_STATES)}, got {state!r}"
                )
        return await self._db.run(_list, tuple(states), session, limit)

    async def prune(self, window: float) -> int:
        """Delete ended rows that ended more than ``window`` seconds ago; returns how many."""
        return await self._db.run(_prune, time.time() - window)


def _check_end(state: str) -> None:
    if state not in END_STATES:
        raise UsageError(f"a child ends {', '.join(END_STATES)}, not {state!r}")


# Store operations: each receives the connection first (see ``Database.run``).


async def _start(
    conn: Conn,
    session: str,
    task: str,
    role: str,
    background: bool,
    owner: Owner,
    now: float,
) -> int:
    async with transaction(conn):
        row = await conn.fetchone(
            "INSERT INTO children (session, task, role, background, state, started_at, "
            "owner_host, owner_pid, owner_start) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?) "
            "RETURNING id",
            (
                clean_text(session),
                clean_text(task),
                role,
                1 if background else 0,
                now,
                owner.host,
                owner.pid,
                owner.start,
            ),
        )
    assert row is not None  # an INSERT … RETURNING always returns its row
    return int(row[0])


async def _end(
    conn: Conn,
    child_id: int,
    state: str,
    outcome: str | None,
    effects: list[Effect],
    now: float,
) -> int | None:
    """End the row and write ``effects``; the id of the `InboxRow` written (0 without one).

    None, and nothing written, when the row was not running or the `InboxRow`'s key was taken
    (a result is never queued twice).
    """
    queued = next((e for e in effects if isinstance(e, InboxRow)), None)
    async with transaction(conn):
        if queued is not None and await _inbox_id(conn, queued) is not None:
            return None
        ended = await conn.execute(
            "UPDATE children SET state = ?, outcome = ?, ended_at = ? "
            "WHERE id = ? AND state = 'running'",
            (state, outcome, now, child_id),
        )
        if ended != 1:
            return None
        await apply_effects(conn, effects, None, now)
        return 0 if queued is None else await _inbox_id(conn, queued)


async def _inbox_id(conn: Conn, row: InboxRow) -> int | None:
    found = await conn.fetchone(
        "SELECT id FROM inbox WHERE source = ? AND account = ? AND message_key = ?",
        (row.source, row.account, row.message_key),
    )
    return None if found is None else int(found[0])


async def _orphans(conn: Conn) -> list[ChildRow]:
    rows = [
        _row(raw)
        for raw in await conn.fetchall(
            f"SELECT {_COLUMNS} FROM children WHERE state = 'running' ORDER BY id"
        )
    ]
    alive = await liveness(conn, [row.owner for row in rows if row.owner is not None])
    # Another host's plain process cannot be looked at from here (None): left alone.
    return [row for row in rows if row.owner is None or alive[row.owner] is False]


async def _get(conn: Conn, child_id: int) -> ChildRow | None:
    raw = await conn.fetchone(f"SELECT {_COLUMNS} FROM children WHERE id = ?", (child_id,))
    return None if raw is None else _row(raw)


async def _list(
    conn: Conn, states: tuple[str, ...], session: str | None, limit: int
) -> list[ChildRow]:
    clauses: list[str] = []
    params: list[Any] = []
    if states:
        clauses.append(f"state IN ({','.join('?' * len(states))})")
        params.extend(states)
    if session is not None:
        clauses.append("session = ?")
        params.append(session)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    rows = await conn.fetchall(
        f"SELECT {_COLUMNS} FROM children {where} ORDER BY id LIMIT ?", (*params, limit)
    )
    return [_row(r) for r in rows]


async def _prune(conn: Conn, before: float) -> int:
    async with transaction(conn):
        deleted = await conn.execute(
            "DELETE FROM children WHERE state != 'running' AND ended_at < ?", (before,)
        )
    return deleted


def _row(raw: tuple[Any, ...]) -> ChildRow:
    (cid, session, task, role, background, state, outcome, started, ended) = raw[:9]
    host, pid, start = raw[9:]
    owner = Owner(host, pid, start) if host is not None and pid is not None else None
    return ChildRow(
        cid, session, task, role, bool(background), state, outcome, started, ended, owner
    )
