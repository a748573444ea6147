"""Slash commands typed by users: the built-ins and the custom ones from the commands file.

Built-ins (``/stop``, ``/plan``, ``/cmd``, ``/help``; ``/clock`` once registered) are answered at
once, without the model. In a group, ``/plan on|off`` (plan mode is the whole group's) is for
admins and trusted users; ``/plan status`` for everyone.
A custom command is expanded into a prompt that then goes through the normal chat path. An
unknown ``/name`` gets a list of the commands; text whose first word is no command name (a path
such as ``/usr/bin``) is an ordinary message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from ..errors import UsageError
from ..session_keys import is_group
from ..text import flatten
from .commands import BUILTIN_COMMANDS, CommandBook, expand
from .plan import PlanMode
from .roles import Roles, rank

PLAN_SWITCHES = frozenset({"on", "enable", "off", "disable"})
CMD_USAGE = "usage: /cmd list | /cmd add <name> <template…> | /cmd del <name>"
HELP = {
    "stop": "stop the current reply and drop waiting messages",
    "plan": "/plan on|off|status: plan only, no side effects (on/off in groups: admins, trusted)",
    "cmd": "/cmd list|add|del: custom commands (add/del: admins only)",
    "help": "this list",
}


@dataclass(frozen=True)
class Routed:
    """A command's outcome: a direct ``reply``, or the ``prompt`` (and images) to process."""

    reply: str | None = None
    prompt: str | None = None
    images: tuple[str, ...] = ()


class Expansion(Protocol):
    """A server command expanded: the prompt text and the images it carries."""

    @property
    def text(self) -> str:
        """The prompt."""

    @property
    def images(self) -> tuple[str, ...]:
        """Images (data URIs) to attach."""


class ServerCommands(Protocol):
    """Commands named ``<server>:<name>`` that another part provides (MCP prompts)."""

    def listing(self) -> list[str]:
        """``/server:name … — what it does`` lines, sorted, without connecting anything."""

    async def expand(self, name: str, args: str) -> Expansion:
        """The prompt for ``/name args``; raises `UsageError` with the usage on bad input."""


class SlashCommands:
    """Routes ``/name args`` for one Agent."""

    def __init__(
        self,
        *,
        plan: PlanMode,
        book: CommandBook | None,
        is_admin: Callable[[str | None], bool],
        stop: Callable[[str], bool],
        roles: Roles | None = None,
    ) -> None:
        self.plan = plan
        self.book = book
        self.is_admin = is_admin
        self.stop = stop
        self.roles = roles
        self._builtins: dict[str, Callable[[str, str, str | None], Awaitable[str]]] = {
            "stop": self._stop,
            "plan": self._plan,
            "cmd": self._cmd,
            "help": self._help,
        }
        self._help_texts = dict(HELP)
        self.server_commands: ServerCommands | None = None  # MCP prompts, set by the Agent

    def register(
        self,
        name: str,
        handler: Callable[[str, str, str | None], Awaitable[str]],
        help_text: str,
    ) -> None:
        """Answer ``/name`` with ``handler(session, args, sender)`` (e.g. the clock's /clock)."""
        self._builtins[name] = handler
        self._help_texts[name] = help_text

    async def route(self, session: str, name: str, args: str, sender: str | None) -> Routed:
        """Answer a built-in, expand a custom command, or explain an unknown one."""
        if ":" in name:
            return await self._server_command(name, args)
        handler = self._builtins.get(name)
        if handler is not None:
            return Routed(reply=await handler(session, args, sender))
        if name in BUILTIN_COMMANDS:
            return Routed(reply=f"/{name} is not available in this agent.")
        custom = await self.book.all() if self.book is not None else {}
        if name in custom:
            return Routed(prompt=expand(custom[name], args))
        return Routed(reply=f"Unknown command /{name}.\n" + await self._help(session, "", sender))

    async def _server_command(self, name: str, args: str) -> Routed:
        if self.server_commands is None:
            return Routed(reply=f"/{name}: no MCP servers are configured, so there are no prompts.")
        try:
            expanded = await self.server_commands.expand(name, args)
        except UsageError as exc:
            return Routed(reply=str(exc))
        return Routed(prompt=expanded.text, images=tuple(expanded.images))

    async def _stop(self, session: str, args: str, sender: str | None) -> str:
        return "Stopped the reply." if self.stop(session) else "Nothing is running."

    async def _plan(self, session: str, args: str, sender: str | None) -> str:
        action = args.strip().lower()
        if action in PLAN_SWITCHES and is_group(session) and self.roles is not None:
            role = self.roles.role_of(session, sender)
            if rank(role) < rank("trusted"):
                return f"/plan {action} is for admins and trusted users in a group."
        await self.plan.load(session)  # what another replica switched
        answer = self.plan.command(session, args)
        await self.plan.save(session)  # so every replica's next turn and call sees it
        return answer

    async def _help(self, session: str, args: str, sender: str | None) -> str:
        lines = ["Commands:", *(f"/{name} — {text}" for name, text in self._help_texts.items())]
        custom = await self.book.all() if self.book is not None else {}
        lines += [f"/{name} — {_preview(t)}" for name, t in sorted(custom.items())]
        prompts = self.server_commands.listing() if self.server_commands is not None else []
        if prompts:
            lines += ["MCP prompts (arguments by position or name=value):", *prompts]
        return "\n".join(lines)

    async def _cmd(self, session: str, args: str, sender: str | None) -> str:
        if self.book is None:
            return "Custom commands are turned off (commands.enable)."
        action, rest = _split(args)
        action = action.lower()
        if action in ("", "list"):
            custom = await self.book.all()
            if not custom:
                return "No custom commands."
            lines = [f"/{name} — {_preview(t)}" for name, t in sorted(custom.items())]
            return "Custom commands:\n" + "\n".join(lines)
        if action not in ("add", "del", "delete", "rm"):
            return CMD_USAGE
        if not self.is_admin(sender):
            return f"/cmd {action} is for admins only."
        name, template = _split(rest)
        if not name:
            return CMD_USAGE
        try:
            if action == "add":
                if not template:
                    return CMD_USAGE
                added = await self.book.add(name, template)
                return f"Saved /{added}."
            if await self.book.delete(name):
                return f"Deleted /{name.lower()}."
            return f"There is no custom command /{name.lower()}."
        except UsageError as exc:
            return f"Not saved: {exc}"


def _split(text: str) -> tuple[str, str]:
    """First word and the rest (line breaks in the rest kept)."""
    parts = text.split(None, 1)
    return (parts[0], parts[1].strip()) if len(parts) == 2 else (text.strip(), "")


def _preview(template: str) -> str:
    return flatten(template, 60)
