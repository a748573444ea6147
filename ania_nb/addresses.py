"""Host names, addresses and URLs: "does this host name only this machine?", "hide its password".

`is_loopback` decides whether a listener may go without a token (``ania-nb serve``'s reverse
WebSocket); `ip_of` reads a literal address the way every check here does. It fails closed:
anything it cannot read as ``localhost`` or a loopback address is not loopback, since a host
name may resolve to anything. `mask_url` shows a URL (a store's, an endpoint's) with its
password as ``***``. Standard library only: every layer may import this module.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import unquote

__all__ = ["MASK", "IPAddress", "ip_of", "is_loopback", "mask_url", "url_scheme"]

MASK = "***"
# Query parameters of a URL (libpq's) that hold a secret.
SECRET_QUERY_KEYS = frozenset({"password", "sslpassword"})
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def ip_of(host: str) -> IPAddress | None:
    """The address ``host`` writes literally, or None for a host name.

    ``[::1]`` (a URL's form) is read as ``::1``, a zone index (``fe80::1%eth0``) is kept, and
    an IPv4 address mapped into IPv6 (``::ffff:127.0.0.1``) is read as the IPv4 one.
    """
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine: ``localhost``, 127.0.0.0/8 or ``::1``.

    Brackets and the IPv4-mapped form are read (see `ip_of`); ``0.0.0.0`` and ``::`` (every
    interface), other host names (``localhost.`` too, which asks DNS) and padded or otherwise
    odd spellings are not loopback.
    """
    if host.lower() == "localhost":
        return True
    address = ip_of(host)
    return address is not None and address.is_loopback


def url_scheme(text: str) -> str:
    """The lower-case scheme of ``scheme://…`` text, or "" when it has none."""
    match = _SCHEME.match(text.strip())
    return match.group(1).lower() if match else ""


def mask_url(url: str) -> str:
    """``url`` for a message: its password (userinfo or query) as ``***``, the rest as written.

    ``postgresql://bob:s3cret@host:5432/db`` → ``postgresql://bob:***@host:5432/db``. Text
    that is not a URL is masked whole (it may be a mistyped secret).
    """
    scheme = url_scheme(url)
    if not scheme:
        return MASK if url.strip() else ""
    head, rest = url.split("://", 1)
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":" + MASK
    path, question, query = tail.partition("?")
    if question:
        query, hash_mark, fragment = query.partition("#")
        query = "&".join(_masked_parameter(p) for p in query.split("&")) + hash_mark + fragment
    return f"{head}://{userinfo}{at}{hosts}{path}{question}{query}"


def _masked_parameter(parameter: str) -> str:
    name, equals, value = parameter.partition("=")
    if equals and unquote(name).strip().lower() in SECRET_QUERY_KEYS and value:
        return f"{name}={MASK}"
    return parameter
