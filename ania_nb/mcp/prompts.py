"""MCP prompts as slash commands: ``/<server>:<prompt> args…`` in chat and in ``%%agent``.

Each connected server's prompts (``prompts/list``, read when the server connects) become
commands. Arguments are given by position (in the order the server declares them; the last
one takes any remaining words) or as ``name=value``; quotes group words (``city="New York"``).
A missing required argument, an unknown ``name=`` or too many words gets the prompt's usage
line. The server's answer (``prompts/get``) is turned into one prompt text — text as it is,
images attached, embedded resources inlined, binary content described — that then goes
through the normal chat path, as a custom command's expansion does.

Listing never connects anything: it shows what connected servers listed (in lazy mode a
server still connecting simply has no commands yet). Using a command of a lost server
reconnects it like a tool call would.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ania_nb.engine.untrusted import untrusted
from ania_nb.errors import ToolError, UsageError
from ania_nb.mcp.results import MAX_IMAGES, convert_blocks
from ania_nb.mcp.transport import RemotePrompt
from ania_nb.text import cut, flatten

if TYPE_CHECKING:
    from ania_nb.mcp.manager import MCPToolManager
    from ania_nb.mcp.registry import MCPRegistry

__all__ = ["ExpandedPrompt", "MCPPrompts", "bind_arguments", "prompt_usage"]

PROMPT_TRUNCATED = "\n...(MCP prompt truncated"
_DESCRIPTION_CHARS = 80  # of a prompt's description in a listing line


@dataclass(frozen=True)
class ExpandedPrompt:
    """A prompt's messages as one user prompt: the text and the images it carries."""

    text: str
    images: tuple[str, ...] = ()


def prompt_usage(server: str, prompt: RemotePrompt) -> str:
    """``/server:prompt <required> [optional]`` with each argument's description."""
    words = [f"<{a.name}>" if a.required else f"[{a.name}]" for a in prompt.arguments]
    line = " ".join([f"/{server}:{prompt.name}", *words])
    described = [f"  {a.name}: {a.description}" for a in prompt.arguments if a.description]
    return "\n".join([f"usage: {line}", *described])


def bind_arguments(server: str, prompt: RemotePrompt, args: str) -> dict[str, str]:
    """The arguments of ``/server:prompt args`` by name; raises `UsageError` with the usage."""
    declared = [a.name for a in prompt.arguments]
    usage = prompt_usage(server, prompt)
    try:
        words = shlex.split(args)
    except ValueError as exc:  # an unbalanced quote
        raise UsageError(f"/{server}:{prompt.name}: {exc}\n{usage}") from None
    named: dict[str, str] = {}
    positional: list[str] = []
    for word in words:
        key, sep, value = word.partition("=")
        if sep and key in declared:
            if key in named:
                raise UsageError(f"/{server}:{prompt.name}: {key}= is given twice\n{usage}")
            named[key] = value
        else:
            positional.append(word)  # also "a=b" when "a" is no argument: a value with '='
    open_slots = [name for name in declared if name not in named]
    if positional and not open_slots:
        what = "takes no arguments" if not declared else "has no argument left for"
        raise UsageError(f"/{server}:{prompt.name} {what} {' '.join(positional)!r}\n{usage}")
    for slot, word in zip(open_slots, positional, strict=False):
        named[slot] = word
    if len(positional) > len(open_slots):  # the last argument takes the remaining words
        last = open_slots[-1]
        named[last] = " ".join(positional[len(open_slots) - 1 :])
    missing = [a.name for a in prompt.arguments if a.required and not named.get(a.name)]
    if missing:
        raise UsageError(f"/{server}:{prompt.name} needs {', '.join(missing)}\n{usage}")
    return {name: named[name] for name in declared if name in named}


def render_messages(messages: Any, limit: int) -> ExpandedPrompt:
    """A ``GetPromptResult``'s messages as one prompt (roles marked when not all are user)."""
    pieces: list[tuple[str, str]] = []
    images: list[str] = []
    for message in messages:
        output = convert_blocks([message.content], limit)
        images.extend(output.images[: MAX_IMAGES - len(images)])
        if output.text:  # the server's words: no chat-template tokens, no forged markers
            pieces.append((str(message.role), untrusted(output.text)))
    if all(role == "user" for role, _ in pieces):
        text = "\n\n".join(body for _, body in pieces)
    else:
        text = "\n\n".join(f"[{role}]\n{body}" for role, body in pieces)
    marker = f"{PROMPT_TRUNCATED}: {len(text)} characters in total)"
    return ExpandedPrompt(cut(text, limit, marker=marker), tuple(images))


class MCPPrompts:
    """The prompts of a registry's servers, listed and expanded as slash commands."""

    def __init__(self, registry: Callable[[], MCPRegistry | None]) -> None:
        """``registry`` returns the current registry (None: MCP is off or not started)."""
        self.registry = registry

    def listing(self) -> list[str]:
        """One line per prompt of every connected server (sorted; connects nothing)."""
        registry = self.registry()
        if registry is None:
            return []
        lines: list[str] = []
        for status in registry.servers():
            manager = registry.get(status.name)
            if manager is not None and manager.state == "connected":
                lines += [_line(status.name, prompt) for prompt in manager.prompts]
        return lines

    async def expand(self, name: str, args: str) -> ExpandedPrompt:
        """Expand ``/server:prompt args``; raises `UsageError` saying what is wrong."""
        server, _, wanted = name.partition(":")
        registry = self.registry()
        manager = registry.get(server) if registry is not None else None
        if manager is None:
            known = sorted(s.name for s in registry.servers()) if registry is not None else []
            raise UsageError(
                f"/{name}: there is no MCP server {server!r}; servers: [{', '.join(known)}]"
            )
        prompt = _find(manager, wanted)
        if prompt is None and manager.state != "connected":
            try:
                await manager.ready()  # a lost server: reconnect it, as a tool call would
            except ToolError as exc:
                raise UsageError(f"/{name}: {exc}") from None
            prompt = _find(manager, wanted)
        if prompt is None:
            offered = ", ".join(f"/{server}:{p.name}" for p in manager.prompts) or "none"
            raise UsageError(
                f"/{name}: MCP server {server!r} has no prompt {wanted!r}; its prompts: {offered}"
            )
        arguments = bind_arguments(server, prompt, args)
        try:
            result = await manager.request(
                f"prompts/get {prompt.name!r}",
                lambda session: session.get_prompt(prompt.name, arguments),
            )
        except ToolError as exc:
            raise UsageError(f"/{server}:{prompt.name}: {exc}") from None
        expanded = render_messages(result.messages, manager.settings.max_result_chars)
        if not expanded.text.strip() and not expanded.images:
            raise UsageError(f"/{server}:{prompt.name}: the server returned an empty prompt")
        return expanded


def _find(manager: MCPToolManager, wanted: str) -> RemotePrompt | None:
    """The prompt named ``wanted`` (exactly, else the one that matches ignoring case)."""
    prompts = manager.prompts if manager.state == "connected" else []
    exact = next((p for p in prompts if p.name == wanted), None)
    if exact is not None:
        return exact
    folded = [p for p in prompts if p.name.lower() == wanted.lower()]
    return folded[0] if len(folded) == 1 else None


def _line(server: str, prompt: RemotePrompt) -> str:
    words = [f"<{a.name}>" if a.required else f"[{a.name}]" for a in prompt.arguments]
    head = " ".join([f"/{server}:{prompt.name}", *words])
    about = flatten(prompt.description, _DESCRIPTION_CHARS) if prompt.description else "MCP prompt"
    return f"{head} — {about}"
