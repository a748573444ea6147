"""Nested transcripts of subagent and team calls inside the run widget.

A tool that runs children (``subagent_run``, ``team_run``) emits ``RunEvent("child", …)`` on
the parent's callbacks with ``{"call_id", "child_id", "label", "kind", "data", "background"}``:
``kind`` is an event of the child's own run (``run_start``, ``tool_start``, ``tool_end``,
``usage``, ``assistant_text``, ``text_delta``, ``run_end``) or the tool's ``child_start``
(``{"role", "task"}``) and ``child_end`` (``{"status", "text", "error", "elapsed", "usage"}``).
`ChildrenView` gathers the children of one parent call under its tool row; each child is a
`ChildRow` with status, elapsed time, tokens, its tool rows and its final reply as Markdown.
A background child shows a pending chip that completes when its ``child_end`` arrives — even
after the parent's run has ended — and then the agent's reply to its result (`RunView` hands it
over from the outbox). Everything updates on the loop that delivers the events (plus
a ticker task for the elapsed time while a child runs); ``text()`` renders it as plain text.
"""

from __future__ import annotations

import asyncio
import html
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...text import cut, flatten
from ._format import STATUS_ICONS, elapsed_text, markdown_html, plural, pre
from ._icons import icon
from .tools import ToolRow

__all__ = ["ChildRow", "ChildrenView"]

TICK = 0.5  # seconds between elapsed-time updates of running children
ICONS = {**STATUS_ICONS, "pending": "○"}  # glyphs of common fonts (DejaVu has them)
CHIP_COLORS = {"pending": "#ef6c00", "success": "#2e7d32"}
TASK_CHARS = 2000  # of the child's task shown when its row is expanded


def tokens_text(usage: Mapping[str, Any]) -> str:
    """Short token figure for a row title: ``1,234 tokens · 2 LLM calls`` ("" when none)."""
    total = int(usage.get("total_tokens", 0) or 0)
    calls = int(usage.get("iterations", 0) or 0)
    if not total and not calls:
        return ""
    text = f"{total:,} tokens"
    if calls:
        text += f" · {plural(calls, 'LLM call')}"
    return text


def _indent(text: str, prefix: str) -> list[str]:
    return [prefix + line if line else line for line in text.splitlines()]


class _Note:
    """An intermediate text block of a child (text the model wrote alongside tool calls)."""

    def __init__(self, text: str) -> None:
        import ipywidgets as w

        self.widget = w.HTML(f'<div style="opacity:0.75">{markdown_html(text)}</div>')
        self._text = text

    def html(self) -> str:
        """The note as HTML."""
        return str(self.widget.value)

    def text(self) -> str:
        """Plain-text line."""
        return "  … " + flatten(self._text, 200)


class ChildRow:
    """One child run (a subagent or a team member) as a collapsible row.

    ``status`` is ``running`` (``pending`` for a background child) until the run ends, then the
    child's final status (success, error, timeout, stopped).
    """

    def __init__(self, child_id: str, label: str, background: bool) -> None:
        import ipywidgets as w

        self.id = child_id
        self.label = label or "subagent"
        self.background = background
        self.status = "pending" if background else "running"
        self.ended = False
        self.role = ""
        self.task = ""
        self.usage: dict[str, int] = {}
        self.reply_text = ""  # streamed while running; the full final reply after child_end
        self.error = ""
        self.items: list[Any] = []  # ToolRow and _Note, in order
        self.tool_rows: dict[str, ToolRow] = {}
        self._started = time.monotonic()
        self._elapsed: float | None = None  # the tool's figure, once the child has ended
        self._rendered = 0
        self.followup_title = ""  # a background child: what the agent made of its result
        self.followup = ""

        self.info = w.HTML("")
        self.body = w.VBox([])
        self.reply = w.HTML("")
        self.error_html = w.HTML("")
        panel = w.VBox([self.info, self.body, self.reply, self.error_html])
        # Foreground children start open so their progress is visible live; a background
        # child's chip says enough until someone opens it.
        self.accordion = w.Accordion(
            children=[panel], titles=(self.title(),), selected_index=None if background else 0
        )
        self.chip = w.HTML(self._chip_html())
        self.followup_html = w.HTML("")
        parts = [self.chip, self.accordion, self.followup_html] if background else [self.accordion]
        self.widget = w.VBox(parts)

    @property
    def elapsed(self) -> float:
        """Seconds the child has run (the tool's own figure once it has ended)."""
        if self._elapsed is not None:
            return self._elapsed
        return time.monotonic() - self._started

    def apply(self, kind: str, data: Mapping[str, Any]) -> None:
        """Apply one event of this child."""
        if kind == "child_start":
            self.role = str(data.get("role") or "")
            self.task = str(data.get("task") or "")
            self._render_info()
        elif kind == "run_start":
            if not self.task and data.get("text"):
                self.task = str(data["text"])
                self._render_info()
        elif kind == "text_delta":  # rendered by the ticker: per delta would be quadratic
            self.reply_text += str(data.get("text", ""))
            return
        elif kind == "assistant_text":  # came with tool calls: intermediate, not the reply
            self._clear_stream()
            if data.get("text"):
                self._add(_Note(str(data["text"])))
        elif kind == "tool_start":
            self._clear_stream()
            self._tool_row(data)
        elif kind == "tool_end":
            row = self._tool_row(data)
            row.finish(
                str(data.get("result", "")),
                data.get("error"),
                int(data.get("duration_ms", 0) or 0),
                str(data.get("outcome") or ""),
            )
        elif kind == "usage":
            self.usage = _ints(data)
        elif kind == "retry" and data.get("discard"):
            self._clear_stream()  # that attempt's streamed text is not part of the answer
        elif kind == "run_end":
            self.error = str(data.get("error") or self.error)
        elif kind == "child_end":
            self.end(
                str(data.get("status") or "error"),
                text=str(data.get("text") or ""),
                error=str(data.get("error") or ""),
                elapsed=data.get("elapsed"),
                usage=data.get("usage"),
            )
            return
        self.render()

    def end(
        self,
        status: str,
        *,
        text: str = "",
        error: str = "",
        elapsed: Any = None,
        usage: Any = None,
    ) -> None:
        """Show how the child ended: status, final reply (Markdown), error, time and tokens."""
        self.ended = True
        self.status = status
        self.error = error or ("" if status == "success" else self.error)
        try:
            self._elapsed = float(elapsed)
        except (TypeError, ValueError):
            self._elapsed = time.monotonic() - self._started
        if isinstance(usage, Mapping):
            self.usage = _ints(usage)
        self.reply_text = text
        self._rendered = -1  # force the final render
        for row in self.tool_rows.values():
            if row.state == "running":
                row.finish(f"the child ended ({status})", "not finished", 0, "stopped")
        self.render()

    def show_followup(self, title: str, text: str) -> None:
        """Show the agent's reply to this background child's result (it came as a message)."""
        self.followup_title, self.followup = title, text
        self.followup_html.value = (
            f'<div style="margin:2px 0 0 12px"><small>↪ {html.escape(title)}</small>'
            f"{markdown_html(text)}</div>"
        )

    def render(self) -> None:
        """Refresh the title, the chip, the streamed or final reply and the error."""
        self.accordion.titles = (self.title(),)
        if self.background:
            self.chip.value = self._chip_html()
        if self._rendered != len(self.reply_text):
            self.reply.value = markdown_html(self.reply_text)
            self._rendered = len(self.reply_text)
        message = self.error if self.status != "success" else ""
        self.error_html.value = (
            f'<span style="color:#c62828">{html.escape(message)}</span>' if message else ""
        )

    def title(self) -> str:
        """The row's one-line heading: icon, name (role), status, elapsed time, tokens."""
        name = self.label
        if self.role and self.role != self.label:
            name += f" ({flatten(self.role, 40)})"
        parts = [f"{ICONS.get(self.status, '?')} {name}"]
        if self.background:
            parts.append("background")
        parts += [self.status, elapsed_text(self.elapsed)]
        tokens = tokens_text(self.usage)
        if tokens:
            parts.append(tokens)
        return " · ".join(parts)

    def text(self) -> str:
        """Plain-text rendering: the title, task, tool rows, intermediate text, final reply."""
        lines = [f"↳ {self.title()}"]
        if self.task:
            lines.append(f"    task: {flatten(self.task, 200)}")
        lines += ["  " + item.text() for item in self.items]
        if self.reply_text:
            lines += _indent(self.reply_text, "    ")
        if self.error and self.status != "success":
            lines.append(f"    error: {self.error}")
        if self.followup_title:
            lines.append(f"    ↪ {self.followup_title}:")
            lines += _indent(self.followup, "      ")
        return "\n".join(lines)

    def html(self) -> str:
        """The child as static HTML: a ``<details>`` block with its transcript, then a follow-up."""
        title = html.escape(self.title().split(" ", 1)[1])
        summary = f"<summary>{icon(self.status)} {title}</summary>"
        body = [self.info.value, *(item.html() for item in self.items), self.reply.value]
        body.append(self.error_html.value)
        inner = '<div style="padding-left:1.4em">' + "".join(body) + "</div>"
        opened = "" if self.background else " open"
        return f"<details{opened}>{summary}{inner}</details>{self.followup_html.value}"

    def _tool_row(self, data: Mapping[str, Any]) -> ToolRow:
        call_id = str(data.get("id", ""))
        row = self.tool_rows.get(call_id)
        if row is None:  # a tool_end whose start was missed still gets its row
            row = ToolRow(call_id, str(data.get("name", "")), str(data.get("arguments", "")))
            self.tool_rows[call_id] = row
            self._add(row)
        return row

    def _add(self, item: Any) -> None:
        self.items.append(item)
        self.body.children = (*self.body.children, item.widget)

    def _clear_stream(self) -> None:
        if self.reply_text and not self.ended:
            self.reply_text = ""

    def _render_info(self) -> None:
        parts = []
        if self.role:
            parts.append(f"<b>role</b> {html.escape(flatten(self.role, 200))}")
        if self.task:
            parts.append(f"<b>task</b>{pre(cut(self.task, TASK_CHARS))}")
        self.info.value = "<br>".join(parts)

    def _chip_html(self) -> str:
        color = CHIP_COLORS.get(self.status, "#c62828")
        if self.ended:
            state = f"{self.status} after {elapsed_text(self.elapsed)}"
            tokens = tokens_text(self.usage)
            if tokens:
                state += f" · {tokens}"
        else:
            state = f"pending · {elapsed_text(self.elapsed)}"
        label = html.escape(f"{ICONS.get(self.status, '?')} {self.label} in background: {state}")
        style = (
            f"display:inline-block;border:1px solid {color};color:{color};"
            "border-radius:10px;padding:0 8px;font-size:90%"
        )
        return f'<span style="{style}">{label}</span>'


class ChildrenView:
    """The children of one parent tool call (a subagent or a team), under its tool row."""

    def __init__(
        self, call_id: str, tool: str = "", on_end: Callable[[ChildRow], Any] | None = None
    ) -> None:
        import ipywidgets as w

        self.call_id = call_id
        self.tool = tool
        self.on_end = on_end  # called after a child's child_end (the run may have finished)
        self.rows: dict[str, ChildRow] = {}
        self.list = w.VBox([])
        self.widget = w.Accordion(
            children=[self.list],
            titles=(self.title(),),
            selected_index=0,
            layout=w.Layout(margin="0 0 0 24px"),
        )
        self._ticker: asyncio.Task[None] | None = None

    def apply(self, event: Mapping[str, Any]) -> ChildRow:
        """Apply one ``child`` event's data to the child it names (created on first sight)."""
        child_id = str(event.get("child_id") or event.get("call_id") or "")
        row = self.rows.get(child_id)
        if row is None:
            label = str(event.get("label") or "subagent")
            row = ChildRow(child_id, label, bool(event.get("background")))
            self.rows[child_id] = row
            self.list.children = (*self.list.children, row.widget)
        kind = str(event.get("kind", ""))
        data = event.get("data")
        row.apply(kind, data if isinstance(data, Mapping) else {})
        self.widget.titles = (self.title(),)
        if kind == "child_end" and self.on_end is not None:
            self.on_end(row)
        self._sync_ticker()
        return row

    def end_foreground(self, status: str) -> None:
        """The parent run ended: foreground children still shown running end with it."""
        for row in self.rows.values():
            if not row.ended and not row.background:
                row.end(status, error=f"the run ended ({status})")
        self.widget.titles = (self.title(),)
        self._sync_ticker()

    @property
    def running(self) -> list[ChildRow]:
        """Children that have not ended yet."""
        return [row for row in self.rows.values() if not row.ended]

    def title(self) -> str:
        """Heading: the tool, the number of children and how many are in each state."""
        counts: dict[str, int] = {}
        for row in self.rows.values():
            counts[row.status] = counts.get(row.status, 0) + 1
        n = len(self.rows)
        head = f"{self.tool or 'children'}: {n} {'child' if n == 1 else 'children'}"
        if counts:
            head += " — " + " · ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        return head

    def html(self) -> str:
        """Static HTML: the heading, then every child's block."""
        rows = "".join(row.html() for row in self.rows.values())
        return (
            f'<div style="margin:0 0 0 24px"><div><b>{html.escape(self.title())}</b></div>'
            f"{rows}</div>"
        )

    def text(self) -> str:
        """Plain-text rendering: the heading, then every child indented under it."""
        lines = [f"    ↳ {self.title()}"]
        for row in self.rows.values():
            lines += _indent(row.text(), "      ")
        return "\n".join(lines)

    def close(self) -> None:
        """Stop the ticker (the widgets are closed with the run view's tree)."""
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    def _sync_ticker(self) -> None:
        if not self.running:
            self.close()
            return
        if self._ticker is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # driven without a loop (a plain-text test): titles update per event
        self._ticker = loop.create_task(self._tick(), name="ania-children-ticker")

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            for row in self.running:
                row.render()  # elapsed time, chip and the streamed reply


def _ints(data: Mapping[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in data.items():
        try:
            out[key] = int(value or 0)
        except (TypeError, ValueError):
            continue
    return out
