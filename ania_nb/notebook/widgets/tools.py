"""`ToolRow`: one tool call in the run widget, a collapsible row that fills in when it ends.

The row is a ``<details>`` block in an HTML widget, so the same HTML is the static fallback of a
saved notebook: the summary line carries an SVG status icon, the call and a result preview; the
expanded row shows the arguments (code as highlighted code blocks) and the full result. Time spent
waiting for a person's approval is shown apart from the tool's own duration. A tool that reports
progress (MCP progress notifications) gets a progress bar while it runs; images a tool returned
(MCP image content) are shown under the row.
"""

from __future__ import annotations

import html
from typing import Any

from ...text import cut, flatten
from ._code import arguments_html, arguments_text
from ._format import brief_arguments, duration_text, elapsed_text, pre
from ._icons import icon

ICONS = {  # plain-text glyphs (DejaVu Sans has them; no emoji font needed)
    "running": "⚙",
    "ok": "✓",
    "error": "✗",
    "blocked": "⊘",
    "denied": "⊘",
    "timeout": "◷",
    "stopped": "■",
}
RESULT_CHARS = 2000  # shown when the row is expanded; the title carries a one-line preview
SUMMARY = "cursor:pointer;padding:1px 0"  # display stays list-item: the ▸ marker shows
THUMB = "max-width:100%;max-height:240px;margin:2px 4px 2px 1.4em;border:1px solid #ddd"


class ToolRow:
    """A tool call: name, arguments, result preview, duration and state.

    ``state`` is running, or the call's outcome: ok, error, blocked (plan mode or a hook),
    denied (a person or an admin said no), timeout or stopped (the approval went unanswered).
    ``waited`` is the seconds an approval card waited for its answer (None: nobody was asked).
    """

    def __init__(self, call_id: str, name: str, arguments: str, *, widget: bool = True) -> None:
        self.id = call_id
        self.name = name
        self.arguments = arguments
        self.state = "running"
        self.result = ""
        self.duration_ms: int | None = None
        self.awaiting_approval = False
        self.waited: float | None = None
        self.progress: tuple[float, float | None, str] | None = None  # done, total, message
        self.images: list[str] = []  # data URIs the tool returned
        self.widget: Any = None  # widget=False: HTML only (a stored run's record view)
        if widget:
            import ipywidgets as w

            self.widget = w.HTML(self.html())

    def finish(self, result: str, error: str | None, duration_ms: int, outcome: str) -> None:
        """Show how the call ended (``outcome`` as in `ToolCallResult.outcome`)."""
        self.result = result
        self.duration_ms = duration_ms
        self.state = outcome if outcome in ICONS else ("error" if error else "ok")
        self.awaiting_approval = False
        self._refresh()

    def set_progress(self, done: float, total: float | None, message: str | None) -> None:
        """The tool reported progress (``total`` None: unknown)."""
        self.progress = (done, total, message or "")
        self._refresh()

    def add_images(self, uris: list[str]) -> None:
        """Images the tool returned (data URIs), shown under the row."""
        self.images += [u for u in uris if u.startswith("data:image/")]
        self._refresh()

    def approval_asked(self) -> None:
        """An approval card for this call is open."""
        self.awaiting_approval = True
        self._refresh()

    def approval_answered(self, waited: float) -> None:
        """The card was answered (or timed out) after ``waited`` seconds."""
        self.awaiting_approval = False
        self.waited = waited
        self._refresh()

    def title(self) -> str:
        """The row's one-line heading as plain text."""
        head = f"{ICONS[self.state]} {self.name}({brief_arguments(self.arguments)})"
        if self.state == "running":
            doing = "waiting for approval" if self.awaiting_approval else "running"
            return f"{head} · {doing}{self._progress_text()}…"
        label = "" if self.state == "ok" else f"{self.state}: "
        pictures = f" [{len(self.images)} image(s)]" if self.images else ""
        return f"{head} → {label}{flatten(self.result, 80)}{pictures}{self._times()}"

    def _progress_text(self) -> str:
        if self.progress is None:
            return ""
        done, total, message = self.progress
        amount = f"{done:g}/{total:g}" if total else f"{done:g}"
        return f" {amount}" + (f" {flatten(message, 60)}" if message else "")

    def _times(self) -> str:
        """`` · 12 ms · approval wait 3.4 s``: the tool's own time, then the wait apart."""
        ran = self.state in ("ok", "error")
        tail = f" · {duration_text(self.duration_ms)}" if ran else ""
        if self.waited is not None:
            tail += f" · approval wait {elapsed_text(self.waited)}"
        return tail

    def text(self) -> str:
        """Plain-text line for the run's text rendering."""
        return "  " + self.title()

    def details_text(self) -> str:
        """The arguments (code with its line breaks) as plain text."""
        return arguments_text(self.name, self.arguments)

    def html(self) -> str:
        """The row as a ``<details>`` block (the widget's value and the static fallback)."""
        title = html.escape(self.title().split(" ", 1)[1])  # the glyph becomes an SVG icon
        state = "waiting" if self.awaiting_approval else self.state
        bar = ""
        if self.state == "running" and self.progress is not None:
            done, total, _ = self.progress
            if total:
                bar = f' <progress value="{min(done, total):g}" max="{total:g}"></progress>'
        summary = f'<summary style="{SUMMARY}">{icon(state)} <span>{title}</span>{bar}</summary>'
        parts = [
            "<b>arguments</b>",
            arguments_html(self.name, self.arguments),
        ]
        if self.state != "running":
            label = f"{self.state}"
            if self.state in ("ok", "error"):
                label += f" after {duration_text(self.duration_ms)}"
            if self.waited is not None:
                label += f"; approval wait {elapsed_text(self.waited)}"
            result = pre(cut(self.result, RESULT_CHARS))
            parts.append(f"<b>result</b> <small>({html.escape(label)})</small>{result}")
        body = '<div style="padding:2px 0 4px 1.4em">' + "".join(parts) + "</div>"
        row = f'<details class="ania-tool" data-state="{self.state}">{summary}{body}</details>'
        if not self.images:
            return row
        thumbs = "".join(f'<img src="{html.escape(u)}" style="{THUMB}">' for u in self.images)
        return f"<div>{row}<div>{thumbs}</div></div>"

    def _refresh(self) -> None:
        if self.widget is not None:
            self.widget.value = self.html()
