"""Shared HTTP plumbing for the web-facing built-in tools: one lazily created httpx2 client."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import ToolError

if TYPE_CHECKING:  # pragma: no cover
    import httpx2

USER_AGENT = "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) ania-nb"


class HttpSource:
    """Hands out an `httpx2.AsyncClient`: the injected one, or one created on first use."""

    def __init__(self, client: httpx2.AsyncClient | None = None) -> None:
        self._client = client
        self._owned: httpx2.AsyncClient | None = None

    def get(self) -> httpx2.AsyncClient:
        """The client to use (created lazily so importing tools stays cheap)."""
        if self._client is not None:
            return self._client
        if self._owned is None:
            import httpx2

            self._owned = httpx2.AsyncClient(
                follow_redirects=True, headers={"User-Agent": USER_AGENT}
            )
        return self._owned

    async def aclose(self) -> None:
        """Close the client this source created (an injected one belongs to its owner)."""
        if self._owned is not None:
            await self._owned.aclose()
            self._owned = None


async def get_ok(
    http: HttpSource, url: str, *, what: str, seconds: float, **kwargs: Any
) -> httpx2.Response:
    """GET ``url`` within ``seconds``; a `ToolError` naming ``what`` unless it answers 200."""
    import httpx2

    try:
        response = await http.get().get(url, timeout=seconds, **kwargs)
    except httpx2.TimeoutException:
        raise ToolError(f"{what} timed out after {seconds:g} s") from None
    except httpx2.HTTPError as exc:
        raise ToolError(f"{what} failed: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise ToolError(status_error(what, response))
    return response


def status_error(what: str, response: Any) -> str:
    """A short message for a non-200 answer: the service, the status and the reason."""
    reason = getattr(response, "reason_phrase", "") or ""
    return f"{what} failed: HTTP {response.status_code} {reason}".rstrip()
