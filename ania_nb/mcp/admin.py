"""AI self-management of MCP servers: ``mcp_list``, ``mcp_add``, ``mcp_remove``, ``mcp_reconnect``.

Registered in the shared executor when ``MCPSettings.self_manage`` is on. Changes are made at
runtime and persisted to the MCP config file (atomically, in the file's own form): ``mcp_add``
connects first and saves second, and undoes the connection if saving fails, so the runtime and
the file never disagree; ``mcp_remove`` edits the file first and always succeeds there, even for a
server that is not running. File I/O runs in worker threads. With the store's `SharedServers`
(an Agent's registry) each change is recorded there too, after the file, so every replica of the
agent applies it (`MCPRegistry.sync_shared`); a failed record rolls the file and the server back.

The servers are shared by every chat, so changing them is an admin's act: ``mcp_add`` and
``mcp_remove`` always wait for an admin's approval (``needs_admin_approval``, which the tool
gate asks; the requester cannot approve), and so does ``mcp_reconnect`` of a server that is not
running (it would start the config file's entry, which may have been written after the agent
started): the admin is shown the command, every argument, the environment's names (never its
values), the URL and the header names; ``mcp_remove`` shows the entry it deletes. A reconnect
starts the entry only if it is still exactly the one the admin was shown. Reconnecting a running
server reuses the configuration it was started with, never a changed file entry.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from ania_nb._atomic import write_text_atomic
from ania_nb._preview import read_bounded, visible
from ania_nb.errors import ConfigError, ToolError, UsageError
from ania_nb.mcp.config import (
    MCPConfigFile,
    MCPServerConfig,
    check_server_name,
    load_config_file,
    parse_config,
    save_config_file,
    validate_server,
)
from ania_nb.mcp.manager import MCPServerError
from ania_nb.tools.base import FunctionTool, ToolContext

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


def _add_entry(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The config entry ``mcp_add`` makes of its arguments (``ToolError`` on bad pairs)."""
    return {
        "name": arguments.get("name"),
        "transport": arguments.get("transport"),
        "command": arguments.get("command"),
        "args": arguments.get("args") or [],
        "env": _pairs(arguments.get("env"), "env"),
        "endpoint": arguments.get("endpoint"),
        "headers": _pairs(arguments.get("headers"), "headers"),
        "timeout": arguments.get("timeout_sec"),
        "description": arguments.get("description") or "",
    }


def describe_server(server: MCPServerConfig | Mapping[str, Any]) -> list[str]:
    """What an admin must see before a server starts: program, arguments, env names, URL."""
    data = server.model_dump() if isinstance(server, MCPServerConfig) else dict(server)
    transport = data.get("transport") or ("streamable-http" if data.get("endpoint") else "stdio")
    lines = [f"transport: {visible(str(transport))}"]
    if data.get("command") is not None or transport == "stdio":
        lines.append(f"command (the program that will run): {visible(str(data.get('command')))}")
        args = list(data.get("args") or [])
        lines.append(f"args ({len(args)}):")
        lines += [f"  [{n}] {visible(str(arg))}" for n, arg in enumerate(args)]
        if data.get("cwd"):
            lines.append(f"working directory: {visible(str(data['cwd']))}")
    env = sorted(str(k) for k in dict(data.get("env") or {}))
    if env:
        lines.append(f"env (names; values hidden): {', '.join(visible(k) for k in env)}")
    if data.get("endpoint") is not None:
        lines.append(f"URL: {visible(str(data['endpoint']))}")
    headers = sorted(str(k) for k in dict(data.get("headers") or {}))
    if headers:
        lines.append(f"headers (names; values hidden): {', '.join(visible(k) for k in headers)}")
    if data.get("timeout") is not None:
        lines.append(f"timeout: {data['timeout']} s")
    if data.get("description"):
        lines.append(f"description: {visible(str(data['description']))}")
    return lines


def _entry_in_file(path: Path, name: str) -> MCPServerConfig | str:
    """The file's entry for ``name`` (read without blocking on odd files), or why there is none."""
    limit = 1_000_000
    try:
        text, size = read_bounded(path, limit)
    except FileNotFoundError:
        return f"the MCP config file {path} does not exist"
    except (OSError, ValueError) as exc:
        return f"the MCP config file {path} cannot be read: {exc}"
    if size > limit:
        return f"the MCP config file {path} is too large to show"
    try:
        _form, servers = parse_config(json.loads(text), source=str(path))
    except (ValueError, ConfigError) as exc:
        return f"the MCP config file {path} is not usable: {exc}"
    found = next((s for s in servers if s.name == name), None)
    return found if found is not None else f"no MCP server named {name!r} in {path}"


class _AdminTool(FunctionTool):
    """A self-management tool whose approval request says exactly what will start."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        summary: Callable[[Mapping[str, Any]], str],
        needs_admin: Callable[[Mapping[str, Any]], bool] = lambda arguments: True,
    ) -> None:
        super().__init__(func, side_effects=True)
        self._describe = summary
        self._needs_admin = needs_admin

    def approval_summary(self, arguments: Mapping[str, Any]) -> str:
        """What the admin is shown (the tool gate asks)."""
        return self._describe(arguments)

    def needs_admin_approval(self, arguments: Mapping[str, Any]) -> bool:
        """Whether this call must wait for an admin (the tool gate asks)."""
        return self._needs_admin(arguments)


async def _read(registry: MCPRegistry) -> MCPConfigFile:
    path = registry.settings.config_file
    try:
        return await asyncio.to_thread(load_config_file, path)
    except ConfigError as exc:
        raise ToolError(f"{exc}; fix the file before changing MCP servers") from None


async def _save(registry: MCPRegistry, data: dict[str, Any]) -> None:
    await asyncio.to_thread(save_config_file, registry.settings.config_file, data)


async def _restore(registry: MCPRegistry, file: MCPConfigFile) -> None:
    """Put the file back as it was read (a missing or empty one as empty: no servers)."""
    if file.data:
        await _save(registry, file.data)
    else:
        await asyncio.to_thread(write_text_atomic, registry.settings.config_file, "")


async def _configured(registry: MCPRegistry, file: MCPConfigFile) -> dict[str, MCPServerConfig]:
    """The servers of the file with every replica's changes (the store's) applied, by name."""
    await registry.read_shared()
    return {s.name: s for s in registry.overlay(file.servers)}


def _entry_known(registry: MCPRegistry, path: Path, name: str) -> MCPServerConfig | str:
    """The entry for ``name``: the store's shared one (as last read), else the file's."""
    if name in registry.shared_state:
        shared = registry.shared_state[name]
        return shared if shared is not None else f"MCP server {name!r} was removed (shared)"
    return _entry_in_file(path, name)


def admin_tools(registry: MCPRegistry) -> list[FunctionTool]:
    """The four self-management tools, bound to ``registry``."""
    path = registry.settings.config_file

    async def mcp_list() -> str:
        """List the MCP servers (config file and running), with their state and tool counts."""
        problem = ""
        in_file: set[str] = set()
        try:
            file = await _read(registry)
            in_file = set(file.names())
            configured = await _configured(registry, file)
        except ToolError as exc:
            configured, problem = {}, f"\n(config file problem: {exc})"
        running = {s.name: s for s in registry.servers()}
        if not configured and not running:
            return "No MCP servers are configured; add one with mcp_add." + problem
        lines = [f"MCP servers ({registry.mode} mode; from {registry.source()}):"]
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
                reason, _, tail = (status.error or "").partition("\n")
                state = f"{status.state}" + (f": {reason}" if reason else "")
                if tail.strip():  # a stdio server's last stderr lines say why it failed
                    state += "\n  " + "\n  ".join(tail.strip().splitlines()[-8:])
            else:
                state = "disabled" if config and config.disabled else "not running"
            if config is None:
                state += ", not in the config file"
            elif name not in in_file:
                state += ", added on another replica (not in this replica's file)"
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
        entry = _add_entry(
            {
                "name": name,
                "transport": transport,
                "command": command,
                "args": args,
                "env": env,
                "endpoint": endpoint,
                "headers": headers,
                "timeout_sec": timeout_sec,
                "description": description,
            }
        )
        async with registry.file_lock:
            file = await _read(registry)
            taken = name in file.names() or name in await _configured(registry, file)
            if taken or registry.get(name) is not None:
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
            if registry.shared_servers is not None:
                try:  # the other replicas start it from the store
                    await registry.shared_servers.put(server)
                except Exception as exc:
                    await _restore(registry, file)
                    await registry.remove(name)
                    raise ToolError(
                        f"MCP server '{name}' connected, but recording it in the store for the "
                        f"other replicas failed ({type(exc).__name__}: {exc}); it was "
                        "disconnected again, nothing changed"
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
            configured = await _configured(registry, file)
            if name not in configured and not in_file and registry.get(name) is None:
                raise ToolError(
                    f"no MCP server named '{name}'. Configured: [{', '.join(sorted(configured))}]"
                )
            if in_file:
                try:
                    await _save(registry, file.without_server(name))
                except OSError as exc:
                    raise ToolError(
                        f"saving {str(path)!r} failed ({exc}); nothing was removed"
                    ) from None
            if registry.shared_servers is not None:
                try:  # the other replicas stop it too, and skip it at their next start
                    await registry.shared_servers.remove(name)
                except Exception as exc:
                    if in_file:
                        await _restore(registry, file)
                    raise ToolError(
                        f"recording the removal of '{name}' in the store for the other replicas "
                        f"failed ({type(exc).__name__}: {exc}); nothing was removed"
                    ) from None
        try:
            await registry.remove(name)
        except Exception:  # the file is already right; a stuck shutdown must not undo that
            _log.warning("MCP server %r: error while stopping it", name, exc_info=True)
        return f"MCP server '{name}' removed; its tools are gone from your next step."

    shown: dict[str, MCPServerConfig] = {}  # reconnect: the entry each admin was shown

    async def mcp_reconnect(name: Name, ctx: ToolContext) -> str:
        """Reconnect an MCP server (or start one that failed); loaded tools must be loaded again."""
        name = _name(name)
        try:
            if registry.get(name) is None:
                server = (await _configured(registry, await _read(registry))).get(name)
                if server is None:
                    known = sorted({s.name for s in registry.servers()})
                    raise ToolError(f"no MCP server named '{name}'. Known: [{', '.join(known)}]")
                if server.disabled:
                    raise ToolError(f"MCP server '{name}' is disabled in {str(path)!r}")
                # Only the entry an admin approved may start: not one changed after the request.
                if not ctx.approved or shown.pop(name, None) != server:
                    raise ToolError(
                        f"starting MCP server '{name}' from {str(path)!r} needs an admin's "
                        "approval of exactly that entry, and its entry changed (or was never "
                        "approved); nothing was started. Call mcp_reconnect again to ask"
                    )
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

    def add_summary(arguments: Mapping[str, Any]) -> str:
        name = visible(str(arguments.get("name", "")))
        head = f"mcp_add: start MCP server {name} and save it to {str(path)!r}. It will run:"
        try:
            entry = _add_entry(arguments)
        except ToolError as exc:
            return f"{head}\n(arguments not usable, nothing will run: {exc})"
        return "\n".join([head, *describe_server(entry)])

    def remove_summary(arguments: Mapping[str, Any]) -> str:
        name = str(arguments.get("name", "")).strip()
        head = f"mcp_remove: stop MCP server {visible(name)} and delete it from {str(path)!r}"
        found = _entry_known(registry, Path(path), name)
        if isinstance(found, str):
            running = " (it is running)" if registry.get(name) is not None else ""
            return f"{head}{running}: {found}"
        return "\n".join([f"{head}. Its entry:", *describe_server(found)])

    def reconnect_needs_admin(arguments: Mapping[str, Any]) -> bool:
        name = str(arguments.get("name", "")).strip()
        return registry.get(name) is None  # starts the file's entry, not the approved config

    def reconnect_summary(arguments: Mapping[str, Any]) -> str:
        name = str(arguments.get("name", "")).strip()
        running = registry.get(name)
        if running is not None:
            return f"mcp_reconnect: restart MCP server {visible(name)} with its current config"
        found = _entry_known(registry, Path(path), name)
        if isinstance(found, str):
            shown.pop(name, None)
            return f"mcp_reconnect: start MCP server {visible(name)}: {found}; nothing will run"
        shown[name] = found
        head = f"mcp_reconnect: start MCP server {visible(name)} from {str(path)!r}. It will run:"
        return "\n".join([head, *describe_server(found)])

    return [
        FunctionTool(mcp_list),
        _AdminTool(mcp_add, summary=add_summary),
        _AdminTool(mcp_remove, summary=remove_summary),
        _AdminTool(mcp_reconnect, summary=reconnect_summary, needs_admin=reconnect_needs_admin),
    ]
