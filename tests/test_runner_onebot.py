"""The OneBot v11 adapter against the test implementation (ania_nb.testing.onebot), both modes.

Models and CQ strings are checked against the spec's own examples; everything else goes over
real WebSockets on 127.0.0.1 to `OneBotImpl`, in forward and reverse mode.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import pytest
from _waits import until
from hypothesis import given
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

import ania_nb.testing.onebot as ob
from ania_nb.config import RunnerSettings
from ania_nb.errors import ConfigError
from ania_nb.runner import AdapterError, ChatRef, Incoming, Outgoing
from ania_nb.runner.model import MessageHandler
from ania_nb.runner.onebot import (
    ActionFailed,
    OneBotAdapter,
    Segment,
    escape,
    parse_cq,
    parse_event,
    parse_message,
    to_cq,
    unescape,
)
from ania_nb.testing import reply
from ania_nb.testing.onebot import HandshakeRejected, OneBotImpl

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()
BOT = "10000"

# ---------------------------------------------------------------- models and CQ strings


def test_cq_string_of_the_spec_example_parses_to_its_array_form() -> None:
    """message/array.md: the string example and the array example are the same message."""
    message = "&#91;第一部分&#93;[CQ:image,file=123.jpg]图片之后的部分，表情：[CQ:face,id=123]"
    expected = [
        Segment.text("[第一部分]"),
        Segment(type="image", data={"file": "123.jpg"}),
        Segment.text("图片之后的部分，表情："),
        Segment(type="face", data={"id": "123"}),
    ]
    assert parse_cq(message) == expected
    assert to_cq(expected) == message


def test_cq_parameters_unescape_commas_and_keep_equals_signs() -> None:
    """message/string.md: values split at the first '=', with &#44; &amp; &#91; &#93; undone."""
    share = parse_cq(
        "[CQ:share,title=震惊&#44;小伙睡觉前居然...,url=http://baidu.com/?a=1&amp;b=2]"
    )
    assert share == [
        Segment(
            type="share",
            data={"title": "震惊,小伙睡觉前居然...", "url": "http://baidu.com/?a=1&b=2"},
        )
    ]
    assert parse_cq("[CQ:share,title=标题中有=等号,url=http://baidu.com]")[0].data == {
        "title": "标题中有=等号",
        "url": "http://baidu.com",
    }
    assert parse_cq("[CQ:shake]") == [Segment(type="shake")]
    assert (
        to_cq(share)
        == "[CQ:share,title=震惊&#44;小伙睡觉前居然...,url=http://baidu.com/?a=1&amp;b=2]"
    )


def test_text_escaping_follows_the_spec_table() -> None:
    """Text escapes & [ ] (not commas); parameter values also escape commas; one-pass undo."""
    assert escape("- [x] 使用 `&data` 获取地址") == "- &#91;x&#93; 使用 `&amp;data` 获取地址"
    assert escape("a,b") == "a,b"
    assert escape("a,b", comma=True) == "a&#44;b"
    assert unescape("&amp;#91;") == "&#91;"  # an escaped escape stays literal
    assert parse_cq("a,b &#44; [不是CQ码") == [Segment.text("a,b , [不是CQ码")]


_texts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)
_values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
_codes = st.builds(
    lambda kind, data: Segment(type=kind, data=data),
    st.sampled_from(["face", "image", "at", "share", "file"]),
    st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), _values, max_size=3),
)


@given(st.lists(st.tuples(_texts, _codes), max_size=5))
def test_any_message_survives_a_cq_round_trip(pairs: list[tuple[str, Segment]]) -> None:
    """Array → CQ string → array is the identity, whatever characters the text and values hold."""
    segments = [seg for text, code in pairs for seg in (Segment.text(text), code)]
    assert parse_cq(to_cq(segments)) == segments


def test_message_values_in_every_form_the_spec_allows() -> None:
    """api/README.md: a message is a CQ string, a segment array or a single segment."""
    assert parse_message("hi[CQ:face,id=1]") == [
        Segment.text("hi"),
        Segment(type="face", data={"id": "1"}),
    ]
    assert parse_message({"type": "at", "data": {"qq": 1}}) == [Segment.at(1)]  # type: ignore[arg-type]
    assert parse_message([{"type": "shake", "data": None}]) == [Segment(type="shake")]
    assert Segment.at(1).get("qq") == "1"  # type: ignore[arg-type]  # numbers read as strings
    with pytest.raises(ValueError, match="not int"):
        parse_message(5)
    assert parse_event({"post_type": "notice", "notice_type": "group_increase"}) is None
    meta = parse_event({"post_type": "meta_event", "meta_event_type": "heartbeat", "self_id": 1})
    assert meta is not None and meta.post_type == "meta_event"


# ---------------------------------------------------------------- wiring


def _settings(**kw: Any) -> RunnerSettings:
    return RunnerSettings(**kw)


@contextlib.asynccontextmanager
async def linked(
    mode: str, impl: OneBotImpl, on_message: MessageHandler | None = None, **kw: Any
) -> AsyncIterator[tuple[OneBotAdapter, asyncio.Queue[Incoming]]]:
    """An adapter connected to ``impl`` in ``mode``; the queue gets every Incoming (by default)."""
    received: asyncio.Queue[Incoming] = asyncio.Queue()
    if on_message is None:
        on_message = received.put

    if mode == "forward":
        settings = _settings(
            mode="forward", url=await impl.serve(), access_token=impl.access_token, **kw
        )
    else:
        settings = _settings(mode="reverse", port=0, access_token=impl.access_token, **kw)
    adapter = OneBotAdapter(settings)
    try:
        await adapter.start(on_message)
        if mode == "reverse":
            await impl.connect(adapter.url)
        await asyncio.wait_for(adapter.wait_connected(), 10)
        yield adapter, received
    finally:
        await adapter.aclose()
        await impl.aclose()


async def _next(queue: asyncio.Queue[Incoming]) -> Incoming:
    return await asyncio.wait_for(queue.get(), 10)


both_modes = pytest.mark.parametrize("mode", ["forward", "reverse"])


# ---------------------------------------------------------------- messages in and out


@both_modes
async def test_private_message_in_and_reply_out(mode: str) -> None:
    """A friend's message becomes an Incoming; a reply goes out as send_private_msg."""
    impl = OneBotImpl(self_id=BOT)
    async with linked(mode, impl) as (adapter, received):
        mid = await impl.private_message(20001, "你好 [x] & y", nickname="小明")
        got = await _next(received)
        assert got == Incoming(
            message_id=str(mid),
            chat=ChatRef("private", "20001"),
            sender_id="20001",
            sender_name="小明",
            text="你好 [x] & y",
            time=got.time,
        )
        assert adapter.self_id == BOT and adapter.connected
        sent_id = await adapter.send(Outgoing(ChatRef("private", "20001"), text="pong [ok]"))
        action = await impl.wait_for_action("send_private_msg")
        assert action.params["user_id"] == 20001
        assert action.params["message"] == [{"type": "text", "data": {"text": "pong [ok]"}}]
        [stored] = impl.sent("private", 20001)
        assert sent_id == str(stored.message_id)


@both_modes
@pytest.mark.parametrize("fmt", ["array", "string"])
async def test_group_message_segments_become_text_flags_images_and_files(
    mode: str, fmt: str
) -> None:
    """@bot is removed and sets mentioned; others' @ stay; reply, image, file, face are mapped."""
    impl = OneBotImpl(self_id=BOT, message_format=fmt)  # type: ignore[arg-type]
    async with linked(mode, impl) as (_, received):
        first = await impl.group_message(500, 30001, [ob.at("all"), ob.text(" 先说一句")])
        everyone = await _next(received)  # @全体成员 is text, not a mention of the bot
        assert everyone.mentioned is False and everyone.text == "@全体成员 先说一句"
        mid = await impl.group_message(
            500,
            30002,
            [
                ob.text("看图, [1] & 文件"),
                ob.image("https://img.example/a.png"),
                ob.face(178),
                ob.at(30001),
                ob.file("报告.pdf", "fid-1", url="https://files.example/1"),
            ],
            at_bot=True,
            reply_to=first,
            nickname="乙",
            card="乙的群名片",
        )
        got = await _next(received)
        assert got.message_id == str(mid) and got.chat == ChatRef("group", "500")
        assert got.sender_id == "30002" and got.sender_name == "乙的群名片"
        assert got.mentioned is True
        assert got.text == "看图, [1] & 文件[图片][表情]@30001[文件 报告.pdf id=fid-1]"
        assert got.reply_to == str(first) and got.replied_to_bot is False  # 甲 wrote it
        assert got.images == ("https://img.example/a.png",)
        assert got.files == (("报告.pdf", "fid-1"),)
        assert await impl.wait_for_action("get_msg")  # asked whose message it was


@both_modes
async def test_a_reply_to_the_bot_is_recognised_even_after_a_restart(mode: str) -> None:
    """replied_to_bot: from the ids the adapter sent, and via get_msg for older messages."""
    impl = OneBotImpl(self_id=BOT)
    async with linked(mode, impl) as (adapter, received):
        own = await adapter.send(Outgoing(ChatRef("group", "600"), text="我是机器人"))
        assert own is not None
        await impl.group_message(600, 30001, "回你", reply_to=own)
        got = await _next(received)
        assert got.replied_to_bot is True and got.mentioned is False
        assert not [a for a in impl.actions if a.name == "get_msg"]  # known without asking
    # A new adapter (a restarted runner) has to ask the implementation.
    impl2 = OneBotImpl(self_id=BOT)
    impl2.messages = impl.messages
    impl2._next_id = impl._next_id  # continue the message ids of the same "account"
    async with linked(mode, impl2) as (adapter, received):
        await impl2.group_message(600, 30001, "再回你", reply_to=own)
        got = await _next(received)
        assert got.replied_to_bot is True
        assert (await impl2.wait_for_action("get_msg")).params["message_id"] == int(own)


@both_modes
async def test_outgoing_becomes_reply_at_text_image_segments_and_a_file_message(mode: str) -> None:
    """Reply first, then @s, then text, images; each file is a message of its own."""
    impl = OneBotImpl(self_id=BOT)
    async with linked(mode, impl) as (adapter, _):
        quoted = await impl.group_message(700, 30001, "问题")
        msg_id = await adapter.send(
            Outgoing(
                ChatRef("group", "700"),
                text="答案",
                mentions=("30001", "30002"),
                images=(PNG, f"data:image/png;base64,{PNG}", "https://img.example/b.png"),
                files=(
                    ("a.txt", base64.b64encode(b"hello").decode()),
                    ("b.txt", "data:text/plain;base64,aGk="),
                ),
                reply_to=str(quoted),
            )
        )
        first = await impl.wait_for_action("send_group_msg", answered=True)
        assert first.params["group_id"] == 700
        assert first.params["message"] == [
            {"type": "reply", "data": {"id": str(quoted)}},
            {"type": "at", "data": {"qq": "30001"}},
            {"type": "at", "data": {"qq": "30002"}},
            {"type": "text", "data": {"text": " 答案"}},
            {"type": "image", "data": {"file": f"base64://{PNG}"}},
            {"type": "image", "data": {"file": f"base64://{PNG}"}},
            {"type": "image", "data": {"file": "https://img.example/b.png"}},
        ]
        assert msg_id == str(first.response["data"]["message_id"])  # type: ignore[index]
        second = await impl.wait_for_action("send_group_msg", after=impl.actions.index(first) + 1)
        assert second.params["message"] == [
            {"type": "file", "data": {"file": "base64://aGVsbG8=", "name": "a.txt"}}
        ]
        third = await impl.wait_for_action("send_group_msg", after=impl.actions.index(second) + 1)
        assert third.params["message"] == [  # a data: URL loses its header
            {"type": "file", "data": {"file": "base64://aGk=", "name": "b.txt"}}
        ]
        assert await adapter.send(Outgoing(ChatRef("group", "700"))) is None  # nothing to send
        with pytest.raises(AdapterError, match=r"'b\.txt'.*not base64"):
            await adapter.send(Outgoing(ChatRef("group", "700"), files=(("b.txt", "%%%"),)))


async def test_history_get_message_and_file_url() -> None:
    """History (oldest first, count, before_seq), get_msg → Incoming, private file URLs."""
    impl = OneBotImpl(self_id=BOT)
    async with linked("reverse", impl) as (adapter, received):
        ids = [
            await impl.group_message(800, 30000 + i, f"第{i}条", nickname=f"u{i}") for i in range(4)
        ]
        pic = await impl.group_message(
            800, 30009, [ob.text("图"), ob.image("https://img.example/c.png")]
        )
        for _ in range(5):
            await _next(received)
        items = await adapter.history(ChatRef("group", "800"), 3)
        assert [i.text for i in items] == ["第2条", "第3条", "图[图片]"]
        assert items[0].sender_id == "30002" and items[0].sender_name == "u2"
        older = await adapter.history(ChatRef("group", "800"), 10, before_seq=ids[2])
        assert [i.message_id for i in older] == [str(ids[0]), str(ids[1])]
        asked = [a.params for a in impl.actions if a.name == "get_group_msg_history"]
        assert asked == [
            {"count": 3, "group_id": 800},  # no message_seq: "the latest"
            {"count": 10, "group_id": 800, "message_seq": ids[2]},
        ]

        fetched = await adapter.get_message(str(pic))
        assert fetched is not None and fetched.images == ("https://img.example/c.png",)
        assert fetched.chat == ChatRef("group", "800") and fetched.sender_id == "30009"
        assert await adapter.get_message("999999") is None  # the implementation says "unknown"

        await impl.private_message(
            20001, [ob.file("x.zip", "fid-9", url="https://files.example/9")]
        )
        got = await _next(received)
        assert got.files == (("x.zip", "fid-9"),)
        assert await adapter.file_url(got.chat, "fid-9") == "https://files.example/9"
        with pytest.raises(ActionFailed, match=r"get_private_file_url.*retcode 1400"):
            await adapter.file_url(got.chat, "nope")
        private = await adapter.history(ChatRef("private", "20001"), 5)
        assert [i.text for i in private] == ["[文件 x.zip id=fid-9]"]
        assert (await impl.wait_for_action("get_friend_msg_history")).params["user_id"] == 20001


# ---------------------------------------------------------------- events the adapter skips


async def test_other_events_are_ignored_and_a_bad_one_does_not_break_the_link() -> None:
    """Notices, heartbeats, anonymous/temp messages and malformed events: skipped, link stays."""
    impl = OneBotImpl(self_id=BOT)
    async with linked("forward", impl) as (adapter, received):
        await impl.heartbeat()
        base = {"time": 1, "self_id": int(BOT), "post_type": "message", "font": 0}
        await impl.push({"post_type": "notice", "notice_type": "group_increase", "self_id": 1})
        await impl.push({**base, "message_type": "group"})  # no ids, no message
        await impl.push(
            {
                **base,
                "message_type": "private",
                "sub_type": "group",
                "message_id": 1,
                "user_id": 2,
                "message": "临时会话",
            }
        )
        await impl.push(
            {
                **base,
                "message_type": "group",
                "sub_type": "anonymous",
                "message_id": 3,
                "user_id": 80000000,
                "group_id": 5,
                "message": "匿名",
            }
        )
        await impl.push(
            {
                **base,
                "post_type": "message_sent",
                "message_type": "private",
                "sub_type": "friend",
                "message_id": 4,
                "user_id": int(BOT),
                "target_id": 20001,
                "message": "我自己发的",
                "sender": None,
            }
        )
        await impl.private_message(20001, "正常消息")
        mine = await _next(received)
        assert (
            mine.from_self
            and mine.chat == ChatRef("private", "20001")
            and mine.text == "我自己发的"
        )
        assert (await _next(received)).text == "正常消息"
        assert received.empty() and adapter.connected


async def test_each_chat_keeps_its_order_while_other_chats_go_ahead() -> None:
    """A reply whose get_msg stalls holds back its own chat only."""
    impl = OneBotImpl(self_id=BOT)
    async with linked("reverse", impl) as (_, received):
        first = await impl.group_message(900, 30001, "原话")
        await _next(received)
        impl.hold_next(actions=["get_msg"])
        a1 = await impl.group_message(900, 30002, "回复", reply_to=first)
        a2 = await impl.group_message(900, 30003, "紧随其后")
        b1 = await impl.private_message(20001, "别的聊天")
        assert (await _next(received)).message_id == str(b1)
        assert received.empty()  # a2 waits behind a1 although it needs no get_msg
        impl.release()
        assert [(await _next(received)).message_id for _ in range(2)] == [str(a1), str(a2)]


# ---------------------------------------------------------------- actions: failure and timeout


@both_modes
async def test_failed_and_timed_out_actions_raise_adapter_errors(mode: str) -> None:
    """status failed → ActionFailed naming action, retcode and message; no answer → timeout."""
    impl = OneBotImpl(self_id=BOT)
    async with linked(mode, impl, action_timeout=0.5) as (adapter, _):
        chat = ChatRef("private", "20001")
        impl.fail_next(actions=["send_private_msg"], retcode=100, message="风控了")
        with pytest.raises(
            ActionFailed, match="send_private_msg failed: status failed, retcode 100: 风控了"
        ) as err:
            await adapter.send(Outgoing(chat, text="x"))
        assert err.value.retcode == 100 and err.value.action == "send_private_msg"
        with pytest.raises(ActionFailed, match="retcode 1404"):
            await adapter.transport.call("no_such_action")
        impl.hold_next(actions=["send_private_msg"])
        with pytest.raises(
            AdapterError, match=r"send_private_msg timed out .*runner.action_timeout"
        ):
            await adapter.send(Outgoing(chat, text="y"))
        impl.release()
        assert await adapter.send(Outgoing(chat, text="z"))  # the link is still fine


@both_modes
async def test_a_pending_action_fails_when_the_socket_drops(mode: str) -> None:
    """A call waiting for its answer fails at once with AdapterError when the link goes."""
    impl = OneBotImpl(self_id=BOT)
    async with linked(mode, impl) as (adapter, _):
        impl.hold_next(actions=["send_group_msg"])
        sending = asyncio.create_task(adapter.send(Outgoing(ChatRef("group", "1"), text="x")))
        await impl.wait_for_action("send_group_msg")
        await impl.drop()
        with pytest.raises(
            AdapterError, match="send_group_msg failed: the OneBot connection closed"
        ) as failed:
            await asyncio.wait_for(sending, 10)
        assert failed.value.written  # it reached the implementation: never to be sent again
        impl.release()
        await impl.wait_connected(connections=2)
        await asyncio.wait_for(adapter.wait_connected(), 10)
        assert [a.name for a in impl.actions].count("send_group_msg") == 1


async def test_a_send_with_no_connection_was_provably_not_written() -> None:
    """Not connected until the action timeout: ``written`` is False, so resending is safe."""
    impl = OneBotImpl(self_id=BOT)
    async with linked("reverse", impl, action_timeout=0.2) as (adapter, _):
        await impl.drop(reconnect=False)
        await until(lambda: not adapter.transport.connected, "the adapter to see the drop")
        with pytest.raises(AdapterError, match="not connected") as failed:
            await adapter.send(Outgoing(ChatRef("private", "2"), text="later"))
        assert not failed.value.written


async def test_a_reconnect_storm_leaves_no_unretrieved_future_exception() -> None:
    """Sends racing abrupt drops: every failed answer future is retrieved (no loop warning)."""
    loop = asyncio.get_running_loop()
    problems: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: problems.append(context["message"]))
    impl = OneBotImpl(self_id=BOT)
    try:
        async with linked("reverse", impl) as (adapter, _):

            async def send(n: int) -> None:
                with contextlib.suppress(AdapterError):
                    await adapter.send(Outgoing(ChatRef("private", str(n % 7 + 1)), text=f"{n}"))

            for round_ in range(20):
                sends = [asyncio.ensure_future(send(round_ * 20 + n)) for n in range(20)]
                await asyncio.sleep(0)
                drop = asyncio.ensure_future(impl.drop(abrupt=round_ % 2 == 1))
                while not drop.done():  # sends meet the closing handshake, and a dead socket
                    sends.append(asyncio.ensure_future(send(round_)))
                    await asyncio.sleep(0.001)
                await drop
                await asyncio.gather(*sends)
                await asyncio.wait_for(adapter.wait_connected(), 10)
            del sends
            gc.collect()
            await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert [p for p in problems if "never retrieved" in p] == []


# ---------------------------------------------------------------- reconnects


@both_modes
async def test_messages_flow_again_after_the_implementation_drops(mode: str) -> None:
    """Forward: the adapter redials (backoff); reverse: the implementation dials back."""
    impl = OneBotImpl(self_id=BOT)
    async with linked(mode, impl) as (adapter, received):
        await impl.drop(abrupt=True)
        await impl.wait_connected(connections=2)
        await asyncio.wait_for(adapter.wait_connected(), 10)
        mid = await impl.private_message(20001, "重连之后")
        assert (await _next(received)).message_id == str(mid)
        assert await adapter.send(Outgoing(ChatRef("private", "20001"), text="收到"))


async def test_a_send_during_a_reconnect_waits_for_the_link() -> None:
    """An action made while (or just as) the link is down goes out once it is back."""
    impl = OneBotImpl(self_id=BOT)
    async with linked("reverse", impl) as (adapter, _):
        url = adapter.url
        await impl.drop(reconnect=False)
        # No wait for the adapter to notice: the frame meets a closing socket or no link at all.
        sending = asyncio.create_task(adapter.send(Outgoing(ChatRef("private", "2"), text="稍等")))
        await until(lambda: not adapter.transport.connected, "the adapter to see the drop")
        assert not sending.done()  # the link is gone: the frame waits for the next one
        await impl.connect(url)
        assert await asyncio.wait_for(sending, 10)
        assert impl.sent("private", 2)[0].segments == [ob.text("稍等")]
        assert [a.name for a in impl.actions].count("send_private_msg") == 1


async def test_closing_the_adapter_fails_waiting_calls_at_once() -> None:
    """aclose: a call waiting for a link fails as closed instead of running out its timeout."""
    impl = OneBotImpl(self_id=BOT)
    async with linked("reverse", impl) as (adapter, _):
        await impl.drop(reconnect=False)
        await until(lambda: not adapter.transport.connected, "the adapter to see the drop")
        waiting = asyncio.create_task(adapter.transport.call("get_status"))
        await asyncio.sleep(0)  # its first step: no link, so it waits for one
        assert not waiting.done()
        await adapter.aclose()
        with pytest.raises(AdapterError, match="get_status failed: the adapter is closed"):
            await asyncio.wait_for(waiting, 5)


async def test_a_newer_reverse_connection_replaces_the_older() -> None:
    """One connection at a time: the second implementation takes over, the first is closed."""
    old, new = OneBotImpl(self_id=BOT), OneBotImpl(self_id=BOT)
    async with linked("reverse", old) as (adapter, received):
        await new.connect(adapter.url)
        try:
            await old.drop(reconnect=False)  # stop it redialing after being replaced
            await new.private_message(20001, "新连接")
            assert (await _next(received)).text == "新连接"
            await adapter.send(Outgoing(ChatRef("private", "20001"), text="ok"))
            assert await new.wait_for_action("send_private_msg")
            assert not [a for a in old.actions if a.name == "send_private_msg"]
        finally:
            await new.aclose()


# ---------------------------------------------------------------- authentication


async def test_reverse_mode_refuses_missing_and_wrong_tokens() -> None:
    """With runner.access_token set: no token → 401, wrong → 403, right (header or query) → in."""
    settings = _settings(mode="reverse", port=0, access_token="s3cret")
    adapter = OneBotAdapter(settings)
    await adapter.start(lambda message: asyncio.sleep(0))
    try:
        with pytest.raises(HandshakeRejected) as missing:
            await OneBotImpl(self_id=BOT).connect(adapter.url, token=None)
        with pytest.raises(HandshakeRejected) as wrong:
            await OneBotImpl(self_id=BOT).connect(adapter.url, token="guess")
        assert (missing.value.status, wrong.value.status) == (401, 403)
        assert not adapter.connected and "access token" in (adapter.last_error or "")
        with pytest.raises(InvalidStatus, match="404"):
            await connect(adapter.url.replace("/onebot/v11/ws", "/other"), proxy=None)
        async with connect(adapter.url + "?access_token=s3cret", proxy=None):
            await asyncio.wait_for(adapter.wait_connected(), 10)
        impl = OneBotImpl(self_id=BOT, access_token="s3cret")
        assert adapter.listen_url == adapter.url and adapter.url.endswith("/onebot/v11/ws")
        await impl.connect(adapter.url)
        await impl.aclose()
    finally:
        await adapter.aclose()


async def test_reverse_mode_takes_only_universal_clients_whatever_the_case() -> None:
    adapter = OneBotAdapter(_settings(mode="reverse", port=0))
    await adapter.start(lambda message: asyncio.sleep(0))
    impl = OneBotImpl(self_id=BOT)
    try:
        with pytest.raises(HandshakeRejected) as api_only:
            await OneBotImpl(self_id=BOT).connect(adapter.url, role="API")
        assert api_only.value.status == 400 and "Universal" in (adapter.last_error or "")
        await impl.connect(adapter.url, role="universal")  # header values: case-insensitive
        await asyncio.wait_for(adapter.wait_connected(), 10)
    finally:
        await impl.aclose()
        await adapter.aclose()


@pytest.mark.parametrize("url", ["127.0.0.1:3001", "http://127.0.0.1:3001", "ws://127.0.0.1:99999"])
def test_forward_mode_refuses_a_url_that_is_not_a_websocket_address(url: str) -> None:
    """A bad runner.url is a ConfigError naming the key, not an endless reconnect loop."""
    with pytest.raises(ConfigError, match=r"runner\.url must be .* ws://") as err:
        OneBotAdapter(_settings(mode="forward", url=url))
    assert err.value.key == "runner.url"


def test_reverse_mode_will_not_listen_beyond_loopback_without_a_token() -> None:
    """Fail closed: a public listener needs a token; loopback or a token is fine."""
    with pytest.raises(ConfigError, match=r"without runner\.access_token") as err:
        OneBotAdapter(_settings(mode="reverse", host="0.0.0.0"))
    assert err.value.key == "runner.access_token"
    OneBotAdapter(_settings(mode="reverse", host="0.0.0.0", access_token="t"))
    OneBotAdapter(_settings(mode="reverse", host="::1"))


async def test_forward_mode_sends_the_token_and_reports_a_refusal() -> None:
    """Forward: token as Bearer header and query; a wrong one leaves a clear last_error."""
    impl = OneBotImpl(self_id=BOT, access_token="s3cret")
    url = await impl.serve()
    wrong = OneBotAdapter(
        _settings(mode="forward", url=url, access_token="guess", action_timeout=0.3)
    )
    try:
        await wrong.start(lambda message: asyncio.sleep(0))  # returns after the first attempt
        assert not wrong.connected
        assert impl.rejections == [403]
        assert "HTTP 403" in (wrong.last_error or "") and "runner.access_token" in (
            wrong.last_error or ""
        )
        with pytest.raises(AdapterError, match=r"not connected.*HTTP 403"):
            await wrong.transport.call("get_status")
    finally:
        await wrong.aclose()
    right = OneBotAdapter(_settings(mode="forward", url=url, access_token="s3cret"))
    try:
        await right.start(lambda message: asyncio.sleep(0))
        await asyncio.wait_for(right.wait_connected(), 10)
        assert right.listen_url is None
        [headers] = impl.request_headers
        assert headers["Authorization"] == "Bearer s3cret"
        assert await right.transport.call("get_status") == {"online": True, "good": True}
    finally:
        await right.aclose()
        await impl.aclose()


async def test_a_connect_error_naming_the_dialed_url_hides_the_quoted_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The token travels URL-quoted in the dialed URL; an error that repeats that URL (here a
    302 to a fragment, which websockets refuses naming the full URL) must not show it."""
    token = "ob-Tok/en+42=&x%y"  # quoting changes every one of these characters

    async def redirect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 302 Found\r\nLocation: #moved\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(redirect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    adapter = OneBotAdapter(
        _settings(mode="forward", url=f"ws://127.0.0.1:{port}/", access_token=token)
    )
    caplog.set_level(logging.INFO, logger="ania_nb.runner")
    try:
        await adapter.start(lambda message: asyncio.sleep(0))  # returns after the first attempt
        error = adapter.last_error or ""
    finally:
        await adapter.aclose()
        server.close()
        await server.wait_closed()
    assert error.startswith(f"cannot connect to ws://127.0.0.1:{port}/: ws://127.0.0.1:{port}/")
    assert "access_token=***#moved isn't a valid URI" in error  # the URL, token blanked
    shown = error + "\n" + caplog.text
    assert token not in shown and quote(token, safe="") not in shown


# ---------------------------------------------------------------- with the real Router


@both_modes
async def test_the_router_answers_a_group_through_the_adapter(
    mode: str, make_agent: Any, llm: Any
) -> None:
    """Impl → adapter → Router → Agent → adapter → impl: @-ed and replied-to messages answered."""
    from ania_nb.runner.router import Router

    agent = make_agent()
    await agent.start()
    impl = OneBotImpl(self_id=BOT)
    routers: list[Router] = []

    async def to_router(message: Incoming) -> None:
        await routers[0].handle(message)

    llm.script(reply("你好，阿明"), reply("不客气"))
    async with linked(mode, impl, to_router) as (adapter, _):
        router = Router(agent, adapter)
        routers.append(router)
        try:
            await impl.group_message(501, 30001, "大家好")  # not for the bot: counted only
            await impl.group_message(501, 30001, "你好", at_bot=True, nickname="阿明")
            first = await impl.wait_for_action("send_group_msg", answered=True)
            assert first.segments == [ob.at(30001), ob.text(" 你好，阿明")]
            bot_msg = first.response["data"]["message_id"]  # type: ignore[index]
            await impl.group_message(501, 30002, "谢谢", reply_to=bot_msg, nickname="阿红")
            second = await impl.wait_for_action(
                "send_group_msg", after=impl.actions.index(first) + 1, answered=True
            )
            assert second.segments == [ob.at(30002), ob.text(" 不客气")]
            assert "[nickname:阿明 id:30001]: 你好" in str(llm.requests[0].messages[-1])
            assert len(llm.requests) == 2  # "大家好" never reached the model
        finally:
            await router.close(0)


# ---------------------------------------------------------------- compression


@pytest.mark.parametrize("compression", [False, True])
async def test_permessage_deflate_is_negotiated_only_when_configured(compression: bool) -> None:
    """Frames are small JSON: by default neither mode offers nor accepts permessage-deflate."""
    from websockets.asyncio.server import serve

    reverse = OneBotAdapter(_settings(mode="reverse", port=0, ws_compression=compression))
    await reverse.start(lambda message: asyncio.sleep(0))
    try:
        async with connect(reverse.url, proxy=None) as ws:  # offers permessage-deflate
            assert ws.response is not None
            accepted = ws.response.headers.get("Sec-WebSocket-Extensions") or ""
            assert ("permessage-deflate" in accepted) is compression
    finally:
        await reverse.aclose()

    offered: list[str] = []

    async def handler(ws: Any) -> None:
        offered.append(ws.request.headers.get("Sec-WebSocket-Extensions") or "")
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        forward = OneBotAdapter(
            _settings(mode="forward", url=f"ws://127.0.0.1:{port}", ws_compression=compression)
        )
        await forward.start(lambda message: asyncio.sleep(0))
        try:
            await until(lambda: offered, "the adapter's handshake")
        finally:
            await forward.aclose()
    assert ("permessage-deflate" in offered[0]) is compression
