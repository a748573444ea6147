"""The running subagents of one Agent, by session; background ones report through the store.

Every ``subagent_run`` registers its child here while it runs, so ``subagent_list`` and
``subagent_cancel`` see synchronous and background children alike, and every child is a row of
the store's ``children`` table from launch to end (`ania_nb.store.children`): the row's id is
the id users see, unique across restarts. A synchronous child ends with its parent's tool call
(stopping the parent's run cancels it with the call). A background child outlives the call
that started it: when it finishes, its row becomes ``finished`` and, for a session a durable
front end serves (the chat runner), its result is an inbox row (source ``agent``, key
``bg:<id>``) in the same transaction, answered by the session like any message (a full queue
never drops it; a result that ends during a shutdown is answered after the restart). Elsewhere
(a notebook) the result is queued in memory as before (`AgentHost.inject`). Its tokens are
counted for the session (`AgentHost.add_derived_usage`); ``agent.stop(session)`` and
``subagent_cancel`` cancel it (row ``stopped``, nothing reported). A shutdown
(`SubagentRegistry.stop_background`) stops the ones still running with one notice to their chat
("background task N was stopped by a restart") in the transaction that ends the row; after a
kill -9 `Agent.recover` ends the rows left ``running`` ``interrupted`` with the same notice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..catalogue import CATALOGUE, Language, language_for, say
from ..engine.callbacks import NO_CALLBACKS, Callbacks, RunEvent
from ..orchestration.inbox import AGENT_SOURCE, Inbound
from ..orchestration.outbox import Delivery, delivery_payload
from ..store import OutboxRow
from ..text import flatten
from .subagent import SubagentOutcome, child_event, failure_text, format_result, run_subagent

if TYPE_CHECKING:  # pragma: no cover
    from ..orchestration.host import AgentHost
    from ..store import Store
    from ..store.children import ChildState
    from ..tools import Role

__all__ = [
    "PREVIEW_CHARS",
    "STOPPED_BY_RESTART",
    "Child",
    "SubagentRegistry",
    "cancel_text",
    "completion_text",
    "result_inbound",
    "running_text",
    "stopped_notice",
]

log = logging.getLogger(__name__)

PREVIEW_CHARS = 60  # characters of a task shown by subagent_list
INJECTED_TASK_CHARS = 1000  # characters of the task repeated in a completion message
STOPPED_BY_RESTART = CATALOGUE["notice.background_stopped"]["zh"]  # the chat's default text


@dataclass
class Child:
    """One running subagent."""

    id: str
    session: str
    task: str
    timeout: float
    background: bool
    call_id: str = ""  # the parent's tool call that started it
    callbacks: Callbacks = NO_CALLBACKS  # the launching run's (child events go there)
    role: Role = "member"  # the launching run's: the child and the reply to its result get it
    started: float = field(default_factory=time.monotonic)
    outcome: SubagentOutcome = field(init=False)
    handle: asyncio.Task[Any] | None = None
    # "cancel" (subagent_cancel), "stop" (the session stopped) or "restart" (a shutdown)
    cancel_reason: str = ""
    ended: bool = False  # its run is over (its row may still be being written)
    stored: bool = False  # it has a ``children`` row (made by `SubagentRegistry.create`)

    def __post_init__(self) -> None:
        self.outcome = SubagentOutcome(self.task)

    @property
    def elapsed(self) -> float:
        """Seconds since the child started."""
        return time.monotonic() - self.started

    @property
    def active(self) -> bool:
        """Whether the child runs and nobody cancelled it (a cancelled run may take a moment)."""
        return (
            self.handle is not None
            and not self.handle.done()
            and not self.cancel_reason
            and not self.ended
        )

    def cancel(self, reason: str) -> bool:
        """Cancel the child's run; False if it already ended or is being cancelled."""
        if not self.active or self.handle is None:
            return False
        self.cancel_reason = reason
        # On the loop's next turn: a task cancelled before its first step never runs its body,
        # so the child would end with no outcome, no child_end event and no clean-up. Threadsafe,
        # because a sync tool calls this from a worker thread.
        self.handle.get_loop().call_soon_threadsafe(self.handle.cancel)
        return True

    async def emit(self, kind: str, data: dict[str, Any]) -> None:
        """Send one ``child`` event on the callbacks of the run that started the child."""
        event = child_event(
            self.session, self.call_id, self.id, "subagent", kind, data, background=self.background
        )
        await self.callbacks.emit(event)

    async def forward(self, event: RunEvent) -> None:
        """Pass one of the child run's live events on as a ``child`` event."""
        await self.emit(event.kind, event.data)


def running_text(children: list[Child], *, modes: bool = False) -> str:
    """subagent_list's answer: one line per running child (``modes``: background or waited)."""
    if not children:
        return "no running subagents"
    lines = [f"running subagents ({len(children)}):"]
    for i, child in enumerate(children, 1):
        mode = f" ({'background' if child.background else 'waited for'})" if modes else ""
        lines.append(
            f"{i}. ID: {child.id}{mode} / task: {flatten(child.task, PREVIEW_CHARS)} / "
            f"running for {child.elapsed:.0f}s"
        )
    return "\n".join(lines)


def cancel_text(child_id: str, cancelled: bool) -> str:
    """subagent_cancel's answer."""
    if cancelled:
        return f"cancelled subagent {child_id}"
    return f"no subagent with ID {child_id} (finished or wrong ID)"


def completion_text(child: Child, max_len: int) -> str:
    """The message injected when a background child ended (None-worthy if it was cancelled)."""
    outcome = child.outcome
    task = (
        flatten(child.task, INJECTED_TASK_CHARS)
        if len(child.task) > INJECTED_TASK_CHARS
        else child.task
    )
    if outcome.ok:
        head, body = "[Subagent finished]", format_result(outcome, max_len, header="")
    elif outcome.status == "timeout":
        head, body = "[Subagent timed out]", f"Error: {failure_text(outcome, child.timeout)}"
    else:
        head, body = "[Subagent failed]", f"Error: {failure_text(outcome, child.timeout)}"
    return f"{head}\nID: {child.id}\nTask: {task}\n\n{body}"


def result_inbound(child: Child, text: str, language: Language = "zh") -> Inbound:
    """A background child's result as the message its session answers (``bg:<id>``).

    ``meta`` keeps the launching run's role (the reply's run gets it, after a restart too) and
    a label a restart notice can quote.
    """
    return Inbound(
        AGENT_SOURCE,
        "",
        f"bg:{child.id}",
        child.session,
        "subagent",
        text,
        meta={
            "role": child.role,
            "child_id": child.id,
            # how a restart notice quotes a result whose reply it cut
            "text": say("notice.background_result", language, id=child.id),
        },
    )


def stopped_notice(
    session: str, child_id: int | str, state: str, language: Language = "zh"
) -> OutboxRow:
    """The chat's one notice that a restart stopped (or a kill -9 cut off) a background task."""
    delivery = Delivery(
        session,
        say("notice.background_stopped", language, id=child_id),
        "restart",
        title=f"background task {child_id} {state}",
        status=state,
        meta={"notice": "background", "child_id": str(child_id)},
    )
    return OutboxRow(session, "notice", delivery_payload(delivery))


class SubagentRegistry:
    """Running subagents of one Agent: ids, listing, cancelling, background completion."""

    def __init__(self, host: AgentHost) -> None:
        """Track the children of ``host``'s sessions; a stop of a session cancels its children."""
        self.host = host
        self._children: dict[str, Child] = {}
        self._store: Store | None = None  # kept: a closing Agent opens no store any more
        self._closed = False
        # A truthy return tells Agent.stop that something was stopped.
        host.on_stop(self.stop_session)

    async def create(
        self,
        session: str,
        task: str,
        budget: float,
        *,
        background: bool,
        call_id: str = "",
        callbacks: Callbacks = NO_CALLBACKS,
        role: Role = "member",
    ) -> Child:
        """A new child with ``budget`` seconds, stored ``running`` (its id is the row's).

        Not started yet: `launch` or `run_sync` it.
        """
        if self._closed:
            raise RuntimeError("the agent is closed: no subagent can start")
        store = await self._open_store()
        child_id = await store.children.start(session, task, role, background=background)
        return Child(
            str(child_id),
            session,
            task,
            budget,
            background,
            call_id=call_id,
            callbacks=callbacks,
            role=role,
            stored=True,
        )

    def running(self, session: str) -> list[Child]:
        """The session's running children, oldest first."""
        return [c for c in self._children.values() if c.session == session and c.active]

    @property
    def background_running(self) -> int:
        """How many background children have not ended yet (their rows included), all sessions."""
        return sum(
            1
            for c in self._children.values()
            if c.background and c.handle is not None and not c.handle.done()
        )

    def get(self, session: str, child_id: str) -> Child | None:
        """The session's running child with this id, if any."""
        child = self._children.get(child_id.strip())
        return child if child is not None and child.session == session and child.active else None

    def cancel(self, session: str, child_id: str) -> bool:
        """Cancel a running child of ``session``; False if there is none with that id."""
        child = self.get(session, child_id)
        return child is not None and child.cancel("cancel")

    def stop_session(self, session: str) -> bool:
        """Cancel the session's background children (its synchronous ones end with its run)."""
        stopped = False
        for child in self.running(session):
            if child.background:
                stopped = child.cancel("stop") or stopped
        return stopped

    async def stop_background(self) -> int:
        """A shutdown: stop every background child still running, each with its chat's notice.

        Returns how many were stopped, once their rows are ``stopped`` (the notice is an
        outbox row of the same transaction: sent now if the front end is connected, else after
        the restart).
        """
        children = [c for c in self._children.values() if c.background and c.active]
        for child in children:
            child.cancel("restart")
        await self._wait(children)
        return len(children)

    async def run_sync(self, child: Child, max_iterations: int | None = None) -> SubagentOutcome:
        """Run a synchronous child to its end (cancelled by subagent_cancel or with its caller)."""
        self._children[child.id] = child
        child.handle = asyncio.create_task(self._run(child, max_iterations))
        try:
            await child.handle
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if not child.cancel_reason or (caller is not None and caller.cancelling()):
                child.handle.cancel()  # the caller itself was cancelled: pass it on
                raise
        finally:
            self._children.pop(child.id, None)
            child.ended = True
            outcome = child.cancel_reason or child.outcome.status
            await asyncio.shield(self._end_row(child, outcome))
        return child.outcome

    def launch(self, child: Child, max_iterations: int | None = None) -> None:
        """Start a background child; it reports through the store when it ends."""
        if self._closed:
            raise RuntimeError("the agent is closed: no subagent can start")
        self._children[child.id] = child
        child.handle = asyncio.create_task(self._background(child, max_iterations))

    async def abandon(self, child: Child) -> None:
        """A created child that never started (launch refused): its row ends ``stopped``."""
        await self._end_row(child, "closed")

    async def _run(self, child: Child, max_iterations: int | None) -> None:
        await run_subagent(
            self.host,
            child.session,
            child.task,
            child.timeout,
            callbacks=child.callbacks,
            on_event=None if child.background else child.forward,
            max_iterations=max_iterations,
            outcome=child.outcome,
            role=child.role,
        )

    async def _background(self, child: Child, max_iterations: int | None) -> None:
        try:
            try:
                await self._run(child, max_iterations)
            except asyncio.CancelledError:
                pass  # cancelled children report nothing but their tokens (and a restart's notice)
            finally:
                child.ended = True
                self.host.add_derived_usage(child.session, child.outcome.usage)
                await child.emit("child_end", child.outcome.end_data())
            await self._report(child)
        except Exception:  # the task's end is nobody's to retrieve: say it here
            log.exception("background subagent %s of %s did not report", child.id, child.session)
        finally:
            self._children.pop(child.id, None)

    async def _report(self, child: Child) -> None:
        """Store how a background child ended; queue its result (see the module docstring)."""
        session, outcome = child.session, child.outcome
        durable = self.host.outbox.durable(session)
        if outcome.cancelled:
            reason = child.cancel_reason or "stop"
            restart = reason == "restart" and durable
            language = language_for(self.host.config.ui.language, session)
            notice = [stopped_notice(session, child.id, "stopped", language)] if restart else []
            if await self._end_row(child, reason, notice) and notice:
                self.host.outbox.woken(session)
            return
        text = completion_text(child, self.host.config.subagent.max_result_chars)
        if durable and child.stored:
            inbound = result_inbound(
                child, text, language_for(self.host.config.ui.language, session)
            )
            try:
                store = await self._open_store()
                inbox_id = await store.children.finish(int(child.id), outcome.status, inbound.row())
            except Exception:  # the store failed: the result still reaches the session now
                log.exception("could not store subagent %s's result; queued in memory", child.id)
            else:
                if inbox_id is None:
                    log.warning("subagent %s had ended already: its result is not queued", child.id)
                elif not await self.host.queue_stored(inbox_id, inbound):
                    log.info(
                        "%s: subagent %s's result is stored, answered after the restart",
                        session,
                        child.id,
                    )
                return
        await self._end_row(child, outcome.status)
        if self._closed:
            return
        callbacks = self.host.outbox.callbacks_for(session)
        injected = self.host.inject(
            session, text, sender="subagent", callbacks=callbacks, role=child.role
        )
        if not injected:
            # The session's queue is full: the model never sees the result, the front end does.
            log.warning("queue of %s is full: subagent %s's result not injected", session, child.id)
            await self.host.outbox.publish(
                Delivery(
                    session,
                    text,
                    "subagent",
                    title=f"subagent {child.id} (not answered: the queue was full)",
                    status=outcome.status,
                    meta={"child_id": child.id},
                )
            )

    async def _end_row(
        self, child: Child, outcome: str, notice: list[OutboxRow] | None = None
    ) -> bool:
        """End the child's row (``stopped`` if it was cancelled, else ``finished``); never raises.

        False when nothing was written (no such running row, or the store failed: then the
        next start finds the row ``running`` with its owner gone, and ends it ``interrupted``).
        """
        if not child.stored:
            return False  # a child made without `create` has no row
        stopped = child.outcome.cancelled or outcome == "closed"
        state: ChildState = "stopped" if stopped else "finished"
        try:
            store = await self._open_store()
            return await store.children.end(int(child.id), state, outcome, notice or ())
        except Exception:
            log.exception("could not store how subagent %s of %s ended", child.id, child.session)
            return False

    async def _open_store(self) -> Store:
        if self._store is None:
            self._store = await self.host.open_store()
        return self._store

    async def _wait(self, children: list[Child]) -> None:
        handles = [c.handle for c in children if c.handle is not None]
        if handles:
            await asyncio.gather(*handles, return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel every child and wait until they ended (background ones as by a restart)."""
        self._closed = True
        children = list(self._children.values())
        for child in children:
            child.cancel("restart" if child.background else "stop")
        await self._wait(children)
