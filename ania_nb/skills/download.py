"""Bounded downloads for skill installs: HTTP 200, a byte cap, public addresses only.

A body sent with ``Content-Encoding: gzip`` or ``deflate`` (though we ask for ``identity``) is
decompressed here, never past the cap: a small compressed body cannot inflate in memory.

The model chooses the URL, so a download must not reach the machine's own services or its
network: every hop (the URL and each redirect, followed here, at most 5) is resolved and refused if
any address is loopback, private, link-local (cloud metadata 169.254.169.254), multicast, reserved
or otherwise not public, unless the operator allowed it (``skills.allow_private_hosts``). The
installer's own client also checks the address it actually connects to, so a name that resolves
differently a moment later (DNS rebinding) is refused too; an injected client gets the per-hop
checks only. Errors name the status and the refused address, never bytes of a response body.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import zlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from .errors import SkillInstallError

if TYPE_CHECKING:
    import httpx2

__all__ = ["MAX_REDIRECTS", "AddressPolicy", "Downloader", "resolve"]

MAX_REDIRECTS = 5
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_METADATA = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (literal addresses, decimal forms included)."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise SkillInstallError(
            f"the host {host!r} cannot be resolved ({exc}); check the URL"
        ) from None
    found: list[IPAddress] = []
    for *_, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    return found


def _embedded(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64), else itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _why_refused(address: IPAddress) -> str | None:
    """Why ``address`` is not a public one, or None if it is."""
    inner = _embedded(address)
    if address in _METADATA or inner in _METADATA:
        return "a cloud metadata address"
    for value in (inner, address) if inner != address else (address,):
        if value.is_loopback:
            return "a loopback address"
        if value.is_unspecified:
            return "an unspecified address"
        if value.is_link_local:
            return "a link-local address"
        if value.is_multicast:
            return "a multicast address"
        if value.is_private:
            return "a private address"
        if value.is_reserved:
            return "a reserved address"
        if not value.is_global:
            return "not a public address"
    return None


class AddressPolicy:
    """Which addresses downloads may reach: public ones, plus the operator's allowed networks."""

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        """``allowed``: addresses or networks (CIDR) reachable although not public."""
        self.allowed = tuple(ipaddress.ip_network(a, strict=False) for a in allowed)

    def refusal(self, address: IPAddress) -> str | None:
        """Why a connection to ``address`` is refused, or None to allow it."""
        if any(address in net or _embedded(address) in net for net in self.allowed):
            return None
        return _why_refused(address)

    async def check(self, host: str, port: int, what: str) -> list[IPAddress]:
        """The addresses of ``host``; `SkillInstallError` if any of them is refused."""
        addresses = await resolve(host, port)
        if not addresses:
            raise SkillInstallError(f"the host {host!r} of {what} has no address")
        for address in addresses:
            reason = self.refusal(address)
            if reason is not None:
                raise SkillInstallError(
                    f"refused to download {what}: {host!r} resolves to {address}, which is "
                    f"{reason}; skills are only downloaded from public addresses (an operator "
                    "can allow a private server with skills.allow_private_hosts)"
                )
        return addresses


class _GuardedBackend:
    """The network backend of the installer's own client: connects only to checked addresses."""

    def __init__(self, inner: Any, policy: AddressPolicy) -> None:
        self._inner = inner
        self._policy = policy

    async def connect_tcp(self, host: str, port: int, **kwargs: Any) -> Any:
        """Resolve, check every address, then connect to a checked one by its address."""
        import httpcore2

        addresses = await self._policy.check(host, port, f"{host}:{port}")
        for address in addresses[:-1]:  # every one was checked: try them in order
            try:
                return await self._inner.connect_tcp(str(address), port, **kwargs)
            except (OSError, httpcore2.ConnectError, httpcore2.ConnectTimeout):
                continue  # the next address may answer; the last one's error is raised
        return await self._inner.connect_tcp(str(addresses[-1]), port, **kwargs)

    def __getattr__(self, name: str) -> Any:  # sleep, connect_unix_socket
        return getattr(self._inner, name)


def _guarded_client(timeout: float, policy: AddressPolicy) -> httpx2.AsyncClient:
    """A client whose connections go only where ``policy`` allows (DNS rebinding included)."""
    import httpcore2
    import httpx2

    transport = httpx2.AsyncHTTPTransport()
    pool = getattr(transport, "_pool", None)
    if isinstance(pool, httpcore2.AsyncConnectionPool) and hasattr(pool, "_network_backend"):
        # Duck-typed: httpcore2 is imported only when something is downloaded.
        guarded = _GuardedBackend(pool._network_backend, policy)
        pool._network_backend = cast("httpcore2.AsyncNetworkBackend", guarded)
    timeouts = httpx2.Timeout(timeout, connect=min(timeout, 15.0))
    return httpx2.AsyncClient(timeout=timeouts, transport=transport, follow_redirects=False)


class Downloader:
    """Fetches one URL into memory with an overall timeout, a size cap and address checks."""

    def __init__(
        self,
        client: httpx2.AsyncClient | None = None,
        *,
        timeout: float = 120.0,
        allow_private_hosts: Iterable[str] = (),
    ) -> None:
        """Use ``client`` if given; otherwise a short-lived guarded client is made per download.

        ``allow_private_hosts``: addresses or networks that may be reached although not public.
        """
        self._client = client
        self.timeout = timeout
        self.policy = AddressPolicy(allow_private_hosts)

    async def fetch(self, url: str, limit: int, what: str = "the file") -> bytes:
        """The body of ``url``; `SkillInstallError` on non-200, overflow, timeout, bad address."""
        import httpx2  # imported here: only installs download anything

        try:
            # One deadline for the whole transfer: a slow trickle cannot hold the tool forever.
            async with asyncio.timeout(self.timeout):
                if self._client is not None:
                    return await self._follow(self._client, url, limit, what)
                async with _guarded_client(self.timeout, self.policy) as client:
                    return await self._follow(client, url, limit, what)
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

    async def _follow(self, client: httpx2.AsyncClient, url: str, limit: int, what: str) -> bytes:
        """Follow redirects by hand, checking each hop's addresses before connecting."""
        import httpx2

        current = httpx2.URL(url)
        for hop in range(MAX_REDIRECTS + 1):
            if current.scheme not in ("http", "https") or not current.host:
                raise SkillInstallError(
                    f"downloading {url} was redirected to a non-http(s) URL; nothing was "
                    "downloaded",
                    source=url,
                )
            port = current.port or (443 if current.scheme == "https" else 80)
            where = url if hop == 0 else f"{url} (redirect {hop})"
            await self.policy.check(current.host, port, where)
            target = await self._fetch(client, current, limit, what, url)
            if isinstance(target, bytes):
                return target
            current = target
        raise SkillInstallError(
            f"downloading {url} was redirected more than {MAX_REDIRECTS} times; nothing was "
            "downloaded",
            source=url,
        )

    async def _fetch(
        self, client: httpx2.AsyncClient, current: httpx2.URL, limit: int, what: str, url: str
    ) -> bytes | httpx2.URL:
        """The body of one hop, or the URL it redirects to."""
        # identity: the file as it is. A server that compresses anyway is decoded below, by us,
        # so that no more than the cap is ever inflated.
        headers = {"Accept-Encoding": "identity"}
        async with client.stream(
            "GET", current, headers=headers, follow_redirects=False
        ) as response:
            if response.status_code in _REDIRECTS and "location" in response.headers:
                return current.join(response.headers["location"])
            if response.status_code != 200:
                # Status only: the reason phrase and body are the server's words, not ours.
                raise SkillInstallError(
                    f"downloading {url} failed: HTTP {response.status_code}",
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
