"""``team_run``: several role-described members work on one task in parallel (reference §5.3).

Each member is a one-shot run of kind ``team_member`` with the team's time, round and result
limits. Its system prompt comes from the first of: the role given in the call, a built-in role
of its name, the role saved for a member of that name in a team of the session's scope (then
of ``global``), else the plain subagent prompt (noted in the report). The member is asked the
overall task followed by its own. The call waits for every member and reports each in input
order. Every member's tokens are added to the calling run's usage, and its live events reach
the caller's front end as ``child`` events (a nested transcript per member).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engine.callbacks import RunEvent
from ..engine.usage import Usage
from ..errors import ToolError
from ..orchestration.oneshot import OneShotJob
from .roles import MAX_ROLE_CHARS, builtin_role, role_prompt
from .team_store import GLOBAL_SCOPE, TeamStore

if TYPE_CHECKING:  # pragma: no cover
    from ..orchestration.host import AgentHost
    from ..result import RunResult
    from ..tools import ToolContext

__all__ = ["HARD_MAX_MEMBERS", "MemberOutcome", "MemberRequest", "team_run"]

HARD_MAX_MEMBERS = 10

# --- TEMPORARY until agents/subagent.py (H-sub) lands: then imported from there.
PARENT_RESERVE = 30.0
MAX_TIMEOUT = 1800.0


def clamp_timeout(requested: float | None, default: float) -> float:
    if requested is None or requested <= 0:
        requested = default
    return min(requested, MAX_TIMEOUT)


def subagent_prompt() -> str:
    return "You are a subagent working for the main agent. Your final text is returned."


def compose_prompt(base: str, scene: str) -> str:
    return f"{base}\n\n{scene}" if scene else base


def truncate_result(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… (result too long, cut; the original has {len(text)} characters)"


@dataclass(frozen=True)
class MemberRequest:
    """One member as ``team_run`` was asked for it."""

    name: str
    role: str = ""
    task: str = ""


@dataclass
class MemberOutcome:
    """How one member's run went."""

    name: str
    role: ResolvedRole
    prompt: str
    task: str
    result: RunResult | None = None
    error: str = ""
    elapsed: float = 0.0
    usage: Usage = field(default_factory=Usage)

    @property
    def ok(self) -> bool:
        """Whether the member finished successfully."""
        return self.result is not None and self.result.ok


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
    scopes = [session] if session == GLOBAL_SCOPE else [session, GLOBAL_SCOPE]
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
    budget = clamp_timeout(timeout_sec, settings.timeout)  # clamped before anything else
    deadline = ctx.run_state.get("deadline")
    if deadline:
        left = deadline - time.monotonic()
        if left <= PARENT_RESERVE:
            raise ToolError(
                f"cannot start the agent team: this request has {max(left, 0):.0f} s left and "
                f"needs more than {PARENT_RESERVE:.0f} s; answer without the team"
            )
        budget = min(budget, left - PARENT_RESERVE)
    scene = host.system_prompt_for(ctx.session)
    outcomes: list[MemberOutcome] = []
    for member in checked:
        role = await resolve_role(host, ctx.session, member)
        member_task = f"{task}\n\n{member.task}" if member.task else task
        outcomes.append(
            MemberOutcome(member.name, role, compose_prompt(role.prompt, scene), member_task)
        )
    for i, outcome in enumerate(outcomes):
        await _emit_child(
            ctx, i, outcome.name, "child_start", {"role": outcome.role.role, "task": outcome.task}
        )
    started = time.monotonic()
    await asyncio.gather(*(_run_member(host, ctx, i, o, budget) for i, o in enumerate(outcomes)))
    return report(outcomes, time.monotonic() - started, settings.max_result_len)


async def _run_member(
    host: AgentHost, ctx: ToolContext, index: int, outcome: MemberOutcome, budget: float
) -> None:
    """One member's run; its tokens join the caller's tally even if it is cancelled."""

    async def forward(event: RunEvent) -> None:
        await _emit_child(ctx, index, outcome.name, event.kind, event.data)

    job = OneShotJob(
        kind="team_member",
        session=ctx.session,
        text=outcome.task,
        system_prompt=outcome.prompt,
        timeout=budget,
        callbacks=ctx.callbacks,
        on_event=forward,
        usage=outcome.usage,
        max_iterations=host.config.team.max_iterations,
    )
    started = time.monotonic()
    try:
        outcome.result = await host.run_one_shot(job)
        if not outcome.result.ok:
            outcome.error = outcome.result.error or outcome.result.status
    except asyncio.CancelledError:
        outcome.error = "stopped"
        raise
    except Exception as exc:  # one member's crash must not lose the others' results
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        outcome.elapsed = time.monotonic() - started
        parent = ctx.run_state.get("usage")
        if isinstance(parent, Usage):
            parent.merge(outcome.usage)
        await _emit_child(ctx, index, outcome.name, "child_end", _end_data(outcome))


def _end_data(outcome: MemberOutcome) -> dict[str, Any]:
    result = outcome.result
    return {
        "status": result.status if result is not None else "error",
        "text": result.text if result is not None else "",
        "error": outcome.error,
        "elapsed": round(outcome.elapsed, 3),
        "usage": outcome.usage.to_dict(),
    }


async def _emit_child(
    ctx: ToolContext, index: int, label: str, kind: str, data: dict[str, Any]
) -> None:
    await ctx.callbacks.emit(
        RunEvent(
            "child",
            ctx.session,
            {
                "call_id": ctx.call_id,
                "child_id": f"{ctx.call_id}:{index}",
                "label": label,
                "kind": kind,
                "data": data,
                "background": False,
            },
        )
    )


def report(outcomes: Sequence[MemberOutcome], elapsed: float, max_result_len: int) -> str:
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
            lines.append(f"Failed: {o.error}")
        elif not (o.result and o.result.text.strip()):
            lines.append("(the member returned nothing)")
        else:
            lines.append(truncate_result(o.result.text.strip(), max_result_len))
    return "\n".join(lines).rstrip()
