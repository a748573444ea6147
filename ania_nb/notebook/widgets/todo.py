"""`TodoView`: a session's todo_write list, live (○ pending, ◐ in progress, ● completed)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ...engine.callbacks import Callbacks, RunEvent
from ...session_keys import DEFAULT_NOTEBOOK
from ._display import Displayable, close_tree
from ._format import TODO_ICONS

if TYPE_CHECKING:  # pragma: no cover
    from ...agent import Agent

ITEM_STYLES = {
    "pending": "padding:1px 6px",
    "in_progress": "padding:1px 6px;background:#fff3cd;font-weight:bold;border-radius:3px",
    "completed": "padding:1px 6px;color:#757575;text-decoration:line-through",
}


class TodoView(Displayable):
    """The todo list of one session, from `Agent.todos` and ``todos`` run events."""

    def __init__(self, agent: Agent, session: str = DEFAULT_NOTEBOOK) -> None:
        import ipywidgets as w

        self.agent = agent
        self.session = session
        self.todos: list[dict[str, str]] = []
        self.heading = w.HTML()
        self.list = w.VBox([])
        self.widget = w.VBox([self.heading, self.list])
        self.callbacks = Callbacks(on_event=self.callbacks_hook)  # for runs without a RunView
        self._render()

    async def refresh(self) -> list[dict[str, str]]:
        """Load the stored list and show it; returns it."""
        self.show(await self.agent.todos(self.session))
        return self.todos

    def callbacks_hook(self, event: RunEvent) -> None:
        """Apply a ``todos`` event of this session (other events are ignored)."""
        if event.kind == "todos" and event.session == self.session:
            self.show(event.data.get("todos", []))

    def show(self, todos: Iterable[Mapping[str, Any]]) -> None:
        """Replace the shown list."""
        self.todos = [{k: str(v) for k, v in item.items()} for item in todos]
        self._render()
        self.refresh_display()

    @property
    def in_progress(self) -> dict[str, str] | None:
        """The item being worked on, if any."""
        return next((t for t in self.todos if t.get("status") == "in_progress"), None)

    def text(self) -> str:
        """The list as plain text, one item a line."""
        lines = [self._heading_text()]
        lines += [f"  {TODO_ICONS.get(t.get('status', ''), '?')} {_label(t)}" for t in self.todos]
        return "\n".join(lines)

    def _heading_text(self) -> str:
        if not self.todos:
            return f"Todos for {self.session}: none"
        done = sum(t.get("status") == "completed" for t in self.todos)
        return f"Todos for {self.session} ({done}/{len(self.todos)} done)"

    def _render(self) -> None:
        import ipywidgets as w

        self.heading.value = f"<b>{html.escape(self._heading_text())}</b>"
        rows = list(self.list.children)
        while len(rows) > len(self.todos):  # reuse the row widgets, close the extra ones
            close_tree(rows.pop())
        while len(rows) < len(self.todos):
            rows.append(w.HTML())
        for row, item in zip(rows, self.todos, strict=True):
            status = item.get("status", "")
            style = ITEM_STYLES.get(status, "")
            icon = TODO_ICONS.get(status, "?")
            row.value = f'<span style="{style}">{icon} {html.escape(_label(item))}</span>'
        self.list.children = tuple(rows)


def _label(item: Mapping[str, str]) -> str:
    """The item's text; the in-progress one also says what is happening."""
    content = item.get("content", "")
    active = item.get("activeForm", "")
    if item.get("status") == "in_progress" and active and active != content:
        return f"{content} — {active}…"
    return content
