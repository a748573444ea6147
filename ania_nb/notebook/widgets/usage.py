"""`UsagePanel`: today's tokens per session against the quotas, and a plot of the last days.

The panel reads a `UsageReport` from `Quota.report` (``agent.quota``) on the kernel's event loop
(the Refresh button starts a task there) and draws the daily tokens with matplotlib into a PNG
``Image`` widget, off the loop. matplotlib is an optional import: `panel_available` says whether
the panel can be shown, and ``%ania usage`` prints ``report.to_text()`` when it cannot. The
panel's plain text (``text()``, the text/plain of its output) is that same table.
"""

from __future__ import annotations

import asyncio
import html
import io
from typing import TYPE_CHECKING, Any

from ._display import close_tree
from .panel import Panel

if TYPE_CHECKING:  # pragma: no cover
    from ...quota import Quota, UsageReport

# Stacked from the bottom: cached prompt tokens are a part of the prompt, so the bar's height
# is prompt + completion and cached is shown as the share of the prompt that hit the cache.
SERIES = ("cached", "prompt (not cached)", "completion")
COLORS = {"cached": "#90caf9", "prompt (not cached)": "#1e88e5", "completion": "#fb8c00"}
MAX_LABELLED = 31  # more days than this: fewer day labels and no cost labels on the bars
WARN_SHARE = 0.8  # bars turn orange here; red once the limit is reached (work is refused)


def panel_available() -> bool:
    """Whether ipywidgets and matplotlib can be imported (else: the text table)."""
    try:
        import ipywidgets  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def daily_series(report: UsageReport) -> dict[str, list[int]]:
    """The plotted values per day (oldest first): cached, not-cached prompt and completion."""
    cached = [min(d.cached, d.prompt) for d in report.days]
    return {
        "cached": cached,
        "prompt (not cached)": [d.prompt - c for d, c in zip(report.days, cached, strict=True)],
        "completion": [d.completion for d in report.days],
    }


def bar_style(share: float | None) -> str:
    """The progress bar's style for a used/limit share: red when used up."""
    if share is None:
        return ""
    if share >= 1:
        return "danger"
    return "warning" if share >= WARN_SHARE else "success"


def period_cost(report: UsageReport) -> float | None:
    """The cost of the shown days; None if none is priced or a day with tokens is unpriced."""
    used = [d for d in report.days if d.total or d.prompt or d.completion]
    if not used or any(d.cost is None for d in used):
        return None
    return sum(d.cost or 0.0 for d in used)


def plot_png(report: UsageReport) -> bytes:
    """The daily tokens as stacked bars (costs above them when priced), as PNG bytes."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend
    from matplotlib.ticker import FuncFormatter

    series = daily_series(report)
    count = len(report.days)
    crowded = count > MAX_LABELLED
    figure = Figure(figsize=(min(max(4.0, 0.45 * count + 3), 12.0), 2.8), dpi=100)
    axes = figure.add_subplot()
    places = list(range(count))
    bottom = [0] * count
    for name in SERIES:
        values = series[name]
        axes.bar(places, values, bottom=bottom, label=name, color=COLORS[name], width=0.7)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for x, (day, height) in enumerate(zip(report.days, bottom, strict=True)):
        if day.cost is not None and not crowded:
            label = _short_money(day.cost, report.currency)
            axes.annotate(label, (x, height), ha="center", va="bottom", fontsize=7)
    step = 1 if not crowded else -(-count // MAX_LABELLED)  # every step-th day labelled
    shown = places[::-1][::step][::-1]  # always label the newest day (today)
    axes.set_xticks(shown, [report.days[i].day[5:] for i in shown])  # MM-DD
    who = f"session {report.session}" if report.session else "all sessions"
    axes.set_title(f"Daily tokens, {who}", fontsize=9)
    axes.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    axes.tick_params(axis="both", labelsize=7)
    axes.tick_params(axis="x", labelrotation=60)
    axes.set_ylim(0, max([*bottom, 1]) * 1.15)  # room for the cost labels
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    axes.spines[["top", "right"]].set_visible(False)
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png")
    return out.getvalue()


class UsagePanel(Panel):
    """Today's usage per session vs the limits (progress bars), a daily plot and a Refresh button.

    Show it, then `refresh` (``%ania usage`` does both). ``days`` is the plot's span;
    ``session`` limits the rows and the plot to one session.
    """

    def __init__(self, quota: Quota, *, days: int = 14, session: str | None = None) -> None:
        import ipywidgets as w

        if days < 1:
            raise ValueError(f"days must be at least 1, got {days}")
        super().__init__()
        self.quota = quota
        self.days = days
        self.session = session
        self.report: UsageReport | None = None
        self.bars: dict[str, Any] = {}  # session (or "" for all sessions) → its progress bar
        self.plot_data: dict[str, list[int]] = {}

        self.header = w.HTML()
        self.refresh_button = w.Button(
            description="Refresh", icon="refresh", layout=w.Layout(width="auto")
        )
        self.refresh_button.on_click(lambda _: self.reload())
        self.total_box = w.VBox([])
        self.session_box = w.VBox([])
        self.model_table = w.HTML()  # today's tokens by model: main, quota fallback, embeddings
        self.notes_html = w.HTML()  # the quota fallback and what embeddings cost
        self.plot = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.plot_note = w.HTML()
        self.day_table = w.HTML()
        self.widget = w.VBox(
            [
                w.HBox([self.header, self.refresh_button], layout=w.Layout(align_items="center")),
                self.total_box,
                self.session_box,
                self.model_table,
                self.notes_html,
                self.plot,
                self.plot_note,
                w.Accordion([self.day_table], titles=("Daily table",)),
                self.message_html,
            ],
            layout=w.Layout(border="1px solid #ddd", padding="4px"),
        )
        self._render()

    async def refresh(self) -> UsagePanel:
        """Read the report and redraw the bars and the plot."""
        await self._load()
        self._render()
        return self

    def reload(self) -> asyncio.Task[Any]:
        """Refresh as a task on the running loop (what the Refresh button does)."""
        return self._act(self._load())

    def text(self) -> str:
        """The plain-text table of the report (what terminals and ``ania-nb usage`` show)."""
        lines = [self.report.to_text() if self.report is not None else "📊 usage (not loaded)"]
        if self.message:
            lines.append(self.message)
        return "\n".join(lines)

    # ------------------------------------------------------------------ internals

    async def _load(self) -> None:
        """Read the report and draw the plot (off the loop); `_render` shows them."""
        report = await self.quota.report(self.days, self.session)
        png = await asyncio.to_thread(_plot_or_none, report)  # drawing takes a while: off-loop
        self.report = report
        self.plot_data = daily_series(report)
        self.plot.value = png or b""
        self.plot.layout.display = None if png else "none"
        self.plot_note.value = (
            "" if png else "<small><i>no plot: matplotlib is not installed</i></small>"
        )
        self.message = ""
        self.message_html.value = ""

    def _render(self) -> None:
        if self.closed:
            return
        report = self.report
        if report is None:
            self.header.value = "<b>📊 usage</b> <small>(loading…)</small>"
            self.refresh_display()  # e.g. the error of a first refresh
            return
        resets = f"{report.resets_at:%H:%M}"
        self.header.value = (
            f"<b>📊 usage · {html.escape(report.today)}</b> "
            f"<small>({html.escape(report.timezone)}; the day resets at {resets})</small>"
        )
        for bar in list(self.bars.values()):
            bar.close()
        self.bars = {}
        for box in (self.total_box, self.session_box):
            for child in box.children:
                close_tree(child)
        notes = []
        if not report.enabled:
            notes.append(_note("quota.enable is off: nothing is counted or limited"))
        share = report.global_used / report.global_limit if report.global_limit else None
        label = f"all sessions: {_tokens(report.global_used, report.global_limit, share)}"
        self.total_box.children = (*notes, self._row("", label, share))
        rows = [
            self._row(s.session, f"{s.session}: {_tokens(s.total, s.limit, s.share)}", s.share)
            for s in report.sessions
        ]
        if not rows:
            rows = [
                _note("no tokens counted today" + (f" in {self.session}" if self.session else ""))
            ]
        self.session_box.children = tuple(rows)
        self.model_table.value = _model_table(report)
        notes = [report.fallback_text()]
        if report.embeddings:
            notes.append(f"Embeddings: {report.embeddings}")
        self.notes_html.value = "<br>".join(
            f'<small style="color:#757575">{html.escape(n)}</small>' for n in notes if n
        )
        self.day_table.value = _day_table(report)
        self.refresh_display()

    def _row(self, key: str, label: str, share: float | None) -> Any:
        import ipywidgets as w

        text = w.HTML(html.escape(label), layout=w.Layout(width="360px"))
        if share is None:  # no limit: nothing to fill
            return w.HBox([text])
        bar = w.FloatProgress(
            value=min(share, 1.0) * 100,
            min=0,
            max=100,
            bar_style=bar_style(share),
            layout=w.Layout(width="240px"),
        )
        self.bars[key] = bar
        return w.HBox([text, bar], layout=w.Layout(align_items="center"))


def _plot_or_none(report: UsageReport) -> bytes | None:
    try:
        return plot_png(report)
    except ImportError:
        return None


def _short_money(value: float, currency: str) -> str:
    """A cost label for a bar: two decimals, or four for fractions of a cent."""
    return f"{currency}{value:,.2f}" if value >= 0.01 or value == 0 else f"{currency}{value:.4f}"


def _tokens(used: int, limit: int, share: float | None) -> str:
    if not limit or share is None:
        return f"{used:,} tokens (no limit)"
    return f"{used:,} of {limit:,} tokens ({share:.0%})"


def _note(text: str) -> Any:
    import ipywidgets as w

    return w.HTML(f'<small style="color:#757575">{html.escape(text)}</small>')


def _model_table(report: UsageReport) -> str:
    """Today's tokens by model (most used first), with what each model is for."""
    if not report.models:
        return ""
    cell = 'style="padding:0 8px;text-align:right"'
    head = "".join(f"<th {cell}>{h}</th>" for h in ("tokens", "prompt", "completion", "cached"))
    rows = []
    for m in report.models:
        values = (m.total, m.prompt, m.completion, m.cached)
        cells = "".join(f"<td {cell}>{v:,}</td>" for v in values)
        role = f' <small style="color:#757575">{html.escape(m.role)}</small>' if m.role else ""
        rows.append(f"<tr><td>{html.escape(m.model or '(unnamed)')}{role}</td>{cells}</tr>")
    return f"<table><tr><th>model today</th>{head}</tr>{''.join(rows)}</table>"


def _day_table(report: UsageReport) -> str:
    priced = any(d.cost is not None for d in report.days)
    head = ["day", "tokens", "prompt", "completion", "cached", *(["cost"] if priced else [])]
    cell = 'style="padding:0 8px;text-align:right"'
    rows = []
    for d in reversed(report.days):  # newest first
        values = [f"{d.total:,}", f"{d.prompt:,}", f"{d.completion:,}", f"{d.cached:,}"]
        if priced:
            values.append("-" if d.cost is None else f"{report.currency}{d.cost:,.4f}")
        cells = "".join(f"<td {cell}>{html.escape(v)}</td>" for v in values)
        rows.append(f"<tr><td>{html.escape(d.day)}</td>{cells}</tr>")
    total = period_cost(report)
    foot = (
        f"<small>cost over {len(report.days)} days: {report.currency}{total:,.4f}</small>"
        if total is not None
        else ""
    )
    header = "".join(f"<th {cell}>{h}</th>" for h in head)
    return f"<table><tr>{header}</tr>{''.join(rows)}</table>{foot}"
