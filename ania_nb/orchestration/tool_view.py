"""`ToolView`: a session's tool table minus the tools a run kind may not use.

Subagents and team members must not start subagents or teams, and one-shot runs have no todo
list; the view hides those names from the definitions and refuses them at call time, while
tools that register tools (``mcp_load_*``) still reach the underlying session table.
`front_end_view` also hides the tools the run's front end cannot serve (a notebook has no chat
history to page through, a headless run cannot show a sticker).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..tools import ToolContext
from ..tools.executor import ToolOutcome

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.callbacks import Callbacks
    from ..tools import SessionToolExecutor, Tool


class ToolView:
    """A read-through view of ``table`` without the ``hidden`` tool names."""

    def __init__(self, table: SessionToolExecutor, hidden: Iterable[str]) -> None:
        self.table = table
        self.hidden = frozenset(hidden)
        self._cache: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None

    def get(self, name: str) -> Tool | None:
        """The tool called ``name`` unless hidden."""
        return None if name in self.hidden else self.table.get(name)

    def names(self) -> list[str]:
        """Visible tool names, sorted."""
        return [n for n in self.table.names() if n not in self.hidden]

    def definitions(self) -> list[dict[str, Any]]:
        """The table's definitions without hidden tools; the same list until the table changes."""
        full = self.table.definitions()
        cached = self._cache
        if cached is not None and cached[0] is full:
            return cached[1]
        visible = [d for d in full if d["function"]["name"] not in self.hidden]
        self._cache = (full, visible)
        return visible

    async def execute(
        self, name: str, arguments: str | Mapping[str, Any] | None, ctx: ToolContext | None = None
    ) -> ToolOutcome:
        """Run a visible tool; a hidden one answers like an unknown tool."""
        if name in self.hidden:
            error = f"tool '{name}' not found. Available tools: [{', '.join(self.names())}]"
            return ToolOutcome("Error executing tool: " + error, error, 0)
        return await self.table.execute(name, arguments, ctx)


def front_end_view(
    table: SessionToolExecutor, callbacks: Callbacks, hidden: Iterable[str] = ()
) -> ToolView | SessionToolExecutor:
    """``table`` minus ``hidden`` and minus the tools whose ``requires`` ``callbacks`` lack."""
    from ..tools.builtin import unavailable_tools

    tools = [t for t in map(table.get, table.names()) if t is not None]
    gone = frozenset(hidden) | unavailable_tools(tools, callbacks)
    return ToolView(table, gone) if gone else table
