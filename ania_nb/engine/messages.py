"""Chat messages as plain OpenAI-format dicts, and the small pure functions around them."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

Message = dict[str, Any]  # one chat message in OpenAI form: role, content, tool_calls, …

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)

LIMIT_MESSAGE = (
    "<system>You have reached the limit of consecutive tool calls for this request. Answer the "
    "user now with what you have gathered. If you need more tool calls, ask the user first; "
    "their next message resets the limit.</system>"
)

EMPTY_REPLY_MESSAGE = (
    "<system>Your last reply was empty. Answer the user now in plain text, using what the "
    "conversation and the tool results above already tell you.</system>"
)

SUMMARY_PREFIX = "Summary of the earlier conversation:\n"


def strip_think(text: str | None) -> str:
    """Remove ``<think>…</think>`` blocks (reasoning some models inline) and trim."""
    if not text:
        return ""
    return _THINK.sub("", text).strip()


def image_hash(url: str) -> str:
    """Short stable label of an image: the first 8 hex digits of SHA-256 of its URL/data URI."""
    return hashlib.sha256(url.encode("utf-8")).hexdigest()[:8]


def image_marker(url: str) -> str:
    """The text that stands for an image in stored history and in labels: ``[image <hash8>]``."""
    return f"[image {image_hash(url)}]"


def user_message(text: str, images: Sequence[str] = ()) -> Message:
    """A user message; with images, a multi-part content whose images are labelled by marker."""
    if not images:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    for url in images:
        parts.append({"type": "text", "text": image_marker(url)})
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"role": "user", "content": parts}


def timestamped(text: str, now: datetime | None = None) -> str:
    """Prefix the user's text with the local time, so the model knows when it was said."""
    stamp = (now or datetime.now().astimezone()).isoformat(timespec="seconds")
    return f"[{stamp}] {text}"


def for_storage(message: Message) -> Message:
    """Copy of a message fit for the store: image parts become ``[image <hash8>]`` text."""
    content = message.get("content")
    if not isinstance(content, list):
        return dict(message)
    texts: list[str] = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            texts.append(part.get("text", ""))
        elif kind == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            marker = image_marker(url)
            if not texts or texts[-1] != marker:  # already labelled by user_message()
                texts.append(marker)
        else:
            texts.append(f"[{kind}]")
    return {**message, "content": "\n".join(texts)}


def text_of(message: Message) -> str:
    """The text content of a message (parts joined), '' when none."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
    return ""


def count_images(message: Message) -> int:
    """Number of image parts in a message."""
    content = message.get("content")
    if not isinstance(content, list):
        return 0
    return sum(1 for p in content if p.get("type") == "image_url")


def estimate_tokens(messages: Iterable[Message]) -> int:
    """Rough prompt size when no usage was reported yet: characters / 2, plus 1000 per image."""
    chars = 0
    images = 0
    for msg in messages:
        chars += len(text_of(msg)) + len(msg.get("reasoning_content") or "")
        for call in msg.get("tool_calls") or ():
            fn = call.get("function", {})
            chars += len(fn.get("name", "")) + len(fn.get("arguments", ""))
        images += count_images(msg)
    return chars // 2 + 1000 * images


def tool_call_ids(message: Message) -> list[str]:
    """The ids of the tool calls an assistant message made."""
    return [c["id"] for c in message.get("tool_calls") or ()]


def align_to_turn_start(messages: list[Message]) -> list[Message]:
    """Drop leading messages until the list starts on a clean boundary (no orphan tool results)."""
    start = 0
    while start < len(messages) and messages[start].get("role") == "tool":
        start += 1
    return messages[start:]


def drop_oldest_half(messages: list[Message]) -> list[Message]:
    """Keep the newest half (at least one message), never starting on an orphan tool result."""
    if not messages:
        return []
    keep = max(1, len(messages) // 2)
    return align_to_turn_start(messages[len(messages) - keep :])


def render_transcript(messages: Iterable[Message]) -> str:
    """Plain transcript for the summariser: tool traffic is skipped, roles named."""
    names = {"user": "User", "assistant": "Assistant", "system": "System"}
    lines = []
    for msg in messages:
        role = msg.get("role")
        if role not in names or msg.get("tool_calls"):
            continue
        text = text_of(msg).strip()
        if text:
            lines.append(f"[{names[role]}]: {text}")
    return "\n".join(lines)


def dumps(value: Any) -> str:
    """Compact JSON used for arguments and records."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
