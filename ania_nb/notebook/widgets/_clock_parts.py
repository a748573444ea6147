"""Parts of the clock panel: feed items, task rows and their HTML and plain-text forms.

Nothing here imports ipywidgets at module level, so the plain-text renderings work without a
front end.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ...text import flatten
from ._format import (
    STATUS_ICONS,
    decode_base64,
    download_link,
    duration_text,
    image_format,
    markdown_html,
    size_text,
)

if TYPE_CHECKING:  # pragma: no cover
    from ...clock import ClockTask, TaskLogEntry

ICONS = {**STATUS_ICONS, "skipped": "↷", "interrupted": "■"}
COLORS = {"running": "#1565c0", "success": "#2e7d32", "skipped": "#757575"}
ROW = "padding:2px 4px"


@dataclass
class FeedItem:
    """One result in the feed: a run (by log entry id), or a delivery/media without one."""

    key: str
    task_id: str
    title: str
    target: str
    status: str
    when: float
    text: str = ""  # Markdown: the delivered text, else the logged reply, else the error
    error: str | None = None
    duration_ms: int | None = None
    manual: bool = False
    delivered: bool = False  # the text is the one delivered to the target (not the log's cut)
    media: list[tuple[str, str]] = field(default_factory=list)  # (plain text, html)

    def headline(self) -> str:
        """``✓ success · title (#id) · nb:x · 20:31:05 · 1.2 s``."""
        parts = [f"{ICONS.get(self.status, '?')} {self.status}"]
        name = self.title or "(untitled)"
        parts.append(f"{name} (#{self.task_id})" if self.task_id else name)
        parts.append(self.target)
        parts.append(clock_time(self.when))
        if self.duration_ms is not None and self.status != "running":
            parts.append(duration_text(self.duration_ms))
        if self.manual:
            parts.append("run now")
        return " · ".join(p for p in parts if p)


class TaskRow:
    """One task: its description and the Disable/Enable, Run now and Delete buttons."""

    def __init__(self, task_id: str, act: Callable[[str, str], Any]) -> None:
        """Build the row; ``act(action, task_id)`` runs a button's action (toggle/run/delete)."""
        import ipywidgets as w

        self.task_id = task_id
        self.info = w.HTML(layout=w.Layout(flex="1 1 auto"))
        small = w.Layout(width="auto")
        self.toggle_button = w.Button(description="Disable", layout=small)
        self.run_button = w.Button(description="Run now", icon="play", layout=small)
        self.delete_button = w.Button(description="Delete", icon="trash", layout=small)
        self.toggle_button.on_click(lambda _: act("toggle", task_id))
        self.run_button.on_click(lambda _: act("run_now", task_id))
        self.delete_button.on_click(lambda _: act("delete", task_id))
        self.widget = w.HBox(
            [self.info, self.toggle_button, self.run_button, self.delete_button],
            layout=w.Layout(align_items="center", flex_flow="row wrap"),
        )

    def show(self, task: ClockTask) -> None:
        """Render the task's current state."""
        self.info.value = f'<span style="{ROW}">{task_html(task)}</span>'
        self.toggle_button.description = "Disable" if task.enabled else "Enable"
        self.toggle_button.icon = "pause" if task.enabled else "check"
        self.run_button.disabled = task.last_status == "running"


def entry_key(entry_id: Any) -> str:
    """The feed key of a task-log entry."""
    return f"e{entry_id}"


def creation_key(task: ClockTask) -> tuple[float, int, str]:
    """Sort key for creation order (ids are base 36 of a counter: shorter is older)."""
    return (task.created_at, len(task.id), task.id)


def apply_entry(item: FeedItem, entry: TaskLogEntry) -> None:
    """Copy a log entry's outcome into its feed item (a delivered text wins over the log's)."""
    item.status = entry.status
    item.duration_ms = entry.duration_ms
    item.manual = entry.manual
    item.error = entry.error
    item.title = entry.title or item.title
    if not item.delivered:
        item.text = entry.reply or ""


def clock_time(when: float | None) -> str:
    """Local time of day (today) or date and time (other days); empty for None."""
    if when is None:
        return ""
    moment = datetime.fromtimestamp(when)
    if moment.date() == datetime.now().date():
        return moment.strftime("%H:%M:%S")
    return moment.strftime("%Y-%m-%d %H:%M")


def task_line(task: ClockTask) -> str:
    """``#1 title — @every 2s (once) · next 20:31:05 · last ✓ success · nb:x``."""
    mode = " (once)" if task.run_once else ""
    parts = [f"#{task.id} {task.title or '(untitled)'} — {task.cron}{mode}"]
    if not task.enabled:
        parts.append("disabled")
    elif task.next_run_at is not None:
        parts.append(f"next {clock_time(task.next_run_at)}")
    if task.last_status:
        parts.append(f"last {ICONS.get(task.last_status, '?')} {task.last_status}")
    parts.append(task.target)
    return " · ".join(parts)


def task_html(task: ClockTask) -> str:
    """A task row's description as HTML."""
    title = html.escape(task.title or "(untitled)")
    mode = " (once)" if task.run_once else ""
    schedule = f"<code>{html.escape(task.cron)}</code>{mode}"
    parts = [f"<b>#{html.escape(task.id)} {title}</b>", schedule]
    if not task.enabled:
        parts.append('<span style="color:#757575">disabled</span>')
    elif task.next_run_at is not None:
        parts.append(f"next {clock_time(task.next_run_at)}")
    if task.last_status:
        color = COLORS.get(task.last_status, "#c62828")
        icon = ICONS.get(task.last_status, "?")
        parts.append(f'last <span style="color:{color}">{icon} {task.last_status}</span>')
    parts.append(f"<small>{html.escape(task.target)}</small>")
    content = html.escape(flatten(task.content, 160))
    return " · ".join(parts) + f"<br><small>{content}</small>"


def item_html(item: FeedItem) -> str:
    """A feed item as HTML: headline, the text as Markdown, error, images and files."""
    color = COLORS.get(item.status, "#c62828") if item.status else "#555"
    head = f'<div style="color:{color};font-size:90%">{html.escape(item.headline())}</div>'
    body = markdown_html(item.text) if item.text else ""
    if item.status == "running" and not item.text:
        body = "<i>running…</i>"
    if item.error and not item.delivered:
        body += f'<div style="color:#c62828">{html.escape(item.error)}</div>'
    media = "".join(f"<div>{h}</div>" for _, h in item.media if h)
    style = "border-top:1px solid #eee;padding:4px 2px"
    return f'<div style="{style}">{head}{body}{media}</div>'


def image_media(data: str) -> tuple[str, str]:
    """Plain text and HTML of an image sent as base64, a data: URI or an http(s) URL."""
    if data.startswith(("http://", "https://")):
        return f"[image {data}]", f'<img src="{html.escape(data)}" style="max-width:100%">'
    try:
        raw = decode_base64(data)
    except ValueError as exc:
        return f"(an image could not be shown: {exc})", ""
    fmt = image_format(raw)
    b64 = base64.b64encode(raw).decode("ascii")
    tag = f'<img src="data:image/{fmt};base64,{b64}" style="max-width:100%">'
    return f"[image {fmt}, {size_text(len(raw))}]", tag


def file_media(name: str, data: str) -> tuple[str, str]:
    """Plain text and HTML (a download link) of a file sent as base64."""
    try:
        raw = decode_base64(data)
    except ValueError as exc:
        return f"(the file {name} could not be offered: {exc})", ""
    link = download_link(name, base64.b64encode(raw).decode("ascii"), len(raw))
    return f"[file {name}, {size_text(len(raw))}]", link
