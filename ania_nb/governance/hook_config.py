"""The hooks file: which shell command runs at which event, in either of two forms.

Original form::

    {"hooks": {"PreToolUse": [{"matcher": "bash|file", "command": "./check.sh", "timeout_sec": 5}]}}

Claude Code's settings form::

    {"hooks": {"PreToolUse": [{"matcher": "bash", "hooks": [
        {"type": "command", "command": "./check.sh", "timeout": 5}]}]}}

``matcher`` is a regex searched in the tool name (empty, missing or ``*`` matches everything);
events without a tool match against the empty string, so there a matcher like ``bash`` never
fires. In Claude Code's form a matcher of only letters, digits, ``_`` and ``|`` is a list of
exact names (``Write`` does not fire for ``TodoWrite``), as Claude Code reads it.

A matcher may name a tool by our name or by Claude Code's name where a tool really maps:

=================  ===========================================================
Claude Code        ania-nb
=================  ===========================================================
``Bash``           ``bash``
``Read``           ``file`` (sends a local file), ``local_image`` (shows one)
``WebSearch``      ``webSearch``
``WebFetch``       ``webExplore``
``TodoWrite``      ``todo_write``
=================  ===========================================================

``Write``, ``Edit``, ``MultiEdit``, ``Glob``, ``Grep``, ``Task``, ``NotebookEdit`` have no
equivalent and match nothing (``bash`` can still write files: guard it with a ``Bash`` hook).
``tool_input`` carries our tools' own argument names (``command``, ``path``, ...).

Any invalid entry rejects the whole file (the last good one stays in use).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

HOOK_EVENTS = (
    "SessionStart",
    "UserPromptSubmit",
    "PreToolUse",
    "PostToolUse",
    "Stop",
    "SubagentStop",
    "PreCompact",
)
MAX_TIMEOUT = 60.0

# Our tool -> the Claude Code tool names that mean the same thing (see the module docstring).
CLAUDE_TOOL_NAMES: dict[str, tuple[str, ...]] = {
    "bash": ("Bash",),
    "file": ("Read",),
    "local_image": ("Read",),
    "webSearch": ("WebSearch",),
    "webExplore": ("WebFetch",),
    "todo_write": ("TodoWrite",),
}
_EXACT_NAMES = re.compile(r"[A-Za-z0-9_|]+")

HookTable = dict[str, tuple["ShellHook", ...]]


@dataclass(frozen=True)
class ShellHook:
    """One shell command bound to an event (and, optionally, to tool names)."""

    event: str
    command: str
    matcher: re.Pattern[str] | None = None
    timeout: float | None = None  # None: the configured default
    exact: frozenset[str] | None = None  # Claude Code form: a list of exact tool names

    def matches(self, tool_name: str) -> bool:
        """Whether this hook fires for a call of ``tool_name`` ('' for events without a tool).

        The tool's Claude Code names (`CLAUDE_TOOL_NAMES`) are tried too.
        """
        names = (tool_name, *CLAUDE_TOOL_NAMES.get(tool_name, ()))
        if self.exact is not None:
            return any(name in self.exact for name in names)
        return self.matcher is None or any(self.matcher.search(name) for name in names)

    def effective_timeout(self, default: float) -> float:
        """Seconds this hook may run: its own value or the default, at most 60."""
        return min(self.timeout or default, MAX_TIMEOUT)


def parse_hooks(data: Any) -> HookTable:
    """Compile a decoded hooks file; raises `ValueError` naming the first bad entry."""
    if not isinstance(data, dict) or not isinstance(data.get("hooks", {}), dict):
        raise ValueError('expected an object {"hooks": {"<Event>": [ ... ]}}')
    table: dict[str, list[ShellHook]] = {}
    for event, entries in data.get("hooks", {}).items():
        if event not in HOOK_EVENTS:
            raise ValueError(f"unknown event {event!r}; events are {', '.join(HOOK_EVENTS)}")
        if not isinstance(entries, list):
            raise ValueError(f"hooks.{event} must be a list of entries")
        for i, entry in enumerate(entries, 1):
            table.setdefault(event, []).extend(_entry(event, i, entry))
    return {event: tuple(hooks) for event, hooks in table.items() if hooks}


def _entry(event: str, index: int, entry: Any) -> list[ShellHook]:
    where = f"hooks.{event}[{index}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be an object")
    matcher = _matcher(where, entry.get("matcher"))
    if "hooks" in entry:  # Claude Code form: a matcher with a list of command hooks
        exact = None
        if matcher is not None and _EXACT_NAMES.fullmatch(matcher.pattern):
            exact = frozenset(n for n in matcher.pattern.split("|") if n)
        inner = entry["hooks"]
        if not isinstance(inner, list):
            raise ValueError(f"{where}.hooks must be a list")
        found = []
        for j, item in enumerate(inner, 1):
            if not isinstance(item, dict):
                raise ValueError(f"{where}.hooks[{j}] must be an object")
            kind = item.get("type", "command")
            if kind != "command":
                raise ValueError(f"{where}.hooks[{j}]: only type 'command' is supported")
            hook = _hook(f"{where}.hooks[{j}]", event, matcher, item)
            if hook is not None:
                found.append(replace(hook, exact=exact))
        return found
    hook = _hook(where, event, matcher, entry)
    return [hook] if hook is not None else []


def _hook(
    where: str, event: str, matcher: re.Pattern[str] | None, item: dict[str, Any]
) -> ShellHook | None:
    command = item.get("command", "")
    if not isinstance(command, str):
        raise ValueError(f"{where}.command must be a string")
    if not command.strip():
        return None  # blank commands are skipped, as in the original
    raw = item.get("timeout_sec", item.get("timeout"))
    if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int | float)):
        raise ValueError(f"{where}: timeout must be a number of seconds, got {raw!r}")
    timeout = float(raw) if raw is not None and raw > 0 else None
    return ShellHook(event, command, matcher, timeout)


def _matcher(where: str, raw: Any) -> re.Pattern[str] | None:
    if raw is None or raw == "" or raw == "*":
        return None
    if not isinstance(raw, str):
        raise ValueError(f"{where}.matcher must be a string (a regex), got {raw!r}")
    try:
        return re.compile(raw)
    except re.error as exc:
        raise ValueError(f"{where}.matcher {raw!r} is not a valid regex: {exc}") from None
