"""The one loopback check (`ania_nb.addresses`) and the places that decide with it."""

from __future__ import annotations

import ipaddress

import pytest
from pydantic import SecretStr

from ania_nb.addresses import ip_of, is_loopback
from ania_nb.config import RunnerSettings
from ania_nb.errors import ConfigError
from ania_nb.notebook.firstrun import is_local
from ania_nb.runner.onebot import OneBotAdapter
from ania_nb.runner.serve import StartError, check_settings

LOOPBACK = [
    "localhost",
    "LOCALHOST",
    "127.0.0.1",
    "127.0.0.2",
    "127.255.255.254",
    "::1",
    "[::1]",  # a URL's spelling
    "0:0:0:0:0:0:0:1",
    "::ffff:127.0.0.1",  # IPv4-mapped
    "[::ffff:127.0.0.1]",
    "::1%lo",  # a zone index
]
NOT_LOOPBACK = [
    "0.0.0.0",  # every interface
    "::",
    "[::]",
    "192.168.1.20",
    "10.0.0.5",
    "8.8.8.8",
    "::ffff:8.8.8.8",
    "fe80::1",
    "example.com",
    "localhost.",  # asks DNS
    "localhost.example.com",
    "my.localhost",
    " 127.0.0.1",  # padded: not what a listener binds
    "127.1",  # a shorthand getaddrinfo reads, ipaddress does not: refused, not guessed
    "2130706433",
    "[[::1]]",
    "[::1",
    "",
]


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", NOT_LOOPBACK)
def test_hosts_that_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_ip_of_reads_literal_addresses_only() -> None:
    assert ip_of("[::1]") == ipaddress.IPv6Address("::1")
    assert ip_of("::ffff:127.0.0.1") == ipaddress.IPv4Address("127.0.0.1")
    assert ip_of("10.0.0.5") == ipaddress.IPv4Address("10.0.0.5")
    assert ip_of("localhost") is None
    assert ip_of("example.com") is None
    assert ip_of("") is None


def _reverse(host: str, token: str | None = None) -> RunnerSettings:
    secret = SecretStr(token) if token else None
    return RunnerSettings(mode="reverse", host=host, port=0, access_token=secret)


@pytest.mark.parametrize("host", LOOPBACK + NOT_LOOPBACK)
def test_serve_and_the_transport_agree_on_every_host(host: str) -> None:
    """`ania-nb serve`'s start-up check and the reverse transport refuse the same hosts.

    (They disagreed: serve called ``[::1]`` not loopback while the transport said it was.)
    """
    try:
        check_settings(_reverse(host))
        serve_allows = True
    except StartError:
        serve_allows = False
    try:
        OneBotAdapter(_reverse(host))
        transport_allows = True
    except ConfigError:
        transport_allows = False
    assert serve_allows is transport_allows is is_loopback(host)
    check_settings(_reverse(host, token="t"))  # with a token, any host may listen
    OneBotAdapter(_reverse(host, token="t"))


async def _ignore(message: object) -> None:
    """A message handler for listeners nobody talks to."""


async def test_a_bracketed_host_listens_on_its_address() -> None:
    """``[::1]`` passes the check and binds as ``::1`` (a bind of "[::1]" fails)."""
    adapter = OneBotAdapter(_reverse("[::1]"))
    try:
        await adapter.start(_ignore)
        assert adapter.transport.url.startswith("ws://[::1]:")
    finally:
        await adapter.aclose()
    mapped = OneBotAdapter(_reverse("::ffff:127.0.0.1"))
    try:
        await mapped.start(_ignore)
        assert mapped.transport.url.startswith("ws://127.0.0.1:")
    finally:
        await mapped.aclose()


@pytest.mark.parametrize(
    ("host", "local"),
    [
        *[(host, True) for host in ("localhost", "127.0.0.1", "[::1]", "::ffff:127.0.0.1")],
        ("192.168.1.20", True),
        ("::ffff:192.168.1.20", True),
        ("fe80::1", True),
        ("gpu-box.local", True),
        ("8.8.8.8", False),
        ("::ffff:8.8.8.8", False),  # a public address, however it is written
        ("api.example.com", False),
    ],
)
def test_the_first_run_check_counts_loopback_as_local(host: str, local: bool) -> None:
    assert is_local(host) is local
