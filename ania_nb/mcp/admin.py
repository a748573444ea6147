"""AI self-management of MCP servers: ``mcp_list``, ``mcp_add``, ``mcp_remove``, ``mcp_reconnect``.

Registered in the shared executor when ``MCPSettings.self_manage`` is on. Changes are made at
runtime and persisted to the MCP config file (atomically, in the file's own form): ``mcp_add``
connects first and saves second, and undoes the connection if saving fails, so the runtime and
the file never disagree; ``mcp_remove`` edits the file first and always succeeds there, even for a
server that is not running. File I/O runs in worker threads.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Annotated, Any

from ania_nb.errors import ConfigError, ToolError, UsageError
from ania_nb.mcp.config import (
    MCPConfigFile,
    check_server_name,
    load_config_file,
    save_config_file,
    validate_server,
)
from ania_nb.mcp.manager import MCPServerError
from ania_nb.tools.base import FunctionTool

if TYPE_CHECKING:
    from ania_nb.mcp.registry import MCPRegistry

__all__ = ["admin_tools"]

_log = logging.getLogger(__name__)

Name = Annotated[str, "Server name: 1-51 characters from A-Z, a-z, 0-9, '_' and '-'."]


def _name(value: str) -> str:
    try:
        return check_server_name(value)
    except ValueError as exc:
        raise ToolError(str(exc)) from None


def _pairs(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ToolError(f"{what} item {item!r} is not KEY=VALUE")
        out[key.strip()] = value
    return out


async def _read(registry: MCPRegistry) -> MCPConfigFile:
    path = registry.settings.config_file
    try:
        return await asyncio.to_thread(load_config_file, path)
    except ConfigError as exc:
        raise ToolError(f"{exc}; fix the file before changing MCP servers") from None


async def _save(registry: MCPRegistry, data: dict[str, Any]) -> None:
    await asyncio.to_thread(save_config_file, registry.settings.config_file, data)


def admin_tools(registry: MCPRegistry) -> list[FunctionTool]:
    """The four self-management tools, bound to ``registry``."""
    path = registry.settings.config_file

    async def mcp_list() -> str:
        """List the MCP servers (config file and running), with their state and tool counts."""
        problem = ""
        try:
            configured = {s.name: s for s in (await _read(registry)).servers}
        except ToolError as exc:
            configured, problem = {}, f"\n(config file problem: {exc})"
        running = {s.name: s for s in registry.servers()}
        if not configured and not running:
            return "No MCP servers are configured; add one with mcp_add." + problem
        lines = [f"MCP servers ({registry.mode} mode):"]
        for name in sorted(configured.keys() | running.keys()):
            status = running.get(name)
            config = configured.get(name)
            description = config.description if config else status.description if status else ""
            target = (
                f"{config.transport} {config.target}"
                if config
                else (f"{status.transport} {status.target}" if status else "")
            )
            if status is not None and status.state == "connected":
                state = f"connected, {status.tools} tools"
            elif status is not None:
                why = (status.error or "").split("\n", 1)[0]
                state = f"{status.state}" + (f": {why}" if why else "")
            else:
                state = "disabled" if config and config.disabled else "not running"
            if config is None:
                state += ", not in the config file"
            about = f": {description}" if description else ""
            lines.append(f"- {name}{about} ({target}; {state})")
        return "\n".join(lines) + problem

    async def mcp_add(
        name: Name,
        transport: Annotated[
            str | None, "stdio (default with command), streamable-http or sse."
        ] = None,
        command: Annotated[str | None, "stdio: the program to start."] = None,
        args: Annotated[list[str] | None, "stdio: its arguments."] = None,
        env: Annotated[list[str] | None, "stdio: environment, KEY=VALUE items."] = None,
        endpoint: Annotated[str | None, "HTTP/SSE: the server URL."] = None,
        headers: Annotated[list[str] | None, "HTTP/SSE: headers, KEY=VALUE items."] = None,
        timeout_sec: Annotated[float | None, "Seconds to connect and list tools."] = None,
        description: Annotated[str | None, "What the server offers."] = None,
    ) -> str:
        """Add an MCP server: connect to it, register its tools and save it to the config file."""
        name = _name(name)
        entry: dict[str, Any] = {
            "name": name,
            "transport": transport,
            "command": command,
            "args": args or [],
            "env": _pairs(env, "env"),
            "endpoint": endpoint,
            "headers": _pairs(headers, "headers"),
            "timeout": timeout_sec,
            "description": description or "",
        }
        async with registry.file_lock:
            file = await _read(registry)
            if name in file.names() or registry.get(name) is not None:
                raise ToolError(f"an MCP server named '{name}' already exists; mcp_remove it first")
            try:
                server = validate_server(entry, "mcp_add", f"server '{name}'")
            except ConfigError as exc:
                raise ToolError(str(exc)) from None
            try:
                status = await registry.add(server)
            except (MCPServerError, UsageError) as exc:
                raise ToolError(f"{exc}; nothing was saved") from None
            try:
                await _save(registry, file.with_server(server))
            except Exception as exc:
                await registry.remove(name)  # roll back: the file is the source of truth
                raise ToolError(
                    f"MCP server '{name}' connected, but saving {str(path)!r} failed "
                    f"({type(exc).__name__}: {exc}); it was disconnected again, nothing changed"
                ) from None
        if registry.mode == "lazy":
            usage = f"list its tools with mcp_discover_{name}, then load one with mcp_load_{name}"
        else:
            usage = "its tools are registered under their own names"
        return (
            f"MCP server '{name}' added and saved ({status.tools} tools); from your next step, "
            f"{usage}."
        )

    async def mcp_remove(name: Name) -> str:
        """Remove an MCP server from the config file and stop it."""
        name = _name(name)
        async with registry.file_lock:
            file = await _read(registry)
            in_file = name in file.names()
            if not in_file and registry.get(name) is None:
                raise ToolError(
                    f"no MCP server named '{name}'. Configured: [{', '.join(file.names())}]"
                )
            if in_file:
                try:
                    await _save(registry, file.without_server(name))
                except OSError as exc:
                    raise ToolError(
                        f"saving {str(path)!r} failed ({exc}); nothing was removed"
                    ) from None
        try:
            await registry.remove(name)
        except Exception:  # the file is already right; a stuck shutdown must not undo that
            _log.warning("MCP server %r: error while stopping it", name, exc_info=True)
        return f"MCP server '{name}' removed; its tools are gone from your next step."

    async def mcp_reconnect(name: Name) -> str:
        """Reconnect an MCP server (or start one that failed); loaded tools must be loaded again."""
        name = _name(name)
        try:
            if registry.get(name) is None:
                server = next((s for s in (await _read(registry)).servers if s.name == name), None)
                if server is None:
                    known = sorted({s.name for s in registry.servers()})
                    raise ToolError(f"no MCP server named '{name}'. Known: [{', '.join(known)}]")
                if server.disabled:
                    raise ToolError(f"MCP server '{name}' is disabled in {str(path)!r}")
                status = await registry.add(server)
            else:
                status = await registry.reconnect(name)
        except (MCPServerError, UsageError) as exc:
            raise ToolError(str(exc)) from None
        again = (
            f"tools loaded before must be loaded again with mcp_load_{name}"
            if registry.mode == "lazy"
            else "its tools are registered again"
        )
        return f"MCP server '{name}' reconnected ({status.tools} tools); {again}."

    return [
        FunctionTool(mcp_list),
        FunctionTool(mcp_add, side_effects=True),
        FunctionTool(mcp_remove, side_effects=True),
        FunctionTool(mcp_reconnect, side_effects=True),
    ]
