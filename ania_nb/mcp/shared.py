"""`SharedServers`: the MCP servers the admin tools changed, kept in the store for every replica.

Replicas of one agent share the store but each has its own MCP config file (possibly on another
host), so ``mcp_add`` and ``mcp_remove`` record their change here as well as in the file: a
server added is its entry under its name, a server removed is a tombstone. Every change bumps the
``mcp`` revision; each replica polls the revisions (`ania_nb.orchestration.shared.SharedChanges`)
and applies the new state with `MCPRegistry.sync_shared`, and applies it at start on top of its
own file. What an admin edits by hand in one host's file stays that host's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ania_nb.errors import ConfigError
from ania_nb.mcp.config import MCPServerConfig, validate_server
from ania_nb.store.kv import REVISIONS_NAMESPACE

if TYPE_CHECKING:
    from ania_nb.store import KVNamespace

__all__ = ["MCP_SERVERS_NAMESPACE", "REVISIONS_NAMESPACE", "REVISION_KEY", "SharedServers"]

MCP_SERVERS_NAMESPACE = "mcp_servers"
"""The store's KV namespace of the servers the admin tools added (entries) or removed."""
REVISION_KEY = "mcp"
"""This counter of the store's `REVISIONS_NAMESPACE` moves with every change here."""

_REMOVED = {"removed": True}
_log = logging.getLogger(__name__)


class SharedServers:
    """The admin tools' server changes in the store: ``name -> entry``, or removed."""

    def __init__(self, entries: KVNamespace, revisions: KVNamespace) -> None:
        """Bind to the store's `MCP_SERVERS_NAMESPACE` and `REVISIONS_NAMESPACE` namespaces."""
        self.entries = entries
        self.revisions = revisions

    async def state(self) -> dict[str, MCPServerConfig | None]:
        """Every recorded server: its config, or None when it was removed.

        A stored entry that no longer validates (written by another version) is skipped, logged.
        """
        out: dict[str, MCPServerConfig | None] = {}
        for name, value in await self.entries.items():
            if value == _REMOVED:
                out[name] = None
                continue
            try:
                out[name] = _entry(name, value)
            except ConfigError as exc:
                _log.warning("ignoring the store's shared MCP server %r: %s", name, exc)
        return out

    async def put(self, server: MCPServerConfig) -> None:
        """Record ``server`` as added (every replica starts it)."""
        await self._record(server.name, {"entry": server.to_entry("servers")})

    async def remove(self, name: str) -> None:
        """Record the server ``name`` as removed (every replica stops it)."""
        await self._record(name, _REMOVED)

    async def _record(self, name: str, value: dict[str, Any]) -> None:
        """Write the record, then bump the revision; a failed bump puts the old record back.

        In this order a replica that sees the new revision reads the new record.
        """
        missing = object()
        previous = await self.entries.get(name, missing)
        await self.entries.set(name, value)
        try:
            await self.revisions.incr(REVISION_KEY)
        except BaseException:
            if previous is missing:
                await self.entries.delete(name)
            else:
                await self.entries.set(name, previous)
            raise


def _entry(name: str, value: Any) -> MCPServerConfig:
    """A stored ``{"entry": {...}}`` as a server (`ConfigError` when it is not one)."""
    where = "the store's shared MCP servers"
    entry = value.get("entry") if isinstance(value, Mapping) else None
    if not isinstance(entry, Mapping) or entry.get("name") != name:
        raise ConfigError(f"{where}: the value under {name!r} is not a server entry of that name")
    return validate_server(dict(entry), where, f"server {name!r}")
