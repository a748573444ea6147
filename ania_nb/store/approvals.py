"""Pending tool approvals that survive a restart: the request and the run's state at that point.

A row is written when the gate asks a person, before the front end is told (`ApprovalLog.add`),
and follows the request to its end: ``pending`` (asked; its owner is the process that holds the
question) → ``allowed`` | ``denied`` | ``timeout`` | ``stopped`` | ``error``; or ``suspended``
(given up at shutdown, the run ended without a tool result). After a restart, ``suspended``
rows and ``pending`` rows whose owner is gone (a kill -9) are *open*: the front end claims each
(`ApprovalLog.claim`, atomic, so two processes never both re-post it), posts the card again and
continues the conversation from the stored checkpoint once the verdict comes.

A verdict given while the process shuts down, after the row was suspended, is kept on it
(`ApprovalLog.decide`: ``verdict`` ``allowed`` | ``denied``, with ``approver`` and ``reason``);
the row stays ``suspended`` (open) and the next start continues the run with that verdict
instead of posting the card again.

``deadline`` is wall-clock time (``time.time()``): a restart does not reset the timeout.
``request`` and ``checkpoint`` are JSON objects; this module does not interpret them (the
governance and orchestration layers do): the request (tool, summary, details, requester,
requesters, admin_only) and the checkpoint (the conversation up to and including the assistant
message with the tool calls, the round's finished results, the pending call, who ran the run).
Final rows older than the prune window are deleted (`ApprovalLog.prune`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ania_nb.errors import UsageError

from .db import to_json, transaction
from .owner import Owner, liveness

if TYPE_CHECKING:
    from .db import Conn, Database

ApprovalState = Literal["pending", "suspended", "allowed", "denied", "timeout", "stopped", "error"]
OPEN_STATES: frozenset[str] = frozenset({"pending", "suspended"})
FINAL_STATES: frozenset[str] = frozenset({"allowed", "denied", "timeout", "stopped", "error"})

_COLUMNS = (
    "id, session, run_id, state, created_at, deadline, request, checkpoint, reason, approver, "
    "resent, owner_host, owner_pid, owner_start, verdict"
)
VERDICTS: frozenset[str] = frozenset({"allowed", "denied"})


@dataclass(frozen=True)
class ApprovalRow:
    """One stored approval request (see the module docstring)."""

    id: str
    session: str
    run_id: int | None
    state: str
    created_at: float
    deadline: float
    request: dict[str, Any]
    checkpoint: dict[str, Any]
    reason: str | None = None
    approver: str | None = None
    resent: int = 0  # how many times the card was posted again after a restart
    owner: Owner | None = None
    verdict: str | None = None  # allowed | denied: decided while suspended, applied at resume

    @property
    def expired(self) -> bool:
        """Whether the deadline has passed (wall clock)."""
        return time.time() >= self.deadline


class ApprovalLog:
    """The ``approvals`` table; every call runs on the store thread."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(
        self,
        *,
        request_id: str,
        session: str,
        run_id: int | None,
        deadline: float,
        request: dict[str, Any],
        checkpoint: dict[str, Any],
        state: ApprovalState = "pending",
    ) -> None:
        """Store a new request (owned by this process) in one transaction.

        Seam for the durable outbox: the approval card's outbox row belongs in this transaction.
        """
        if state not in OPEN_STATES:
            raise UsageError(f"a new approval row is pending or suspended, not {state!r}")
        encoded = (to_json(request), to_json(checkpoint))
        await self._db.run(
            _add, request_id, session, run_id, state, deadline, encoded, self._db.owner
        )

    async def settle(
        self, request_id: str, state: ApprovalState, reason: str = "", approver: str | None = None
    ) -> bool:
        """Move an open row to ``state`` (final or ``suspended``); False if it was not open."""
        if state == "pending":
            raise UsageError("settle moves a row out of pending; use claim to take it over")
        return await self._db.run(_settle, request_id, state, reason, approver, time.time())

    async def decide(
        self, request_id: str, verdict: str, reason: str, approver: str | None
    ) -> bool:
        """Keep a verdict on a suspended row not decided yet; False if there is no such row."""
        if verdict not in VERDICTS:
            raise UsageError(f"a stored verdict is allowed or denied, not {verdict!r}")
        return await self._db.run(_decide, request_id, verdict, reason, approver, time.time())

    async def update_checkpoint(self, request_id: str, checkpoint: dict[str, Any]) -> bool:
        """Replace an open row's checkpoint (a sibling call ended); False if it is not open."""
        return await self._db.run(_update_checkpoint, request_id, to_json(checkpoint), time.time())

    async def open_rows(self) -> list[tuple[ApprovalRow, bool]]:
        """Open rows, oldest first, each with whether its owner still holds it (live)."""
        return await self._db.run(_open_rows)

    async def claim(self, row: ApprovalRow) -> ApprovalRow | None:
        """Take an open row over for this process (re-posted); None if someone else did."""
        return await self._db.run(_claim, row, self._db.owner, time.time())

    async def get(self, request_id: str) -> ApprovalRow | None:
        """The row of ``request_id``, or None."""
        return await self._db.run(_get, request_id)

    async def prune(self, window: float) -> int:
        """Delete final rows not updated for ``window`` seconds; returns how many."""
        return await self._db.run(_prune, time.time() - window)


# Store operations: each receives the connection first (see ``Database.run``).


async def _add(
    conn: Conn,
    request_id: str,
    session: str,
    run_id: int | None,
    state: str,
    deadline: float,
    encoded: tuple[str, str],
    owner: Owner,
) -> None:
    now = time.time()
    async with transaction(conn):
        await conn.execute(
            "INSERT INTO approvals (id, session, run_id, state, created_at, updated_at, deadline, "
            "request, checkpoint, owner_host, owner_pid, owner_start) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (request_id, session, run_id, state, now, now, deadline, *encoded, *_owner(owner)),
        )


async def _settle(
    conn: Conn,
    request_id: str,
    state: str,
    reason: str,
    approver: str | None,
    now: float,
) -> bool:
    # Suspended again (closed before its run went on), a decided row keeps who decided and why.
    keep = "CASE WHEN ? = 'suspended' AND verdict IS NOT NULL THEN {0} ELSE ? END"
    async with transaction(conn):
        changed = await conn.execute(
            f"UPDATE approvals SET state = ?, reason = {keep.format('reason')}, "
            f"approver = {keep.format('approver')}, updated_at = ? "
            "WHERE id = ? AND state IN ('pending', 'suspended')",
            (state, state, reason or None, state, approver, now, request_id),
        )
    return changed > 0


async def _decide(
    conn: Conn,
    request_id: str,
    verdict: str,
    reason: str,
    approver: str | None,
    now: float,
) -> bool:
    changed = await conn.execute(  # one statement: atomic without BEGIN
        "UPDATE approvals SET verdict = ?, reason = ?, approver = ?, updated_at = ? "
        "WHERE id = ? AND state = 'suspended' AND verdict IS NULL",
        (verdict, reason or None, approver, now, request_id),
    )
    return changed > 0


async def _update_checkpoint(conn: Conn, request_id: str, raw: str, now: float) -> bool:
    async with transaction(conn):
        changed = await conn.execute(
            "UPDATE approvals SET checkpoint = ?, updated_at = ? "
            "WHERE id = ? AND state IN ('pending', 'suspended')",
            (raw, now, request_id),
        )
    return changed > 0


async def _open_rows(conn: Conn) -> list[tuple[ApprovalRow, bool]]:
    rows = [
        _row(raw)
        for raw in await conn.fetchall(
            f"SELECT {_COLUMNS} FROM approvals WHERE state IN ('pending', 'suspended') "
            "ORDER BY created_at, id"
        )
    ]
    alive = await liveness(conn, [row.owner for row in rows if row.owner is not None])
    # A pending question is held while its owner lives (another host's plain process: assume
    # so; it cannot be looked at from here).
    return [
        (row, row.state == "pending" and row.owner is not None and alive[row.owner] is not False)
        for row in rows
    ]


async def _claim(conn: Conn, row: ApprovalRow, me: Owner, now: float) -> ApprovalRow | None:
    # Conditional on the state and owner read before: a second claimer finds them changed.
    old = _owner(row.owner) if row.owner is not None else (None, None, None)
    async with transaction(conn):
        changed = await conn.execute(
            "UPDATE approvals SET state = 'pending', "
            "resent = resent + CASE WHEN verdict IS NULL THEN 1 ELSE 0 END, updated_at = ?, "
            "owner_host = ?, owner_pid = ?, owner_start = ? "
            "WHERE id = ? AND state = ? AND owner_host IS NOT DISTINCT FROM ? "
            "AND owner_pid IS NOT DISTINCT FROM ? AND owner_start IS NOT DISTINCT FROM ?",
            (now, *_owner(me), row.id, row.state, *old),
        )
        if changed == 0:
            return None
        raw = await conn.fetchone(f"SELECT {_COLUMNS} FROM approvals WHERE id = ?", (row.id,))
    return None if raw is None else _row(raw)


async def _get(conn: Conn, request_id: str) -> ApprovalRow | None:
    raw = await conn.fetchone(f"SELECT {_COLUMNS} FROM approvals WHERE id = ?", (request_id,))
    return _row(raw) if raw is not None else None


async def _prune(conn: Conn, before: float) -> int:
    async with transaction(conn):
        changed = await conn.execute(
            "DELETE FROM approvals WHERE state NOT IN ('pending', 'suspended') AND updated_at < ?",
            (before,),
        )
    return changed


def _owner(owner: Owner) -> tuple[str, int, str | None]:
    return owner.host, owner.pid, owner.start


def _row(raw: tuple[Any, ...]) -> ApprovalRow:
    (rid, session, run_id, state, created, deadline, request, checkpoint) = raw[:8]
    reason, approver, resent, host, pid, start, verdict = raw[8:]
    owner = Owner(host, pid, start) if host is not None and pid is not None else None
    return ApprovalRow(
        rid,
        session,
        run_id,
        state,
        created,
        deadline,
        _object(request),
        _object(checkpoint),
        reason,
        approver,
        resent,
        owner,
        verdict if verdict in VERDICTS else None,
    )


def _object(raw: str) -> dict[str, Any]:
    """A stored JSON object; anything else (a hand-edited row) reads as empty."""
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
