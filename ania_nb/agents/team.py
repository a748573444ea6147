"""``team_run``: several role-described members work on one task in parallel [orig §5.3].

Each member is a one-shot run of kind ``team_member`` with the team's time, round and result
limits. Its system prompt comes from the first of: the role given in the call, a built-in role
of its name, the role saved for a member of that name in a team of the session's scope (then
of ``global``), else the plain subagent prompt (noted in the report). The member is asked the
overall task followed by its own. The call waits for every member and reports each in input
order. Every member's tokens are added to the calling run's usage, and its live events reach
the caller's front end as ``child`` events (a nested transcript per member).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..engine.callbacks import RunEvent
from ..engine.concurrency import gather_all
from ..engine.usage import Usage
from ..errors import ToolError
from ..session_keys import read_scopes
from .roles import MAX_ROLE_CHARS, builtin_role, role_prompt
from .subagent import (
    SubagentOutcome,
    check_quota,
    child_budget,
    child_event,
    compose_prompt,
    run_subagent,
    subagent_prompt,
    truncate_result,
)
from .team_store import TeamStore

if TYPE_CHECKING:  # pragma: no cover
    from ..orchestration.host import AgentHost
    from ..tools import ToolContext

__all__ = ["HARD_MAX_MEMBERS", "MemberOutcome", "MemberRequest", "team_run"]

HARD_MAX_MEMBERS = 10


@dataclass(frozen=True)
class MemberRequest:
    """One member as ``team_run`` was asked for it."""

    name: str
    role: str = ""
    task: str = ""


@dataclass
class MemberOutcome:
    """One member: its role, full system prompt, and how its run went (``run``)."""

    name: str
    role: ResolvedRole
    prompt: str
    run: SubagentOutcome  # the run's task, result, error, elapsed time and usage

    @property
    def ok(self) -> bool:
        """Whether the member finished successfully."""
        return self.run.ok


def check_request(
    task: str, members: Sequence[MemberRequest], max_members: int
) -> tuple[str, list[MemberRequest]]:
    """The trimmed task and members; `ToolError` saying what is wrong."""
    task = task.strip()
    if not task:
        raise ToolError("task is empty; describe the overall task the team works on")
    limit = max(1, min(max_members, HARD_MAX_MEMBERS))
    if not members:
        raise ToolError(f"members is empty; give 1-{limit} members with a name each")
    if len(members) > limit:
        raise ToolError(f"too many members: {len(members)} (at most {limit})")
    checked: list[MemberRequest] = []
    seen: set[str] = set()
    for i, member in enumerate(members, 1):
        name = member.name.strip()
        if not name:
            raise ToolError(f"member {i} has an empty name")
        if name in seen:
            raise ToolError(f"member {i}: the name {name!r} is used twice; names must be unique")
        seen.add(name)
        checked.append(MemberRequest(name, member.role.strip(), member.task.strip()))
    return task, checked


@dataclass(frozen=True)
class ResolvedRole:
    """Where a member's role came from and what it makes of the member."""

    prompt: str  # the role part of the system prompt
    role: str  # what the front end shows: the role text or built-in role name ('' if none)
    source: str  # given, builtin, saved or none
    note: str = ""  # said in the report (an unrecognised role)


async def resolve_role(host: AgentHost, session: str, member: MemberRequest) -> ResolvedRole:
    """The member's role by the chain: given → built-in by name → saved (scope, global) → none."""
    if member.role:
        role = member.role[:MAX_ROLE_CHARS]
        return ResolvedRole(role_prompt(member.name, role), role, "given")
    builtin = builtin_role(member.name)
    if builtin is not None:
        return ResolvedRole(builtin.prompt(), builtin.name, "builtin")
    teams = TeamStore(await host.open_store())
    scopes = read_scopes(session)
    found = await teams.find_role(scopes, member.name)
    if found is not None:
        saved = found[1].role
        return ResolvedRole(role_prompt(member.name, saved), saved, "saved")
    note = f"unrecognised role “{member.name}”: run as a plain subagent"
    return ResolvedRole(subagent_prompt(), "", "none", note)


async def team_run(
    host: AgentHost,
    ctx: ToolContext,
    task: str,
    members: Sequence[MemberRequest],
    timeout_sec: float | None = None,
) -> str:
    """Run the members in parallel on ``task`` and return the report (see the module doc)."""
    settings = host.config.team
    task, checked = check_request(task, members, settings.max_members)
    await check_quota(host, ctx.session, "agent team")
    # Clamped to 1800 s first, then shrunk to leave the parent 30 s (refused with ≤ 30 s left).
    budget = child_budget(
        timeout_sec, settings.timeout, ctx.run_state.get("deadline"), what="the agent team"
    )
    scene = host.system_prompt_for(ctx.session)
    outcomes: list[MemberOutcome] = []
    for member in checked:
        role = await resolve_role(host, ctx.session, member)
        member_task = f"{task}\n\n{member.task}" if member.task else task
        outcomes.append(
            MemberOutcome(
                member.name, role, compose_prompt(role.prompt, scene), SubagentOutcome(member_task)
            )
        )
    for i, outcome in enumerate(outcomes):
        await _emit_child(
            ctx,
            i,
            outcome.name,
            "child_start",
            {"role": outcome.role.role, "task": outcome.run.task},
        )
    started = time.monotonic()
    # Every member ends (and adds its tokens to the caller's tally) before the team's call does.
    await gather_all(*(_run_member(host, ctx, i, o, budget) for i, o in enumerate(outcomes)))
    return report(outcomes, time.monotonic() - started, settings.max_result_chars)


async def _run_member(
    host: AgentHost, ctx: ToolContext, index: int, outcome: MemberOutcome, budget: float
) -> None:
    """One member's run; its tokens join the caller's tally even if it is cancelled."""

    async def forward(event: RunEvent) -> None:
        await _emit_child(ctx, index, outcome.name, event.kind, event.data)

    parent = ctx.run_state.get("usage")
    try:
        await run_subagent(
            host,
            ctx.session,
            outcome.run.task,
            budget,
            kind="team_member",
            system_prompt=outcome.prompt,
            callbacks=ctx.callbacks,
            on_event=forward,
            usage=parent if isinstance(parent, Usage) else None,
            max_iterations=host.config.team.max_iterations,
            outcome=outcome.run,
            role=ctx.role,  # members act for whoever the team's caller acts for
        )
    finally:
        await _emit_child(ctx, index, outcome.name, "child_end", outcome.run.end_data())


async def _emit_child(
    ctx: ToolContext, index: int, label: str, kind: str, data: dict[str, Any]
) -> None:
    event = child_event(ctx.session, ctx.call_id, f"{ctx.call_id}:{index}", label, kind, data)
    await ctx.callbacks.emit(event)


def report(outcomes: Sequence[MemberOutcome], elapsed: float, max_result_chars: int) -> str:
    """The team's result: a summary line, then every member in input order."""
    ok = sum(o.ok for o in outcomes)
    total = len(outcomes)
    lines = [
        f"[Agent team finished] {elapsed:.1f}s · {total} members "
        f"({ok} succeeded · {total - ok} failed)"
    ]
    for i, o in enumerate(outcomes, 1):
        lines.append(f"\n===== Member {i}/{total}: {o.name} =====")
        if o.role.note:
            lines.append(f"({o.role.note})")
        if not o.ok:
            lines.append(f"Failed: {o.run.error}")
        elif not o.run.text.strip():
            lines.append("(the member returned nothing)")
        else:
            lines.append(truncate_result(o.run.text.strip(), max_result_chars))
    return "\n".join(lines).rstrip()
