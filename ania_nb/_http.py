"""The one place to hand ania-nb your own HTTP clients (proxies, custom TLS, recording, tests).

Every client is an `httpx2.AsyncClient`: the HTTP library under both the openai SDK and the mcp
SDK, so one client type serves model calls, web tools and MCP connections.
An injected client stays open when the Agent closes: its owner closes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import httpx2

__all__ = ["HttpClients", "MCPClientFactory"]


class MCPClientFactory(Protocol):
    """Builds the client for one MCP streamable-HTTP or SSE connection.

    Called once per connection with the server's headers and ania-nb's timeouts (no read
    timeout: an event stream may stay silent); the transport enters and closes the client it
    gets. Leave ``follow_redirects`` off: the SDK follows same-origin redirects itself.
    """

    def __call__(
        self,
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        """A new client for one connection."""
        ...


@dataclass(frozen=True)
class HttpClients:
    """HTTP clients to use instead of the ones ania-nb creates; None = ania-nb's own."""

    llm: httpx2.AsyncClient | None = None
    """Main, fallback and compressor model calls."""
    vision: httpx2.AsyncClient | None = None
    """The vision model that describes images; None = the ``llm`` client."""
    web: httpx2.AsyncClient | None = None
    """webSearch, webExplore and meme. (Skill downloads keep their own client: it refuses
    non-public addresses at connect time, which an injected client could not promise.)"""
    mcp: MCPClientFactory | None = None
    """Makes the client of each MCP streamable-HTTP/SSE connection (stdio servers use none)."""

    @property
    def vision_client(self) -> httpx2.AsyncClient | None:
        """The client for the vision model: ``vision``, else ``llm``."""
        return self.vision if self.vision is not None else self.llm
