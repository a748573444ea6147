"""Human approval of tool calls: one pending request per session, answered through the Agent.

The front end is told of a request through the ``request_approval`` callback (a notebook shows
Allow/Deny buttons, a chat bot posts a message) and answers with `Agent.answer_approval`, so a
button click and a chat reply take the same path. No answer within the timeout, or a stop,
denies.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import defaultdict

from ..engine.callbacks import ApprovalRequest, Callbacks, Verdict
from ..errors import UsageError

log = logging.getLogger(__name__)

ALLOW_WORDS = frozenset({"允许", "同意", "批准", "allow", "approve", "yes", "y"})
DENY_WORDS = frozenset({"拒绝", "deny", "reject", "no", "n"})


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

    def __init__(self, *, timeout: float = 120.0) -> None:
        self.timeout = timeout
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._pending: dict[str, tuple[ApprovalRequest, asyncio.Future[Verdict]]] = {}

    async def request(
        self,
        *,
        session: str,
        tool: str,
        summary: str,
        callbacks: Callbacks,
        requester: str | None = None,
        admin_only: bool = False,
    ) -> Verdict:
        """Ask a human and wait for the verdict (denied on timeout, stop or no front end)."""
        if not callbacks.has("request_approval"):
            return Verdict(False, "nobody can approve tool calls in this conversation")
        async with self._locks[session]:  # one question at a time per conversation
            request = ApprovalRequest(
                id=secrets.token_hex(4),
                session=session,
                tool=tool,
                summary=summary,
                requester=requester,
                admin_only=admin_only,
            )
            future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
            self._pending[request.id] = (request, future)
            try:
                await callbacks.call("request_approval", request)
                return await asyncio.wait_for(asyncio.shield(future), self.timeout)
            except TimeoutError:
                return Verdict(False, f"no answer within {self.timeout:g} s, denied automatically")
            finally:
                self._pending.pop(request.id, None)

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
        who = f" by {approver}" if approver else ""
        text = reason or (f"approved{who}" if allow else f"denied{who}")
        if not future.done():
            future.set_result(Verdict(allow, text, approver))
        return request

    def cancel(self, session: str, reason: str = "stopped by the user") -> int:
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
                raise UsageError(f"no pending approval request with id {request_id!r}")
            return found
        matches = [e for e in self._pending.values() if session is None or e[0].session == session]
        if not matches:
            where = f" in session {session!r}" if session else ""
            raise UsageError(f"no approval request is pending{where}")
        if len(matches) > 1:
            raise UsageError("several approval requests are pending; answer one by its id")
        return matches[0]
