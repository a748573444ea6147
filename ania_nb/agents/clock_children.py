"""Subagents inside a clock run [orig §4.4]: started in the background, gathered at the end.

A clock run has nobody to inject a late result into, so its subagents report back to the run
itself. The clock runner builds one `ClockChildren` per task run and gives the run its
`tools()` (``subagent_run`` / ``subagent_list`` / ``subagent_cancel``, replacing the main
variant) through ``OneShotJob.extra_tools``; after the run's first reply it calls `drain`::

    children = ClockChildren(host, session=target, deadline=deadline, usage=usage)
    result = await host.run_one_shot(job(trigger, extra_tools=children.tools()))
    if result.ok:
        result = await children.drain(result, continue_with)  # continue_with(text) -> RunResult
    await children.cancel_all()  # always, also when the run failed or was cancelled

- ``subagent_run`` starts a child at once and returns its id (``1``, ``2``, … per task run); it
  refuses when the task has 30 s or less left. A child's timeout is the requested one (or
  ``subagent.timeout``) clamped to 1800 s, then shrunk to end 30 s before the task's deadline.
- `drain`: while children are unreported, up to 5 rounds: wait for every running child but
  no later than 30 s before the deadline; if none finished, cancel the rest and keep the last
  reply; else feed a report of the finished ones (and how many still run) into the same chat
  with ``continue_with`` — its reply replaces the previous one. After the last round the
  children still running are cancelled.
- Every child's tokens are added to ``usage`` (the clock run's tally) when it ends, cancelled
  or not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, Field

from ..engine.callbacks import Callbacks
from ..engine.usage import Usage
from ..errors import ToolError
from ..tools import BaseTool, Role, Tool, ToolContext
from .background import Child, cancel_text, running_text
from .subagent import (
    MAX_TIMEOUT,
    PARENT_RESERVE,
    check_quota,
    child_budget,
    failure_text,
    format_result,
    run_subagent,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..orchestration.host import AgentHost
    from ..result import RunResult

__all__ = ["MAX_DRAIN_ROUNDS", "REPORT_HEADER", "ClockChildren"]

MAX_DRAIN_ROUNDS = 5
REPORT_HEADER = (
    "【子代理执行结果汇总】 The subagents you started have reported (below). Use their results "
    "to write your final reply; only your final reply is pushed to the chat."
)


class ClockChildren:
    """The subagents of one clock task run: their tools, the drain, and cancelling them."""

    def __init__(
        self,
        host: AgentHost,
        session: str,
        deadline: float,
        usage: Usage,
        callbacks: Callbacks | None = None,
        hidden: frozenset[str] = frozenset(),
    ) -> None:
        """Children of a run for ``session`` ending by ``deadline`` (``time.monotonic()``).

        ``usage`` is the run's tally (children's tokens join it); ``callbacks`` reach the front
        end for images, files and approvals (default: the outbox's for the session);
        ``hidden`` are tools the children may not see (the clock's ``clock_create``).
        """
        self.host = host
        self.session = session
        self.deadline = deadline
        self.usage = usage
        self.callbacks = callbacks if callbacks is not None else host.outbox.callbacks_for(session)
        self.hidden = hidden
        self._children: list[Child] = []
        self._unreported: list[Child] = []

    def tools(self) -> list[Tool]:
        """``subagent_run``, ``subagent_list`` and ``subagent_cancel`` of this run."""
        return [_RunTool(self), _ListTool(self), _CancelTool(self)]

    @property
    def running(self) -> list[Child]:
        """The children still running, oldest first."""
        return [c for c in self._children if c.active]

    def launch(self, task: str, timeout_sec: float | None, role: Role = "member") -> Child:
        """Start a child on ``task`` with the clock run's ``role``.

        `ToolError` when the run has too little time left.
        """
        task = task.strip()
        if not task:
            raise ToolError("task is empty; describe the complete task for the subagent")
        timeout = child_budget(
            timeout_sec, self.host.config.subagent.timeout, self.deadline, what="subagent"
        )
        child = Child(
            str(len(self._children) + 1), self.session, task, timeout, background=True, role=role
        )
        child.handle = asyncio.create_task(self._run(child))
        self._children.append(child)
        self._unreported.append(child)
        return child

    async def _run(self, child: Child) -> None:
        try:
            await run_subagent(
                self.host,
                self.session,
                child.task,
                child.timeout,
                callbacks=self.callbacks,
                outcome=child.outcome,
                role=child.role,
                hidden=self.hidden,
            )
        finally:
            self.usage.include(child.outcome.usage)

    def cancel(self, child_id: str) -> bool:
        """Cancel a running child; False if there is none with that id."""
        for child in self._children:
            if child.id == child_id.strip() and child.cancel("cancel"):
                self._unreported.remove(child)  # cancelled on purpose: nothing to report
                return True
        return False

    async def drain(
        self, result: RunResult, continue_with: Callable[[str], Awaitable[RunResult]]
    ) -> RunResult:
        """Feed the children's results into the run until none is left (see the module doc)."""
        try:
            for _ in range(MAX_DRAIN_ROUNDS):
                if not self._unreported:
                    break
                running = [c.handle for c in self.running if c.handle is not None]
                wait = self.deadline - time.monotonic() - PARENT_RESERVE
                if running and wait > 0:
                    await asyncio.wait(running, timeout=wait)
                finished = [c for c in self._unreported if c.handle is None or c.handle.done()]
                if not finished:
                    break  # nothing came back in time: keep the last reply
                self._unreported = [c for c in self._unreported if c not in finished]
                result = await continue_with(self.report(finished))
                if not result.ok:
                    break
        finally:
            await self.cancel_all()
        return result

    def report(self, finished: list[Child]) -> str:
        """The summary fed back to the run: each finished child, and how many still run."""
        limit = self.host.config.subagent.max_result_chars
        parts = [REPORT_HEADER]
        for child in finished:
            outcome = child.outcome
            body = (
                format_result(outcome, limit)
                if outcome.ok
                else f"Failed: {failure_text(outcome, child.timeout)}"
            )
            parts.append(f"--- subagent (ID: {child.id}) ---\nTask: {child.task}\n{body}")
        still = len(self.running)
        if still:
            parts.append(f"{still} more still running…")
        return "\n\n".join(parts)

    async def cancel_all(self) -> None:
        """Cancel every running child and wait until they ended (their tokens are counted)."""
        for child in self.running:
            child.cancel("stop")
        handles = [c.handle for c in self._children if c.handle is not None and not c.handle.done()]
        if handles:
            await asyncio.gather(*handles, return_exceptions=True)


class _RunParams(BaseModel):
    """subagent_run parameters (clock runs)."""

    task: Annotated[
        str,
        Field(
            description="The complete, self-contained task: the subagent has no history and "
            "cannot ask back."
        ),
    ]
    timeout_sec: Annotated[
        float | None,
        Field(description=f"Seconds it may take (default from config, ≤{MAX_TIMEOUT:.0f})."),
    ] = None


class _RunTool(BaseTool[_RunParams]):
    """Start a subagent in the background; its result is gathered when you finish."""

    name = "subagent_run"
    description = (
        "Start a subagent: an independent worker that does one self-contained task with your "
        "tools and reports back. It runs in the background; start several to work in parallel. "
        "When you give your reply, the results of your subagents are handed to you so you can "
        "write the final reply with them."
    )

    def __init__(self, children: ClockChildren) -> None:
        self.children = children

    async def execute(self, params: _RunParams, ctx: ToolContext) -> str:
        """Launch the child (unless a daily token quota is used up)."""
        await check_quota(self.children.host, self.children.session)
        child = self.children.launch(params.task, params.timeout_sec, ctx.role)
        return (
            f"✅ subagent started (ID: {child.id}), up to {child.timeout:.0f} s; results will be "
            "gathered when you finish"
        )


class _NoParams(BaseModel):
    """No parameters."""


class _ListTool(BaseTool[_NoParams]):
    """List the subagents of this task run that are still running."""

    name = "subagent_list"

    def __init__(self, children: ClockChildren) -> None:
        self.children = children

    async def execute(self, params: _NoParams, ctx: ToolContext) -> str:
        """List them."""
        return running_text(self.children.running)


class _CancelParams(BaseModel):
    """subagent_cancel parameters."""

    id: Annotated[str, Field(description="The subagent's ID (from subagent_run).")]


class _CancelTool(BaseTool[_CancelParams]):
    """Cancel a running subagent of this task run."""

    name = "subagent_cancel"

    def __init__(self, children: ClockChildren) -> None:
        self.children = children

    async def execute(self, params: _CancelParams, ctx: ToolContext) -> str:
        """Cancel it."""
        child_id = params.id.strip()
        return cancel_text(child_id, self.children.cancel(child_id))
