"""`RunView`: the live widget of one agent run, driven by the callbacks bridge.

Header (spinner, status, elapsed time, token usage incl. cached), then the run in order —
intermediate assistant text, one collapsible row per tool call (a subagent or team call with its
children's nested transcripts under it), approval cards, images and files — then the reply,
streamed from ``text_delta`` events and rendered as Markdown. Every update happens on the event
loop that runs the agent (callbacks and small ticker tasks), never on another thread. ``text()``
renders the same run as plain text and ``html()`` as static HTML.

A successful run whose calls were denied, blocked or failed says so ("finished · 1 call denied")
instead of a plain success. The display carries the widget view and the static HTML; once the
run is over (and no background child is pending) it is updated to the static HTML alone, so a
saved notebook shows the run without a kernel instead of "Error displaying widget".
"""

from __future__ import annotations

import asyncio
import base64
import html
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...engine.callbacks import ApprovalRequest, Callbacks, RunEvent
from ...result import run_headline
from ...session_keys import DEFAULT_NOTEBOOK
from ...text import flatten
from ._display import Displayable, close_tree
from ._format import (
    STATUS_ICONS,
    decode_base64,
    download_link,
    elapsed_text,
    image_format,
    markdown_html,
    size_text,
    usage_text,
)
from ._static import header_html, run_html
from .approval import ApprovalCard, row_asking
from .children import ChildrenView, ChildRow
from .tools import ToolRow

if TYPE_CHECKING:  # pragma: no cover
    from ...agent import Agent
    from ...orchestration.outbox import Delivery
    from ...result import RunResult
    from .todo import TodoView

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"  # Braille patterns: DejaVu Sans has them
TICK = 0.25  # seconds between spinner/elapsed updates


class _Item:
    """A finished body entry (text block, image, file link) with its plain-text form."""

    def __init__(self, widget: Any, text: str, kind: str, html_text: str | None = None) -> None:
        self.widget = widget
        self.kind = kind
        self._text = text
        self._html = html_text

    def text(self) -> str:
        """Plain-text line(s)."""
        return self._text

    def html(self) -> str:
        """Static HTML of the entry (an HTML widget's value unless given)."""
        return self._html if self._html is not None else str(self.widget.value)


class RunView(Displayable):
    """Live view of one run: build it, pass ``view.callbacks`` to `Agent.chat`, then `finish`.

    >>> view = RunView(agent, session="nb:x", prompt="…"); display(view)
    >>> view.finish(await agent.chat("…", session="nb:x", callbacks=view.callbacks))
    """

    def __init__(
        self,
        agent: Agent,
        session: str = DEFAULT_NOTEBOOK,
        prompt: str = "",
        *,
        todo_view: TodoView | None = None,
    ) -> None:
        import ipywidgets as w

        self.agent = agent
        self.session = session
        self.prompt = prompt
        self.todo_view = todo_view
        self.status = "running"
        self.error: str | None = None
        self.notice = ""  # a passing note (a retry), cleared when the run ends
        # What went wrong without failing the run (a call written as text not run, repeats).
        self.warnings: list[str] = []
        self.usage: dict[str, int] = {}
        self.reply_text = ""  # streamed so far; the final reply after finish
        self.result: RunResult | None = None
        self.items: list[Any] = []  # body entries in order: _Item, ToolRow, ApprovalCard
        self.tool_rows: dict[str, ToolRow] = {}
        self.cards: dict[str, ApprovalCard] = {}
        self._card_rows: dict[str, ToolRow] = {}  # approval id -> the row of the call asked about
        self.children: dict[str, ChildrenView] = {}  # by the parent tool call's id
        self._followups: list[ChildRow] = []  # background children whose reply is awaited
        self._unfollow: Callable[[], None] | None = None
        self._last_assistant = ""
        self._rendered = 0  # characters of the streamed reply rendered so far
        self._started = time.monotonic()
        self._stopped_at: float | None = None
        self._frame = 0
        self._ticker: asyncio.Task[None] | None = None

        self.spinner = w.Label(SPINNER[0], layout=w.Layout(margin="0 6px"))
        self.status_label = w.HTML(layout=w.Layout(margin="0 6px"))
        self.elapsed_label = w.Label(elapsed_text(0), layout=w.Layout(margin="0 6px"))
        self.usage_label = w.Label("", layout=w.Layout(margin="0 6px"))
        self.header = w.HBox(
            [self.spinner, self.status_label, self.elapsed_label, self.usage_label],
            layout=w.Layout(align_items="center", flex_flow="row wrap"),  # narrow cells wrap
        )
        self.prompt_html = w.HTML(
            f"<small>› {html.escape(flatten(prompt, 200))}</small>" if prompt else ""
        )
        self.body = w.VBox([])
        self.reply = w.HTML("")
        self.error_html = w.HTML("")
        self.widget = w.VBox(
            [self.header, self.prompt_html, self.body, self.reply, self.error_html],
            layout=w.Layout(border="1px solid #ddd", padding="4px"),
        )
        self.callbacks = Callbacks(
            send_text=self.send_text,
            send_image=self.send_image,
            send_file=self.send_file,
            request_approval=self.request_approval,
            on_event=self.on_event,
        )
        self._render_header()
        self._start_ticker()

    # ------------------------------------------------------------- callbacks

    def on_event(self, event: RunEvent) -> None:
        """Apply one progress event from the run."""
        data = event.data
        kind = event.kind
        if event.session != self.session and kind != "approval_resolved":
            return  # e.g. a subagent's own loop: its text and usage are not this run's
        if kind == "text_delta":
            self.reply_text += str(data.get("text", ""))
            # Re-rendering the whole reply per delta is quadratic: render on 25 % growth here
            # and let the ticker flush the rest.
            if len(self.reply_text) - self._rendered >= self._rendered // 4:
                self._render_stream()
        elif kind == "assistant_text":  # the round's text came with tool calls: intermediate
            self._last_assistant = str(data.get("text", ""))
            self._clear_stream()
            self._add_text(self._last_assistant)
        elif kind == "tool_start":
            self._clear_stream()  # e.g. streamed <think> text the model did not keep
            row = ToolRow(str(data.get("id", "")), str(data["name"]), str(data["arguments"]))
            self.tool_rows[row.id] = row
            self._add(row)
        elif kind == "tool_end":
            self._tool_end(data)
        elif kind in ("tool_progress", "tool_images"):  # an MCP tool's progress or pictures
            target = self.tool_rows.get(str(data.get("id", "")))
            if target is not None and kind == "tool_progress":
                done, total = float(data["progress"]), data.get("total")
                target.set_progress(done, total, data.get("message"))
            elif target is not None:
                target.add_images([str(u) for u in data.get("images", [])])
        elif kind == "child":
            self._child(data)
        elif kind == "retry":
            if data.get("discard"):
                self._clear_stream()  # that attempt's text is not part of the answer
            self.notice = f"retrying with {data.get('model', '')}: {data.get('error', '')}"
            self._render_header()
        elif kind == "model_switch":  # e.g. a used-up quota: the fallback model answers
            self.notice = f"{data.get('model', '')} answers: {data.get('reason', '')}"
            self._render_header()
        elif kind == "usage":
            self.usage = {k: int(v) for k, v in data.items()}
            self.usage_label.value = usage_text(self.usage)
        elif kind == "approval_resolved":
            card = self.cards.get(str(data.get("id")))
            if card is not None:
                card.resolve(str(data.get("outcome", "error")), str(data.get("reason", "")))
                self._answered(card)
        elif kind == "knowledge":  # what auto-inject put into this turn
            self._injected(data)
        elif kind == "todos" and self.todo_view is not None:
            self.todo_view.callbacks_hook(event)
        elif kind == "run_start":
            self._start_ticker()
        elif kind == "run_end":
            self._render_stream()
            self.status = str(data.get("status", "error"))
            self.error = data.get("error") or self.error
            self.warnings = [str(w) for w in data.get("warnings") or ()]
            self.notice = ""
            self._stop_ticker()
            self._render_header()

    def send_text(self, text: str) -> None:
        """A message for the user (the loop's copy of intermediate text is already shown)."""
        if text and text != self._last_assistant:
            self._add_text(text)

    def send_image(self, data: str) -> None:
        """Show an image sent as base64 (or a data: URI, or an http(s) URL) inline."""
        import ipywidgets as w

        layout = w.Layout(max_width="100%")
        if data.startswith(("http://", "https://")):
            tag = f'<img src="{html.escape(data)}" style="max-width:100%">'
            self._add(_Item(w.Image.from_url(data), f"  [image {data}]", "image", tag))
            return
        try:
            raw = decode_base64(data)
        except ValueError as exc:
            self._add_text(f"(an image could not be shown: {exc})")
            return
        fmt = image_format(raw)
        image = w.Image(value=raw, format=fmt, layout=layout)
        uri = f"data:image/{fmt};base64,{base64.b64encode(raw).decode('ascii')}"
        tag = f'<img src="{uri}" style="max-width:100%">'
        self._add(_Item(image, f"  [image {fmt}, {size_text(len(raw))}]", "image", tag))

    def send_file(self, name: str, data: str) -> None:
        """Offer a file sent as base64 as a download link."""
        import ipywidgets as w

        try:
            raw = decode_base64(data)
        except ValueError as exc:
            self._add_text(f"(the file {name} could not be offered: {exc})")
            return
        link = download_link(name, base64.b64encode(raw).decode("ascii"), len(raw))
        self._add(_Item(w.HTML(link), f"  [file {name}, {size_text(len(raw))}]", "file"))

    def request_approval(self, request: ApprovalRequest) -> None:
        """Show an approval card with the complete call; its buttons answer through the Agent."""
        row = self._row_asking(request)
        card = ApprovalCard(self.agent, request, row.arguments if row is not None else None)
        self.cards[request.id] = card
        if row is not None:
            self._card_rows[request.id] = row
            row.approval_asked()
        self._add(card)

    def _answered(self, card: ApprovalCard) -> None:
        """A card was settled: its tool row shows the wait apart from the tool's own time."""
        asked = self._card_rows.get(card.request.id)
        if asked is not None and card.waited is not None:
            asked.approval_answered(card.waited)

    def _row_asking(self, request: ApprovalRequest) -> ToolRow | None:
        """The running tool row (of this run or a child) whose call the request is about."""
        rows = [*self.tool_rows.values()]
        for nested in self.children.values():
            for child in nested.rows.values():
                rows += child.tool_rows.values()
        asked = set(map(id, self._card_rows.values()))
        return row_asking(self.agent, request, [r for r in rows if id(r) not in asked])

    # ---------------------------------------------------------------- finish

    def finish(self, result: RunResult) -> None:
        """Show the final state: status, the reply as Markdown, usage; stops the ticker."""
        self.result = result
        self.status = result.status
        self.error = result.error
        self.warnings = list(result.warnings)
        self.usage = result.usage.to_dict()
        self.reply_text = result.text
        self.reply.value = markdown_html(result.text)
        self._rendered = len(result.text)
        self.usage_label.value = usage_text(self.usage) + self._cost_text(result)
        self._end_open_parts(result.status)

    def abort(self, error: str, status: str = "error") -> None:
        """End the view of a run that gave no `RunResult` (it raised): the status and why."""
        self.status, self.error, self.notice = status, error, ""
        self._render_stream()
        self._end_open_parts(status)

    def _end_open_parts(self, status: str) -> None:
        """Settle open cards, running rows and children; stop the ticker; save the final state."""
        for card in self.cards.values():
            if card.state == "pending":
                card.resolve("stopped", f"the run ended ({status})")
                self._answered(card)
        for row in self.tool_rows.values():
            if row.state == "running":
                row.finish(f"the run ended ({status})", "not finished", 0, "stopped")
        for nested in self.children.values():
            nested.end_foreground(status)  # background children go on
        self._stop_ticker()
        self._render_header()
        self.refresh_display()

    def _cost_text(self, result: RunResult) -> str:
        """`` · cost $0.0123`` when every model the run used has a configured price."""
        if result.usage.cost is None:
            return ""
        return f" · cost {self.agent.config.pricing.currency}{result.usage.cost:,.4f}"

    def close(self) -> None:
        """Stop the ticker and close the widgets (the view cannot be shown again)."""
        self._stop_ticker()
        for nested in self.children.values():
            nested.close()
        self._stop_following()
        close_tree(self.widget)

    @property
    def elapsed(self) -> float:
        """Seconds since the view was created (frozen when the run ends)."""
        end = self._stopped_at if self._stopped_at is not None else time.monotonic()
        return end - self._started

    def headline(self) -> tuple[str, str]:
        """The header's state and words: the status, or ``finished · 1 call denied``."""
        if self._stopped_at is None:
            return self.status, self.status
        return run_headline(self.status, (row.state for row in self.tool_rows.values()))

    @property
    def live(self) -> bool:
        """Whether the widget still has something to show that static HTML cannot (running)."""
        if self._stopped_at is None:
            return True
        return any(row.background for n in self.children.values() for row in n.running)

    def html(self) -> str:
        """The run's current state as static HTML (the saved notebook's fallback)."""
        return run_html(self)

    def text(self) -> str:
        """The whole run as plain text: status line, prompt, tools, approvals, reply."""
        state, label = self.headline()
        head = f"{STATUS_ICONS.get(state, '?')} {label} · {self.session}"
        head += f" · {elapsed_text(self.elapsed)}"
        usage = usage_text(self.usage) if self.usage else ""
        if usage:
            head += f" · {usage}"
            if self.result is not None:
                head += self._cost_text(self.result)
        lines = [head]
        if self.prompt:
            lines.append(f"› {flatten(self.prompt, 200)}")
        lines += [item.text() for item in self.items]
        if self.reply_text:
            lines.append(self.reply_text)
        if self.error:
            lines.append(f"error: {self.error}")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    # -------------------------------------------------------------- internals

    def _add(self, item: Any) -> None:
        self.items.append(item)
        self.body.children = (*self.body.children, item.widget)

    def _add_text(self, text: str) -> None:
        import ipywidgets as w

        block = w.HTML(f'<div style="opacity:0.75">{markdown_html(text)}</div>')
        self._add(_Item(block, "  … " + flatten(text, 200), "text"))

    def _render_stream(self) -> None:
        if self._rendered != len(self.reply_text):
            self.reply.value = markdown_html(self.reply_text)
            self._rendered = len(self.reply_text)

    def _clear_stream(self) -> None:
        if self.reply_text and self.status == "running":
            self.reply_text = ""
            self.reply.value = ""
            self._rendered = 0

    def _injected(self, data: dict[str, Any]) -> None:
        import ipywidgets as w

        self._add(_Item(w.HTML(injected_html(data)), f"  {injected_text(data)}", "knowledge"))

    def _tool_end(self, data: dict[str, Any]) -> None:
        row = self.tool_rows.get(str(data.get("id", "")))
        if row is None:  # its start was missed: show it anyway
            row = ToolRow(str(data.get("id", "")), str(data["name"]), str(data["arguments"]))
            self.tool_rows[row.id] = row
            self._add(row)
        row.finish(
            str(data.get("result", "")),
            data.get("error"),
            int(data.get("duration_ms", 0) or 0),
            str(data.get("outcome") or ""),
        )

    def _child(self, data: dict[str, Any]) -> None:
        """Route a child run's event to the nested view under its parent tool row."""
        inner = data.get("data")
        if data.get("kind") == "approval_resolved" and isinstance(inner, dict):
            # A child's approval card is this view's (its request came through our callbacks).
            self.on_event(RunEvent("approval_resolved", self.session, inner))
            return
        call_id = str(data.get("call_id", ""))
        nested = self.children.get(call_id)
        if nested is None:
            row = self.tool_rows.get(call_id)
            nested = ChildrenView(call_id, row.name if row else "", on_end=self._child_ended)
            self.children[call_id] = nested
            at = self.items.index(row) + 1 if row in self.items else len(self.items)
            self.items.insert(at, nested)
            body = list(self.body.children)
            body.insert(at, nested.widget)
            self.body.children = tuple(body)
        nested.apply(data)

    def _child_ended(self, row: ChildRow) -> None:
        if row.background and row.status != "stopped":  # a cancelled child injects nothing
            self._follow(row)
        if self._stopped_at is not None:  # a background child after the run: resave the text
            self.refresh_display()

    def _follow(self, row: ChildRow) -> None:
        """Wait for the agent's reply to a background child's result, published on the outbox."""
        outbox = getattr(self.agent, "outbox", None)
        if outbox is None:
            return
        self._followups.append(row)
        if self._unfollow is None:
            self._unfollow = outbox.subscribe(self._on_delivery)

    def _on_delivery(self, delivery: Delivery) -> None:
        if delivery.source != "subagent" or delivery.session != self.session:
            return
        # The results that ended by now are answered together (one queued batch, one reply).
        rows, self._followups = self._followups, []
        self._stop_following()
        for row in rows:
            row.show_followup(delivery.title, delivery.text)
        if self._stopped_at is not None:
            self.refresh_display()

    def _stop_following(self) -> None:
        if self._unfollow is not None:
            self._unfollow()
            self._unfollow = None

    def _render_header(self) -> None:
        # While running, the spinner stands where the status icon will be.
        self.status_label.value = header_html(self, spinner=self._ticking)
        self.spinner.layout.display = None if self._ticking else "none"
        self.spinner.value = SPINNER[self._frame % len(SPINNER)] if self._ticking else ""
        self.elapsed_label.value = elapsed_text(self.elapsed)
        lines = (
            [f'<span style="color:#c62828">{html.escape(self.error)}</span>'] if self.error else []
        )
        lines += [
            f'<span style="color:#ef6c00">warning: {html.escape(w)}</span>' for w in self.warnings
        ]
        if self.notice and not lines:
            lines.append(f'<span style="color:#ef6c00">{html.escape(self.notice)}</span>')
        self.error_html.value = "<br>".join(lines)

    @property
    def _ticking(self) -> bool:
        return self._stopped_at is None

    def _start_ticker(self) -> None:
        if self._ticker is not None or not self._ticking:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: the first event (on the agent's loop) starts it
        self._ticker = loop.create_task(self._tick(), name="ania-run-view-ticker")

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            self._frame += 1
            self.spinner.value = SPINNER[self._frame % len(SPINNER)]
            self.elapsed_label.value = elapsed_text(self.elapsed)
            self._render_stream()

    def _stop_ticker(self) -> None:
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None


def injected_text(data: Mapping[str, Any]) -> str:
    """The run widget's line for a ``knowledge`` event: what auto-inject put into the turn.

    ``📚 injected: 《Deploy guide》 ×2 (score 0.81), 《FAQ》 (score 0.52) · 🧠 1 memory: “…”``.
    Chunks of one document are counted, not repeated; the best score of each is shown.
    """
    best: dict[str, tuple[str, int, float]] = {}  # doc id → title, chunks, best score
    for chunk in data.get("chunks") or ():
        key = str(chunk.get("doc_id") or chunk.get("chunk_id") or len(best))
        title, count, score = best.get(key, (str(chunk.get("title") or "(untitled)"), 0, 0.0))
        best[key] = (title, count + 1, max(score, float(chunk.get("score") or 0.0)))
    parts = []
    if best:
        docs = [
            f"《{title}》{f' ×{count}' if count > 1 else ''} (score {score:.2f})"
            for title, count, score in best.values()
        ]
        parts.append("📚 injected: " + ", ".join(docs))
    memories: Sequence[Mapping[str, Any]] = data.get("memories") or ()
    if memories:
        noun = "memory" if len(memories) == 1 else "memories"
        shown = ", ".join(f"“{flatten(str(m.get('content', '')), 40)}”" for m in memories[:3])
        more = f" +{len(memories) - 3}" if len(memories) > 3 else ""
        parts.append(f"🧠 {len(memories)} {noun}: {shown}{more}")
    return " · ".join(parts) or "📚 injected: nothing"


def injected_html(data: Mapping[str, Any]) -> str:
    """The ``knowledge`` event's line as HTML, with each chunk's scores in a tooltip."""
    details = []
    for chunk in data.get("chunks") or ():
        similarity = chunk.get("similarity")
        sim = f", similarity {float(similarity):.3f}" if similarity is not None else ""
        details.append(
            f"{chunk.get('title', '')} [{chunk.get('chunk_id', '')}] {chunk.get('scope', '')}: "
            f"score {float(chunk.get('score') or 0):.3f}{sim}, "
            f"match {float(chunk.get('match') or 0):.2f}"
        )
    tip = html.escape("\n".join(details), quote=True)
    from ._icons import icon  # SVG, not emoji: no emoji font needed in the browser

    line = html.escape(injected_text(data))
    line = line.replace("📚", icon("book", label="knowledge")).replace("🧠", icon("memory"))
    return f'<div style="opacity:0.75;font-size:90%" title="{tip}">{line}</div>'
