"""The OneBot v11 test implementation, checked against the spec with a bare `websockets` peer.

The peer here is deliberately not our adapter: these tests pin down what the impl puts on the
wire (so the adapter's tests can trust it), using only the spec's JSON shapes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosedError, InvalidStatus

from ania_nb.testing.onebot import (
    HandshakeRejected,
    OneBotImpl,
    at,
    cq_escape,
    cq_unescape,
    face,
    file,
    from_cq,
    image,
    reply,
    text,
    to_cq,
)

TOKEN = "s3cret"


async def recv_json(ws: ClientConnection | ServerConnection) -> dict[str, Any]:
    """The next JSON frame (10 s at most)."""
    return json.loads(await asyncio.wait_for(ws.recv(), 10))


async def call(
    ws: ClientConnection | ServerConnection, action: str, echo: Any = "e1", **params: Any
) -> dict[str, Any]:
    """Send an action and return the response with its echo (skipping events in between)."""
    await ws.send(json.dumps({"action": action, "params": params, "echo": echo}))
    while True:
        frame = await recv_json(ws)
        if "post_type" not in frame:
            return frame


@pytest.fixture
async def impl() -> AsyncIterator[OneBotImpl]:
    """A forward-mode impl with a token."""
    onebot = OneBotImpl(self_id="10000", access_token=TOKEN)
    yield onebot
    await onebot.aclose()


async def open_client(url: str, token: str | None = TOKEN) -> ClientConnection:
    """Dial the impl as the bot would in forward mode, and read the lifecycle event."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    ws = await connect(url, additional_headers=headers, proxy=None)
    lifecycle = await recv_json(ws)
    assert lifecycle["post_type"] == "meta_event"
    assert lifecycle["meta_event_type"] == "lifecycle"
    assert lifecycle["sub_type"] == "connect"
    return ws


# ---------------------------------------------------------------- CQ strings


def test_cq_escape_follows_the_spec_tables() -> None:
    assert cq_escape("- [x] 使用 `&data` 获取地址") == "- &#91;x&#93; 使用 `&amp;data` 获取地址"
    assert cq_escape("震惊,小伙", comma=True) == "震惊&#44;小伙"
    assert cq_unescape("&amp;#91;") == "&#91;"  # an escaped escape stays literal


def test_cq_strings_round_trip_the_spec_example() -> None:
    cq = "&#91;第一部分&#93;[CQ:image,file=123.jpg]图片之后的部分，表情：[CQ:face,id=123]"
    segs = from_cq(cq)
    assert segs == [
        text("[第一部分]"),
        {"type": "image", "data": {"file": "123.jpg"}},
        text("图片之后的部分，表情："),
        {"type": "face", "data": {"id": "123"}},
    ]
    assert to_cq(segs) == cq
    share = from_cq("[CQ:share,title=标题中有=等号,url=http://baidu.com/?a=1&amp;b=2]")
    assert share == [
        {"type": "share", "data": {"title": "标题中有=等号", "url": "http://baidu.com/?a=1&b=2"}}
    ]


# ---------------------------------------------------------------- forward mode: auth


async def test_forward_accepts_the_token_as_header_or_query(impl: OneBotImpl) -> None:
    url = await impl.serve()
    ws = await open_client(url)
    await ws.close()
    ws = await connect(f"{url}/?access_token={TOKEN}", proxy=None)
    assert (await recv_json(ws))["meta_event_type"] == "lifecycle"
    await ws.close()
    assert impl.connections == 2


async def test_forward_refuses_missing_and_wrong_tokens(impl: OneBotImpl) -> None:
    url = await impl.serve()
    with pytest.raises(InvalidStatus) as missing:
        await connect(url, proxy=None)
    assert missing.value.response.status_code == 401
    with pytest.raises(InvalidStatus) as wrong:
        await connect(url, additional_headers={"Authorization": "Bearer nope"}, proxy=None)
    assert wrong.value.response.status_code == 403
    with pytest.raises(InvalidStatus) as wrong_query:
        await connect(f"{url}/?access_token=nope", proxy=None)
    assert wrong_query.value.response.status_code == 403
    assert impl.rejections == [401, 403, 403]
    assert impl.connections == 0


async def test_forward_unknown_path_is_404(impl: OneBotImpl) -> None:
    url = await impl.serve()
    with pytest.raises(InvalidStatus) as exc:
        await connect(
            f"{url}/nope", additional_headers={"Authorization": f"Bearer {TOKEN}"}, proxy=None
        )
    assert exc.value.response.status_code == 404


# ---------------------------------------------------------------- events


@pytest.mark.parametrize("fmt", ["array", "string"])
async def test_private_message_event_has_the_spec_fields(fmt: str) -> None:
    async with OneBotImpl(self_id="10000", message_format=fmt) as onebot:  # type: ignore[arg-type]
        ws = await open_client(await onebot.serve(), token=None)
        mid = await onebot.private_message(42, "a&b [1]", nickname="Ann")
        event = await recv_json(ws)
        assert event["post_type"] == "message"
        assert event["message_type"] == "private"
        assert event["sub_type"] == "friend"
        assert event["message_id"] == mid
        assert event["user_id"] == 42
        assert event["self_id"] == 10000
        assert event["sender"]["nickname"] == "Ann"
        assert event["raw_message"] == "a&amp;b &#91;1&#93;"
        expected = "a&amp;b &#91;1&#93;" if fmt == "string" else [text("a&b [1]")]
        assert event["message"] == expected
        await ws.close()


async def test_group_message_with_at_reply_and_image() -> None:
    async with OneBotImpl(self_id="10000", message_format="string") as onebot:
        ws = await open_client(await onebot.serve(), token=None)
        first = await onebot.group_message(555, 42, "hi")
        assert (await recv_json(ws))["message_id"] == first
        pic = image("http://127.0.0.1:1/a.png", file="a.png")
        mid = await onebot.group_message(
            555, 43, [text("look"), pic], at_bot=True, reply_to=first, nickname="Bo", card="B"
        )
        event = await recv_json(ws)
        assert event["message_type"] == "group"
        assert event["group_id"] == 555
        assert event["anonymous"] is None
        assert event["sender"]["card"] == "B"
        assert event["message_id"] == mid
        assert from_cq(event["message"]) == [reply(first), at("10000"), text(" look"), pic]
        assert event["message"] == event["raw_message"]
        await ws.close()


async def test_heartbeat_meta_event() -> None:
    async with OneBotImpl(heartbeat_interval=0.05) as onebot:
        ws = await open_client(await onebot.serve(), token=None)
        beat = await recv_json(ws)
        assert beat["meta_event_type"] == "heartbeat"
        assert beat["interval"] == 50
        assert beat["status"] == {"online": True, "good": True}
        await ws.close()


async def test_event_and_api_paths_split_the_services(impl: OneBotImpl) -> None:
    url = await impl.serve()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    api = await connect(f"{url}/api", additional_headers=auth, proxy=None)
    events = await connect(f"{url}/event", additional_headers=auth, proxy=None)
    assert (await recv_json(events))["meta_event_type"] == "lifecycle"
    reply_ = await call(api, "get_login_info")  # no lifecycle event came first on /api
    assert reply_["data"] == {"user_id": 10000, "nickname": "onebot-test"}
    await impl.private_message(1, "x")
    assert (await recv_json(events))["post_type"] == "message"
    await api.close()
    await events.close()


# ---------------------------------------------------------------- actions


async def test_send_actions_store_messages_and_echo(impl: OneBotImpl) -> None:
    ws = await open_client(await impl.serve())
    r1 = await call(
        ws, "send_private_msg", echo={"n": 1}, user_id=42, message="[CQ:face,id=1]hi &amp; bye"
    )
    assert r1["status"] == "ok" and r1["retcode"] == 0 and r1["echo"] == {"n": 1}
    r2 = await call(ws, "send_group_msg", echo="g", group_id="555", message=[at(42), text(" yo")])
    r3 = await call(
        ws, "send_msg", echo=3, group_id=555, message={"type": "text", "data": {"text": "t"}}
    )
    r4 = await call(
        ws, "send_msg", echo=4, message_type="private", user_id=42, message="[x]", auto_escape=True
    )
    assert [r["echo"] for r in (r2, r3, r4)] == ["g", 3, 4]
    sent = impl.sent()
    assert [m.message_id for m in sent] == [r["data"]["message_id"] for r in (r1, r2, r3, r4)]
    assert sent[0].segments == [{"type": "face", "data": {"id": "1"}}, text("hi & bye")]
    assert sent[3].segments == [text("[x]")]
    assert [m.peer for m in impl.sent("group")] == [555, 555]
    action = await impl.wait_for_action("send_group_msg", lambda a: a.text == " yo")
    assert action.params["group_id"] == "555" and action.response == r2 | {"echo": "g"}


async def test_bad_actions_fail_with_spec_retcodes(impl: OneBotImpl) -> None:
    ws = await open_client(await impl.serve())
    unknown = await call(ws, "set_group_kick", echo="k")
    assert unknown == {"status": "failed", "retcode": 1404, "data": None, "echo": "k"} | {
        "message": unknown["message"],
        "wording": unknown["wording"],
    }
    no_target = await call(ws, "send_private_msg", message="hi")
    assert no_target["retcode"] == 1400 and "user_id" in no_target["message"]
    bad_seg = await call(ws, "send_private_msg", user_id=1, message=[{"data": {}}])
    assert bad_seg["retcode"] == 1400
    bad_image = await call(
        ws,
        "send_private_msg",
        user_id=1,
        message=[{"type": "image", "data": {"file": "base64://%%%"}}],
    )
    assert bad_image["retcode"] == 1400 and "base64" in bad_image["message"]
    assert (await call(ws, "send_private_msg", user_id=1, message=""))["retcode"] == 1400
    cq_image = await call(ws, "send_private_msg", user_id=1, message="[CQ:image,file=base64://%]")
    assert cq_image["retcode"] == 1400
    bad_count = await call(ws, "get_group_msg_history", group_id=1, count="many")
    assert bad_count["retcode"] == 1400 and "count" in bad_count["message"]
    await ws.send("not json")
    assert (await recv_json(ws))["retcode"] == 1400
    assert impl.sent() == []


async def test_get_msg_history_and_file_url(impl: OneBotImpl) -> None:
    ws = await open_client(await impl.serve())
    mids = [await impl.group_message(555, 42, f"m{i}", nickname="Ann") for i in range(3)]
    await impl.group_message(777, 42, "elsewhere")
    pm = await impl.private_message(
        42, [text("here"), file("a.txt", "f-1", url="http://127.0.0.1:1/a.txt")]
    )
    sent = await call(ws, "send_group_msg", group_id=555, message="reply")
    got = await call(ws, "get_msg", message_id=mids[1])
    assert got["data"]["message_id"] == mids[1]
    assert got["data"]["sender"]["user_id"] == 42 and got["data"]["message"] == [text("m1")]
    own = await call(ws, "get_msg", message_id=sent["data"]["message_id"])
    assert own["data"]["sender"]["user_id"] == 10000
    missing = await call(ws, "get_msg", message_id=1)
    assert missing["status"] == "failed"
    history = (await call(ws, "get_group_msg_history", group_id=555))["data"]["messages"]
    assert [m["raw_message"] for m in history] == ["m0", "m1", "m2", "reply"]
    upto = (await call(ws, "get_group_msg_history", group_id=555, message_seq=mids[1], count=1))[
        "data"
    ]
    assert [m["message_id"] for m in upto["messages"]] == [mids[1]]
    friend = (await call(ws, "get_friend_msg_history", user_id=42))["data"]["messages"]
    assert [m["message_id"] for m in friend] == [pm]
    url = await call(ws, "get_private_file_url", file_id="f-1")
    assert url["data"] == {"url": "http://127.0.0.1:1/a.txt"}
    assert (await call(ws, "get_private_file_url", file_id="nope"))["status"] == "failed"
    assert (await call(ws, "get_status"))["data"] == {"online": True, "good": True}


async def test_fail_next_then_normal(impl: OneBotImpl) -> None:
    ws = await open_client(await impl.serve())
    impl.fail_next(1, actions="send_private_msg", retcode=1200, message="risk control")
    assert (await call(ws, "get_status"))["status"] == "ok"  # other actions are untouched
    failed = await call(ws, "send_private_msg", user_id=1, message="a")
    assert (
        failed["status"] == "failed"
        and failed["retcode"] == 1200
        and failed["message"] == "risk control"
    )
    assert (await call(ws, "send_private_msg", user_id=1, message="b"))["status"] == "ok"
    assert [m.segments for m in impl.sent()] == [[text("b")]]


async def test_held_action_does_not_block_others(impl: OneBotImpl) -> None:
    ws = await open_client(await impl.serve())
    impl.hold_next(1, actions=["get_msg"])
    await ws.send(json.dumps({"action": "get_msg", "params": {"message_id": 1}, "echo": "held"}))
    await impl.wait_for_action("get_msg")
    assert (await call(ws, "get_status", echo="quick"))["echo"] == "quick"  # answered while held
    impl.release()
    assert (await recv_json(ws))["echo"] == "held"


async def test_delayed_action_is_answered_after_the_other(impl: OneBotImpl) -> None:
    ws = await open_client(await impl.serve())
    impl.delay_next(1, 0.3, actions=["get_login_info"])
    await ws.send(json.dumps({"action": "get_login_info", "echo": "slow"}))
    await ws.send(json.dumps({"action": "get_status", "echo": "fast"}))
    assert [(await recv_json(ws))["echo"] for _ in range(2)] == ["fast", "slow"]


async def test_wait_for_action_after_ignores_earlier_ones(impl: OneBotImpl) -> None:
    ws = await open_client(await impl.serve())
    await call(ws, "send_private_msg", user_id=1, message="old")
    mark = len(impl.actions)
    waiter = asyncio.create_task(impl.wait_for_action("send_private_msg", after=mark))
    await call(ws, "send_private_msg", user_id=1, message="new")
    assert (await waiter).text == "new"
    with pytest.raises(TimeoutError):
        await impl.wait_for_action("send_group_msg", timeout=0.05)


# ---------------------------------------------------------------- reverse mode


class Bot:
    """A bare reverse-WS server standing in for the bot: records upgrades and frames."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.headers: list[dict[str, str]] = []
        self.frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sockets: list[ServerConnection] = []

    def check(self, connection: ServerConnection, request: Any) -> Any:
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            return connection.respond(401, "no\n")
        self.headers.append(dict(request.headers.raw_items()))
        return None

    async def handler(self, ws: ServerConnection) -> None:
        self.sockets.append(ws)
        async for raw in ws:
            await self.frames.put(json.loads(raw))


async def test_reverse_connects_with_headers_and_reconnects_after_drop() -> None:
    bot = Bot(token=TOKEN)
    async with serve(bot.handler, "127.0.0.1", 0, process_request=bot.check) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        async with OneBotImpl(self_id="10000", access_token=TOKEN) as onebot:
            await onebot.connect(f"ws://127.0.0.1:{port}/onebot/v11/ws")
            headers = bot.headers[0]
            assert headers["X-Self-ID"] == "10000"
            assert headers["X-Client-Role"] == "Universal"
            assert headers["Authorization"] == f"Bearer {TOKEN}"
            assert (await asyncio.wait_for(bot.frames.get(), 10))["sub_type"] == "connect"
            await onebot.drop()
            await onebot.wait_connected(connections=2)
            assert (await asyncio.wait_for(bot.frames.get(), 10))["sub_type"] == "connect"
            await onebot.private_message(7, "after")
            assert (await asyncio.wait_for(bot.frames.get(), 10))["raw_message"] == "after"
            await bot.sockets[-1].send(json.dumps({"action": "get_status", "echo": 9}))
            assert (await asyncio.wait_for(bot.frames.get(), 10))["echo"] == 9


async def test_reverse_refused_token_raises_at_once() -> None:
    bot = Bot(token=TOKEN)
    async with serve(bot.handler, "127.0.0.1", 0, process_request=bot.check) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        async with OneBotImpl(access_token="wrong") as onebot:
            with pytest.raises(HandshakeRejected) as exc:
                await onebot.connect(f"ws://127.0.0.1:{port}/")
            assert exc.value.status == 401
            with pytest.raises(HandshakeRejected):
                await onebot.connect(f"ws://127.0.0.1:{port}/", token=None)
            assert onebot.rejections == [401, 401]


async def test_reverse_retries_until_the_bot_listens() -> None:
    bot = Bot()
    server = await serve(bot.handler, "127.0.0.1", 0)
    port = next(iter(server.sockets)).getsockname()[1]
    server.close()
    await server.wait_closed()
    async with OneBotImpl() as onebot:
        connecting = asyncio.create_task(onebot.connect(f"ws://127.0.0.1:{port}/", deadline=10))
        await onebot.wait_until(lambda: onebot.dial_failures >= 1)  # nothing listened yet
        async with serve(bot.handler, "127.0.0.1", port):
            await connecting
            assert onebot.connected
    async with OneBotImpl() as onebot:
        with pytest.raises(ConnectionError, match="could not reach"):
            await onebot.connect(f"ws://127.0.0.1:{port}/", deadline=0.2)


# ---------------------------------------------------------------- extras the runner relies on


async def test_report_sent_pushes_message_sent_events() -> None:
    async with OneBotImpl(report_sent=True) as onebot:
        ws = await open_client(await onebot.serve(), token=None)
        await ws.send(
            json.dumps(
                {
                    "action": "send_group_msg",
                    "params": {"group_id": 5, "message": [at(42), text(" hi")]},
                }
            )
        )
        frames = [await recv_json(ws), await recv_json(ws)]
        event = next(f for f in frames if f.get("post_type") == "message_sent")
        assert event["user_id"] == 10000 and event["group_id"] == 5
        assert onebot.sent()[0].mentions == ["42"] and onebot.sent()[0].text == " hi"
        await ws.close()


async def test_push_any_event_and_temp_session_sub_type(impl: OneBotImpl) -> None:
    ws = await open_client(await impl.serve())
    notice = {"time": 1, "self_id": 10000, "post_type": "notice", "notice_type": "group_increase"}
    await impl.push(notice)
    assert await recv_json(ws) == notice
    await impl.private_message(42, "tmp", sub_type="group")
    assert (await recv_json(ws))["sub_type"] == "group"
    assert impl.events[-2] == notice


async def test_abrupt_drop_in_forward_mode_and_new_connection(impl: OneBotImpl) -> None:
    url = await impl.serve()
    ws = await open_client(url)
    await impl.drop(abrupt=True)
    with pytest.raises(ConnectionClosedError):
        await asyncio.wait_for(ws.recv(), 10)
    assert not impl.connected
    ws2 = await open_client(url)
    await impl.wait_connected(connections=2)
    await ws2.close()


async def test_push_without_a_connection_times_out() -> None:
    async with OneBotImpl() as onebot:
        await onebot.serve()
        with pytest.raises(TimeoutError, match="bot connection"):
            await onebot.private_message(1, "lost", wait=0.05)


async def test_standalone_script_serves_and_obeys_stdin(tmp_path: Any) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "ania_nb.testing.onebot",
        "--token",
        TOKEN,
        "--print-actions",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin and proc.stdout

    async def line() -> dict[str, Any]:
        return json.loads(await asyncio.wait_for(proc.stdout.readline(), 10))  # type: ignore[union-attr]

    async def command(ident: int, op: str, **args: Any) -> None:
        proc.stdin.write(json.dumps({"id": ident, "op": op, "args": args}).encode() + b"\n")  # type: ignore[union-attr]
        await proc.stdin.drain()  # type: ignore[union-attr]

    try:
        ready = await line()
        assert ready["ready"] is True
        ws = await open_client(ready["url"])
        await command(1, "private_message", user_id=42, message="hi")
        event = await recv_json(ws)
        assert event["raw_message"] == "hi"
        assert await line() == {"id": 1, "result": event["message_id"]}
        await call(ws, "send_private_msg", echo="x", user_id=42, message="yo")
        printed = await line()
        assert (
            printed["action"]["action"] == "send_private_msg" and printed["action"]["echo"] == "x"
        )
        await command(2, "sent")
        sent = await line()
        assert [m["text"] for m in sent["result"]] == ["yo"]
        await command(3, "no_such_op")
        assert "unknown op" in (await line())["error"]
        await command(4, "quit")
        assert await line() == {"id": 4, "result": None}
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        await ws.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_async_and_rate_limited_suffixes(impl: OneBotImpl) -> None:
    ws = await open_client(await impl.serve())
    queued = await call(ws, "send_private_msg_async", user_id=1, message="a")
    assert (queued["status"], queued["retcode"], queued["data"]) == ("async", 1, None)
    limited = await call(ws, "send_msg_rate_limited", user_id=1, message="b")
    assert limited["status"] == "async"
    assert (await call(ws, "nope_async"))["retcode"] == 1404
    assert [m.text for m in impl.sent()] == ["a", "b"]


async def test_big_frames_pass(impl: OneBotImpl) -> None:
    ws = await open_client(await impl.serve())
    big = "base64://" + base64.b64encode(b"\0" * 3 * 2**20).decode()
    answer = await call(
        ws, "send_private_msg", user_id=1, message=[{"type": "image", "data": {"file": big}}]
    )
    assert answer["status"] == "ok"
    assert impl.sent()[0].segments[0]["data"]["file"] == big


async def test_reverse_drop_without_reconnect_stops_redialing() -> None:
    bot = Bot()
    server = await serve(bot.handler, "127.0.0.1", 0)
    port = next(iter(server.sockets)).getsockname()[1]
    url = f"ws://127.0.0.1:{port}/"
    async with OneBotImpl() as onebot:
        await onebot.connect(url, retry_interval=0.01)
        await onebot.drop(reconnect=False)  # while connected
        await onebot.wait_until(lambda: not onebot.redialing)
        assert onebot.connections == 1
        await onebot.connect(url, retry_interval=0.01)  # a fresh connect works again
        server.close()  # the bot goes away: the impl keeps dialing
        await server.wait_closed()
        await onebot.wait_until(lambda: onebot.dial_failures >= 1)
        await onebot.drop(reconnect=False)  # while dialing
        await onebot.wait_until(lambda: not onebot.redialing)
        assert onebot.connections == 2


async def test_aclose_closes_the_reverse_connection_cleanly() -> None:
    bot = Bot()
    async with serve(bot.handler, "127.0.0.1", 0) as server:
        url = f"ws://127.0.0.1:{next(iter(server.sockets)).getsockname()[1]}/"
        onebot = OneBotImpl()
        await onebot.connect(url)
        await onebot.aclose()
        await asyncio.wait_for(bot.sockets[0].wait_closed(), 10)
        assert bot.sockets[0].close_code == 1000
        assert not onebot.redialing


_ident = st.from_regex(r"[a-z][a-z_0-9]{0,7}", fullmatch=True)
_media = st.builds(
    lambda kind, data: {"type": kind, "data": data},
    _ident.filter(lambda k: k != "text"),
    st.dictionaries(_ident, st.text(max_size=12), max_size=3),
)


@given(st.lists(st.one_of(st.builds(text, st.text(max_size=12)), _media), max_size=6))
def test_cq_round_trip_property(segments: list[dict[str, Any]]) -> None:
    merged: list[dict[str, Any]] = []  # the string form cannot tell adjacent texts apart
    for seg in segments:
        if seg["type"] == "text" and merged and merged[-1]["type"] == "text":
            merged[-1] = text(merged[-1]["data"]["text"] + seg["data"]["text"])
        else:
            merged.append(seg)
    expected = [s for s in merged if s["type"] != "text" or s["data"]["text"]]
    assert from_cq(to_cq(segments)) == expected


async def test_string_format_in_get_msg_and_history_and_answered_waits() -> None:
    async with OneBotImpl(message_format="string") as onebot:
        ws = await open_client(await onebot.serve(), token=None)
        mid = await onebot.group_message(5, 6, [text("a,b&"), face(1)])
        await recv_json(ws)
        got = await call(ws, "get_msg", message_id=str(mid))  # numeric strings are accepted
        assert got["data"]["message"] == "a,b&amp;[CQ:face,id=1]"
        assert got["data"]["group_id"] == 5 and got["data"]["user_id"] == 6
        history = await call(ws, "get_group_msg_history", group_id=5, message_seq=0)
        assert [m["message"] for m in history["data"]["messages"]] == ["a,b&amp;[CQ:face,id=1]"]
        assert (await call(ws, "get_msg", message_id="x"))["retcode"] == 1400
        onebot.hold_next()
        await ws.send(json.dumps({"action": "get_status", "echo": 1}))
        seen = await onebot.wait_for_action("get_status")
        assert seen.response is None
        answered = asyncio.create_task(onebot.wait_for_action("get_status", answered=True))
        onebot.release()
        assert (await answered).response == {
            "status": "ok",
            "retcode": 0,
            "data": {"online": True, "good": True},
            "echo": 1,
        }
        await ws.close()
    with pytest.raises(ValueError, match="message_format"):
        OneBotImpl(message_format="xml")  # type: ignore[arg-type]


async def test_standalone_script_reverse_mode_sigterm_and_unreachable() -> None:
    bot = Bot(token=TOKEN)
    async with serve(bot.handler, "127.0.0.1", 0, process_request=bot.check) as server:
        url = f"ws://127.0.0.1:{next(iter(server.sockets)).getsockname()[1]}/onebot/v11/ws"
        proc = await asyncio.create_subprocess_exec(
            *(
                sys.executable,
                "-m",
                "ania_nb.testing.onebot",
                "--connect",
                url,
                "--token",
                TOKEN,
                "--self-id",
                "777",
                "--no-stdin",
            ),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout
        try:
            ready = json.loads(await asyncio.wait_for(proc.stdout.readline(), 10))
            assert ready == {"ready": True, "url": url}
            assert bot.headers[0]["X-Self-ID"] == "777"
            assert (await asyncio.wait_for(bot.frames.get(), 10))["sub_type"] == "connect"
            proc.terminate()
            assert await asyncio.wait_for(proc.wait(), 10) == 0
            await asyncio.wait_for(bot.sockets[0].wait_closed(), 10)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        refused = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "ania_nb.testing.onebot", "--connect", url, "--token", "wrong"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(refused.communicate(), 20)
        assert refused.returncode == 2
        assert "HTTP 401" in json.loads(out)["error"]


# ---------------------------------------------------------------- several bots (replicas)


async def test_forward_broadcasts_every_event_to_every_client_and_names_who_sent() -> None:
    async with OneBotImpl(access_token=TOKEN) as onebot:
        url = await onebot.serve()
        first = await open_client(f"{url}/?client=r1")
        second = await open_client(f"{url}/?client=r2")
        await onebot.wait_until(lambda: onebot.connected_clients == {"r1", "r2"})
        message_id = await onebot.private_message(42, "to all")
        for ws in (first, second):  # NapCat's forward server: every event to every client
            event = await recv_json(ws)
            assert (event["message_id"], event["raw_message"]) == (message_id, "to all")
        await call(second, "send_private_msg", user_id=42, message="from r2")
        await call(first, "send_private_msg", user_id=42, message="from r1")
        sent = {a.text: a.client for a in onebot.actions if a.name == "send_private_msg"}
        assert sent == {"from r1": "r1", "from r2": "r2"}
        assert onebot.actions[0].as_dict()["client"] == "r2"


def stalled_client(port: int) -> socket.socket:
    """A client that upgrades to a WebSocket and then reads nothing, as one under SIGSTOP.

    Blocking (run it in a thread); a small receive buffer, so the server's writes to it block
    after a few MiB instead of tens (autotuning).
    """
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"GET /?client=frozen HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


async def test_buffered_fan_out_lets_a_stalled_client_delay_no_other() -> None:
    big = "x" * 2**18  # 512 KiB events (the text twice): 20 MiB in all
    async with OneBotImpl(buffered=True) as onebot:
        url = await onebot.serve()
        stalled = await asyncio.to_thread(stalled_client, int(url.rsplit(":", 1)[1]))
        try:
            live = await open_client(f"{url}/?client=live", token=None)
            await onebot.wait_until(lambda: onebot.connected_clients == {"frozen", "live"})
            ids = [
                await asyncio.wait_for(onebot.private_message(7, f"{n} {big}"), 5)
                for n in range(40)
            ]
            got = []
            while len(got) < len(ids):
                got.append(json.loads(await asyncio.wait_for(live.recv(), 10))["message_id"])
            assert got == ids  # in order, all of them, while the other client reads nothing
            await live.close()
        finally:
            stalled.close()  # before the impl closes: its writes to it end at once


async def test_reverse_dials_one_entry_per_replica_and_broadcasts() -> None:
    bots = [Bot(), Bot()]
    async with contextlib.AsyncExitStack() as stack:
        ports = []
        for bot in bots:
            server = await stack.enter_async_context(serve(bot.handler, "127.0.0.1", 0))
            ports.append(next(iter(server.sockets)).getsockname()[1])
        onebot = await stack.enter_async_context(OneBotImpl())
        for n, port in enumerate(ports):
            await onebot.connect(f"ws://127.0.0.1:{port}/", client=f"r{n}")
        with pytest.raises(RuntimeError, match="already connected"):
            await onebot.connect(f"ws://127.0.0.1:{ports[0]}/")
        assert onebot.connected_clients == {"r0", "r1"}
        message_id = await onebot.group_message(5, 6, "hello all", at_bot=True)
        for bot in bots:
            assert (await asyncio.wait_for(bot.frames.get(), 10))["sub_type"] == "connect"
            assert (await asyncio.wait_for(bot.frames.get(), 10))["message_id"] == message_id
        send = {"action": "send_group_msg", "params": {"group_id": 5, "message": "ok"}}
        await bots[1].sockets[0].send(json.dumps(send))
        action = await onebot.wait_for_action("send_group_msg", answered=True)
        assert action.client == "r1"
        await onebot.drop()  # both entries dial again
        await onebot.wait_until(lambda: onebot.connections == 4 and onebot.connected_clients)
        assert onebot.redialing
