"""Text helpers shared by the widgets: Markdown to HTML, previews, sizes, tokens, media types.

Nothing here imports ipywidgets, so the plain-text renderings work without a front end.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import mimetypes
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import cache
from typing import Any

from ...text import cut, flatten

# Plain-text glyphs, all in DejaVu Sans (no emoji font needed); HTML uses `_icons` SVGs.
STATUS_ICONS = {
    "running": "◐",
    "success": "✓",
    "finished": "⚠",  # a success with calls that were denied, blocked or failed
    "stopped": "■",
    "timeout": "◷",
    "error": "✗",
    "interrupted": "■",
    "denied": "⊘",
}
TODO_ICONS = {"pending": "○", "in_progress": "◐", "completed": "●"}
_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"<svg", "svg+xml"),
    (b"<?xml", "svg+xml"),
)


def brief_arguments(arguments: str, limit: int = 60) -> str:
    """Tool arguments for a one-line title: ``code=totals = {} …(4 lines)`` (strings decoded)."""
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except (TypeError, ValueError):
        return flatten(arguments, limit)
    if not isinstance(parsed, dict):
        return flatten(arguments, limit)
    parts = [f"{key}={_brief_value(value)}" for key, value in parsed.items()]
    return flatten(", ".join(parts), limit)


def _brief_value(value: Any) -> str:
    """A value for a one-line title: code is its first line and its line count, not flattened."""
    if not isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    lines = [line for line in value.split("\n") if line.strip()]
    if len(lines) < 2:
        return value
    return f"{cut(lines[0].strip(), 40)} …({len(value.split(chr(10)))} lines)"


def pre(text: str) -> str:
    """Escaped text in a wrapping ``<pre>`` block."""
    style = "white-space:pre-wrap;word-break:break-word;margin:2px 0"
    return f'<pre style="{style}">{html.escape(text)}</pre>'


@cache
def _renderer() -> Callable[[str], str]:
    """The best Markdown renderer installed: mistune, Python-Markdown, or escaped <pre>."""
    try:
        import mistune  # comes with nbconvert (so with JupyterLab)

        # escape=True: model output must not inject raw HTML or scripts into the page.
        md = mistune.create_markdown(escape=True, plugins=["strikethrough", "table"])
        return lambda text: str(md(text))
    except ImportError:
        pass
    try:
        import markdown

        # Python-Markdown passes raw HTML through, so escape it first (entities in code spans
        # then show literally — acceptable for a fallback).
        return lambda text: markdown.markdown(
            html.escape(text, quote=False), extensions=["fenced_code", "tables"]
        )
    except ImportError:
        return pre


def markdown_html(text: str) -> str:
    """Markdown rendered to safe HTML (raw HTML in the text is escaped)."""
    return _renderer()(text) if text else ""


def size_text(n: int) -> str:
    """A byte count for people: 512 B, 1.2 kB, 3.4 MB."""
    if n < 1000:
        return f"{n} B"
    if n < 1_000_000:
        return f"{n / 1000:.1f} kB"
    return f"{n / 1_000_000:.1f} MB"


def elapsed_text(seconds: float) -> str:
    """Elapsed time: 0.4 s, 12.3 s, 2 m 05 s."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} m {secs:02d} s"


def duration_text(ms: int | None) -> str:
    """A duration in milliseconds for a table cell ("" when unknown)."""
    if ms is None:
        return ""
    return f"{ms} ms" if ms < 1000 else elapsed_text(ms / 1000)


def usage_text(usage: Mapping[str, Any]) -> str:
    """Token usage on one line: ``1,234 tokens (in 1,000 · cached 512 · out 234) · 2 LLM calls``."""
    total = int(usage.get("total_tokens", 0) or 0)
    if not total and not usage.get("iterations"):
        return ""
    prompt = int(usage.get("prompt_tokens", 0) or 0)
    cached = int(usage.get("cached_tokens", 0) or 0)
    completion = int(usage.get("completion_tokens", 0) or 0)
    text = f"{total:,} tokens (in {prompt:,} · cached {cached:,} · out {completion:,})"
    calls = int(usage.get("iterations", 0) or 0)
    if calls:
        text += f" · {plural(calls, 'LLM call')}"
    return text


def plural(n: int, word: str) -> str:
    """``1 call``, ``2 calls``."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def decode_base64(data: str) -> bytes:
    """Bytes of base64 text (a ``data:…;base64,`` prefix is accepted); ValueError when invalid."""
    if data.startswith("data:") and "," in data:
        data = data.split(",", 1)[1]
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not valid base64 data: {exc}") from None


def image_format(data: bytes) -> str:
    """The image subtype from the magic bytes (png, jpeg, gif, webp, svg+xml), png if unknown."""
    for magic, fmt in _IMAGE_MAGIC:
        if data.startswith(magic):
            return fmt
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return "png"


def download_link(name: str, data_b64: str, size: int) -> str:
    """An ``<a download>`` link carrying the file as a data: URI."""
    mime = mimetypes.guess_type(name)[0] or "application/octet-stream"
    href = f"data:{mime};base64,{data_b64}"
    from ._icons import icon

    label = icon("download", label="download") + html.escape(f" {name} ({size_text(size)})")
    return f'<a download="{html.escape(name)}" href="{href}">{label}</a>'


def clock_time(when: float | None) -> str:
    """Local time of day (today) or date and time (other days); empty for None."""
    if when is None:
        return ""
    moment = datetime.fromtimestamp(when)
    if moment.date() == datetime.now().date():
        return moment.strftime("%H:%M:%S")
    return moment.strftime("%Y-%m-%d %H:%M")
