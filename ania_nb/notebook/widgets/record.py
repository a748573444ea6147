"""`RecordView`: one stored run from the run log, in full — the run record view.

Status, session, start, duration and tokens; the whole input; each kept tool call as a
collapsible row whose arguments show code as highlighted code blocks (as in the live run view);
the reply as Markdown and any error. The view is static HTML (nothing in it changes), so it
survives a saved notebook as it is; ``text()`` renders it as plain text.
"""

from __future__ import annotations

import html
from datetime import datetime
from typing import TYPE_CHECKING

from ...errors import UsageError
from ._display import Displayable
from ._format import STATUS_ICONS, duration_text, markdown_html, plural
from ._icons import color_of, icon
from .tools import ToolRow

if TYPE_CHECKING:  # pragma: no cover
    from ...agent import Agent
    from ...store import RunRecord

FRAME = "border:1px solid #ddd;padding:4px"


class RecordView(Displayable):
    """A stored `RunRecord` shown in full (``await record_view(agent, run_id)`` finds one)."""

    def __init__(self, record: RunRecord) -> None:
        self.record = record
        self.rows = [
            ToolRow(str(n), call.name, call.arguments, widget=False)
            for n, call in enumerate(record.tool_calls)
        ]
        for row, call in zip(self.rows, record.tool_calls, strict=True):
            row.finish(call.result, call.error, call.duration_ms, "error" if call.error else "ok")
        self.widget = None  # static: the bundle is the HTML and the text

    def _facts(self) -> list[str]:
        r = self.record
        facts = [
            f"#{r.id}",
            r.session,
            datetime.fromtimestamp(r.started_at).strftime("%m-%d %H:%M:%S"),
        ]
        if r.duration_ms is not None:
            facts.append(duration_text(r.duration_ms))
        facts.append(f"{plural(r.total_tokens, 'token')}")
        if r.iterations:
            facts.append(plural(r.iterations, "LLM call"))
        return facts

    def _more(self) -> str:
        missing = self.record.tool_calls_total - len(self.record.tool_calls)
        return f"… and {plural(missing, 'more call')} (not kept in the log)" if missing > 0 else ""

    def html(self) -> str:
        """The record as static HTML."""
        r = self.record
        facts = html.escape(" · ".join(self._facts()))
        parts = [
            f'{icon(r.status)} <b style="color:{color_of(r.status)}">{html.escape(r.status)}</b>'
            f" <small>{facts}</small>",
            '<div style="white-space:pre-wrap;word-break:break-word;margin:4px 0">'
            f"<small>›</small> {html.escape(r.input)}</div>",
            *(row.html() for row in self.rows),
        ]
        if self._more():
            parts.append(f"<div><small>{html.escape(self._more())}</small></div>")
        if r.reply:
            parts.append(f"<div>{markdown_html(r.reply)}</div>")
        if r.error:
            parts.append(f'<div style="color:#c62828">{html.escape(r.error)}</div>')
        return f'<div class="ania-record" style="{FRAME}">' + "".join(parts) + "</div>"

    def text(self) -> str:
        """The record as plain text: status line, input, tool calls (code as code), reply."""
        r = self.record
        lines = [f"{STATUS_ICONS.get(r.status, '?')} {r.status} · " + " · ".join(self._facts())]
        lines.append(f"› {r.input}")
        for row in self.rows:
            lines.append(row.text())
            lines += ["      " + line if line else "" for line in row.details_text().split("\n")]
        if self._more():
            lines.append("  " + self._more())
        if r.reply:
            lines.append(r.reply)
        if r.error:
            lines.append(f"error: {r.error}")
        return "\n".join(lines)


async def record_view(agent: Agent, run_id: int) -> RecordView:
    """The view of run ``run_id`` from the agent's run log; UsageError when it is not there."""
    for record in await agent.runs(limit=100_000):  # the log keeps a bounded number of runs
        if record.id == run_id:
            return RecordView(record)
    raise UsageError(f"no run #{run_id} in the run log (see %ania log for the recent runs)")
