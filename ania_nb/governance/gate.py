"""The tool gate: what every tool call passes, inside its own task, before it runs.

In order: plan mode → PreToolUse hooks → an admin's approval for ``config_set`` and
``config_file_set`` (always; being the requester is not enough) → a human's approval for the
tools in ``approval.tools`` (when ``approval.enable``). The first stage that stops a call returns
the text that becomes the call's result; the loop goes on with the other calls. Because the gate
runs inside each call's task, a call waiting for a human never delays its siblings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..tools import ToolContext
from ..tools.builtin.bash import summarize
from .hooks import payload_for

if TYPE_CHECKING:  # pragma: no cover
    from ..config import ApprovalSettings
    from ..engine.loop import ToolCall
    from .approval import ApprovalManager
    from .hooks import HookRunner
    from .plan import PlanMode

ADMIN_APPROVAL_TOOLS = frozenset({"config_set", "config_file_set"})
SUMMARY_CHARS = 300
LONG_SUMMARY_CHARS = 4000  # config_file_set: the admin should see the whole file if possible

HOOK_BLOCKED = "Tool call blocked by a hook: "
NOT_APPROVED = "Tool call not approved: "
NOT_APPROVED_BY_ADMIN = "Tool call not approved by an admin: "


class ToolGate:
    """The gate pipeline; set as ``agent.hooks.tool_gate``."""

    def __init__(
        self,
        *,
        plan: PlanMode,
        hooks: HookRunner,
        approvals: ApprovalManager,
        approval: ApprovalSettings,
    ) -> None:
        self.plan = plan
        self.hooks = hooks
        self.approvals = approvals
        self.approval = approval

    async def __call__(self, call: ToolCall, ctx: ToolContext) -> str | None:
        """The block text for this call, or None to let it run."""
        tool = ctx.executor.get(call.name) if ctx.executor is not None else None
        blocked = self.plan.blocks(ctx.session, call.name, tool)
        if blocked is not None:
            return blocked
        payload = payload_for(
            "PreToolUse",
            ctx.session,
            ctx.agent_kind,
            tool_name=call.name,
            tool_input=call.arguments,
        )
        outcome = await self.hooks.run("PreToolUse", payload)
        if outcome.blocked:
            return HOOK_BLOCKED + outcome.reason
        if call.name in ADMIN_APPROVAL_TOOLS:
            return await self._ask(call, ctx, admin_only=True, prefix=NOT_APPROVED_BY_ADMIN)
        if self.approval.enable and call.name in self.approval.tools:
            # Nobody stands behind a clock run or a subagent: only an admin may answer.
            admin_only = ctx.agent_kind != "main"
            return await self._ask(call, ctx, admin_only=admin_only, prefix=NOT_APPROVED)
        return None

    async def _ask(
        self, call: ToolCall, ctx: ToolContext, *, admin_only: bool, prefix: str
    ) -> str | None:
        limit = LONG_SUMMARY_CHARS if call.name == "config_file_set" else SUMMARY_CHARS
        verdict = await self.approvals.request(
            session=ctx.session,
            tool=call.name,
            summary=summarize(call.arguments, limit),
            callbacks=ctx.callbacks,
            requester=ctx.sender,
            admin_only=admin_only,
        )
        return None if verdict.allowed else prefix + (verdict.reason or "denied")
