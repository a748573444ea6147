"""`ClockPanel`: the clock's tasks and the latest results of its runs, live in a notebook.

The panel listens to `Clock.subscribe` (tasks created, changed, deleted; runs started and
finished — other processes' changes included) and to the Agent's outbox (the text delivered to
a session when a clock run finishes), so it keeps changing while the kernel is idle. Every update
runs on the kernel's event loop: listeners are called there, button clicks start tasks there,
and a slow ticker re-reads the lease state (a takeover sends no event). ``text()`` renders the
same panel as plain text for nbconvert and terminals.

Images, files and approval requests of clock runs reach the open panels through
`panel_callbacks`, which the notebook extension installs as the outbox's ``callbacks_for``.
"""

from __future__ import annotations

import asyncio
import base64
import html
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...engine.callbacks import NO_CALLBACKS, ApprovalRequest, Callbacks
from ...text import flatten
from ._display import close_tree
from ._format import (
    STATUS_ICONS,
    clock_time,
    decode_base64,
    download_link,
    duration_text,
    image_format,
    markdown_html,
    size_text,
)
from .panel import Panel

if TYPE_CHECKING:  # pragma: no cover
    from ...agent import Agent
    from ...clock import ClockEvent, ClockTask, TaskLogEntry
    from ...orchestration.outbox import Delivery

log = logging.getLogger(__name__)

LEASE_TICK = 2.0  # seconds between looks at the lease (taking it over sends no event)
ICONS = {**STATUS_ICONS, "skipped": "↷", "interrupted": "■"}
COLORS = {"running": "#1565c0", "success": "#2e7d32", "skipped": "#757575"}
ROW = "padding:2px 4px"


class ClockPanel(Panel):
    """The clock of ``agent``: a header, one row per task with buttons, and a result feed.

    ``target`` limits the panel to one session's tasks and results (None: all of them).
    Show it, then `refresh` (``%ania clock`` does both); `close` stops the live updates.
    """

    def __init__(self, agent: Agent, *, target: str | None = None, feed_limit: int = 20) -> None:
        import ipywidgets as w

        super().__init__()
        self.agent = agent
        self.clock = agent.clock
        self.target = target
        self.feed_limit = feed_limit
        self.lease_tick = LEASE_TICK
        self.tasks: dict[str, ClockTask] = {}  # in creation order
        self.feed: list[FeedItem] = []  # newest first
        self._rows: dict[str, TaskRow] = {}
        self._feed_widgets: dict[str, Any] = {}
        self._cards: list[Any] = []
        self._deliveries = 0
        self._lease_seen: tuple[bool, str] | None = None
        self._changed: asyncio.Future[None] | None = None  # resolved by the next render
        self._reloads: dict[str, int] = {}  # task id → number of its newest store read

        self.header = w.HTML()
        self.task_box = w.VBox([])
        self.feed_heading = w.HTML("<b>Latest results</b> <small>(newest first)</small>")
        self.feed_box = w.VBox([])
        self.widget = w.VBox(
            [self.header, self.task_box, self.message_html, self.feed_heading, self.feed_box],
            layout=w.Layout(border="1px solid #ddd", padding="4px"),
        )
        self._unsubscribe = [
            self.clock.subscribe(self.on_clock_event),
            agent.outbox.subscribe(self.on_delivery),
        ]
        global _opened
        _opened += 1
        self._order = _opened
        _OPEN.add(self)
        self._render_header()
        self._render_tasks()
        self._start_ticker(self._tick, "ania-clock-panel-ticker")

    @staticmethod
    def open_panels(agent: Agent | None = None) -> list[ClockPanel]:
        """The panels not closed yet (of ``agent``, or all), oldest first."""
        shown = [p for p in list(_OPEN) if not p.closed and (agent is None or p.agent is agent)]
        return sorted(shown, key=lambda p: p._order)

    # ------------------------------------------------------------------ loading

    async def refresh(self) -> ClockPanel:
        """Load the tasks and the latest log entries from the clock and show them."""
        tasks = await self.clock.list(self.target)
        entries = await self.clock.logs(target=self.target, limit=self.feed_limit)
        self.tasks = {task.id: task for task in tasks}
        known = {item.key: item for item in self.feed}
        for entry in reversed(entries):  # oldest first, so the newest ends on top
            item = known.get(entry_key(entry.id))
            if item is None:
                self._upsert_entry(entry)
            elif not item.delivered:
                apply_entry(item, entry)
        self.feed.sort(key=lambda item: item.when, reverse=True)  # events may have come first
        self._render()
        return self

    # ------------------------------------------------------------------ events

    def on_clock_event(self, event: ClockEvent) -> None:
        """Apply one clock change: a task row appears, changes or goes; a run enters the feed."""
        if self.closed:
            return
        task = event.task
        if task is not None and not self._mine(task.target):
            if self.tasks.pop(task.id, None) is not None:  # moved to another session
                self._render()
            return
        if event.kind in ("task_created", "task_updated") and task is not None:
            self.tasks[task.id] = task
            self.tasks = dict(sorted(self.tasks.items(), key=lambda kv: creation_key(kv[1])))
        elif event.kind == "task_deleted":
            self.tasks.pop(event.task_id, None)
        elif event.kind in ("run_started", "run_finished"):
            entry = event.entry
            known = self.tasks.get(event.task_id)
            if known is not None and entry is not None and entry.status != "skipped":
                # The event's task is as it was when the run began: take the run's status
                # now and the rest (next_run_at moved on) from the store.
                self.tasks[known.id] = replace(known, last_status=entry.status)
                self._reload_task(known.id)
            if entry is not None and self._mine(entry.target):
                self._upsert_entry(entry)
        self._render()

    def on_delivery(self, delivery: Delivery) -> None:
        """Show the text a clock run delivered to its session (full, unlike the log's copy)."""
        if self.closed or delivery.source != "clock" or not self._mine(delivery.session):
            return
        meta = delivery.meta or {}
        entry_id = meta.get("entry_id")
        task_id = str(meta.get("task_id", "") or "")
        item = self._find(entry_key(entry_id)) if entry_id is not None else None
        if item is None and entry_id is None and task_id:
            # No entry id: the newest run of the task that has no delivered text yet.
            item = next((i for i in self.feed if i.task_id == task_id and not i.delivered), None)
        if item is None:
            self._deliveries += 1
            key = entry_key(entry_id) if entry_id is not None else f"d{self._deliveries}"
            task = self.tasks.get(task_id)
            item = FeedItem(
                key=key,
                task_id=task_id,
                title=delivery.title or (task.title if task else ""),
                target=delivery.session,
                status=delivery.status,
                when=time.time(),
            )
            self._insert(item)
        item.text = delivery.text
        item.delivered = True
        if item.status == "running":
            item.status = delivery.status
        self._render()

    # ------------------------------------------------------------------ media

    def add_image(self, session: str, data: str) -> None:
        """Show an image a clock run sent to ``session`` (base64, data: URI or URL)."""
        self._add_media(session, *image_media(data))

    def add_file(self, session: str, name: str, data: str) -> None:
        """Offer a file a clock run sent to ``session`` as a download link."""
        self._add_media(session, *file_media(name, data))

    def add_approval(self, request: ApprovalRequest) -> None:
        """Show an approval card for a clock run's tool call (answered through the Agent)."""
        from .approval import ApprovalCard

        if self.closed:
            return
        # Answered cards go once a new question comes (the feed keeps the run's outcome).
        for old in [c for c in self._cards if c.state != "pending"]:
            self._cards.remove(old)
            close_tree(old.widget)
        self._cards.append(ApprovalCard(self.agent, request))
        self._render()

    # ------------------------------------------------------------------ buttons

    def toggle(self, task_id: str) -> asyncio.Task[Any]:
        """Enable a disabled task or disable an enabled one (what the task's first button does)."""
        task = self.tasks.get(task_id)
        enable = not task.enabled if task is not None else True
        verb = "enabled" if enable else "disabled"

        async def work() -> str:
            done = await self.clock.update(task_id, updater="panel", enabled=enable)
            self._apply_task(done)
            return f"{verb} #{task_id}"

        return self._act(work())

    def run_now(self, task_id: str) -> asyncio.Task[Any]:
        """Run a task now (its result enters the feed when it finishes)."""

        async def work() -> str:
            self._set_message(f"running #{task_id}…")
            entry = await self.clock.run_now(task_id)
            self._upsert_entry(entry)
            return f"ran #{task_id}: {entry.status}"

        return self._act(work())

    def delete(self, task_id: str) -> asyncio.Task[Any]:
        """Delete a task (its log stays)."""

        async def work() -> str:
            gone = await self.clock.delete(task_id)
            self.tasks.pop(gone.id, None)
            return f"deleted #{task_id} {gone.title}".rstrip()

        return self._act(work())

    async def wait_until(self, condition: Callable[[ClockPanel], bool]) -> None:
        """Wait until ``condition(panel)`` holds, checking after every change of the panel.

        Bound it with ``asyncio.timeout``; meanwhile the loop (and so the clock) keeps running.
        """
        while not condition(self):
            if self.closed:
                raise RuntimeError("the clock panel was closed")
            self._changed = asyncio.get_running_loop().create_future()
            await self._changed

    # ------------------------------------------------------------------ text

    def text(self) -> str:
        """The panel as plain text: lease line, one line per task, then the feed."""
        lines = [self._header_text()]
        lines += [f"  {task_line(task)}" for task in self.tasks.values()]
        if self.message:
            lines.append(self.message)
        lines += [card.text().strip() for card in self._cards if card.state == "pending"]
        lines.append("Latest results (newest first):" if self.feed else "No results yet.")
        for item in self.feed:
            lines.append(f"  {item.headline()}")
            body = item.text or (f"error: {item.error}" if item.error else "")
            lines += [f"    {line}" for line in body.splitlines() if line.strip()]
            lines += [f"    {text}" for text, _ in item.media]
        return "\n".join(lines)

    def close(self) -> None:
        """Stop listening (clock and outbox), cancel the panel's tasks, close the widgets.

        A "Run now" still running is cancelled with the rest (its run ends ``interrupted``).
        """
        if self.closed:
            return
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
        _OPEN.discard(self)
        super().close()
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)  # a waiter wakes up and sees the panel closed

    # ------------------------------------------------------------------ internals

    def _mine(self, session: str) -> bool:
        return self.target is None or session == self.target

    def _find(self, key: str) -> FeedItem | None:
        return next((item for item in self.feed if item.key == key), None)

    def _insert(self, item: FeedItem) -> None:
        self.feed.insert(0, item)
        for old in self.feed[self.feed_limit :]:
            widget = self._feed_widgets.pop(old.key, None)
            if widget is not None:
                close_tree(widget)
        del self.feed[self.feed_limit :]

    def _upsert_entry(self, entry: TaskLogEntry) -> None:
        item = self._find(entry_key(entry.id))
        if item is None:
            item = FeedItem(
                key=entry_key(entry.id),
                task_id=entry.task_id,
                title=entry.title,
                target=entry.target,
                status=entry.status,
                when=entry.started_at,
            )
            self._insert(item)
        apply_entry(item, entry)

    def _reload_task(self, task_id: str) -> None:
        """Re-read one task from the store soon; only the newest read of a task is applied."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop (a script): the next event or refresh brings it
            return
        self._reloads[task_id] = generation = self._reloads.get(task_id, 0) + 1

        async def reload() -> None:
            try:
                task = await self.clock.get(task_id)
            except Exception:  # e.g. the clock closed meanwhile: the row stays as it was
                log.debug("reloading clock task %s failed", task_id, exc_info=True)
                return
            current = self._reloads.get(task_id) == generation
            if task is not None and current and task_id in self.tasks and not self.closed:
                self.tasks[task_id] = task
                self._render()

        self._spawn(reload())

    def _apply_task(self, task: ClockTask) -> None:
        if task.id in self.tasks or self._mine(task.target):
            self.tasks[task.id] = task

    def _add_media(self, session: str, text: str, html_: str) -> None:
        if self.closed or not self._mine(session):
            return
        # Media come during a run: they belong to the newest running item of the session.
        item = next((i for i in self.feed if i.target == session and i.status == "running"), None)
        if item is None:
            self._deliveries += 1
            item = FeedItem(
                f"d{self._deliveries}", "", "sent by a clock run", session, "", time.time()
            )
            self._insert(item)
        item.media.append((text, html_))
        self._render()

    def _render(self) -> None:
        if self.closed:
            return
        self._render_header()
        self._render_tasks()
        self._render_feed()
        self.refresh_display()
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    def _header_text(self) -> str:
        status = self.clock.status_text()
        where = f" · tasks of {self.target}" if self.target else ""
        return f"◷ {status}{where} · {len(self.tasks)} task(s) shown"

    def _render_header(self) -> None:
        self._lease_seen = (self.clock.active, self.clock.status_text())
        color = "#2e7d32" if self.clock.active else "#ef6c00"
        self.header.value = f'<b style="color:{color}">{html.escape(self._header_text())}</b>'

    def _render_tasks(self) -> None:
        for task_id in [t for t in self._rows if t not in self.tasks]:
            close_tree(self._rows.pop(task_id).widget)
        for task in self.tasks.values():
            row = self._rows.get(task.id)
            if row is None:
                row = self._rows[task.id] = TaskRow(task.id, self._button)
            row.show(task)
        self.task_box.children = tuple(self._rows[t].widget for t in self.tasks)

    def _render_feed(self) -> None:
        import ipywidgets as w

        for key in [k for k in self._feed_widgets if self._find(k) is None]:
            close_tree(self._feed_widgets.pop(key))
        for item in self.feed:
            widget = self._feed_widgets.get(item.key)
            if widget is None:
                widget = self._feed_widgets[item.key] = w.HTML()
            widget.value = item_html(item)
        cards = [card.widget for card in self._cards]
        self.feed_box.children = (*cards, *(self._feed_widgets[i.key] for i in self.feed))

    async def _tick(self) -> None:
        while not self.closed:
            await asyncio.sleep(self.lease_tick)
            if (self.clock.active, self.clock.status_text()) != self._lease_seen:
                self._render()
            if self.clock.status_text().startswith("clock: closed"):
                return  # its Agent was closed (e.g. by %ania config): nothing changes any more

    def _button(self, action: str, task_id: str) -> None:
        """A task row's button was clicked (on the kernel's loop)."""
        {"toggle": self.toggle, "run_now": self.run_now, "delete": self.delete}[action](task_id)


# Open panels, so `panel_callbacks` can route a clock run's media to them (weak: a panel the
# user dropped without closing is not kept alive by this set).
_OPEN: weakref.WeakSet[ClockPanel] = weakref.WeakSet()
_opened = 0  # panels made so far: their order


def panel_callbacks(agent: Agent) -> Callable[[str], Callbacks]:
    """The outbox's ``callbacks_for`` in a notebook: clock runs' media go to the open panels.

    A session gets images, files and approval requests only while a panel that shows it is
    open; without one its clock runs have no such callbacks (tools say so, approvals deny).
    """

    def panels(session: str) -> list[ClockPanel]:
        return [p for p in ClockPanel.open_panels(agent) if p._mine(session)]

    def callbacks_for(session: str) -> Callbacks:
        if not panels(session):
            return NO_CALLBACKS

        def send_image(data: str) -> None:
            for panel in panels(session):
                panel.add_image(session, data)

        def send_file(name: str, data: str) -> None:
            for panel in panels(session):
                panel.add_file(session, name, data)

        def request_approval(request: ApprovalRequest) -> None:
            shown = panels(session)
            if shown:  # one card, in the newest panel: answering it there settles the call
                shown[-1].add_approval(request)

        return Callbacks(
            send_image=send_image, send_file=send_file, request_approval=request_approval
        )

    return callbacks_for


# ------------------------------------------------------------------ rows and feed items


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
