"""MCP tools as ania-nb tools: `MCPTool` and the lazy pair mcp_discover_<s> / mcp_load_<s>.

Lazy (two-phase) loading keeps a big server out of the request's ``tools`` field: the load
tool's description names the server's tools, so a model that knows what it wants loads one or
several at once into its own session (``ctx.executor``), callable from the next step; the
read-only discover tool gives their descriptions. Both lazy tools live in the shared executor;
what they load never leaves the calling session, and removing the server unloads it everywhere.

One naming rule in both modes: an MCP tool never shadows a tool of another owner (a built-in,
your own, another server's); it is exposed as ``<server>__<name>`` instead.
"""

from __future__ import annotations

import logging
import re
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any

from ania_nb.engine.callbacks import RunEvent
from ania_nb.errors import ToolError
from ania_nb.mcp.manager import MCPToolManager, ProgressHandler
from ania_nb.mcp.results import ToolOutput, convert_contents, read_tool_name
from ania_nb.mcp.transport import RemoteResource, RemoteTool
from ania_nb.text import cut, flatten
from ania_nb.tools.base import FunctionTool, Tool, ToolContext
from ania_nb.tools.schema import function_definition, normalize_input_schema

if TYPE_CHECKING:
    from ania_nb.tools.builtin.images import ImageViewer

__all__ = ["MCPTool", "MCPToolset", "read_tool_name", "show_output"]

_log = logging.getLogger(__name__)

_INVALID_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_LINE_LIMIT = 200
NAMES_IN_DESCRIPTION = 1500  # characters of tool names the load tool's description may list
PROGRESS_INTERVAL = 0.2  # seconds between progress events of one call (the last always goes)
NO_TASKS = (
    "not offered: it requires MCP task augmentation (execution.taskSupport = required), "
    "which ania-nb does not support"
)
CANNOT_VIEW_HERE = "(it returned {n} image(s), but no image viewer is set up for MCP tools)"


class MCPTool:
    """One MCP server tool, callable by the model; bound to the connection it was listed on.

    Its annotations decide how it is gated: side-effecting (blocked in plan mode) unless the
    server marks it ``readOnlyHint: true``; with ``destructiveHint: true`` a person is asked
    before each call when ``approval_enabled`` (the agent's ``approval.enable``). Images it
    returns are shown to the model through ``viewer`` (like ``load_images``) and to the front
    end as a ``tool_images`` event; server progress becomes ``tool_progress`` events.
    """

    def __init__(
        self,
        manager: MCPToolManager,
        remote: RemoteTool,
        name: str,
        *,
        approval_enabled: bool = False,
        viewer: ImageViewer | None = None,
    ) -> None:
        self.manager = manager
        self.remote = remote
        self.viewer = viewer
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
        await self.manager.ready()  # waits for a start, reconnects a lost server
        if self.generation != self.manager.generation:
            current = self.manager.current(self.remote.name)
            if current is not None and current.input_schema == self.remote.input_schema:
                self.remote, self.generation = current, self.manager.generation  # re-bound
        output = await self.manager.call(
            self.remote.name,
            arguments,
            generation=self.generation,
            on_progress=self._progress_reporter(ctx) if ctx.callbacks.on_event else None,
            ctx=ctx,
        )
        return await show_output(output, ctx, self.name, self.viewer)

    def _progress_reporter(self, ctx: ToolContext) -> ProgressHandler:
        """Server progress -> ``tool_progress`` events, at most one per PROGRESS_INTERVAL."""
        last = 0.0

        async def report(progress: float, total: float | None, message: str | None) -> None:
            nonlocal last
            now = time.monotonic()
            done = total is not None and progress >= total
            if now - last < PROGRESS_INTERVAL and not done:
                return
            last = now
            data = {
                "id": ctx.call_id,
                "name": self.name,
                "progress": progress,
                "total": total,
                "message": message,
            }
            await ctx.callbacks.emit(RunEvent("tool_progress", ctx.session, data))

        return report


async def show_output(
    output: ToolOutput, ctx: ToolContext, tool: str, viewer: ImageViewer | None
) -> str:
    """The text for the model; images go to the front end and, through ``viewer``, the model."""
    if not output.images:
        return output.text
    event = {"id": ctx.call_id, "name": tool, "images": output.images}
    await ctx.callbacks.emit(RunEvent("tool_images", ctx.session, event))
    count = len(output.images)
    if viewer is None:
        note = CANNOT_VIEW_HERE.format(n=count)
    else:
        note = await viewer.show(output.images, ctx, f"{count} image(s) it returned")
    return f"{output.text}\n{note}" if output.text else note


def _one_line(text: str) -> str:
    return flatten(text.split("\n", 1)[0], _LINE_LIMIT, marker="...")


def describe_resources(server: str, found: list[RemoteResource], limit: int) -> str:
    """The listing ``mcp_resources_<server>`` returns (sorted by URI; bounded)."""
    resources = sorted((r for r in found if not r.template), key=lambda r: r.uri)
    templates = sorted((r for r in found if r.template), key=lambda r: r.uri)
    if not resources and not templates:
        return f"MCP server '{server}' lists no resources."
    reader = read_tool_name(server)
    lines = [
        f"MCP server '{server}' has {len(resources)} resources and {len(templates)} templates; "
        f"read one with {reader}(uri=...)."
    ]

    def line(r: RemoteResource) -> str:
        about = ", ".join(x for x in (r.name, r.mime_type) if x)
        size = f", {r.size} bytes" if r.size is not None else ""
        text = f"{r.uri} ({about}{size})"
        return f"{text}: {_one_line(r.description)}" if r.description else text

    lines += [line(r) for r in resources]
    if templates:
        lines.append("Templates (fill in each {placeholder}, then read the URI):")
        lines += [line(r) for r in templates]
    text = "\n".join(lines)
    return cut(text, limit, marker=f"\n...(listing truncated: {len(found)} entries in total)")


class MCPToolset:
    """A server's tools as `MCPTool` objects (rebuilt per connection) and its lazy tools."""

    def __init__(
        self,
        manager: MCPToolManager,
        *,
        approval_enabled: bool = False,
        viewer: ImageViewer | None = None,
    ) -> None:
        self.manager = manager
        self.approval_enabled = approval_enabled  # passed to every MCPTool (destructiveHint)
        self.viewer = viewer  # shows the images MCP tools return (None: they are described)
        self._cache: tuple[int, dict[str, MCPTool]] | None = None
        # Session tables this server's tools were loaded into (to unload them on removal).
        self._loaded_into: weakref.WeakSet[Any] = weakref.WeakSet()

    def owns(self, tool: Tool | None) -> bool:
        """Whether ``tool`` is one of this server's tools (any connection, any name)."""
        return isinstance(tool, MCPTool) and tool.manager.name == self.server

    def exposed(self, name: str, taken: Callable[[str], Tool | None]) -> MCPTool:
        """The tool ``name`` under the name it may use where ``taken`` says what exists.

        A name another owner uses (a built-in, a user tool, another server) is never
        shadowed: the tool gets ``<server>__<name>`` instead.
        """
        tool = self.tools()[name]
        existing = taken(tool.name)
        if existing is None or self.owns(existing):
            return tool
        prefixed = f"{self.server}__{tool.name}"[:64]
        return self._make(tool.remote, prefixed)

    def _make(self, remote: RemoteTool, name: str) -> MCPTool:
        return MCPTool(
            self.manager, remote, name, approval_enabled=self.approval_enabled, viewer=self.viewer
        )

    def unsupported(self) -> dict[str, str]:
        """Tools the server lists that are not offered, with the reason (sorted by name)."""
        return {
            remote.name: NO_TASKS
            for remote in sorted(self.manager.tools, key=lambda r: r.name)
            if remote.task_support == "required"
        }

    def unload_everywhere(self) -> int:
        """Remove this server's tools from every session they were loaded into."""
        removed = 0
        for table in list(self._loaded_into):
            for name in table.names():
                if self.owns(table.get(name)) and table.remove(name):
                    removed += 1
        self._loaded_into = weakref.WeakSet()
        return removed

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
            if remote.task_support == "required":
                continue  # see unsupported(): calling it without a task would fail
            name = _INVALID_CHARS.sub("_", remote.name)[:64] or "_"
            if name in tools:
                _log.warning(
                    "MCP server %r: tool %r is skipped, its name clashes with %r once made valid",
                    self.server,
                    remote.name,
                    tools[name].remote.name,
                )
                continue
            tools[name] = self._make(remote, name)
        self._cache = (self.manager.generation, tools)
        return tools

    def resources_tool(self) -> FunctionTool:
        """``mcp_resources_<server>``: the read-only listing of its resources and templates."""
        server, label = self.server, self.manager.config.label

        async def resources() -> str:
            found = await self.manager.list_resources()
            return describe_resources(server, found, self.manager.settings.max_result_chars)

        return FunctionTool(
            resources,
            name=f"mcp_resources_{server}"[:64],
            description=(
                f"List the resources (documents, data) and resource templates of MCP server "
                f"'{label}'; read one with {read_tool_name(server)}."
            ),
        )

    def read_tool(self) -> FunctionTool:
        """``mcp_read_<server>(uri)``: read one resource (read-only; text cut, images shown)."""
        server, label = self.server, self.manager.config.label
        name = read_tool_name(server)

        async def read(
            uri: Annotated[str, "The resource URI (a template's URI with its values filled)."],
            ctx: ToolContext,
        ) -> str:
            if not uri.strip():
                raise ToolError(f"{name} needs the uri of a resource (see mcp_resources_{server})")
            result = await self.manager.read_resource(uri.strip())
            output = convert_contents(result.contents, self.manager.settings.max_result_chars)
            if not output.text and not output.images:
                return f"resource {uri} of MCP server '{server}' is empty"
            return await show_output(output, ctx, name, self.viewer)

        return FunctionTool(
            read, name=name, description=f"Read a resource of MCP server '{label}' by its URI."
        )

    def discover_tool(self) -> FunctionTool:
        """``mcp_discover_<server>``: the read-only, sorted listing of the server's tools."""
        server, label = self.server, self.manager.config.label

        async def discover() -> str:
            await self.manager.ready()
            tools, unsupported = self.tools(), self.unsupported()
            if not tools and not unsupported:
                return f"MCP server '{server}' offers no tools."
            lines = [
                f"MCP server '{server}' has {len(tools)} tools; load one with "
                f"mcp_load_{server}(tool_names=[...]) to call them:"
            ]
            lines += [
                f"{name}: {_one_line(tool.description)}" for name, tool in sorted(tools.items())
            ]
            lines += [f"{name}: {why}" for name, why in unsupported.items()]
            return "\n".join(lines)

        return FunctionTool(
            discover,
            name=f"mcp_discover_{server}",
            description=f"Describe the tools of MCP server '{label}', one line each.",
        )

    def load_description(self) -> str:
        """The load tool's description: what it does and the server's tool names (bounded)."""
        server, label = self.server, self.manager.config.label
        if self.manager.state != "connected":
            return (
                f"Load tools of MCP server '{label}', callable from your next step. It is still "
                f"connecting: mcp_discover_{server} waits for it and lists its tools."
            )
        names = sorted(self.tools())
        shown, size = [], 0
        for name in names:
            size += len(name) + 2
            if size > NAMES_IN_DESCRIPTION:
                break
            shown.append(name)
        listed = ", ".join(shown)
        if len(shown) < len(names):
            listed += f", … ({len(names) - len(shown)} more: see mcp_discover_{server})"
        return (
            f"Load tools of MCP server '{label}', callable from your next step. Its tools: "
            f"{listed or '(none)'}."
        )

    def load_tool(self) -> FunctionTool:
        """``mcp_load_<server>(tool_names)``: add tools to the calling session."""
        server = self.server

        async def load(
            tool_names: Annotated[list[str], "Names of the tools to load."],
            ctx: ToolContext,
        ) -> str:
            await self.manager.ready()
            tools = self.tools()
            wanted = list(dict.fromkeys(n.strip() for n in tool_names if n.strip()))
            if not wanted:
                raise ToolError("name the tools to load in tool_names")
            refused = [n for n in wanted if n in self.unsupported()]
            if refused:
                raise ToolError(
                    f"MCP tool {', '.join(repr(n) for n in refused)} of server '{server}' is "
                    f"{NO_TASKS}; nothing was loaded"
                )
            missing = [n for n in wanted if n not in tools]
            if missing:
                raise ToolError(
                    f"MCP server '{server}' has no tool {', '.join(repr(n) for n in missing)}; "
                    f"nothing was loaded. Available tools: [{', '.join(sorted(tools))}]"
                )
            if ctx.executor is None:
                raise ToolError(f"mcp_load_{server} needs a session to load tools into")
            table = ctx.executor
            loaded = []
            for name in wanted:
                tool = self.exposed(name, table.get)
                table.add(tool, replace=True)
                note = "" if tool.name == name else f" as '{tool.name}' (the name is taken)"
                loaded.append(f"'{name}'{note}")
            self._loaded_into.add(table)
            if len(loaded) == 1:
                return f"tool {loaded[0]} loaded; call it directly from your next step."
            return f"tools {', '.join(loaded)} loaded; call them directly from your next step."

        return FunctionTool(load, name=f"mcp_load_{server}", description=self.load_description())
