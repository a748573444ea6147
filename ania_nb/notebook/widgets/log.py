"""`LogView`: recent runs from the run log as a table (status, duration, tokens, tools, input).

Cells never wrap (a date stays on one line; each column is as wide as its widest cell); the
input column is cut to one line with the full text in its tooltip, and a table wider than the
cell scrolls sideways instead of squeezing its columns.
"""

from __future__ import annotations

import asyncio
import html
from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING

from ...result import run_headline
from ...text import flatten
from ._display import Displayable
from ._format import STATUS_ICONS, duration_text
from ._icons import icon

if TYPE_CHECKING:  # pragma: no cover
    from ...agent import Agent
    from ...store import RunRecord

COLUMNS = ("#", "started", "session", "status", "duration", "tokens", "tools", "input")
CELL = "padding:2px 8px;text-align:left;vertical-align:top;white-space:nowrap"
NUMERIC = {"#", "duration", "tokens"}  # right-aligned, so digits line up


class LogView(Displayable):
    """The newest ``limit`` runs (of one session, or all) from `Agent.runs`."""

    def __init__(self, agent: Agent, limit: int = 20, *, session: str | None = None) -> None:
        import ipywidgets as w

        self.agent = agent
        self.limit = limit
        self.session = session
        self.records: list[RunRecord] = []
        self.refresh_task: asyncio.Task[object] | None = None
        self.heading = w.HTML(self._heading_text())
        self.refresh_button = w.Button(description="Refresh", icon="refresh")
        self.refresh_button.on_click(lambda _: self._refresh_soon())
        self.table = w.HTML()
        self.widget = w.VBox([w.HBox([self.heading, self.refresh_button]), self.table])

    async def refresh(self) -> list[RunRecord]:
        """Load the recent runs and show them; returns the records (newest first)."""
        self.records = await self.agent.runs(session=self.session, limit=self.limit)
        self.heading.value = f"<b>{html.escape(self._heading_text())}</b>"
        self.table.value = self._table_html()
        self.refresh_display()
        return self.records

    @property
    def rows(self) -> list[tuple[str, ...]]:
        """The table cells as text, one tuple per run (newest first)."""
        return [_row(record) for record in self.records]

    def text(self) -> str:
        """The table as aligned plain text."""
        rows = [COLUMNS, *self.rows]
        widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        return "\n".join([self._heading_text(), *(line.rstrip() for line in lines)])

    def _refresh_soon(self) -> None:
        # A click arrives on the kernel's loop; the refresh itself is async (store access).
        if self.refresh_task is None or self.refresh_task.done():
            self.refresh_task = asyncio.get_running_loop().create_task(self.refresh())

    def _heading_text(self) -> str:
        where = f" in {self.session}" if self.session else ""
        return f"Recent runs{where}: {len(self.records)} shown (newest first)"

    def _table_html(self) -> str:
        head = "".join(f'<th style="{_style(c)}">{html.escape(c)}</th>' for c in COLUMNS)
        body = "".join(
            "<tr>" + "".join(_cell(c, v, r) for c, v in zip(COLUMNS, row, strict=True)) + "</tr>"
            for r, row in zip(self.records, self.rows, strict=True)
        )
        table = (
            '<table class="ania-log" style="border-collapse:collapse;width:max-content">'
            f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )
        return f'<div style="overflow-x:auto;max-width:100%">{table}</div>'


def record_headline(record: RunRecord) -> tuple[str, str]:
    """The stored run's state and words, as its run widget said them (`run_headline`)."""
    return run_headline(record.status, (call.outcome for call in record.tool_calls))


def _style(column: str) -> str:
    return CELL + (";text-align:right" if column in NUMERIC else "")


def _cell(column: str, value: str, record: RunRecord) -> str:
    """One ``<td>``: the status as an SVG icon and its word, the input with its full tooltip."""
    if column == "status":
        state, words = record_headline(record)
        content = f"{icon(state)} {html.escape(words)}"
    else:
        content = html.escape(value)
    title = f' title="{html.escape(flatten(record.input, 2000))}"' if column == "input" else ""
    return f'<td style="{_style(column)}"{title}>{content}</td>'


def _row(record: RunRecord) -> tuple[str, ...]:
    """One run's cells."""
    started = datetime.fromtimestamp(record.started_at).strftime("%m-%d %H:%M:%S")
    state, words = record_headline(record)
    status = f"{STATUS_ICONS.get(state, '?')} {words}"
    tokens = f"{record.total_tokens:,}"
    if record.cached_tokens:
        tokens += f" ({record.cached_tokens:,} cached)"
    names = Counter(call.name for call in record.tool_calls)
    tools = str(record.tool_calls_total)
    if names:
        tools += ": " + ", ".join(f"{n}×{c}" if c > 1 else n for n, c in sorted(names.items()))
    return (
        str(record.id),
        started,
        record.session,
        status,
        duration_text(record.duration_ms),
        tokens,
        tools,
        flatten(record.input, 60),
    )
