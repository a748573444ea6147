"""`ToolView`: a session's tool table minus the tools a run may not use.

Subagents and team members must not start subagents or teams, and one-shot runs have no todo
list; the view hides those names from the definitions and refuses them at call time, while
tools that register tools (``mcp_load_*``) still reach the underlying session table.
`front_end_view` also hides the tools the run's front end cannot serve (a notebook has no chat
history to page through, a headless run cannot show a sticker) and, through ``allowed``, the
tools the run's role may not use (`ania_nb.governance.roles`) — decided by name as tools come,
so MCP tools a run loads are filtered too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..tools import ToolContext
from ..tools.executor import ToolOutcome

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.callbacks import Callbacks
    from ..tools import SessionToolExecutor, Tool


class ToolView:
    """A read-through view of ``table`` without the ``hidden`` names and those not ``allowed``."""

    def __init__(
        self,
        table: SessionToolExecutor,
        hidden: Iterable[str],
        allowed: Callable[[str], bool] | None = None,
    ) -> None:
        self.table = table
        self.hidden = frozenset(hidden)
        self.allowed = allowed
        self._cache: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None

    def _hides(self, name: str) -> bool:
        return name in self.hidden or (self.allowed is not None and not self.allowed(name))

    def get(self, name: str) -> Tool | None:
        """The tool called ``name`` unless hidden."""
        return None if self._hides(name) else self.table.get(name)

    def names(self) -> list[str]:
        """Visible tool names, sorted."""
        return [n for n in self.table.names() if not self._hides(n)]

    def definitions(self) -> list[dict[str, Any]]:
        """The table's definitions without hidden tools; the same list until the table changes."""
        full = self.table.definitions()
        cached = self._cache
        if cached is not None and cached[0] is full:
            return cached[1]
        visible = [d for d in full if not self._hides(d["function"]["name"])]
        self._cache = (full, visible)
        return visible

    async def execute(
        self, name: str, arguments: str | Mapping[str, Any] | None, ctx: ToolContext | None = None
    ) -> ToolOutcome:
        """Run a visible tool; a hidden one answers like an unknown tool."""
        if self._hides(name):
            error = f"tool '{name}' not found. Available tools: [{', '.join(self.names())}]"
            return ToolOutcome("Error executing tool: " + error, error, 0)
        return await self.table.execute(name, arguments, ctx)


def front_end_view(
    table: SessionToolExecutor,
    callbacks: Callbacks,
    hidden: Iterable[str] = (),
    allowed: Callable[[str], bool] | None = None,
) -> ToolView | SessionToolExecutor:
    """``table`` minus ``hidden``, the tools ``callbacks`` cannot serve and those not ``allowed``.

    ``allowed`` is the run role's filter by tool name (None: every name); ``requires`` of a
    tool names the callbacks it needs.
    """
    from ..tools.builtin import unavailable_tools

    tools = [t for t in map(table.get, table.names()) if t is not None]
    gone = frozenset(hidden) | unavailable_tools(tools, callbacks)
    return ToolView(table, gone, allowed) if gone or allowed is not None else table
