"""The tool gate: what every tool call passes, inside its own task, before it runs.

In order: the run's role (a tool its role may not use is refused: `Roles.refusal`) → plan mode
→ PreToolUse hooks → an admin's approval when the tool says the call needs one
(``tool.needs_admin_approval(arguments)``: the config tools, adding, replacing or removing a
skill or an MCP server, starting an MCP server from a changed file entry; always asked, being
the requester is not enough) → a person's approval for the tools in ``approval.tools`` (when
``approval.enable``) and for tools that say a call needs one (``tool.needs_approval(arguments)``:
``bash`` outside its lists, ``python``). A call is asked about at most once, and when nobody
stands behind the run (clock, subagent, team member: ``ctx.admin_only_approval``) only an admin
may answer, whatever the tool. The first stage that stops a call returns a `GateDecision` whose
text becomes the call's result; the loop goes on with the other calls. A run that can be resumed
after a restart (a main run) leaves its checkpoint in ``ctx.run_state[CHECKPOINT]``; the gate
marks the call as waiting for a person and hands the checkpoint to the approval manager, which
stores it with the request (`governance.approval`). Because the gate runs
inside each call's task, a call waiting for a person never delays its siblings.

A PreToolUse hook's permission decision (Claude Code's JSON output): ``deny`` blocks; ``ask``
makes a person approve the call even if nothing else would ask; ``allow`` skips the person's
approval (and counts as it for ``bash``/``python``) but never an admin's: the admin tools
always ask an admin. ``continue: false`` blocks the call and ends the run (`Governance.after_tool`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..catalogue import Language
from ..engine.loop import GateDecision, ToolOutcomeKind
from ..text import flatten
from ..tools import ToolContext
from .approval_text import approval_text
from .hooks import PRE_TOOL_OUTCOME, enter_call, payload_for
from .secrets import SECRET_CONTAINERS, mask_json

if TYPE_CHECKING:  # pragma: no cover
    from ..config import ApprovalSettings
    from ..engine.callbacks import Verdict
    from ..engine.loop import ToolCall
    from ..tools import Tool
    from .approval import ApprovalManager, Checkpoint
    from .hooks import HookRunner
    from .plan import PlanMode
    from .roles import Roles

SUMMARY_CHARS = 300
LONG_SUMMARY_CHARS = 4000  # config_file_set: the admin should see the whole file if possible

HOOK_BLOCKED = "Tool call blocked by a hook: "
NOT_APPROVED = "Tool call not approved: "
NOT_APPROVED_BY_ADMIN = "Tool call not approved by an admin: "
CHECKPOINT = "approval_checkpoint"  # ToolContext.run_state key of a resumable run's checkpoint

# How an approval request ended → the call's outcome.
_VERDICT_OUTCOMES: dict[str, ToolOutcomeKind] = {"timeout": "timeout", "stopped": "stopped"}


class ToolGate:
    """The gate pipeline; set as ``agent.tool_gate``."""

    def __init__(
        self,
        *,
        plan: PlanMode,
        hooks: HookRunner,
        approvals: ApprovalManager,
        approval: ApprovalSettings,
        roles: Roles | None = None,
        language: Callable[[str], Language] | None = None,
    ) -> None:
        self.plan = plan
        self.hooks = hooks
        self.approvals = approvals
        self.approval = approval
        self.roles = roles
        # The language a session's front end shows the approval text in (`ania_nb.catalogue`).
        self.language = language or (lambda session: "en")

    async def __call__(self, call: ToolCall, ctx: ToolContext) -> GateDecision | None:
        """The decision that stops this call, or None to let it run."""
        tool = ctx.executor.get(call.name) if ctx.executor is not None else None
        stopped = enter_call(ctx)  # a hook's continue: false already ended this run
        if stopped is not None:
            return GateDecision(HOOK_BLOCKED + stopped, "blocked", "hook")
        refused = self.roles.refusal(ctx.role, call.name) if self.roles is not None else None
        if refused is not None:  # not offered to this run, called anyway
            return GateDecision(refused, "blocked", "role")
        if not ctx.plan_mode:
            await self.plan.load(ctx.session)  # switched on another replica meanwhile
        blocked = self.plan.blocks(ctx.session, call.name, tool, this_run=ctx.plan_mode)
        if blocked is not None:
            return GateDecision(blocked, "blocked", "plan")
        payload = payload_for(
            "PreToolUse",
            ctx.session,
            ctx.agent_kind,
            tool_name=call.name,
            tool_input=call.arguments,
        )
        outcome = await self.hooks.run("PreToolUse", payload)
        ctx.extras[PRE_TOOL_OUTCOME] = outcome  # context and stop: Governance.after_tool
        if outcome.blocked or outcome.stopped:
            reason = outcome.reason if outcome.blocked else outcome.stop_reason
            return GateDecision(HOOK_BLOCKED + reason, "blocked", "hook")
        if _needs_admin(call, tool):
            # A hook's "allow" never stands in for an admin.
            return await self._ask(call, tool, ctx, admin_only=True)
        if outcome.ask or (not outcome.allow and self._needs_approval(call, tool)):
            return await self._ask(call, tool, ctx, admin_only=ctx.admin_only_approval)
        if outcome.allow:  # the hook's "allow" stands in for the person (bash/python check it)
            ctx.approved = True
        return None

    def _needs_approval(self, call: ToolCall, tool: Tool | None) -> bool:
        if self.approval.enable and call.name in self.approval.tools:
            return True
        asks = getattr(tool, "needs_approval", None)
        if asks is None:
            return False
        arguments = _arguments(call.arguments)
        # Unparseable arguments never run (the executor refuses them), so nothing to ask.
        return arguments is not None and bool(asks(arguments))

    async def _ask(
        self, call: ToolCall, tool: Tool | None, ctx: ToolContext, *, admin_only: bool
    ) -> GateDecision | None:
        # A run that can be resumed after a restart (a main run) left its checkpoint here.
        checkpoint: Checkpoint | None = ctx.run_state.get(CHECKPOINT)
        if checkpoint is not None:
            checkpoint.asking(call.id, True)
        try:
            # Off the loop: a tool's summary may read the file it would change (bounded).
            language = self.language(ctx.session)
            summary, details = await asyncio.to_thread(_describe, call, tool, language)
            verdict = await self.approvals.request(
                session=ctx.session,
                tool=call.name,
                summary=summary,
                callbacks=ctx.callbacks,
                requester=ctx.sender,
                admin_only=admin_only,
                details=details,
                requesters=ctx.requesters,
                call_id=call.id,
                checkpoint=checkpoint,
            )
        finally:
            if checkpoint is not None:
                checkpoint.asking(call.id, False)
        if verdict.allowed:
            ctx.approved = True
            return None
        return refusal(verdict, admin_only=admin_only)


def refusal(verdict: Verdict, *, admin_only: bool) -> GateDecision:
    """The decision of a call a person did not allow (denied, timed out, stopped, …)."""
    prefix = NOT_APPROVED_BY_ADMIN if admin_only else NOT_APPROVED
    kind = _VERDICT_OUTCOMES.get(verdict.outcome, "denied")
    return GateDecision(
        prefix + (verdict.reason or "denied"), kind, "admin" if admin_only else "human"
    )


def _arguments(raw: str) -> Mapping[str, Any] | None:
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _describe(call: ToolCall, tool: Tool | None, language: Language) -> tuple[str, str]:
    """The approval's headline and its full details (worded in ``language``)."""
    return _summary(call, tool), _details(call, tool, language)


def _details(call: ToolCall, tool: Tool | None, language: Language = "en") -> str:
    """Every argument in full, in the tool's parameter order (see `approval_text`)."""
    arguments = _arguments(call.arguments)
    order: list[str] = []
    if tool is not None:
        order = list(tool.parameters_schema().get("properties", {}))
    shell = tuple(getattr(tool, "shell_arguments", ()))
    shown: Mapping[str, Any] | str = call.arguments
    if arguments is not None:
        # Values under env/headers are credentials: the person sees their names, not values.
        shown = {
            k: mask_json(v, secret=True) if k.lower() in SECRET_CONTAINERS else v
            for k, v in arguments.items()
        }
    return approval_text(call.name, shown, order=order, shell_keys=shell, language=language)


def _needs_admin(call: ToolCall, tool: Tool | None) -> bool:
    """``tool.needs_admin_approval(arguments)``: this call waits for an admin.

    The one mechanism for admin approvals: the config tools, ``mcp_add``, ``mcp_remove``,
    ``skill_install`` and ``skill_remove`` say yes to every call, ``mcp_reconnect`` when it
    would start a server that is not running.
    """
    asks = getattr(tool, "needs_admin_approval", None)
    arguments = _arguments(call.arguments)
    return asks is not None and arguments is not None and bool(asks(arguments))


def _summary(call: ToolCall, tool: Tool | None) -> str:
    """What the person is shown: the tool's own summary, else the arguments."""
    describe = getattr(tool, "approval_summary", None)
    arguments = _arguments(call.arguments)
    if describe is not None and arguments is not None:
        return str(describe(arguments))
    limit = LONG_SUMMARY_CHARS if call.name == "config_file_set" else SUMMARY_CHARS
    return flatten(call.arguments, limit)
