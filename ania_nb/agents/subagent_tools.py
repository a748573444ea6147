"""The subagent tools of a main session: ``subagent_run``, ``subagent_list``, ``subagent_cancel``.

``subagent_run`` has two modes. Synchronous (the default): the call returns the subagent's
result, and several calls in one round run in parallel (a round's tool calls always do); the
child's tokens join the calling run's usage and its live events reach the caller's front end as
``child`` events. Background (``background: true``): the call returns the child's id at once;
the result arrives later as a queued message of the session (see `background`). Children never
get these tools (`ania_nb.orchestration.oneshot.HIDDEN_BY_KIND`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, Field

from ..engine.usage import Usage
from ..errors import ToolError
from ..tools import BaseTool, Tool, ToolContext
from .background import SubagentRegistry, cancel_text, running_text
from .subagent import MAX_TIMEOUT, check_quota, child_budget, failure_text, format_result

if TYPE_CHECKING:  # pragma: no cover
    from ..orchestration.host import AgentHost

__all__ = ["subagent_tools"]


class SubagentRunParams(BaseModel):
    """subagent_run parameters."""

    task: Annotated[
        str,
        Field(
            description="The complete, self-contained task: the subagent has no chat history "
            "and cannot ask back, so include every fact, constraint and the expected output."
        ),
    ]
    timeout_sec: Annotated[
        float | None,
        Field(
            description=f"Seconds the subagent may take (default from config, ≤{MAX_TIMEOUT:.0f})."
        ),
    ] = None
    background: Annotated[
        bool,
        Field(
            description="false (default): wait and return the result. true: return an id at "
            "once; the result arrives later as a new message in this chat."
        ),
    ] = False


class SubagentRunTool(BaseTool[SubagentRunParams]):
    """Start a subagent: an independent worker with your tools (not this chat's history)."""

    name = "subagent_run"
    description = (
        "Start a subagent: an independent worker that does one self-contained task with the "
        "tools of this chat (but no chat history, no subagents) and returns its final answer. "
        "By default the call waits for the result; call subagent_run several times in the same "
        "round to run subagents in parallel. With background=true it returns an id at once and "
        "the result arrives later as a message in this chat (see subagent_list/subagent_cancel)."
    )

    def __init__(self, host: AgentHost, registry: SubagentRegistry) -> None:
        self.host = host
        self.registry = registry

    async def execute(self, params: SubagentRunParams, ctx: ToolContext) -> str:
        """Run (or launch) the subagent."""
        task = params.task.strip()
        if not task:
            raise ToolError("task is empty; describe the complete task for the subagent")
        await check_quota(self.host, ctx.session)
        settings = self.host.config.subagent
        deadline = ctx.run_state.get("deadline")
        # Clamped first, then shrunk to the parent's deadline (a background child outlives it).
        timeout = child_budget(
            params.timeout_sec, settings.timeout, deadline, shrink=not params.background
        )
        child = await self.registry.create(  # stored first: its id is unique across restarts
            ctx.session,
            task,
            timeout,
            background=params.background,
            call_id=ctx.call_id,
            callbacks=ctx.callbacks,
            role=ctx.role,  # the child acts for whoever this run acts for
        )
        await child.emit("child_start", {"task": task, "timeout": timeout})
        if params.background:
            try:
                self.registry.launch(child)
            except RuntimeError:  # the Agent closed meanwhile
                await self.registry.abandon(child)
                raise
            return (
                f"✅ subagent started (ID: {child.id}), running in the background for up to "
                f"{timeout:.0f} s; its result will arrive as a new message in this chat"
            )
        try:
            outcome = await self.registry.run_sync(child)
        finally:
            parent = ctx.run_state.get("usage")
            if isinstance(parent, Usage):
                parent.include(child.outcome.usage)
            else:  # called outside a run: count the tokens for the session anyway
                self.host.add_derived_usage(ctx.session, child.outcome.usage)
            await child.emit("child_end", child.outcome.end_data())
        if not outcome.ok:
            raise ToolError(failure_text(outcome, timeout))
        return format_result(outcome, settings.max_result_chars)


class NoParams(BaseModel):
    """No parameters."""


class SubagentListTool(BaseTool[NoParams]):
    """List the subagents of this chat that are still running."""

    name = "subagent_list"

    def __init__(self, registry: SubagentRegistry) -> None:
        self.registry = registry

    async def execute(self, params: NoParams, ctx: ToolContext) -> str:
        """List them."""
        return running_text(self.registry.running(ctx.session), modes=True)


class SubagentCancelParams(BaseModel):
    """subagent_cancel parameters."""

    id: Annotated[str, Field(description="The subagent's ID (from subagent_run or subagent_list).")]


class SubagentCancelTool(BaseTool[SubagentCancelParams]):
    """Cancel a running subagent of this chat; a cancelled background subagent reports nothing."""

    name = "subagent_cancel"

    def __init__(self, registry: SubagentRegistry) -> None:
        self.registry = registry

    async def execute(self, params: SubagentCancelParams, ctx: ToolContext) -> str:
        """Cancel it."""
        child_id = params.id.strip()
        return cancel_text(child_id, self.registry.cancel(ctx.session, child_id))


def subagent_tools(host: AgentHost, registry: SubagentRegistry) -> list[Tool]:
    """The three subagent tools over ``registry`` (the same for every main session)."""
    return [
        SubagentRunTool(host, registry),
        SubagentListTool(registry),
        SubagentCancelTool(registry),
    ]
