"""Human approval of tool calls: one pending request per session, answered through the Agent.

The front end is told of a request through the ``request_approval`` callback (a notebook shows
Allow/Deny buttons, a chat bot posts a message) and answers with `Agent.answer_approval`, so a
button click and a chat reply take the same path. No answer within the timeout, or a stop,
denies. However a request ends, ``RunEvent("approval_resolved", session, {id, tool, allowed,
reason, outcome})`` is emitted through its callbacks so the front end can close its card
(outcome: allowed, denied, timeout, stopped, error or suspended).
`ApprovalManager.allow_for_session` lets a tool through for the rest of a session without
asking (the "always allow" button).

**Surviving a restart.** With the store attached (``store``) and a `Checkpoint` from the run
(main runs give one), the request and the run's state are written to the ``approvals`` table
before the front end is told, and the row follows the verdict. When the run is being suspended
(shutdown: the run is blocked only on approvals), the question ends at once as ``suspended``,
its row too, and the run ends without a tool result. After a restart `resume` asks the stored
request again under the same id, until its original wall-clock deadline, with the same rules.
A request suspended in this process can still be answered while it shuts down
(`ApprovalManager.answer_suspended`, same rules): the verdict is kept on its row and the next
start continues the run with it instead of asking again.

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
import time
from collections import OrderedDict, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from ..catalogue import Language, say
from ..engine.callbacks import ApprovalRequest, Callbacks, RunEvent, Verdict
from ..errors import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from ..store import ApprovalLog, ApprovalRow, OpLog

log = logging.getLogger(__name__)

ALLOW_WORDS = frozenset({"允许", "同意", "批准", "allow", "approve", "yes", "y"})
DENY_WORDS = frozenset({"拒绝", "deny", "reject", "no", "n"})
SESSION_ALLOWED = "allowed for the rest of this session"
STOPPED = "stopped by the user"
ENDED_KEPT = 256  # ended requests remembered to answer late replies precisely
SUSPENDED = "suspended waiting for an approval"
VERDICT_OUTCOMES = frozenset({"allowed", "denied", "timeout"})  # a resumed run goes on with these


class ApprovalRefused(UsageError):
    """An answer to a request was refused (not allowed to answer, none pending, already ended).

    ``key`` and ``params`` name the reason in the message catalogue (`ania_nb.catalogue`), so a
    chat front end tells its users why in their language; the message is the English text.
    """

    def __init__(self, key: str, **params: object) -> None:
        super().__init__(say(key, "en", **params))
        self.key = key
        self.params = params

    def said(self, language: Language) -> str:
        """The reason in ``language``."""
        return say(self.key, language, **self.params)


class Checkpoint(Protocol):
    """The run behind a request, as far as it can be stored and resumed after a restart."""

    @property
    def suspended(self) -> bool:
        """Whether the run is being suspended (its questions end as ``suspended``)."""
        ...

    def snapshot(self, call_id: str) -> dict[str, Any] | None:
        """The run's state with ``call_id`` pending, as JSON data; None: it cannot be resumed."""
        ...

    def stored(self, call_id: str, save: Callable[[dict[str, Any]], Awaitable[object]]) -> None:
        """``call_id``'s request is written; ``save(snapshot)`` rewrites its stored state.

        The run may be suspended from now; it saves again when another call of the round ends.
        """
        ...

    def asking(self, call_id: str, on: bool) -> None:
        """``call_id`` starts (``on``) or stops waiting for a person's verdict."""
        ...


def request_record(request: ApprovalRequest) -> dict[str, Any]:
    """What the ``approvals`` row keeps of a request (its id and session have columns)."""
    return {
        "tool": request.tool,
        "summary": request.summary,
        "details": request.details,
        "requester": request.requester,
        "requesters": list(request.requesters),
        "admin_only": request.admin_only,
    }


def request_from_record(request_id: str, session: str, data: dict[str, Any]) -> ApprovalRequest:
    """The request a stored row describes, marked re-sent; `UsageError` names a broken field."""
    tool, summary = data.get("tool"), data.get("summary")
    if not isinstance(tool, str) or not tool or not isinstance(summary, str):
        raise UsageError(f"approval row {request_id}: the request has no tool name or summary")
    requester = data.get("requester")
    requesters = data.get("requesters") or []
    if requester is not None and not isinstance(requester, str):
        raise UsageError(f"approval row {request_id}: requester is not a string")
    if not isinstance(requesters, list) or not all(isinstance(r, str) for r in requesters):
        raise UsageError(f"approval row {request_id}: requesters is not a list of strings")
    return ApprovalRequest(
        id=request_id,
        session=session,
        tool=tool,
        summary=summary,
        requester=requester,
        admin_only=bool(data.get("admin_only", True)),  # a lost flag asks an admin: the safe side
        details=str(data.get("details") or ""),
        requesters=tuple(requesters),
        resent=True,
    )


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
        self.store: ApprovalLog | None = None  # ditto: requests with a checkpoint are stored
        self._answered: set[str] = set()  # ids answered by a human (audited; stops are not)
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._pending: dict[str, tuple[ApprovalRequest, asyncio.Future[Verdict]]] = {}
        self._session_allowed: dict[str, set[str]] = {}
        self._ended: OrderedDict[str, Verdict] = OrderedDict()  # recently ended requests
        self._suspended: dict[str, ApprovalRequest] = {}  # suspended here, no verdict yet

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
        call_id: str = "",
        checkpoint: Checkpoint | None = None,
    ) -> Verdict:
        """Ask a human and wait for the verdict (denied on timeout, stop or no front end).

        With a ``checkpoint`` (and the store attached) the request is stored with the run's
        state before the front end is told (see the module docstring).
        """
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
            stored = await self._store(request, call_id, checkpoint)
            suspended = (lambda: checkpoint.suspended) if stored and checkpoint else _never
            return await self._ask(request, callbacks, self.timeout, stored, suspended)

    async def resume(
        self, request: ApprovalRequest, callbacks: Callbacks, *, deadline: float
    ) -> Verdict:
        """Ask a stored request again after a restart: same id and rules, the original deadline.

        A deadline already past ends it as ``timeout`` without showing it again. A verdict
        (allowed, denied, timeout) leaves the row open: the caller settles it with `settle`
        once the run goes on, so a verdict whose run never started is asked again after the
        next restart. Cancelled (the Agent closes), it ends ``suspended``.
        """
        async with self._locks[request.session]:
            left = deadline - time.time()
            if left <= 0:
                verdict = Verdict(False, _timed_out(self.timeout), None, "timeout")
                await self._audit(request, verdict, "超时自动拒绝 (timed out)")
                await _resolved(callbacks, request, verdict, "timeout")
                return verdict
            return await self._ask(request, callbacks, left, True, _never, resumed=True)

    async def settle(self, request_id: str, verdict: Verdict) -> None:
        """Record how a stored request ended (its ``outcome``), e.g. once its run goes on."""
        await self._settle(request_id, verdict, verdict.outcome or "error")

    async def _ask(
        self,
        request: ApprovalRequest,
        callbacks: Callbacks,
        seconds: float,
        stored: bool,
        suspended: Callable[[], bool],
        *,
        resumed: bool = False,
    ) -> Verdict:
        """Register ``request``, show it and wait; audit, settle its row and tell the front end.

        ``suspended()`` says the run is being suspended; a ``resumed`` request has no run yet,
        so only closing the Agent cancels it, which suspends it too.
        """
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = (request, future)
        try:
            verdict, outcome = await self._wait(request, future, callbacks, seconds, suspended)
        except asyncio.CancelledError:  # the run was cancelled while the question was open
            outcome = "suspended" if stored and (resumed or suspended()) else "stopped"
            ended = Verdict(False, SUSPENDED if outcome == "suspended" else STOPPED)
            if stored:
                await _shielded(self._settle(request.id, ended, outcome))
                if outcome == "suspended":  # may still be answered while shutting down
                    self._suspended[request.id] = request
            await _resolved(callbacks, request, ended, outcome)
            raise
        finally:
            self._pending.pop(request.id, None)
            self._answered.discard(request.id)
            self._remember(request.id, future)
        if outcome == "timeout":
            await self._audit(request, verdict, "超时自动拒绝 (timed out)")
        elif outcome in ("allowed", "denied"):
            await self._audit(request, verdict, "允许" if verdict.allowed else "拒绝")
        if stored and not (resumed and outcome in VERDICT_OUTCOMES):
            await self._settle(request.id, verdict, outcome)
        await _resolved(callbacks, request, verdict, outcome)
        return replace(verdict, outcome=outcome)

    async def _store(
        self, request: ApprovalRequest, call_id: str, checkpoint: Checkpoint | None
    ) -> bool:
        """Write the request with the run's checkpoint; False when it is not stored."""
        if self.store is None or checkpoint is None:
            return False
        snapshot = checkpoint.snapshot(call_id)
        if snapshot is None:
            return False
        run_id = snapshot.get("run_id")
        try:
            await self.store.add(
                request_id=request.id,
                session=request.session,
                run_id=run_id if isinstance(run_id, int) else None,
                deadline=time.time() + self.timeout,
                request=request_record(request),
                checkpoint=snapshot,
            )
        except Exception:  # the question is still asked; it just will not survive a restart
            log.exception("could not store approval request %s of %s", request.id, request.tool)
            return False
        store = self.store

        async def save(snapshot: dict[str, Any]) -> None:
            try:
                await store.update_checkpoint(request.id, snapshot)
            except Exception:
                log.exception("could not update the stored state of approval %s", request.id)

        checkpoint.stored(call_id, save)
        return True

    async def _settle(self, request_id: str, verdict: Verdict, outcome: str) -> None:
        """Move the request's row to how it ended (best effort: the verdict stands anyway)."""
        if self.store is None:
            return
        try:
            await self.store.settle(request_id, outcome, verdict.reason, verdict.approver)  # type: ignore[arg-type]
        except Exception:
            log.exception("could not record how approval request %s ended", request_id)

    async def _wait(
        self,
        request: ApprovalRequest,
        future: asyncio.Future[Verdict],
        callbacks: Callbacks,
        seconds: float,
        suspended: Callable[[], bool],
    ) -> tuple[Verdict, str]:
        """Show the request and wait; returns the verdict and how the request ended."""
        try:
            # The timeout also bounds a front end that is slow to show the question.
            async with asyncio.timeout(seconds):
                if not suspended():  # a run being suspended ends before anyone is asked
                    try:
                        await callbacks.call("request_approval", request)
                    except Exception as exc:
                        log.warning("request_approval callback failed", exc_info=True)
                        reason = f"the approval request could not be shown: {exc}"
                        return Verdict(False, reason), "error"
                verdict = await future
        except TimeoutError:
            return Verdict(False, _timed_out(self.timeout)), "timeout"
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
        allow = _allowed(allow)
        entry = self._find(request_id, session)
        request, future = entry
        self._authorise(request, approver)
        if future.done():  # answered a moment ago, or ended by a timeout or a stop
            raise _already(request.id, future.result())
        who = f" by {approver}" if approver else ""
        text = reason or (f"approved{who}" if allow else f"denied{who}")
        future.set_result(Verdict(allow, text, approver))
        self._answered.add(request.id)
        return request

    def suspended(self, session: str | None = None) -> list[ApprovalRequest]:
        """Requests suspended in this process not answered yet (of one session, or all)."""
        return [r for r in self._suspended.values() if session is None or r.session == session]

    async def answer_suspended(
        self,
        request_id: str | None = None,
        *,
        session: str | None = None,
        allow: bool | str,
        approver: str | None = None,
        reason: str = "",
    ) -> ApprovalRequest:
        """Answer a request suspended at shutdown: the verdict is kept for the next start.

        Same rules and errors as `answer`; the stored row stays ``suspended`` with the verdict,
        and `resume` is not needed for it: the resumed run goes on with `stored_verdict`.
        """
        allow = _allowed(allow)
        request = self._find_suspended(request_id, session)
        self._authorise(request, approver)
        who = f" by {approver}" if approver else ""
        text = reason or (f"approved{who}" if allow else f"denied{who}")
        outcome = "allowed" if allow else "denied"
        decided = self.store is not None and await self.store.decide(
            request.id, outcome, text, approver
        )
        if not decided:
            self._suspended.pop(request.id, None)
            raise ApprovalRefused("approval.gone", id=request.id)
        self._suspended.pop(request.id, None)
        verdict = Verdict(allow, text, approver, outcome)
        self._ended[request.id] = verdict
        await self._audit(request, verdict, f"{'允许' if allow else '拒绝'} (kept for the restart)")
        return request

    def _find_suspended(self, request_id: str | None, session: str | None) -> ApprovalRequest:
        if request_id is not None:
            found = self._suspended.get(request_id)
            if found is None:
                ended = self._ended.get(request_id)
                if ended is not None:
                    raise _already(request_id, ended)
                raise ApprovalRefused("approval.no_suspended_id", id=request_id)
            return found
        matches = self.suspended(session)
        if not matches:
            where = f" in session {session!r}" if session else ""
            raise ApprovalRefused("approval.none_suspended", where=where)
        if len(matches) > 1:
            raise ApprovalRefused("approval.several_suspended")
        return matches[0]

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
            raise ApprovalRefused("approval.not_admin", tool=request.tool, approver=approver)
        askers = request.requesters or ((request.requester,) if request.requester else ())
        if askers and approver not in askers:
            raise ApprovalRefused(
                "approval.not_requester", approver=approver, askers=", ".join(askers)
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
                    raise _already(request_id, ended)
                raise ApprovalRefused("approval.no_pending_id", id=request_id)
            return found
        matches = [e for e in self._pending.values() if session is None or e[0].session == session]
        if not matches:
            where = f" in session {session!r}" if session else ""
            raise ApprovalRefused("approval.none_pending", where=where)
        if len(matches) > 1:
            raise ApprovalRefused("approval.several_pending")
        return matches[0]


def stored_verdict(row: ApprovalRow) -> Verdict | None:
    """The verdict kept on a stored row (answered while suspended), or None."""
    if row.verdict not in VERDICT_OUTCOMES - {"timeout"}:
        return None
    return Verdict(row.verdict == "allowed", row.reason or "", row.approver, row.verdict)


def _allowed(allow: bool | str) -> bool:
    """``allow`` as a bool; an answer word is parsed, anything else is a `UsageError`."""
    if not isinstance(allow, str):
        return allow
    parsed = parse_verdict_word(allow)
    if parsed is None:
        words = ", ".join(sorted(ALLOW_WORDS | DENY_WORDS))
        raise UsageError(f"{allow!r} is not an answer; use one of: {words}")
    return parsed


def _never() -> bool:
    return False


def _timed_out(timeout: float) -> str:
    return f"no answer within {timeout:g} s, denied automatically"


async def _shielded(work: Awaitable[None]) -> None:
    """Finish ``work`` although the caller is being cancelled (a row must not stay pending)."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task


def _already(request_id: str, verdict: Verdict) -> ApprovalRefused:
    """Why a second answer to request ``request_id`` changes nothing."""
    key = "approval.already_allowed" if verdict.allowed else "approval.already_denied"
    return ApprovalRefused(key, id=request_id, reason=verdict.reason)


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
