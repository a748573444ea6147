"""Subagents and agent teams: one-shot workers a main session starts [orig §5].

``Agents(host)`` is what the Agent wires in: ``agent.add_session_tools(agents.session_tools)``
gives every main session the subagent tools (``subagent.enable``) and the team tools
(``team.enable``); ``await agents.aclose()`` cancels every child still running. Clock runs use
the clock variant of the subagent tools instead (`ania_nb.agents.clock_children`).

Pieces: `subagent` (prompt, time budget, one run, result text), `background` (running children,
injection of background results), `subagent_tools`, `clock_children`, and the team modules
(`team`, `roles`, `team_store`, `team_tools`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .background import SubagentRegistry
from .subagent_tools import subagent_tools

if TYPE_CHECKING:  # pragma: no cover
    from ..orchestration.host import AgentHost
    from ..tools import Tool
    from .team_store import TeamStore

__all__ = ["Agents"]

log = logging.getLogger(__name__)


class Agents:
    """The subagent and team tools of an Agent's main sessions, and their running children."""

    def __init__(self, host: AgentHost) -> None:
        """Serve ``host``'s sessions; a stop of a session cancels its background subagents."""
        self.host = host
        self.subagents = SubagentRegistry(host)

    def session_tools(self, session: str) -> list[Tool]:
        """The tools of a main session: subagent and team tools, as the settings enable them."""
        config = self.host.config
        tools: list[Tool] = []
        if config.subagent.enable:
            tools += subagent_tools(self.host, self.subagents)
        if config.team.enable:
            tools += _team_tools(self.host, session)
        return tools

    async def teams(self) -> TeamStore:
        """The saved teams of every scope, ``global`` included (`TeamStore`).

        >>> teams = await agent.agents.teams()
        >>> await teams.create("global", "reviewers", [{"name": "critic", "role": "…"}])
        """
        from .team_store import TeamStore

        return TeamStore(await self.host.open_store())

    async def aclose(self) -> None:
        """Cancel every running subagent and wait for them to end."""
        await self.subagents.aclose()


def _team_tools(host: AgentHost, session: str) -> list[Tool]:
    try:  # imported lazily: the team modules need the store only when a team tool runs
        from .team_tools import team_tools
    except ImportError:  # pragma: no cover - a broken install; say so, keep the subagents
        log.exception("the team tools cannot be loaded")
        return []
    return team_tools(host, session)
