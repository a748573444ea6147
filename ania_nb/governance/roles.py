"""Roles: who may make the model run which tools in a chat.

Every run has a role, lowest first ``member`` < ``trusted`` < ``admin``. A user's role in a chat:
``admin`` for the ids in ``admin.ids`` and for ``None`` (the local user of a notebook, code in
the same process), ``trusted`` for the ids ``roles.trusted`` lists for that session key (or for
``*``), else ``member``. A main run has the highest role among the senders of the messages it
answers; a one-shot run (clock, subagent, team member, a background result's reply) the role of
whoever started it — the clock task's creator, the parent run.

A tool needs ``admin`` when its name matches a pattern of ``roles.admin_tools``, else ``trusted``
when it matches ``roles.trusted_tools``, else nothing (``fnmatch`` globs, case-sensitive, on the
name the tool is registered under — MCP tools keep their server's names, the lazy loaders are
``mcp_discover_<server>``/``mcp_load_<server>``). A run is not offered the tools its role may
not use (`Roles.tool_filter`, applied by the run's tool view), and the tool gate refuses them if
called anyway (`Roles.refusal`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..config import RolesSettings
    from ..tools import Role

ROLES: tuple[Role, ...] = ("member", "trusted", "admin")
_RANK: dict[str, int] = {role: rank for rank, role in enumerate(ROLES)}
EVERY_CHAT = "*"
REFUSED = "Tool call refused: "


def rank(role: Role) -> int:
    """The role's place in `ROLES` (higher may do more)."""
    return _RANK[role]


def highest(roles: Iterable[Role]) -> Role:
    """The highest of ``roles``; ``member`` when there are none."""
    return max(roles, key=rank, default="member")


class Roles:
    """The ``roles`` settings and the admins, resolved: users' roles and tools' minimum roles."""

    def __init__(self, settings: RolesSettings, admins: Iterable[str]) -> None:
        self.admins = frozenset(admins)
        self.trusted = {chat: frozenset(users) for chat, users in settings.trusted.items()}
        self.admin_tools = tuple(settings.admin_tools)
        self.trusted_tools = tuple(settings.trusted_tools)
        self._required: dict[str, Role] = {}

    def role_of(self, session: str, who: str | None) -> Role:
        """The role of sender ``who`` in ``session`` (None: the local user, an admin)."""
        if who is None or who in self.admins:
            return "admin"
        if who in self.trusted.get(session, ()) or who in self.trusted.get(EVERY_CHAT, ()):
            return "trusted"
        return "member"

    def required(self, tool: str) -> Role:
        """The lowest role whose runs may use the tool called ``tool``."""
        found = self._required.get(tool)
        if found is None:
            if any(fnmatchcase(tool, p) for p in self.admin_tools):
                found = "admin"
            elif any(fnmatchcase(tool, p) for p in self.trusted_tools):
                found = "trusted"
            else:
                found = "member"
            if len(self._required) < 4096:  # names are bounded; a flood of odd ones is not
                self._required[tool] = found
        return found

    def allows(self, role: Role, tool: str) -> bool:
        """Whether a run of ``role`` may use ``tool``."""
        return rank(role) >= rank(self.required(tool))

    def tool_filter(self, role: Role) -> Callable[[str], bool] | None:
        """What a run of ``role`` is offered, by tool name (None: everything, for an admin)."""
        if role == "admin":
            return None
        return lambda tool: self.allows(role, tool)

    def refusal(self, role: Role, tool: str) -> str | None:
        """The result of a call ``role`` may not make (deterministic), or None if it may."""
        needed = self.required(tool)
        if rank(role) >= rank(needed):
            return None
        return (
            f"{REFUSED}{tool} needs the {needed} role in this chat and this request has the "
            f"{role} role; ask an admin."
        )
