"""MCP tools as ania-nb tools: `MCPTool` and the lazy pair mcp_discover_<s> / mcp_load_<s>.

Lazy (two-phase) loading keeps a big server out of the request's ``tools`` field: the model
lists a server's tools with the read-only discover tool, then loads the one it needs into its
own session (``ctx.executor``), where it is callable from the next step. Both lazy tools live in
the shared executor; what they load never leaves the calling session.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Annotated, Any

from ania_nb.errors import ToolError
from ania_nb.mcp.manager import MCPToolManager
from ania_nb.mcp.transport import RemoteTool
from ania_nb.tools.base import FunctionTool, ToolContext
from ania_nb.tools.schema import function_definition, normalize_input_schema

__all__ = ["MCPTool", "MCPToolset"]

_log = logging.getLogger(__name__)

_INVALID_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_LINE_LIMIT = 200


class MCPTool:
    """One MCP server tool, callable by the model; bound to the connection it was listed on.

    Its annotations decide how it is gated: side-effecting (blocked in plan mode) unless the
    server marks it ``readOnlyHint: true``; with ``destructiveHint: true`` a person is asked
    before each call when ``approval_enabled`` (the agent's ``approval.enable``).
    """

    def __init__(
        self,
        manager: MCPToolManager,
        remote: RemoteTool,
        name: str,
        *,
        approval_enabled: bool = False,
    ) -> None:
        self.manager = manager
        self.remote = remote
        self.generation = manager.generation
        self.name = name  # remote.name made safe for the OpenAI function-name rules
        self.description = (
            remote.description or f"Tool '{remote.name}' of MCP server '{manager.name}'."
        )
        # Servers may claim read-only; the user chose to trust the servers they configured.
        self.side_effects = not remote.read_only
        self.destructive = remote.destructive
        self.approval_enabled = approval_enabled
        self._schema = normalize_input_schema(remote.input_schema)

    def __repr__(self) -> str:
        return f"<MCPTool {self.name!r} of {self.manager.name!r} gen {self.generation}>"

    def parameters_schema(self) -> dict[str, Any]:
        """The server's ``inputSchema``, normalised for OpenAI (shared: do not mutate)."""
        return self._schema

    def definition(self) -> dict[str, Any]:
        """Return the OpenAI function-tool entry."""
        return function_definition(self.name, self.description, self._schema)

    def needs_approval(self, arguments: Mapping[str, Any]) -> bool:
        """Whether the tool gate must ask a person first: a destructive tool, approvals on."""
        return self.destructive and self.approval_enabled

    async def invoke(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        """Call the tool on its server (arguments are validated by the server)."""
        if self.needs_approval(arguments) and not ctx.approved:
            # The gate asks; reaching here unapproved means the call bypassed it.
            raise ToolError(
                f"MCP tool '{self.name}' is marked destructive and needs a person's approval, "
                "and this call was not approved"
            )
        return await self.manager.call(self.remote.name, arguments, generation=self.generation)


def _one_line(text: str) -> str:
    line = " ".join(text.split("\n", 1)[0].split())
    return line if len(line) <= _LINE_LIMIT else line[: _LINE_LIMIT - 3] + "..."


class MCPToolset:
    """A server's tools as `MCPTool` objects (rebuilt per connection) and its lazy tools."""

    def __init__(self, manager: MCPToolManager, *, approval_enabled: bool = False) -> None:
        self.manager = manager
        self.approval_enabled = approval_enabled  # passed to every MCPTool (destructiveHint)
        self._cache: tuple[int, dict[str, MCPTool]] | None = None

    @property
    def server(self) -> str:
        """The server's name."""
        return self.manager.name

    def tools(self) -> dict[str, MCPTool]:
        """Exposed name -> tool for the current connection (sorted, cached per generation)."""
        cached = self._cache
        if cached is not None and cached[0] == self.manager.generation:
            return cached[1]
        tools: dict[str, MCPTool] = {}
        for remote in self.manager.tools:
            name = _INVALID_CHARS.sub("_", remote.name)[:64] or "_"
            if name in tools:
                _log.warning(
                    "MCP server %r: tool %r is skipped, its name clashes with %r once made valid",
                    self.server,
                    remote.name,
                    tools[name].remote.name,
                )
                continue
            tools[name] = MCPTool(
                self.manager, remote, name, approval_enabled=self.approval_enabled
            )
        self._cache = (self.manager.generation, tools)
        return tools

    def discover_tool(self) -> FunctionTool:
        """``mcp_discover_<server>``: the read-only, sorted listing of the server's tools."""
        server, label = self.server, self.manager.config.label

        async def discover() -> str:
            self.manager.check_available()
            tools = self.tools()
            if not tools:
                return f"MCP server '{server}' offers no tools."
            lines = [
                f"MCP server '{server}' has {len(tools)} tools; load one with "
                f"mcp_load_{server}(tool_name=...) to call it:"
            ]
            lines += [
                f"{name}: {_one_line(tool.description)}" for name, tool in sorted(tools.items())
            ]
            return "\n".join(lines)

        return FunctionTool(
            discover,
            name=f"mcp_discover_{server}",
            description=(
                f"List the tools of the MCP server '{label}' (name and one-line description). "
                f"Read-only; load the one you need with mcp_load_{server}."
            ),
        )

    def load_tool(self) -> FunctionTool:
        """``mcp_load_<server>(tool_name)``: add one tool to the calling session."""
        server, label = self.server, self.manager.config.label

        async def load(
            tool_name: Annotated[str, "Exact tool name, as listed by the discover tool."],
            ctx: ToolContext,
        ) -> str:
            self.manager.check_available()
            tools = self.tools()
            wanted = tool_name.strip()
            found = tools.get(wanted)
            if found is None:
                raise ToolError(
                    f"tool '{wanted}' does not exist on MCP server '{server}'. "
                    f"Available tools: [{', '.join(sorted(tools))}]"
                )
            if ctx.executor is None:
                raise ToolError(f"mcp_load_{server} needs a session to load the tool into")
            ctx.executor.add(found, replace=True)
            return f"tool '{wanted}' is loaded; you can call it directly from your next step."

        return FunctionTool(
            load,
            name=f"mcp_load_{server}",
            description=(
                f"Load one tool of the MCP server '{label}' into this conversation, so you can "
                f"call it from your next step. Get the names with mcp_discover_{server}."
            ),
        )
