"""Human approval of tool calls: one pending request per session, answered through the Agent.

The front end is told of a request through the ``request_approval`` callback (a notebook shows
Allow/Deny buttons, a chat bot posts a message) and answers with `Agent.answer_approval`, so a
button click and a chat reply take the same path. No answer within the timeout, or a stop,
denies. However a request ends, ``RunEvent("approval_resolved", session, {id, tool, allowed,
reason, outcome})`` is emitted through its callbacks so the front end can close its card
(outcome: allowed, denied, timeout, stopped or error). `ApprovalManager.allow_for_session` lets a
tool through for the rest of a session without asking (the "always allow" button).

Who may answer: ``approver=None`` is the trusted local front end (a notebook button, code in
the same process) and may answer anything. A named approver (a chat user) must be an admin, or,
unless the request is admin-only, its requester; a request without a requester (made for the
local user) may be answered by anyone the front end lets answer. Human verdicts and timeouts are
audited in the op log (action ``tool_approval``) when one is attached; stops are not.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from ..engine.callbacks import ApprovalRequest, Callbacks, RunEvent, Verdict
from ..errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from ..store import OpLog

log = logging.getLogger(__name__)

ALLOW_WORDS = frozenset({"允许", "同意", "批准", "allow", "approve", "yes", "y"})
DENY_WORDS = frozenset({"拒绝", "deny", "reject", "no", "n"})
SESSION_ALLOWED = "allowed for the rest of this session"
STOPPED = "stopped by the user"
ENDED_KEPT = 256  # ended requests remembered to answer late replies precisely


def parse_verdict_word(word: str) -> bool | None:
    """True for an allow word, False for a deny word (case-insensitive), None otherwise."""
    text = word.strip().lower()
    if text in ALLOW_WORDS:
        return True
    if text in DENY_WORDS:
        return False
    return None


class ApprovalManager:
    """Pending approval requests, serialised per session."""

    def __init__(
        self, *, timeout: float = 120.0, admins: Iterable[str] = (), oplog: OpLog | None = None
    ) -> None:
        self.timeout = timeout
        self.admins = frozenset(admins)
        self.oplog = oplog  # attached once the store is open
        self._answered: set[str] = set()  # ids answered by a human (audited; stops are not)
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._pending: dict[str, tuple[ApprovalRequest, asyncio.Future[Verdict]]] = {}
        self._session_allowed: dict[str, set[str]] = {}
        self._ended: OrderedDict[str, Verdict] = OrderedDict()  # recently ended requests

    async def request(
        self,
        *,
        session: str,
        tool: str,
        summary: str,
        callbacks: Callbacks,
        requester: str | None = None,
        admin_only: bool = False,
        details: str = "",
        requesters: tuple[str, ...] = (),
    ) -> Verdict:
        """Ask a human and wait for the verdict (denied on timeout, stop or no front end)."""
        requesters = requesters or ((requester,) if requester else ())
        # Admin-only requests (config changes, background runs) are asked every time.
        if not admin_only and tool in self._session_allowed.get(session, ()):
            return await self._auto_allow(session, tool, summary, requester, admin_only)
        if not callbacks.has("request_approval"):
            return Verdict(
                False, "nobody can approve tool calls in this conversation", None, "error"
            )
        async with self._locks[session]:  # one question at a time per conversation
            # Checked again: "allow for this session" may have been clicked while we queued.
            if not admin_only and tool in self._session_allowed.get(session, ()):
                return await self._auto_allow(session, tool, summary, requester, admin_only)
            request = ApprovalRequest(
                id=secrets.token_hex(4),
                session=session,
                tool=tool,
                summary=summary,
                requester=requester,
                admin_only=admin_only,
                details=details,
                requesters=requesters,
            )
            future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
            self._pending[request.id] = (request, future)
            try:
                verdict, outcome = await self._wait(request, future, callbacks)
            except asyncio.CancelledError:  # the run was cancelled while the question was open
                await _resolved(callbacks, request, Verdict(False, STOPPED), "stopped")
                raise
            finally:
                self._pending.pop(request.id, None)
                self._answered.discard(request.id)
                self._remember(request.id, future)
            if outcome == "timeout":
                await self._audit(request, verdict, "超时自动拒绝 (timed out)")
            elif outcome in ("allowed", "denied"):
                await self._audit(request, verdict, "允许" if verdict.allowed else "拒绝")
            await _resolved(callbacks, request, verdict, outcome)
            return replace(verdict, outcome=outcome)

    async def _wait(
        self, request: ApprovalRequest, future: asyncio.Future[Verdict], callbacks: Callbacks
    ) -> tuple[Verdict, str]:
        """Show the request and wait; returns the verdict and how the request ended."""
        try:
            # The timeout also bounds a front end that is slow to show the question.
            async with asyncio.timeout(self.timeout):
                try:
                    await callbacks.call("request_approval", request)
                except Exception as exc:
                    log.warning("request_approval callback failed", exc_info=True)
                    reason = f"the approval request could not be shown: {exc}"
                    return Verdict(False, reason), "error"
                verdict = await future
        except TimeoutError:
            reason = f"no answer within {self.timeout:g} s, denied automatically"
            return Verdict(False, reason), "timeout"
        if request.id in self._answered:
            return verdict, "allowed" if verdict.allowed else "denied"
        return verdict, "stopped"  # only cancel() sets a verdict without answering

    async def _auto_allow(
        self, session: str, tool: str, summary: str, requester: str | None, admin_only: bool
    ) -> Verdict:
        request = ApprovalRequest(
            secrets.token_hex(4), session, tool, summary, requester, admin_only
        )
        verdict = Verdict(True, SESSION_ALLOWED, None, "allowed")
        await self._audit(request, verdict, "允许 (allowed for this session)")
        return verdict

    def allow_for_session(self, session: str, tool: str) -> None:
        """Allow ``tool`` in ``session`` from now on without asking (until revoked)."""
        if not session or not tool:
            raise UsageError("allow_for_session needs a session and a tool name")
        self._session_allowed.setdefault(session, set()).add(tool)

    def revoke_for_session(self, session: str, tool: str | None = None) -> int:
        """Ask again for ``tool`` (or every tool) in ``session``; returns how many were revoked."""
        allowed = self._session_allowed.get(session, set())
        revoked = set(allowed) if tool is None else allowed & {tool}
        allowed -= revoked
        return len(revoked)

    def allowed_tools(self, session: str) -> list[str]:
        """Tools allowed without asking in ``session``, sorted."""
        return sorted(self._session_allowed.get(session, ()))

    def pending(self, session: str | None = None) -> list[ApprovalRequest]:
        """Requests waiting for an answer (of one session, or all)."""
        return [r for r, _ in self._pending.values() if session is None or r.session == session]

    def answer(
        self,
        request_id: str | None = None,
        *,
        session: str | None = None,
        allow: bool | str,
        approver: str | None = None,
        reason: str = "",
    ) -> ApprovalRequest:
        """Answer a pending request (by id, or the session's current one); returns it."""
        if isinstance(allow, str):
            parsed = parse_verdict_word(allow)
            if parsed is None:
                words = ", ".join(sorted(ALLOW_WORDS | DENY_WORDS))
                raise UsageError(f"{allow!r} is not an answer; use one of: {words}")
            allow = parsed
        entry = self._find(request_id, session)
        request, future = entry
        self._authorise(request, approver)
        if future.done():  # answered a moment ago, or ended by a timeout or a stop
            raise UsageError(_already(request.id, future.result()))
        who = f" by {approver}" if approver else ""
        text = reason or (f"approved{who}" if allow else f"denied{who}")
        future.set_result(Verdict(allow, text, approver))
        self._answered.add(request.id)
        return request

    def _remember(self, request_id: str, future: asyncio.Future[Verdict]) -> None:
        """Keep how a request ended, so a late answer hears it was ignored and why."""
        if future.done() and not future.cancelled():
            self._ended[request_id] = future.result()
            while len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)

    def _authorise(self, request: ApprovalRequest, approver: str | None) -> None:
        """Raise `UsageError` when ``approver`` may not answer ``request``."""
        if approver is None or approver in self.admins:
            return
        if request.admin_only:
            raise UsageError(
                f"{request.tool} needs an admin's approval and {approver!r} is not an admin "
                "(admin.ids)"
            )
        askers = request.requesters or ((request.requester,) if request.requester else ())
        if askers and approver not in askers:
            raise UsageError(
                f"{approver!r} may not answer this request: only the requester or an admin "
                f"may answer it (asked by: {', '.join(askers)})"
            )

    async def _audit(self, request: ApprovalRequest, verdict: Verdict, outcome: str) -> None:
        if self.oplog is None:
            return
        asker = f", requested by {request.requester}" if request.requester else ""
        detail = f"{request.tool}: {outcome}{asker}; {verdict.reason}; {request.summary}"
        try:
            await self.oplog.add(
                "ai",
                "tool_approval",
                actor=verdict.approver,
                session=request.session,
                detail=detail,
            )
        except Exception:  # the audit must not turn a verdict into a failure
            log.exception("could not audit the approval of %s", request.tool)

    def cancel(self, session: str, reason: str = STOPPED) -> int:
        """Deny every pending request of a session (used by stop); returns how many."""
        count = 0
        for request, future in list(self._pending.values()):
            if request.session == session and not future.done():
                future.set_result(Verdict(False, reason))
                count += 1
        return count

    def _find(
        self, request_id: str | None, session: str | None
    ) -> tuple[ApprovalRequest, asyncio.Future[Verdict]]:
        if request_id is not None:
            found = self._pending.get(request_id)
            if found is None:
                ended = self._ended.get(request_id)
                if ended is not None:
                    raise UsageError(_already(request_id, ended))
                raise UsageError(f"no pending approval request with id {request_id!r}")
            return found
        matches = [e for e in self._pending.values() if session is None or e[0].session == session]
        if not matches:
            where = f" in session {session!r}" if session else ""
            raise UsageError(f"no approval request is pending{where}")
        if len(matches) > 1:
            raise UsageError("several approval requests are pending; answer one by its id")
        return matches[0]


def _already(request_id: str, verdict: Verdict) -> str:
    """Why a second answer to request ``request_id`` changes nothing."""
    how = "allowed" if verdict.allowed else "denied"
    return (
        f"approval request {request_id} was already {how} ({verdict.reason}); "
        "this answer was ignored"
    )


async def _resolved(
    callbacks: Callbacks, request: ApprovalRequest, verdict: Verdict, outcome: str
) -> None:
    """Tell the front end that a request ended (a failing display never fails the call)."""
    data = {
        "id": request.id,
        "tool": request.tool,
        "allowed": verdict.allowed,
        "reason": verdict.reason,
        "outcome": outcome,
    }
    await callbacks.emit(RunEvent("approval_resolved", request.session, data))
