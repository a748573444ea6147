"""Bounded downloads for skill installs: HTTP 200 only, a byte cap enforced while streaming."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .errors import SkillInstallError

if TYPE_CHECKING:
    import httpx2

__all__ = ["Downloader"]


class Downloader:
    """Fetches one URL into memory with an overall timeout and a size cap."""

    def __init__(self, client: httpx2.AsyncClient | None = None, *, timeout: float = 120.0) -> None:
        """Use ``client`` if given; otherwise a short-lived client is made per download."""
        self._client = client
        self.timeout = timeout

    async def fetch(self, url: str, limit: int, what: str = "the file") -> bytes:
        """Return the body of ``url``; `SkillInstallError` on non-200, overflow or timeout."""
        import httpx2  # imported here: only installs download anything

        try:
            # One deadline for the whole transfer: a slow trickle cannot hold the tool forever.
            async with asyncio.timeout(self.timeout):
                if self._client is not None:
                    return await self._fetch(self._client, url, limit, what)
                timeouts = httpx2.Timeout(self.timeout, connect=min(self.timeout, 15.0))
                async with httpx2.AsyncClient(timeout=timeouts, follow_redirects=True) as client:
                    return await self._fetch(client, url, limit, what)
        except TimeoutError:
            raise SkillInstallError(
                f"downloading {url} took longer than {self.timeout:g} s; try again later or "
                "use a smaller or closer source",
                source=url,
            ) from None
        except (httpx2.HTTPError, httpx2.InvalidURL, httpx2.StreamError, OSError) as exc:
            raise SkillInstallError(
                f"downloading {url} failed: {type(exc).__name__}: {exc or 'no details'}; check "
                "the URL and the network, then try again",
                source=url,
            ) from exc

    async def _fetch(self, client: httpx2.AsyncClient, url: str, limit: int, what: str) -> bytes:
        # identity: a compressed transfer could inflate far past the cap inside one chunk.
        headers = {"Accept-Encoding": "identity"}
        async with client.stream("GET", url, headers=headers, follow_redirects=True) as response:
            if response.status_code != 200:
                raise SkillInstallError(
                    f"downloading {url} failed: HTTP {response.status_code} "
                    f"{response.reason_phrase}".rstrip(),
                    source=url,
                    status_code=response.status_code,
                )
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise SkillInstallError(
                    f"{what} at {url} is {int(declared)} bytes, more than the limit of {limit}; "
                    "nothing was downloaded"
                )
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > limit:
                    raise SkillInstallError(
                        f"{what} at {url} is larger than the limit of {limit} bytes; the "
                        f"download stopped after {len(body)} bytes"
                    )
            return bytes(body)
