"""`FallbackClients`: the model client of ``quota.fallback_model``, kept while its endpoint is.

Built when a run first needs it (most agents never do) and again when the fallback's endpoint
settings change; every client built is closed with the agent (a run may still be using an
older one when the settings change).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.llm import LLMClient

if TYPE_CHECKING:  # pragma: no cover
    import httpx2

    from ..config import Config, ResolvedEndpoint


class FallbackClients:
    """The client of ``quota.fallback_model`` for the current settings (see the module)."""

    def __init__(self, http_client: httpx2.AsyncClient | None = None) -> None:
        """Build clients over ``http_client`` (yours: left open) when given."""
        self._http_client = http_client
        self._current: tuple[ResolvedEndpoint, LLMClient] | None = None
        self._built: list[LLMClient] = []

    def client(self, config: Config) -> LLMClient:
        """The client for ``config``'s quota fallback (built if its endpoint changed)."""
        endpoint = config.quota.fallback_endpoint().resolved(config.llm)
        if self._current is None or self._current[0] != endpoint:
            built = LLMClient.from_config(config, role="quota", http_client=self._http_client)
            self._built.append(built)
            self._current = (endpoint, built)
        return self._current[1]

    async def aclose(self) -> None:
        """Close every client built."""
        built, self._built, self._current = self._built, [], None
        for client in built:
            await client.aclose()
