"""``@server:uri`` in a user message: the resource is read and attached, as Claude Code does.

A mention is ``@`` (at the start or after white space), a configured server's name, ``:`` and
the resource URI up to the next white space (trailing punctuation is not part of it). Each
resource read is appended to the message under an ``[attached resource …]`` line: text cut at
`MENTION_CHARS` (all mentions together at most ``mcp.max_result_chars``), images attached to
the message, binary content described. At most `MAX_MENTIONS` per message are read; a
mention that cannot be read is attached as a one-line note saying why, so the model (and the
person) know. Words that merely look like mentions (``@alice:``, an unknown server) are left
alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ania_nb.engine.untrusted import untrusted
from ania_nb.errors import ToolError
from ania_nb.mcp.results import MAX_IMAGES, convert_contents

if TYPE_CHECKING:
    from ania_nb.mcp.registry import MCPRegistry

__all__ = ["MAX_MENTIONS", "MENTION_CHARS", "Attached", "attach_mentions", "find_mentions"]

MAX_MENTIONS = 5
MENTION_CHARS = 4000  # of one resource's text
_MENTION = re.compile(r"(?<!\S)@([A-Za-z0-9_-]{1,64}):(\S+)")
_TRAILING = ".,;:!?)]}'\""


@dataclass(frozen=True)
class Attached:
    """A message with its mentioned resources attached."""

    text: str
    images: tuple[str, ...] = ()
    mentions: int = 0


def find_mentions(text: str, servers: set[str]) -> list[tuple[str, str]]:
    """``(server, uri)`` of each distinct mention of one of ``servers``, in order."""
    found: list[tuple[str, str]] = []
    for match in _MENTION.finditer(text):
        server, uri = match.group(1), match.group(2).rstrip(_TRAILING)
        if server in servers and uri and (server, uri) not in found:
            found.append((server, uri))
    return found


async def attach_mentions(registry: MCPRegistry, text: str) -> Attached:
    """``text`` with every ``@server:uri`` of a server offering resources read and attached."""
    if "@" not in text:
        return Attached(text)
    servers = {
        s.name
        for s in registry.servers()
        if (m := registry.get(s.name)) is not None and m.has_resources
    }
    mentions = find_mentions(text, servers)
    if not mentions:
        return Attached(text)
    total = registry.settings.max_result_chars
    left = total
    blocks: list[str] = []
    images: list[str] = []
    for index, (server, uri) in enumerate(mentions):
        head = f"[attached resource @{server}:{uri}"
        if index >= MAX_MENTIONS:
            blocks.append(f"{head}: not read, at most {MAX_MENTIONS} resources per message]")
            continue
        if left <= 0:
            blocks.append(f"{head}: not read, the attachments reached {total} characters]")
            continue
        manager = registry.get(server)
        assert manager is not None
        try:
            result = await manager.read_resource(uri)
        except ToolError as exc:
            blocks.append(f"{head}: could not be read: {exc}]")
            continue
        output = convert_contents(result.contents, min(MENTION_CHARS, left))
        left -= len(output.text)
        images += output.images[: MAX_IMAGES - len(images)]
        body = untrusted(output.text) if output.text else "(no text)"
        blocks.append(f"{head}]\n{body}")
    return Attached(f"{text}\n\n" + "\n\n".join(blocks), tuple(images), len(mentions))
