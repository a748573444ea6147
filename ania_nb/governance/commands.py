"""Custom slash commands: ``/name args`` becomes a prompt from the commands file.

The file is ``{"commands": {"<name>": "<prompt template>"}}``, re-read within 5 s of an edit.
A template's ``$args`` is replaced by the arguments; without ``$args`` they are appended on a new
line. Names match ``^[a-zA-Z][a-zA-Z0-9_-]{0,31}$`` (case-insensitive) and never shadow a
built-in command. Any bad entry rejects the whole file and the last good set stays in use.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from ..errors import UsageError
from ._files import WatchedJSON, read_text, write_atomic

NAME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9_-]{0,31}$")
# An MCP prompt: a server name (the MCP config's rule), ':', a prompt name (not a path or URL).
SERVER_COMMAND_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}:[A-Za-z0-9_.-][^\s/:]{0,127}$")
BUILTIN_COMMANDS = frozenset(
    {
        "clock",
        "quota",
        "stop",
        "plan",
        "cmd",
        "help",
        "reboot",
        "exit",
        "news",
        "explore",
        "close",
        "enable",
    }
)
MAX_TEMPLATE_CHARS = 2000

Commands = dict[str, str]


def parse_slash(text: str) -> tuple[str, str] | None:
    """``(name, args)`` of a message that is a command (``/name …``), else None.

    A first word that is no valid command name (``/usr/bin/env``, ``/ ``) is ordinary text.
    ``/<server>:<prompt>`` (an MCP server's prompt) is a command too, its name kept as typed.
    The arguments are the rest of the message, trimmed (line breaks kept).
    """
    stripped = text.strip()
    match = re.match(r"/(\S+)(.*)", stripped, re.DOTALL)
    if match is None:
        return None
    if SERVER_COMMAND_RE.match(match.group(1)):  # /<server>:<prompt>: names kept as typed
        return match.group(1), match.group(2).strip()
    if not NAME_RE.match(match.group(1)):
        return None
    return match.group(1).lower(), match.group(2).strip()


def check_name(raw: str) -> str:
    """The normalised (lower-case) name; raises `ValueError` when it cannot be a command."""
    name = raw.strip().lower()
    if not NAME_RE.match(name):
        raise ValueError(
            f"command name {raw!r} is invalid: use a letter, then up to 31 letters, digits, "
            "'_' or '-'"
        )
    if name in BUILTIN_COMMANDS:
        raise ValueError(f"/{name} is a built-in command and cannot be redefined")
    return name


def check_template(name: str, template: object) -> str:
    """A usable template; raises `ValueError` otherwise."""
    if not isinstance(template, str) or not template.strip():
        raise ValueError(f"/{name}: the template must be a non-empty string")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise ValueError(
            f"/{name}: the template has {len(template)} characters (at most {MAX_TEMPLATE_CHARS})"
        )
    return template


def parse_commands(data: object) -> Commands:
    """Validate a decoded commands file; raises `ValueError` naming the first bad entry."""
    if not isinstance(data, dict) or not isinstance(data.get("commands", {}), dict):
        raise ValueError('expected an object {"commands": {"<name>": "<template>"}}')
    commands: Commands = {}
    for raw, template in data.get("commands", {}).items():
        name = check_name(raw)
        if name in commands:
            raise ValueError(f"/{name} is defined twice (names are case-insensitive)")
        commands[name] = check_template(name, template)
    return commands


def expand(template: str, args: str) -> str:
    """The prompt for ``/name args``."""
    if "$args" in template:
        return template.replace("$args", args)
    return f"{template}\n{args}" if args else template


class CommandBook:
    """The custom commands of one commands file, with admin edits written back atomically."""

    def __init__(self, path: Path) -> None:
        self.file: WatchedJSON[Commands] = WatchedJSON(
            path, parse_commands, {}, what="commands file"
        )
        self._write_lock = asyncio.Lock()

    async def all(self) -> Commands:
        """Current commands, by name."""
        return dict(await self.file.get())

    async def add(self, name: str, template: str) -> str:
        """Define or redefine a command; returns its normalised name."""
        try:
            name = check_name(name)
            template = check_template(name, template)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        async with self._write_lock:
            commands = await self._current()
            commands[name] = template
            await self._save(commands)
        return name

    async def delete(self, name: str) -> bool:
        """Remove a command; False if there was none by that name."""
        async with self._write_lock:
            commands = await self._current()
            if commands.pop(name.strip().lower(), None) is None:
                return False
            await self._save(commands)
        return True

    async def _current(self) -> Commands:
        # Edit what is on disk now; refuse to overwrite a broken file the user is working on.
        raw = await asyncio.to_thread(read_text, self.file.path)
        try:
            return dict(self.file.parse_text(raw))
        except ValueError as exc:
            raise UsageError(
                f"the commands file {str(self.file.path)!r} is invalid ({exc}); fix it first"
            ) from None

    async def _save(self, commands: Commands) -> None:
        text = json.dumps({"commands": commands}, ensure_ascii=False, indent=2) + "\n"
        await write_atomic(self.file.path, text)
        self.file.invalidate()
