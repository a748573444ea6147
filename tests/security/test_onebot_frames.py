"""The OneBot connection survives any frame (``ania-nb serve`` as a subprocess, both modes).

The test implementation (``ania_nb.testing.onebot``) sends hostile frames on the live
connection: JSON nested a hundred thousand levels deep, invalid UTF-8, huge frames, JSON of
the wrong shape, events with wrong field types, answers nobody asked for. After each one the
bot still answers a normal message — on the same connection when the frame only had to be
ignored, after a reconnect when it broke the WebSocket protocol itself (websockets closes such
a connection) — and SIGTERM still exits 0. A connection loop broken on purpose (a handler
raising outside the per-frame guard) ends the process with exit code 1.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from test_runner_serve import TOKEN, Serve, connect, launch, to_user, uid, write_config

from ania_nb.testing import ScriptedLLM, reply
from ania_nb.testing.onebot import OneBotImpl

pytestmark = pytest.mark.asyncio(loop_scope="module")
__all__ = ["launch"]  # the fixture, shared with test_runner_serve

DEEP = 100_000
_MAX_FRAME = 64 * 2**20  # the runner's websockets max_size


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def _group_event(**fields: Any) -> dict[str, Any]:
    """A group message nobody @-ed (the router keeps it without asking the model)."""
    event = {
        "time": 1,
        "self_id": 10000,
        "post_type": "message",
        "message_type": "group",
        "sub_type": "normal",
        "message_id": 777_001,
        "user_id": 4242,
        "group_id": 4343,
        "message": [{"type": "text", "data": {"text": "just chatting"}}],
        "sender": {"user_id": 4242, "nickname": "eve"},
    }
    return event | fields


def _hostile_frames() -> list[tuple[str, str | bytes, bool | None, bool]]:
    """(what, frame, text flag, whether the connection must stay up)."""
    deep = _nested(900)  # parses (under the recursion limit), then trips whatever recurses
    return [
        ("a list nested 100k deep", "[" * DEEP + "]" * DEEP, None, True),
        ("an object nested 100k deep", '{"a":' * DEEP + "1" + "}" * DEEP, None, True),
        ("an unclosed nest", "[" * DEEP, None, True),
        (
            "an event with 900-deep values in a segment and the sender",
            json.dumps(
                _group_event(
                    message=[{"type": "text", "data": {"text": deep, "more": deep}}],
                    sender={"user_id": 4242, "nickname": deep, "card": deep},
                )
            ),
            None,
            True,
        ),
        ("a binary frame that is not UTF-8", b"\xff\xfe{\x00\x80", None, True),
        ("a binary frame with an event", json.dumps({"post_type": "notice"}).encode(), None, True),
        ("a text frame that is not UTF-8", b'{"post_type": "\xff\xfe"}', True, False),
        ("a 4 MiB frame", json.dumps({"post_type": "notice", "junk": "x" * 4 * 2**20}), None, True),
        ("a frame over the size cap", '"' + "x" * (_MAX_FRAME + 16) + '"', None, False),
        ("a JSON list", "[1, 2, 3]", None, True),
        ("a JSON number", "42", None, True),
        ("a JSON string", '"hello"', None, True),
        ("JSON null", "null", None, True),
        ("a huge integer", "9" * 100_000, None, True),
        ("NaN where an object belongs", "NaN", None, True),
        ("an unknown post_type", '{"post_type": "wormhole", "self_id": 1}', None, True),
        ("a post_type that is a list", '{"post_type": ["message"]}', None, True),
        ("a post_type that is an object", '{"post_type": {"message": 1}}', None, True),
        (
            "a message event with wrong field types",
            json.dumps(
                {
                    "post_type": "message",
                    "message_type": ["private"],
                    "message_id": {},
                    "user_id": [1],
                    "time": "soon",
                    "message": 5,
                    "sender": "me",
                }
            ),
            None,
            True,
        ),
        (
            "a group message with junk in every field",
            json.dumps(
                _group_event(
                    message=[{"type": "at", "data": {"qq": {"all": 1}}}, {"type": 5}],
                    sender=[1, 2],
                )
            ),
            None,
            True,
        ),
        (
            "a message whose segments are objects of the wrong kind",
            json.dumps(_group_event(message=[{"type": "image", "data": {"url": [1], "file": {}}}])),
            None,
            True,
        ),
        ("a meta event with wrong types", '{"post_type": "meta_event", "self_id": {}}', None, True),
        ("an answer with an unknown echo", '{"status": "ok", "echo": "ania:999999"}', None, True),
        ("an answer whose echo is an object", '{"status": "ok", "echo": {"e": 1}}', None, True),
        ("an answer without a status", '{"retcode": 0, "echo": "ania:1"}', None, True),
    ]


def _probe_responder(request: Any) -> Any:
    """Answer ``probe N`` with ``pong N`` (whatever else the bot may ask in between)."""
    found = re.search(r"probe (\d+)", str(request.messages[-1].get("content")))
    return reply(f"pong {found.group(1)}" if found else "noise")


async def _probe(impl: OneBotImpl, user: int, n: int) -> None:
    await impl.private_message(user, f"probe {n}", wait=20)
    await impl.wait_for_action("send_private_msg", to_user(user, f"pong {n}"), 20)


@pytest.fixture
def llm() -> Any:
    """A scripted model that answers every probe (no strict history check: noise is fine)."""
    with ScriptedLLM() as server:
        server.responder = _probe_responder
        yield server


@pytest_asyncio.fixture(loop_scope="module")
async def impl() -> Any:
    """A OneBot implementation requiring the token."""
    onebot = OneBotImpl(self_id="10000", access_token=TOKEN)
    yield onebot
    await onebot.aclose()


@pytest.mark.parametrize("mode", ["forward", "reverse"])
async def test_no_frame_ends_the_connection_or_the_process(
    launch: Any, impl: OneBotImpl, mode: str
) -> None:
    user = uid()
    proc = await connect(launch, impl, mode)
    await _probe(impl, user, 0)
    for n, (what, frame, text, kept) in enumerate(_hostile_frames(), 1):
        connections = impl.connections
        await impl.send_raw(frame, text=text)
        if not kept:  # websockets closed it (1007 / 1009): a new connection is made
            await impl.wait_connected(20, connections=connections + 1)
        try:
            await _probe(impl, user, n)
        except TimeoutError:
            pytest.fail(f"no answer after {what} ({mode}):\n{proc.log[-4000:]}")
        if kept:
            assert impl.connections == connections, f"{what} cost the connection ({mode})"
    assert await proc.stop() == 0
    assert "connection handler failed" not in proc.log  # nothing escaped to websockets
    assert "never retrieved" not in proc.log
    assert "nested too deeply" in proc.log and "not JSON" in proc.log
    assert re.search(r"WARNING .*connection broke: .*1009", proc.log)  # the size cap said so


# ``ania-nb serve`` with one part broken on purpose (argv[2] says which), to prove what holds
# when code outside the per-frame checks fails:
# - "loop": from the second connection on, the connect handler raises something no guard
#   catches (a BaseException), so the connection loop dies;
# - "event": the event handler raises on frames carrying "boom" (a bug in handling a frame);
# - "link": serving the second connection raises (a bug outside any frame).
_BROKEN_RUNNER = """
import sys
from ania_nb.runner.onebot import adapter, transport

class LoopBreaker(BaseException):
    pass

calls = []
part = sys.argv[2]
on_connect = adapter.OneBotAdapter._on_connect
on_event = adapter.OneBotAdapter._on_event
serve_link = transport.Transport._serve_link

def broken_on_connect(self):
    calls.append(1)
    if len(calls) > 1:
        raise LoopBreaker("broken on purpose")
    on_connect(self)

def broken_on_event(self, payload):
    if "boom" in payload:
        raise RuntimeError("event handler broken on purpose")
    on_event(self, payload)

async def broken_serve_link(self, ws):
    calls.append(1)
    if len(calls) == 2:
        raise RuntimeError("link broken on purpose")
    await serve_link(self, ws)

if part == "loop":
    adapter.OneBotAdapter._on_connect = broken_on_connect
elif part == "event":
    adapter.OneBotAdapter._on_event = broken_on_event
else:
    transport.Transport._serve_link = broken_serve_link
from ania_nb.cli import main
sys.exit(main(["serve", "--config", sys.argv[1]]))
"""


class BrokenServe(Serve):
    """``ania-nb serve`` with one part broken on purpose (`_BROKEN_RUNNER`)."""

    def __init__(self, config: Path, part: str) -> None:
        super().__init__(config)
        self.part = part

    async def start(self) -> BrokenServe:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _BROKEN_RUNNER,
            str(self.config),
            self.part,
            cwd=self.config.parent,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.ensure_future(self._read())
        return self


async def _broken(
    impl: OneBotImpl, llm: ScriptedLLM, tmp_path: Path, mode: str, part: str
) -> BrokenServe:
    """A broken runner connected to ``impl`` and answering."""
    runner: dict[str, Any] = {"access_token": TOKEN, "grace_seconds": 1, "reconnect_max": 1}
    if mode == "forward":
        runner |= {"mode": "forward", "url": await impl.serve()}
    else:
        runner |= {"mode": "reverse", "port": 0}
    config = write_config(tmp_path / "ania.toml", llm, tmp_path / "data", runner=runner)
    proc = await BrokenServe(config, part).start()
    if mode == "reverse":
        url = (await proc.wait_log(r"ws://127\.0\.0\.1:\d+/onebot/v11/ws")).group(0)
        await impl.connect(url, deadline=20)
    await impl.wait_connected(20)
    await proc.ready()
    return proc


@pytest.mark.parametrize("mode", ["forward", "reverse"])
async def test_a_connection_loop_that_dies_ends_serve_with_exit_1(
    impl: OneBotImpl, llm: ScriptedLLM, tmp_path: Path, mode: str
) -> None:
    proc = await _broken(impl, llm, tmp_path, mode, "loop")
    try:
        await _probe(impl, uid(), 1)  # alive and answering
        await impl.drop()  # the next connection runs into the broken handler
        assert await proc.wait() == 1
    finally:
        await proc.kill()
    assert re.search(r"ERROR .*LoopBreaker\('broken on purpose'\).*exits with code 1", proc.log)
    assert proc.lines[-1].endswith("ania_nb.runner: stopped")


@pytest.mark.parametrize("mode", ["forward", "reverse"])
async def test_a_handler_that_fails_on_a_frame_costs_only_that_frame(
    impl: OneBotImpl, llm: ScriptedLLM, tmp_path: Path, mode: str
) -> None:
    proc = await _broken(impl, llm, tmp_path, mode, "event")
    try:
        user = uid()
        for n in range(1, 3):
            await impl.send_raw(json.dumps({"post_type": "notice", "boom": n}))
            await _probe(impl, user, n)
        assert impl.connections == 1
        assert await proc.stop() == 0
    finally:
        await proc.kill()
    assert "ignored a OneBot frame whose handling failed" in proc.log
    assert "event handler broken on purpose" in proc.log


@pytest.mark.parametrize("mode", ["forward", "reverse"])
async def test_a_connection_that_fails_unexpectedly_is_made_again(
    impl: OneBotImpl, llm: ScriptedLLM, tmp_path: Path, mode: str
) -> None:
    proc = await _broken(impl, llm, tmp_path, mode, "link")
    try:
        user = uid()
        await _probe(impl, user, 1)
        await impl.drop()  # the second connection fails at once; a third one works
        await impl.wait_connected(20, connections=3)
        await _probe(impl, user, 2)
        assert await proc.stop() == 0
    finally:
        await proc.kill()
    assert "link broken on purpose" in proc.log
