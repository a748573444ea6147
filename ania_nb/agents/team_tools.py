"""The team tools of a main session: ``team_run``, ``team_create``, ``team_list``, ``team_delete``.

They are registered only when ``team.enable`` is set, and never reach subagents, team members
or clock runs (`ania_nb.orchestration.oneshot.HIDDEN_BY_KIND`). The AI saves and deletes teams
of its own session's scope only; it can read (and use the roles of) ``global`` teams.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, ClassVar

from pydantic import BaseModel, Field

from ..errors import ToolError
from ..tools import BaseTool, Tool, ToolContext
from .roles import BUILTIN_ROLES
from .team import MemberRequest, team_run
from .team_store import GLOBAL_SCOPE, Team, TeamError, TeamStore

if TYPE_CHECKING:  # pragma: no cover
    from ..orchestration.host import AgentHost

__all__ = ["format_teams", "team_tools"]

_ROLE_NAMES = ", ".join(f"{r.name} ({r.aliases[0]})" for r in BUILTIN_ROLES)


class MemberParams(BaseModel):
    """One team member."""

    name: Annotated[str, Field(description="Unique member name; may name a built-in role.")]
    role: Annotated[
        str, Field(description="What this member is (≤ 500 characters); empty = by name.")
    ] = ""
    task: Annotated[str, Field(description="This member's own part of the task (optional).")] = ""


class TeamRunParams(BaseModel):
    """team_run parameters."""

    task: Annotated[
        str,
        Field(description="The overall task and background every member gets (self-contained)."),
    ]
    members: Annotated[list[MemberParams], Field(description="The members, run in parallel.")]
    timeout_sec: Annotated[
        float | None, Field(description="Seconds each member may take (default from config).")
    ] = None


class TeamRunTool(BaseTool[TeamRunParams]):
    """Run an agent team: members work on the task in parallel and each reports back."""

    name = "team_run"
    description = (
        "Run an agent team: every member is an independent worker (no chat history) that gets "
        "the overall task plus its own task, and all members work in parallel; the call waits "
        "for them and returns each member's result in order. A member's role comes from its "
        f"`role` text, else from a built-in role of its name ({_ROLE_NAMES}), else from a saved "
        "team member of that name (see team_list). Members cannot start subagents or teams."
    )

    def __init__(self, host: AgentHost) -> None:
        self.host = host

    async def execute(self, params: TeamRunParams, ctx: ToolContext) -> str:
        """Run the team and return its report."""
        members = [MemberRequest(m.name, m.role, m.task) for m in params.members]
        return await team_run(self.host, ctx, params.task, members, params.timeout_sec)


class TeamCreateParams(BaseModel):
    """team_create parameters."""

    name: Annotated[
        str, Field(description="Team name: 1-20 letters, digits, '_' or '-' (any script).")
    ]
    desc: Annotated[str, Field(description="What the team is for (optional).")] = ""
    members: Annotated[
        list[MemberParams],
        Field(description="1-10 members with unique names and their roles (task is ignored)."),
    ]


class _ScopedTool:
    """A team tool bound to one session's scope."""

    def __init__(self, host: AgentHost, session: str) -> None:
        self.host = host
        self.session = session

    async def teams(self) -> TeamStore:
        return TeamStore(await self.host.open_store())


class TeamCreateTool(_ScopedTool, BaseTool[TeamCreateParams]):
    """Save a team (members with roles) for this conversation, to reuse its roles in team_run."""

    name = "team_create"
    side_effects: ClassVar[bool] = True

    async def execute(self, params: TeamCreateParams, ctx: ToolContext) -> str:
        """Save the team."""
        members = [{"name": m.name, "role": m.role} for m in params.members]
        try:
            team = await (await self.teams()).create(
                self.session, params.name, members, description=params.desc, actor=ctx.sender
            )
        except TeamError as exc:
            raise ToolError(str(exc)) from None
        names = " / ".join(m.name for m in team.members)
        return f"saved team {team.name} ({len(team.members)} members: {names})"


class NoParams(BaseModel):
    """No parameters."""


class TeamListTool(_ScopedTool, BaseTool[NoParams]):
    """List the saved teams of this conversation (and the global ones)."""

    name = "team_list"

    async def execute(self, params: NoParams, ctx: ToolContext) -> str:
        """List the teams."""
        teams = await self.teams()
        own = await teams.list(self.session) if self.session != GLOBAL_SCOPE else []
        shared = await teams.list(GLOBAL_SCOPE)
        if not own and not shared:
            return "no saved teams; save one with team_create"
        parts = [format_teams(own, "saved teams")] if own else ["no saved teams of this chat"]
        if shared:
            parts.append(format_teams(shared, "global teams"))
        return "\n\n".join(parts)


class TeamDeleteParams(BaseModel):
    """team_delete parameters."""

    name: Annotated[str, Field(description="The team to delete.")]


class TeamDeleteTool(_ScopedTool, BaseTool[TeamDeleteParams]):
    """Delete a saved team of this conversation."""

    name = "team_delete"
    side_effects: ClassVar[bool] = True

    async def execute(self, params: TeamDeleteParams, ctx: ToolContext) -> str:
        """Delete the team."""
        if await (await self.teams()).delete(self.session, params.name, actor=ctx.sender):
            return f"deleted team {params.name.strip()}"
        return f"no team named {params.name.strip()!r} in this chat; see team_list for the names"


def format_teams(teams: list[Team], title: str) -> str:
    """``<title> (N):`` then each team: name and member count, description, member names."""
    lines = [f"{title} ({len(teams)}):"]
    for i, team in enumerate(teams, 1):
        lines.append(f"{i}. {team.name} ({len(team.members)} members)")
        if team.description:
            lines.append(f"   description: {team.description}")
        lines.append("   members: " + " / ".join(m.name for m in team.members))
    return "\n".join(lines)


def team_tools(host: AgentHost, session: str) -> list[Tool]:
    """The team tools of ``session`` (its scope is the session key)."""
    return [
        TeamRunTool(host),
        TeamCreateTool(host, session),
        TeamListTool(host, session),
        TeamDeleteTool(host, session),
    ]
