"""Host names and addresses: the one answer to "does this host name only this machine?".

`is_loopback` decides whether a listener may go without a token (``ania-nb serve``'s reverse
WebSocket); `ip_of` reads a literal address the way every check here does. It fails closed:
anything it cannot read as ``localhost`` or a loopback address is not loopback, since a host
name may resolve to anything. Standard library only: every layer may import this module.
"""

from __future__ import annotations

import ipaddress

__all__ = ["IPAddress", "ip_of", "is_loopback"]

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
