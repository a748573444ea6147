"""The callbacks bridge: optional, sync or async, and failures in a display never break a run."""

from __future__ import annotations

import logging

from ania_nb import Callbacks, RunEvent
from ania_nb.testing import reply


async def test_sync_and_async_callbacks_and_absent_ones():
    got: list[object] = []

    async def send_image(b64: str) -> str:
        got.append(b64)
        return "sent"

    cb = Callbacks(send_text=got.append, send_image=send_image)
    assert cb.has("send_text") and cb.has("send_image") and not cb.has("send_file")
    assert await cb.call("send_text", "hi") is None
    assert await cb.call("send_image", "AAAA") == "sent"
    assert await cb.call("send_file", "a.txt", "QQ==") is None  # absent: nothing happens
    assert got == ["hi", "AAAA"]
    assert cb.provided() == ["send_image", "send_text"]


async def test_background_copy_drops_intermediate_text_only():
    cb = Callbacks(send_text=print, send_image=print)
    quiet = cb.background()
    assert not quiet.has("send_text") and quiet.has("send_image")
    assert cb.has("send_text")  # the original is unchanged


async def test_a_failing_display_is_logged_and_the_run_still_succeeds(llm, make_agent, caplog):
    def broken(event: RunEvent) -> None:
        raise RuntimeError("widget gone")

    def broken_text(text: str) -> None:
        raise RuntimeError("chat closed")

    llm.script(reply("fine"))
    agent = make_agent()
    with caplog.at_level(logging.ERROR):
        result = await agent.chat("hi", callbacks=Callbacks(on_event=broken, send_text=broken_text))
    assert result.ok and result.text == "fine"
    assert "on_event callback failed" in caplog.text
