"""Bounded downloads for skill installs: HTTP 200 only, a byte cap enforced while streaming.

A body sent with ``Content-Encoding: gzip`` or ``deflate`` (though we ask for ``identity``) is
decompressed here, never past the cap: a small compressed body cannot inflate in memory.
"""

from __future__ import annotations

import asyncio
import zlib
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
        # identity: the file as it is. A server that compresses anyway is decoded below, by us,
        # so that no more than the cap is ever inflated.
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
            inflate = _decompressor(response.headers.get("content-encoding", ""), url)
            body = bytearray()
            async for raw in response.aiter_raw():
                room = limit - len(body) + 1  # one byte past the cap proves the overflow
                body += raw if inflate is None else _inflate(inflate, raw, room, url)
                if len(body) > limit:
                    raise SkillInstallError(
                        f"{what} at {url} is larger than the limit of {limit} bytes; the "
                        f"download stopped after {len(body)} bytes"
                    )
            if inflate is not None and not inflate.eof:
                raise SkillInstallError(
                    f"the compressed download of {url} ended early; try again", source=url
                )
            return bytes(body)


# Decoded with one zlib mode that tells gzip from zlib-wrapped deflate by the header.
_DECODABLE = frozenset({"gzip", "x-gzip", "deflate"})


def _decompressor(header: str, url: str) -> zlib._Decompress | None:
    """A decompressor for the body's Content-Encoding, or None for a plain body."""
    codings = [c.strip().lower() for c in header.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return None
    if len(codings) == 1 and codings[0] in _DECODABLE:
        return zlib.decompressobj(zlib.MAX_WBITS | 32)
    raise SkillInstallError(
        f"{url} was sent compressed as {header!r}, which the installer cannot decode (gzip and "
        "deflate only); link a plain download instead",
        source=url,
    )


def _inflate(inflate: zlib._Decompress, data: bytes, room: int, url: str) -> bytes:
    """Decompress ``data``, producing at most ``room`` bytes (the rest is never made)."""
    try:
        return inflate.decompress(data, room)
    except zlib.error as exc:
        raise SkillInstallError(
            f"{url} is marked as compressed but does not decompress ({exc}); link a plain "
            "download instead",
            source=url,
        ) from None
