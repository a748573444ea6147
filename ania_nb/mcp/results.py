"""What an MCP tool returned, made fit for the model: text, images to show, the rest described.

A ``CallToolResult`` holds content blocks of several kinds. Text (and text resources) reach the
model as text; images (image blocks and image blob resources) are returned as data URIs so the
tool can show them like ``load_images`` does; audio and other binary content cannot be passed on
and is described in one line each instead of being dropped without a word.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from ania_nb.text import cut

__all__ = [
    "MAX_IMAGES",
    "TRUNCATION_MARKER",
    "ToolOutput",
    "convert_blocks",
    "convert_contents",
    "convert_result",
    "read_tool_name",
]

TRUNCATION_MARKER = "\n...(MCP tool result truncated"
MAX_IMAGES = 4  # per result: a screenshot tool's output, not a photo album
MAX_IMAGE_BYTES = 5 * 1024 * 1024  # what vision endpoints commonly accept per image
_IMAGE_MIME = ("image/png", "image/jpeg", "image/gif", "image/webp")


@dataclass(frozen=True)
class ToolOutput:
    """An MCP tool's result: the text for the model and the images it returned (data URIs)."""

    text: str
    images: list[str] = field(default_factory=list)


def read_tool_name(server: str) -> str:
    """``mcp_read_<server>``: the tool that reads a server's resources."""
    return f"mcp_read_{server}"[:64]


def convert_result(result: Any, limit: int, reader: str | None = None) -> ToolOutput:
    """Convert a ``CallToolResult``; the text is truncated at ``limit`` characters.

    ``reader`` (the server's ``mcp_read_<server>`` tool, when it has one) is named in the line
    shown for each resource link, so the model knows how to open it.
    """
    return convert_blocks(result.content, limit, result.structured_content, reader)


def convert_blocks(
    blocks: Any, limit: int, structured: Any = None, reader: str | None = None
) -> ToolOutput:
    """Convert MCP content blocks (a tool result's, a prompt message's); text cut at ``limit``.

    ``structured`` (a tool's ``structuredContent``) stands in as JSON when nothing else came.
    """
    parts: list[str] = []
    images: list[str] = []
    for block in blocks:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource_link":
            parts.append(_link(block, reader))
        elif kind == "resource":
            _contents(parts, images, block.resource, labelled=True)
        elif kind in ("image", "audio"):
            _binary(parts, images, kind, block.mime_type, block.data, None)
    if not parts and not images and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False, sort_keys=True))
    return _output(parts, images, limit)


def convert_contents(contents: Any, limit: int) -> ToolOutput:
    """Convert a ``ReadResourceResult``'s contents (text kept, images shown, binary described)."""
    parts: list[str] = []
    images: list[str] = []
    many = len(contents) > 1
    for inner in contents:
        _contents(parts, images, inner, labelled=many)
    return _output(parts, images, limit)


def _output(parts: list[str], images: list[str], limit: int) -> ToolOutput:
    text = "\n".join(parts)
    text = cut(text, limit, marker=f"{TRUNCATION_MARKER}: {len(text)} characters in total)")
    return ToolOutput(text, images)


def _contents(parts: list[str], images: list[str], inner: Any, *, labelled: bool) -> None:
    """One resource's contents: its text (after a ``[resource <uri>]`` line), or binary."""
    if hasattr(inner, "text"):
        mime = f" ({inner.mime_type})" if inner.mime_type else ""
        parts.append(f"[resource {inner.uri}{mime}]\n{inner.text}" if labelled else inner.text)
    else:
        _binary(parts, images, "resource", inner.mime_type, inner.blob, str(inner.uri))


def _link(block: Any, reader: str | None) -> str:
    """A resource link as one line: where it points, what it is, how to read it."""
    about = [str(x) for x in (block.name, block.mime_type) if x]
    if block.size is not None:
        about.append(_human(int(block.size)))
    what = f" ({', '.join(about)})" if about else ""
    description = f": {' '.join(str(block.description).split())}" if block.description else ""
    how = f"; read it with {reader}(uri=...)" if reader else ""
    return f"[resource link: {block.uri}{what}{description}{how}]"


def _binary(
    parts: list[str], images: list[str], kind: str, mime: str | None, data: str, uri: str | None
) -> None:
    """An image goes to ``images`` (when it can be shown); anything else is described."""
    mime = (mime or "").lower() or "application/octet-stream"
    size = _decoded_size(data)
    where = f" {uri}" if uri else ""
    if size is None:
        parts.append(f"[{kind}{where} ({mime}): the server sent data that is not valid base64]")
        return
    described = f"{mime}, {_human(size)}"
    if mime in _IMAGE_MIME and kind in ("image", "resource"):
        if len(images) >= MAX_IMAGES:
            parts.append(f"[image{where} ({described}) not shown: at most {MAX_IMAGES} per result]")
        elif size > MAX_IMAGE_BYTES:
            limit = _human(MAX_IMAGE_BYTES)
            parts.append(f"[image{where} ({described}) not shown: larger than {limit}]")
        else:
            images.append(f"data:{mime};base64,{data}")
        return
    what = "audio" if kind == "audio" or mime.startswith("audio/") else f"binary {kind}"
    parts.append(f"[{what}{where} ({described}) returned by the tool; it cannot be shown here]")


def _decoded_size(data: str) -> int | None:
    try:
        return len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return None


def _human(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KB"
    return f"{size / (1024 * 1024):.1f} MB"
