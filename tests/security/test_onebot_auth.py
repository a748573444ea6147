"""OneBot authentication: every way authorization.md (and go-cqhttp) sends the token works,
compared in constant time; a wrong token is refused whichever way it comes; a token in the
forward URL never shows in an error or a log line."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any
from urllib.parse import quote

import pytest
from websockets.asyncio.client import connect

from ania_nb.config import RunnerSettings
from ania_nb.runner.onebot import OneBotAdapter
from ania_nb.testing.onebot import HandshakeRejected, OneBotImpl

TOKEN = "ob-Tok/en+42=&x%y"  # URL-quoting changes it: a raw comparison would fail


async def _listening() -> OneBotAdapter:
    adapter = OneBotAdapter(RunnerSettings(mode="reverse", port=0, access_token=TOKEN))
    await adapter.start(lambda message: asyncio.sleep(0))
    return adapter


@pytest.mark.parametrize("auth", ["Bearer", "Token", "query"])
async def test_the_reverse_server_accepts_every_documented_scheme(auth: Any) -> None:
    adapter = await _listening()
    impl = OneBotImpl(self_id="10000", access_token=TOKEN)
    try:
        await impl.connect(adapter.url, auth=auth)
        await asyncio.wait_for(adapter.wait_connected(), 10)
        assert adapter.self_id == "10000"
        with pytest.raises(HandshakeRejected) as wrong:
            await OneBotImpl(self_id="10000").connect(adapter.url, token=TOKEN + "x", auth=auth)
        assert wrong.value.status == 403
    finally:
        await impl.aclose()
        await adapter.aclose()


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"bearer {TOKEN}"},  # schemes are case-insensitive (RFC 9110)
        {"Authorization": f"TOKEN {TOKEN}"},
    ],
)
async def test_scheme_names_are_case_insensitive(headers: dict[str, str]) -> None:
    adapter = await _listening()
    try:
        async with connect(adapter.url, additional_headers=headers, proxy=None):
            await asyncio.wait_for(adapter.wait_connected(), 10)
    finally:
        await adapter.aclose()


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Basic {TOKEN}"},  # another scheme carrying the secret: refused
        {"Authorization": TOKEN},  # no scheme at all
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": "Bearer"},
    ],
)
async def test_other_schemes_and_near_misses_are_refused(headers: dict[str, str]) -> None:
    adapter = await _listening()
    try:
        with pytest.raises(Exception, match=r"HTTP 40[13]"):
            async with connect(adapter.url, additional_headers=headers, proxy=None):
                pass
        assert not adapter.connected
    finally:
        await adapter.aclose()


async def test_a_token_in_the_forward_url_stays_out_of_errors_and_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    url = f"ws://127.0.0.1:{port}/?access_token={quote(TOKEN, safe='')}"
    adapter = OneBotAdapter(
        RunnerSettings(mode="forward", url=url, access_token=TOKEN, action_timeout=0.5)
    )
    caplog.set_level(logging.INFO, logger="ania_nb.runner.onebot")
    try:
        await adapter.start(lambda message: asyncio.sleep(0))
        assert not adapter.connected
        error = adapter.last_error or ""
        assert f"cannot connect to ws://127.0.0.1:{port}/?access_token=***" in error
    finally:
        await adapter.aclose()
    shown = error + "\n" + caplog.text
    assert TOKEN not in shown and quote(TOKEN, safe="") not in shown
