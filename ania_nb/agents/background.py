"""The running subagents of one Agent, by session; background ones report by injection.

Every ``subagent_run`` registers its child here while it runs, so ``subagent_list`` and
``subagent_cancel`` see synchronous and background children alike. A synchronous child ends
with its parent's tool call (stopping the parent's run cancels it with the call). A background
child outlives the call that started it: when it finishes, its result is queued as a message of
its session (`AgentHost.inject`, answered at once when the session is idle), its tokens are
counted for the session (`AgentHost.add_derived_usage`), and ``agent.stop(session)`` cancels it.
A cancelled child injects nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engine.callbacks import NO_CALLBACKS, Callbacks, RunEvent
from ..orchestration.outbox import Delivery
from ..text import flatten
from .subagent import SubagentOutcome, child_event, failure_text, format_result, run_subagent

if TYPE_CHECKING:  # pragma: no cover
    from ..orchestration.host import AgentHost
    from ..tools import Role

__all__ = [
    "PREVIEW_CHARS",
    "Child",
    "SubagentRegistry",
    "cancel_text",
    "completion_text",
    "running_text",
]

log = logging.getLogger(__name__)

PREVIEW_CHARS = 60  # characters of a task shown by subagent_list
INJECTED_TASK_CHARS = 1000  # characters of the task repeated in a completion message


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
    cancel_reason: str = ""  # "cancel" (subagent_cancel) or "stop" (the session stopped)

    def __post_init__(self) -> None:
        self.outcome = SubagentOutcome(self.task)

    @property
    def elapsed(self) -> float:
        """Seconds since the child started."""
        return time.monotonic() - self.started

    @property
    def active(self) -> bool:
        """Whether the child runs and nobody cancelled it (a cancelled run may take a moment)."""
        return self.handle is not None and not self.handle.done() and not self.cancel_reason

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


class SubagentRegistry:
    """Running subagents of one Agent: ids, listing, cancelling, background completion."""

    def __init__(self, host: AgentHost) -> None:
        """Track the children of ``host``'s sessions; a stop of a session cancels its children."""
        self.host = host
        self._children: dict[str, Child] = {}
        self._ids = itertools.count(1)
        self._closed = False
        # A truthy return tells Agent.stop that something was stopped.
        host.on_stop(self.stop_session)

    def new_id(self) -> str:
        """A fresh child id, unique within this Agent."""
        return str(next(self._ids))

    def running(self, session: str) -> list[Child]:
        """The session's running children, oldest first."""
        return [c for c in self._children.values() if c.session == session and c.active]

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
        return child.outcome

    def launch(self, child: Child, max_iterations: int | None = None) -> None:
        """Start a background child; it reports by injection when it ends."""
        if self._closed:
            raise RuntimeError("the agent is closed: no subagent can start")
        self._children[child.id] = child
        child.handle = asyncio.create_task(self._background(child, max_iterations))

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
            await self._run(child, max_iterations)
        except asyncio.CancelledError:
            pass  # cancelled children report nothing but their tokens
        finally:
            self._children.pop(child.id, None)
            self.host.add_derived_usage(child.session, child.outcome.usage)
            await child.emit("child_end", child.outcome.end_data())
        if child.outcome.cancelled or self._closed:
            return
        text = completion_text(child, self.host.config.subagent.max_result_chars)
        callbacks = self.host.outbox.callbacks_for(child.session)
        injected = self.host.inject(
            child.session, text, sender="subagent", callbacks=callbacks, role=child.role
        )
        if not injected:
            # The session's queue is full: the model never sees the result, the front end does.
            log.warning(
                "queue of %s is full: subagent %s's result not injected", child.session, child.id
            )
            await self.host.outbox.publish(
                Delivery(
                    child.session,
                    text,
                    "subagent",
                    title=f"subagent {child.id} (not answered: the queue was full)",
                    status=child.outcome.status,
                    meta={"child_id": child.id},
                )
            )

    async def aclose(self) -> None:
        """Cancel every child and wait until they ended."""
        self._closed = True
        handles = [c.handle for c in self._children.values() if c.handle is not None]
        for child in list(self._children.values()):
            child.cancel("stop")
        if handles:
            await asyncio.gather(*handles, return_exceptions=True)
