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

from ..catalogue import CATALOGUE, Language, say
from ..errors import UsageError
from ..session_keys import is_group
from ..text import flatten
from .commands import BUILTIN_COMMANDS, CommandBook, expand
from .plan import PlanMode
from .roles import Roles, rank

PLAN_SWITCHES = frozenset({"on", "enable", "off", "disable"})
CMD_USAGE = say("command.cmd_usage", "en")
HELP = {name: say(f"help.{name}", "en") for name in ("stop", "plan", "cmd", "help")}


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
        language: Callable[[str], Language] | None = None,
    ) -> None:
        self.plan = plan
        self.book = book
        self.is_admin = is_admin
        self.stop = stop
        self.roles = roles
        # The language of a session's replies (`ania_nb.catalogue`); built-ins only so far.
        self.language = language or (lambda session: "en")
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
        lang = self.language(session)
        if ":" in name:
            return await self._server_command(name, args, lang)
        handler = self._builtins.get(name)
        if handler is not None:
            return Routed(reply=await handler(session, args, sender))
        if name in BUILTIN_COMMANDS:
            return Routed(reply=say("command.not_available", lang, name=name))
        custom = await self.book.all() if self.book is not None else {}
        if name in custom:
            return Routed(prompt=expand(custom[name], args))
        unknown = say("command.unknown", lang, name=name)
        return Routed(reply=f"{unknown}\n" + await self._help(session, "", sender))

    async def _server_command(self, name: str, args: str, lang: Language) -> Routed:
        if self.server_commands is None:
            return Routed(reply=say("command.no_prompts", lang, name=name))
        try:
            expanded = await self.server_commands.expand(name, args)
        except UsageError as exc:
            return Routed(reply=str(exc))
        return Routed(prompt=expanded.text, images=tuple(expanded.images))

    async def _stop(self, session: str, args: str, sender: str | None) -> str:
        key = "command.stopped" if self.stop(session) else "command.nothing_running"
        return say(key, self.language(session))

    async def _plan(self, session: str, args: str, sender: str | None) -> str:
        action = args.strip().lower()
        if action in PLAN_SWITCHES and is_group(session) and self.roles is not None:
            role = self.roles.role_of(session, sender)
            if rank(role) < rank("trusted"):
                return say("command.plan_rank", self.language(session), action=action)
        await self.plan.load(session)  # what another replica switched
        answer = self.plan.command(session, args, self.language(session))
        await self.plan.save(session)  # so every replica's next turn and call sees it
        return answer

    async def _help(self, session: str, args: str, sender: str | None) -> str:
        lang = self.language(session)
        lines = [say("command.help_title", lang)]
        for name, text in self._help_texts.items():
            # A registered command's help in the session's language when the catalogue has it.
            key = f"help.{name}"
            lines.append(f"/{name} — {say(key, lang) if key in CATALOGUE else text}")
        custom = await self.book.all() if self.book is not None else {}
        lines += [f"/{name} — {_preview(t)}" for name, t in sorted(custom.items())]
        prompts = self.server_commands.listing() if self.server_commands is not None else []
        if prompts:
            lines += [say("command.help_prompts", lang), *prompts]
        return "\n".join(lines)

    async def _cmd(self, session: str, args: str, sender: str | None) -> str:
        lang = self.language(session)
        if self.book is None:
            return say("command.cmd_off", lang)
        usage = say("command.cmd_usage", lang)
        action, rest = _split(args)
        action = action.lower()
        if action in ("", "list"):
            custom = await self.book.all()
            if not custom:
                return say("command.cmd_none", lang)
            lines = [f"/{name} — {_preview(t)}" for name, t in sorted(custom.items())]
            return say("command.cmd_list", lang) + "\n" + "\n".join(lines)
        if action not in ("add", "del", "delete", "rm"):
            return usage
        if not self.is_admin(sender):
            return say("command.cmd_admin", lang, action=action)
        name, template = _split(rest)
        if not name:
            return usage
        try:
            if action == "add":
                if not template:
                    return usage
                added = await self.book.add(name, template)
                return say("command.cmd_saved", lang, name=added)
            if await self.book.delete(name):
                return say("command.cmd_deleted", lang, name=name.lower())
            return say("command.cmd_missing", lang, name=name.lower())
        except UsageError as exc:
            return say("command.cmd_not_saved", lang, reason=exc)


def _split(text: str) -> tuple[str, str]:
    """First word and the rest (line breaks in the rest kept)."""
    parts = text.split(None, 1)
    return (parts[0], parts[1].strip()) if len(parts) == 2 else (text.strip(), "")


def _preview(template: str) -> str:
    return flatten(template, 60)
