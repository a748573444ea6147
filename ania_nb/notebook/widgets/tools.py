"""`ToolRow`: one tool call in the run widget, a collapsible row that fills in when it ends."""

from __future__ import annotations

import html

from ._format import brief_arguments, duration_text, one_line, pre, pretty_arguments, truncate

ICONS = {
    "running": "⚙",
    "ok": "✓",
    "error": "✗",
    "blocked": "⛔",
    "denied": "🚫",
    "timeout": "⏱",
    "stopped": "■",
}
RESULT_CHARS = 2000  # shown when the row is expanded; the title carries a one-line preview


class ToolRow:
    """A tool call: name, arguments, result preview, duration and state.

    ``state`` is running, or the call's outcome: ok, error, blocked (plan mode or a hook),
    denied (a person or an admin said no), timeout or stopped (the approval went unanswered).
    """

    def __init__(self, call_id: str, name: str, arguments: str) -> None:
        import ipywidgets as w

        self.id = call_id
        self.name = name
        self.arguments = arguments
        self.state = "running"
        self.result = ""
        self.duration_ms: int | None = None
        self.detail = w.HTML(self._detail_html())
        self.widget = w.Accordion(children=[self.detail], titles=(self.title(),))

    def finish(self, result: str, error: str | None, duration_ms: int, outcome: str) -> None:
        """Show how the call ended (``outcome`` as in `ToolCallResult.outcome`)."""
        self.result = result
        self.duration_ms = duration_ms
        self.state = outcome if outcome in ICONS else ("error" if error else "ok")
        self.detail.value = self._detail_html()
        self.widget.titles = (self.title(),)

    def title(self) -> str:
        """The row's one-line heading (Accordion titles are plain text)."""
        head = f"{ICONS[self.state]} {self.name}({brief_arguments(self.arguments)})"
        if self.state == "running":
            return f"{head} · running…"
        tail = f" · {duration_text(self.duration_ms)}" if self.state in ("ok", "error") else ""
        label = "" if self.state == "ok" else f"{self.state}: "
        return f"{head} → {label}{one_line(self.result, 80)}{tail}"

    def text(self) -> str:
        """Plain-text line for the run's text rendering."""
        return "  " + self.title()

    def _detail_html(self) -> str:
        parts = [f"<b>arguments</b>{pre(pretty_arguments(self.arguments))}"]
        if self.state != "running":
            label = html.escape(f"{self.state} after {duration_text(self.duration_ms)}")
            result = pre(truncate(self.result, RESULT_CHARS))
            parts.append(f"<b>result</b> <small>({label})</small>{result}")
        return "".join(parts)
