"""`MCPRegistry`: every MCP server of an agent, and their tools in the shared executor.

Lazy mode (the default) registers ``mcp_discover_<server>`` and ``mcp_load_<server>`` per
connected server; eager mode registers every (filtered) tool. In both, a tool whose name another
owner already uses (a built-in, a user tool, an earlier server in config order) is exposed as
``<server>__<name>``. Servers start concurrently; one that fails is logged and left ``failed``
(``reconnect`` revives it from its config entry). Removing a server unloads its tools from
every session.

With ``shared_servers`` (the store's `SharedServers`, as an Agent passes it) the servers
``mcp_add`` and ``mcp_remove`` changed on any replica apply on top of the file, at start and at
each `sync_shared`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ania_nb.errors import ConfigError, UsageError
from ania_nb.mcp.config import (
    FORM_NAMES,
    Form,
    MCPConfigFile,
    MCPServerConfig,
    Transport,
    load_config_file,
)
from ania_nb.mcp.manager import MCPServerError, MCPToolManager, ServerState
from ania_nb.mcp.tools import MCPToolset

if TYPE_CHECKING:
    from ania_nb.mcp.shared import SharedServers

if TYPE_CHECKING:
    from ania_nb._http import MCPClientFactory
    from ania_nb.config import MCPSettings, SecuritySettings
    from ania_nb.mcp.sampling import Sampler
    from ania_nb.tools.base import Tool
    from ania_nb.tools.builtin.images import ImageViewer
    from ania_nb.tools.executor import ToolExecutor

__all__ = ["MCPRegistry", "MCPServerStatus"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MCPServerStatus:
    """One server as `MCPRegistry.servers` reports it."""

    name: str
    transport: Transport
    target: str  # command line or URL (never env or headers)
    description: str
    state: ServerState
    tools: int
    error: str | None


class MCPRegistry:
    """Runs the MCP servers of the config file and keeps their tools in ``shared``."""

    def __init__(
        self,
        settings: MCPSettings,
        shared: ToolExecutor,
        *,
        client_factory: MCPClientFactory | None = None,
        approval_enabled: bool = False,
        security: SecuritySettings | None = None,
        viewer: ImageViewer | None = None,
        shared_servers: SharedServers | None = None,
    ) -> None:
        """``approval_enabled`` (the agent's ``approval.enable``): destructive tools ask first.

        ``viewer`` shows the images MCP tools return to the model (None: they are described);
        ``shared_servers`` holds the admin tools' changes for every replica (None: this file only).
        """
        self.settings = settings
        self.approval_enabled = approval_enabled
        self.viewer = viewer
        self.security = security  # what stdio servers do not inherit (child_env)
        self.shared = shared
        self.client_factory = client_factory  # for every HTTP/SSE server; None = the SDK's
        self._managers: dict[str, MCPToolManager] = {}  # config order (eager: first wins)
        self._toolsets: dict[str, MCPToolset] = {}
        self._owned: dict[str, list[str]] = {}  # server -> names it registered in ``shared``
        self._lazy_names: dict[str, list[str]] = {}  # server -> tool names its load tool lists
        self._admin: list[str] = []
        self._lock = asyncio.Lock()  # add / remove / reconnect / close, one at a time
        self.file_lock = asyncio.Lock()  # read-modify-write of the config file (admin tools)
        self._started = False
        self._starting: list[asyncio.Task[None]] = []  # first connections (start)
        self.config_error: str | None = None  # why the config file could not be used
        self.config_form: Form | None = None  # which form the file was written in
        self.shared_servers = shared_servers
        # The store's shared servers as last read (None = removed), for the admin tools' texts.
        self.shared_state: dict[str, MCPServerConfig | None] = {}
        self.sampler: Sampler | None = None  # answers servers' sampling requests (use_sampler)

    @property
    def mode(self) -> Literal["lazy", "eager"]:
        """How tools are exposed: lazy (discover/load) or eager (all registered)."""
        return "lazy" if self.settings.lazy_load else "eager"

    async def __aenter__(self) -> MCPRegistry:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self, *, wait: bool = True) -> None:
        """Read the config file, connect every server concurrently and register their tools.

        With ``wait=False`` the servers connect in the background and each one's tools appear
        when it is ready (lazy mode: its discover/load pair is there at once and waits for the
        server, up to its timeout, when used). An invalid file disables MCP (``config_error``
        says why, chat goes on); a server that cannot connect is logged and skipped.
        """
        if self._started:
            raise UsageError("MCPRegistry.start() was already called")
        self._started = True
        try:
            config = await asyncio.to_thread(load_config_file, self.settings.config_file)
        except ConfigError as exc:
            self.config_error = f"{exc}; MCP servers are off until the file is fixed"
            _log.error("%s", self.config_error)
            config = MCPConfigFile(path=Path(self.settings.config_file))
        self.config_form = config.form if config.servers else None
        servers = self.overlay(config.servers, await self.read_shared())
        async with self._lock:
            for server in servers:
                if not server.disabled:
                    self._put(server)
        self._starting = [self._connect_soon(m) for m in self._managers.values()]
        if wait:
            await self.wait_started()
        if self.settings.self_manage:
            from ania_nb.mcp.admin import admin_tools

            for tool in admin_tools(self):
                self.shared.add(tool, replace=True)
                self._admin.append(tool.name)

    def overlay(
        self,
        servers: Sequence[MCPServerConfig],
        shared: dict[str, MCPServerConfig | None] | None = None,
    ) -> list[MCPServerConfig]:
        """The file's ``servers`` with the shared changes applied: removed ones out, added in.

        A shared entry replaces the file's entry of the same name (it is the later admin act).
        """
        shared = self.shared_state if shared is None else shared
        out: list[MCPServerConfig] = []
        for server in servers:
            if server.name not in shared:
                out.append(server)
            elif (changed := shared[server.name]) is not None:
                out.append(changed)
        known = {s.name for s in servers}
        out += [s for name, s in sorted(shared.items()) if s is not None and name not in known]
        return out

    async def read_shared(self) -> dict[str, MCPServerConfig | None]:
        """Read the store's shared servers (kept in `shared_state`); {} without a store."""
        if self.shared_servers is None:
            return {}
        self.shared_state = await self.shared_servers.state()
        return self.shared_state

    async def sync_shared(self) -> None:
        """Apply the shared changes another replica made: stop removed servers, start added ones.

        A server added there connects here in the background, like one of the file at start
        (one that fails here is left ``failed``, for ``mcp_reconnect``); a server whose entry
        changed is restarted with the new entry. Servers of this file alone are left alone.
        """
        if not self._started:
            return
        shared = await self.read_shared()
        async with self._lock:
            for name, server in sorted(shared.items()):
                running = self._managers.get(name)
                if running is not None and (server is None or running.config != server):
                    await self._drop(name)
                if server is not None and (running is None or running.config != server):
                    _log.info("MCP server %r was added on another replica; starting it", name)
                    self._starting.append(self._connect_soon(self._put(server)))

    def _put(self, server: MCPServerConfig) -> MCPToolManager:
        """Make (not connect) the manager of ``server``; lazy mode registers its pair at once."""
        manager = self._manager(server)
        self._managers[server.name] = manager
        if self.settings.lazy_load:  # usable (it waits) while connecting
            self._register(manager)
        return manager

    def _connect_soon(self, manager: MCPToolManager) -> asyncio.Task[None]:
        manager.starting = asyncio.create_task(
            self._start_one(manager), name=f"mcp-start:{manager.name}"
        )
        return manager.starting

    async def _start_one(self, manager: MCPToolManager) -> None:
        """Connect one configured server and register its tools (or drop its lazy pair)."""
        try:
            await manager.connect()
        except MCPServerError as exc:
            _log.warning("%s; its tools are not available (reconnect to retry)", exc)
        async with self._lock:
            if self._managers.get(manager.name) is not manager:
                return  # removed meanwhile
            if manager.state == "connected":
                self._register(manager)
            else:
                self._unregister(manager.name)

    async def wait_started(self) -> None:
        """Wait until every server configured at start has connected or failed."""
        if self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)

    def source(self) -> str:
        """Where the servers come from, e.g. ``mcp.json (the Claude Code "mcpServers" form)``."""
        path = self.settings.config_file
        if self.config_error is not None:
            return f"{path}: {self.config_error}"
        form = f" ({FORM_NAMES[self.config_form]})" if self.config_form else ""
        return f"{path}{form}"

    def get(self, name: str) -> MCPToolManager | None:
        """The manager of server ``name``, if it is known (connected or not)."""
        return self._managers.get(name)

    def servers(self) -> list[MCPServerStatus]:
        """Every known server with its state, sorted by name."""
        return [
            MCPServerStatus(
                name=m.name,
                transport=m.config.transport,
                target=m.config.target,
                description=m.config.description,
                state=m.state,
                tools=len(m.tools) if m.state == "connected" else 0,
                error=m.error,
            )
            for _, m in sorted(self._managers.items())
        ]

    async def add(self, server: MCPServerConfig) -> MCPServerStatus:
        """Connect a new server and register its tools; raises `MCPServerError` if it fails."""
        async with self._lock:
            if server.name in self._managers:
                raise UsageError(
                    f"an MCP server named {server.name!r} already exists; remove it first"
                )
            manager = self._manager(server)
            await manager.connect()  # nothing is registered unless this succeeds
            self._managers[server.name] = manager
            self._register(manager)
        return self._status(server.name)

    async def remove(self, name: str) -> bool:
        """Unregister a server's tools and close it; False if no such server was known."""
        async with self._lock:
            return await self._drop(name)

    async def _drop(self, name: str) -> bool:
        """`remove` under the lock."""
        manager = self._managers.pop(name, None)
        if manager is None:
            return False
        toolset = self._toolsets.get(name)
        if toolset is not None:
            toolset.unload_everywhere()
        self._unregister(name)
        await manager.aclose()
        return True

    async def reconnect(self, name: str) -> MCPServerStatus:
        """Reconnect a server (also one that failed at start) and register its tools again.

        Tools loaded into sessions before stay stale and tell the model to load them again.
        """
        async with self._lock:
            manager = self._managers.get(name)
            if manager is None:
                known = ", ".join(sorted(self._managers))
                raise UsageError(f"no MCP server named {name!r}; known servers: [{known}]")
            await manager.reconnect()
            self._register(manager)
        return self._status(name)

    async def aclose(self) -> None:
        """Unregister every tool and close every server (concurrently)."""
        for task in self._starting:
            task.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        async with self._lock:
            managers = list(self._managers.values())
            for name in list(self._owned):
                self._unregister(name)
            for tool_name in self._admin:
                self.shared.remove(tool_name)
            self._admin.clear()
            self._managers.clear()
            await asyncio.gather(*(m.aclose() for m in managers), return_exceptions=True)

    def use_sampler(self, sampler: Sampler | None) -> None:
        """Answer the sampling requests of every server (allowed per server) with ``sampler``."""
        self.sampler = sampler
        for manager in self._managers.values():
            manager.sampler = sampler

    def _manager(self, server: MCPServerConfig) -> MCPToolManager:
        manager = MCPToolManager(
            server, self.settings, client_factory=self.client_factory, security=self.security
        )
        manager.sampler = self.sampler
        return manager

    def _status(self, name: str) -> MCPServerStatus:
        return next(s for s in self.servers() if s.name == name)

    def _register(self, manager: MCPToolManager) -> None:
        """Put a connected server's tools in ``shared`` (again, after a reconnect)."""
        name = manager.name
        toolset = self._toolsets.setdefault(
            name, MCPToolset(manager, approval_enabled=self.approval_enabled, viewer=self.viewer)
        )
        toolset.manager = manager
        if self.settings.lazy_load:
            # The pair is kept across reconnects (its bytes stay stable) unless the server's
            # tool names changed: the load tool's description lists them.
            described = self._lazy_names.get(name)
            names = [
                *sorted(toolset.tools()),
                *(["<resources>"] if manager.has_resources else []),
            ]
            if described != names:
                self._unregister(name)
                self._owned[name] = self._add_unique(
                    [toolset.discover_tool(), toolset.load_tool(), *_resource_tools(toolset)], name
                )
                self._lazy_names[name] = names
            return
        # Eager: every connected server again, in config order, so an earlier server keeps a
        # clashing name whichever connected first (a later one gets <server>__<name>).
        for server in self._managers:
            self._unregister(server)
        for server, each in self._managers.items():
            if each.state != "connected" and each is not manager:
                continue
            tools = self._toolsets.setdefault(
                server, MCPToolset(each, approval_enabled=self.approval_enabled, viewer=self.viewer)
            )
            exposed = [tools.exposed(n, self.shared.get) for n in sorted(tools.tools())]
            self._owned[server] = self._add_unique([*exposed, *_resource_tools(tools)], server)

    def _add_unique(self, tools: Sequence[Tool], server: str) -> list[str]:
        added: list[str] = []
        for tool in tools:
            if tool.name in self.shared:
                owner = next((s for s, names in self._owned.items() if tool.name in names), None)
                _log.warning(
                    "MCP server %r: tool %r is skipped, the name is already taken by %s",
                    server,
                    tool.name,
                    f"MCP server {owner!r}" if owner else "another tool",
                )
                continue
            self.shared.add(tool)
            added.append(tool.name)
        return added

    def _unregister(self, name: str) -> None:
        for tool_name in self._owned.pop(name, []):
            self.shared.remove(tool_name)
        if name not in self._managers:  # removed for good, not re-registering
            self._toolsets.pop(name, None)
            self._lazy_names.pop(name, None)


def _resource_tools(toolset: MCPToolset) -> list[Tool]:
    """``mcp_resources_<server>`` and ``mcp_read_<server>`` when the server offers resources."""
    if not toolset.manager.has_resources:
        return []
    return [toolset.resources_tool(), toolset.read_tool()]
