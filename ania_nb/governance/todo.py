"""``todo_write``: the model's task list for a main session, and the reminder it brings back.

Each call replaces the whole list. The list is kept in the store (KV namespace ``todos``) so it
survives a kernel restart, and every change is emitted as a ``RunEvent("todos", …)`` for live
widgets. While items remain unfinished, the next user turn carries a ``<todo_reminder>`` — but
only when the unfinished list changed since the last reminder (hash dedupe, in memory).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, Field, ValidationError

from ..engine.callbacks import RunEvent
from ..errors import ToolError
from ..tools import BaseTool, ToolArgumentsError, ToolContext

if TYPE_CHECKING:  # pragma: no cover
    from ..store import KVNamespace

MAX_ITEMS = 50
MAX_CONTENT_CHARS = 200
STATUSES = ("pending", "in_progress", "completed")
LABELS = {"pending": "pending", "in_progress": "in progress", "completed": "completed"}

Todo = dict[str, str]


class TodoItem(BaseModel):
    """One task."""

    content: Annotated[str, Field(description="What to do, one short line (≤ 200 characters).")]
    status: Annotated[str, Field(description="pending, in_progress or completed.")]
    activeForm: Annotated[  # camelCase: the name models know from other agents
        str, Field(description="Optional present-continuous form, e.g. 'Running tests'.")
    ] = ""


class TodoParams(BaseModel):
    """todo_write parameters."""

    todos: Annotated[
        list[TodoItem],
        Field(description="The complete new list (it replaces the old one); [] clears it."),
    ]


def validate_todos(items: list[TodoItem]) -> list[Todo]:
    """Checked, trimmed items; raises `ToolError` naming the first bad item (1-based)."""
    if len(items) > MAX_ITEMS:
        raise ToolError(f"too many items: {len(items)} (at most {MAX_ITEMS})")
    todos: list[Todo] = []
    for i, item in enumerate(items, 1):
        content = item.content.strip()
        if not content:
            raise ToolError(f"item {i}: content is empty")
        if len(content) > MAX_CONTENT_CHARS:
            raise ToolError(
                f"item {i}: content has {len(content)} characters (at most {MAX_CONTENT_CHARS})"
            )
        status = item.status.strip().lower()
        if status not in STATUSES:
            raise ToolError(
                f"item {i}: status {item.status!r} is invalid; use pending, in_progress or "
                "completed"
            )
        todos.append({"content": content, "status": status, "activeForm": item.activeForm})
    active = [i for i, t in enumerate(todos, 1) if t["status"] == "in_progress"]
    if len(active) > 1:
        raise ToolError(
            f"items {', '.join(map(str, active))} are all in_progress; at most one item may be "
            "in_progress at a time"
        )
    return todos


def summary(todos: list[Todo]) -> str:
    """The tool's result text: counts, then every item."""
    if not todos:
        return "Task list cleared."
    count = {s: sum(t["status"] == s for t in todos) for s in STATUSES}
    head = (
        f"Task list updated: {len(todos)} items ({count['in_progress']} in progress, "
        f"{count['pending']} pending, {count['completed']} completed)"
    )
    return "\n".join([head, *_lines(todos)])


def _lines(todos: list[Todo]) -> list[str]:
    return [f"{i}. [{LABELS[t['status']]}] {t['content']}" for i, t in enumerate(todos, 1)]


class TodoBook:
    """Every main session's task list, kept in a KV namespace (in memory until it opens)."""

    def __init__(self) -> None:
        self.kv: KVNamespace | None = None  # bound when the store opens
        self._lists: dict[str, list[Todo]] = {}
        self._reminded: dict[str, str] = {}  # session → hash of the last reminder

    async def get(self, session: str) -> list[Todo]:
        """The session's list, read from the store each time (another replica may write it)."""
        if self.kv is not None:
            self._lists[session] = [dict(t) for t in await self.kv.get(session, [])]
        return [dict(t) for t in self._lists.get(session, [])]

    async def put(self, session: str, todos: list[Todo]) -> None:
        """Replace the session's list (and its stored copy)."""
        if self.kv is not None:
            if todos:
                await self.kv.set(session, todos)
            else:
                await self.kv.delete(session)
        self._lists[session] = [dict(t) for t in todos]

    async def reminder(self, session: str) -> str:
        """The ``<todo_reminder>`` for the next turn, or '' when nothing changed or is left."""
        pending = [t for t in await self.get(session) if t["status"] != "completed"]
        if not pending:
            self._reminded.pop(session, None)
            return ""
        lines = _lines(pending)
        digest = hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()
        if self._reminded.get(session) == digest:
            return ""
        self._reminded[session] = digest
        return (
            f"<todo_reminder>{len(pending)} item(s) of the task list are not completed:\n"
            + "\n".join(lines)
            + "\nUpdate the list with todo_write as soon as an item is done; clear it when "
            "everything is done.</todo_reminder>"
        )


class TodoWriteTool(BaseTool[TodoParams]):
    """Write the session's task list."""

    name = "todo_write"
    description = (
        "Keep a task list for multi-step work. Send the COMPLETE list every time (it replaces "
        f"the previous one; [] clears it): at most {MAX_ITEMS} items of at most "
        f"{MAX_CONTENT_CHARS} characters, each pending, in_progress or completed, and at most "
        "one in_progress. Mark an item completed as soon as it is done."
    )

    def __init__(self, book: TodoBook, session: str) -> None:
        self.book = book
        self.session = session

    def _validate(self, arguments: dict[str, Any]) -> Any:
        # Name a bad item by its 1-based position, as the other todo errors do.
        try:
            return TodoParams.model_validate(arguments)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            loc = err["loc"]
            if len(loc) < 3 or loc[0] != "todos" or not isinstance(loc[1], int):
                raise ToolArgumentsError.from_validation_error(self.name, exc) from None
            problem = "is required" if err["type"] == "missing" else err["msg"].lower()
            raise ToolArgumentsError(
                f"invalid arguments for tool 'todo_write': item {loc[1] + 1}: {loc[2]} {problem}",
                tool=self.name,
                field=".".join(map(str, loc)),
            ) from None

    async def execute(self, params: TodoParams, ctx: ToolContext) -> str:
        """Validate, store, tell the front end, summarise."""
        todos = validate_todos(params.todos)
        await self.book.put(self.session, todos)
        data: dict[str, Any] = {"todos": todos}
        await ctx.callbacks.emit(RunEvent("todos", self.session, data))
        return summary(todos)
