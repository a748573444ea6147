"""`OneBotAdapter`: the `Adapter` port over OneBot v11 (NapCat, Lagrange, LLOneBot, go-cqhttp).

Events become `Incoming` messages: group and private (friend) ``message`` events, plus NapCat's
``message_sent`` (marked ``from_self``); everything else is ignored. `Outgoing` messages become
``send_group_msg``/``send_private_msg`` with segment arrays. Events are converted concurrently
(a reply's ``get_msg`` must not hold up other chats) but handed on in arrival order per chat.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ...config import RunnerSettings
from ..model import (
    Adapter,
    AdapterError,
    ChatRef,
    HistoryItem,
    Incoming,
    MessageHandler,
    Outgoing,
    image_url_allowed,
    mentionable,
)
from .models import (
    MessageEvent,
    Segment,
    Sender,
    parse_event,
    parse_message,
    validation_summary,
)
from .transport import ActionFailed, ForwardTransport, ReverseTransport, Transport

log = logging.getLogger("ania_nb.runner.onebot")

_MARKERS = {
    "face": "[表情]",
    "mface": "[表情]",
    "image": "[图片]",
    "record": "[语音]",
    "video": "[视频]",
    "forward": "[合并转发]",
    "json": "[卡片消息]",
    "xml": "[卡片消息]",
    "share": "[链接分享]",
    "location": "[位置]",
    "dice": "[骰子]",
    "rps": "[猜拳]",
    "poke": "[戳一戳]",
}
_SENT_IDS_KEPT = 2048  # ids of our own messages, so a reply to the bot needs no get_msg


def _num(value: str) -> int | str:
    """Ids go out as numbers (the spec's type) when they are numeric."""
    return int(value) if value.isdigit() else value


def _image_file(image: str) -> str:
    """An `Outgoing` image (data: URL, URL, path URL or bare base64) as a OneBot ``file``."""
    if image.startswith("data:"):
        _, _, payload = image.partition(",")
        return "base64://" + payload
    if image.startswith(("http://", "https://", "file://", "base64://")):
        return image
    return "base64://" + image


def _file_parts(seg: Segment) -> tuple[str, str]:
    """(name, file id) of a received file segment (names differ between implementations)."""
    name = seg.get("name") or seg.get("file_name") or seg.get("file")
    file_id = seg.get("file_id") or seg.get("id") or seg.get("file")
    return name, file_id


class OneBotAdapter:
    """The OneBot v11 `Adapter`, forward or reverse WebSocket per ``runner.mode``."""

    name = "onebot"
    id_prefix = "qq"

    def __init__(self, settings: RunnerSettings) -> None:
        self.settings = settings
        token = settings.access_token.get_secret_value() if settings.access_token else None
        self.transport: Transport
        if settings.mode == "forward":
            self.transport = ForwardTransport(
                settings.url,
                token=token,
                action_timeout=settings.action_timeout,
                reconnect_max=settings.reconnect_max,
                compression=settings.ws_compression,
            )
        else:  # raises ConfigError now for a non-loopback host without a token
            self.transport = ReverseTransport(
                settings.host,
                settings.port,
                settings.path,
                token=token,
                action_timeout=settings.action_timeout,
                compression=settings.ws_compression,
            )
        self._self_id: str | None = None
        self._on_message: MessageHandler | None = None
        self._tail: dict[str, asyncio.Task[None]] = {}  # per chat: the last event's task
        self._tasks: set[asyncio.Task[None]] = set()
        self._sent: OrderedDict[str, None] = OrderedDict()

    # ------------------------------------------------------------------ state

    @property
    def connected(self) -> bool:
        """Whether the implementation is connected right now."""
        return self.transport.connected

    @property
    def self_id(self) -> str | None:
        """The bot's QQ id: from events, the X-Self-ID header or ``get_login_info``."""
        return self._self_id or self.transport.self_id_hint

    @property
    def last_error(self) -> str | None:
        """Why the last connection attempt failed or was refused (None once connected)."""
        return self.transport.last_error

    @property
    def url(self) -> str:
        """Reverse mode: the URL to configure in the implementation; forward: the dialed URL."""
        return self.transport.url

    @property
    def listen_url(self) -> str | None:
        """Reverse mode: the URL listened at, with the bound port (None in forward mode)."""
        return self.transport.url if isinstance(self.transport, ReverseTransport) else None

    async def wait_connected(self) -> None:
        """Return once the implementation is connected (wrap in ``asyncio.wait_for``)."""
        await self.transport.wait_connected()

    async def wait_broken(self) -> str:
        """Return (why) only when the connection loop stopped for good by itself (a bug)."""
        return await self.transport.wait_broken()

    # ------------------------------------------------------------------ lifecycle

    async def start(self, on_message: MessageHandler) -> None:
        """Listen (reverse) or dial (forward); `AdapterError` when the port cannot be bound."""
        self._on_message = on_message
        await self.transport.start(self._on_event, self._on_connect)

    async def aclose(self) -> None:
        """Close the connection or listener; event tasks are cancelled, pending actions fail."""
        await self.transport.aclose()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _on_connect(self) -> None:
        self._spawn(self._learn_self_id(), "onebot-login-info")

    async def _learn_self_id(self) -> None:
        try:
            data = await self.transport.call("get_login_info")
        except AdapterError as exc:
            log.warning("get_login_info failed: %s", exc)
            return
        if isinstance(data, dict) and data.get("user_id") is not None:
            self._self_id = str(data["user_id"])
            log.info("logged in as %s (%s)", self._self_id, data.get("nickname", ""))

    # ------------------------------------------------------------------ events

    def _on_event(self, payload: dict[str, Any]) -> None:
        try:
            event = parse_event(payload)
        except ValidationError as exc:
            log.warning("ignored a malformed OneBot event: %s", validation_summary(exc))
            return
        except ValueError as exc:
            log.warning("ignored a malformed OneBot event: %s", exc)
            return
        if event is None:
            return
        if event.self_id:
            self._self_id = str(event.self_id)
        if not isinstance(event, MessageEvent) or self._on_message is None:
            return
        chat = self._chat_of(event)
        if chat is None:
            return
        previous = self._tail.get(chat.session)
        task = self._spawn(self._deliver(event, chat, previous), f"onebot-event-{chat.session}")
        self._tail[chat.session] = task
        task.add_done_callback(functools.partial(self._forget_tail, chat.session))

    def _forget_tail(self, key: str, task: asyncio.Task[None]) -> None:
        if self._tail.get(key) is task:
            del self._tail[key]

    def _chat_of(self, event: MessageEvent) -> ChatRef | None:
        if event.message_type == "group":
            # Anonymous senders cannot be @-ed and share one id; system notices are not chat.
            if event.group_id is None or event.sub_type in ("anonymous", "notice"):
                return None
            return ChatRef("group", str(event.group_id))
        if event.message_type == "private" and event.sub_type in ("", "friend"):
            target = event.user_id
            if event.post_type == "message_sent":  # our own message: the chat is the peer's
                target = event.model_extra.get("target_id", target) if event.model_extra else target
            return ChatRef("private", str(target))
        return None

    async def _deliver(
        self, event: MessageEvent, chat: ChatRef, previous: asyncio.Task[None] | None
    ) -> None:
        try:
            incoming: Incoming | None = await self._incoming(event, chat)
        except Exception:  # an event this adapter cannot read is dropped, the chat goes on
            log.exception("ignored OneBot message %.40s: it cannot be read", event.message_id)
            incoming = None
        if previous is not None:  # keep each chat's order; other chats do not wait
            await asyncio.gather(previous, return_exceptions=True)
        if incoming is None or self._on_message is None:
            return
        try:
            await self._on_message(incoming)
        except Exception:
            log.exception("the message handler failed for %s", incoming.message_id)

    async def _incoming(self, event: MessageEvent, chat: ChatRef) -> Incoming | None:
        if not event.message:
            return None
        text, mentioned, reply_to, images, files = self._read_segments(event.message)
        user = str(event.user_id)
        from_self = event.post_type == "message_sent" or user == self.self_id
        replied_to_bot = False
        if reply_to is not None and not from_self:  # the router ignores our own messages
            replied_to_bot = await self._is_own_message(reply_to)
        return Incoming(
            message_id=str(event.message_id),
            chat=chat,
            sender_id=user,
            sender_name=self._name_of(event.sender, user),
            text=text,
            mentioned=mentioned,
            reply_to=reply_to,
            replied_to_bot=replied_to_bot,
            images=images,
            files=files,
            time=float(event.time),
            from_self=from_self,
        )

    @staticmethod
    def _name_of(sender: Sender, user: str) -> str:
        return sender.card or sender.nickname or user

    def _read_segments(
        self, segments: list[Segment]
    ) -> tuple[str, bool, str | None, tuple[str, ...], tuple[tuple[str, str], ...]]:
        """(text, mentioned, reply_to, images, files) of a message."""
        parts: list[str] = []
        mentioned = False
        reply_to: str | None = None
        images: list[str] = []
        files: list[tuple[str, str]] = []
        me = self.self_id
        for seg in segments:
            if seg.type == "text":
                parts.append(seg.get("text"))
            elif seg.type == "at":
                qq = seg.get("qq")
                if me is not None and qq == me:
                    mentioned = True
                elif qq == "all":
                    parts.append("@全体成员")
                else:
                    parts.append(f"@{seg.get('name') or qq}")
            elif seg.type == "reply":
                reply_to = seg.get("id") or None
            elif seg.type == "image":
                parts.append("[图片]")
                url = seg.get("url") or seg.get("file")
                if image_url_allowed(url):
                    images.append(url)
                elif url.startswith("base64://"):
                    images.append("data:image/png;base64," + url.removeprefix("base64://"))
            elif seg.type == "file":
                name, file_id = _file_parts(seg)
                parts.append(f"[文件 {name} id={file_id}]")
                files.append((name, file_id))
            else:
                parts.append(_MARKERS.get(seg.type, f"[{seg.type}]"))
        text = "".join(parts).strip()  # the space after a removed @bot must not linger
        return text, mentioned, reply_to, tuple(images), tuple(files)

    async def _is_own_message(self, message_id: str) -> bool:
        if message_id in self._sent:
            return True
        try:
            data = await self.transport.call("get_msg", {"message_id": _num(message_id)})
        except AdapterError as exc:
            log.info("cannot tell whose message %s is: %s", message_id, exc)
            return False
        if not isinstance(data, dict):
            return False
        sender = data.get("sender") or {}
        author = sender.get("user_id", data.get("user_id"))
        return author is not None and str(author) == self.self_id

    # ------------------------------------------------------------------ actions

    def _mentions(self, message: Outgoing) -> list[str]:
        """The ids ``message`` may @: real QQ numbers in a group, never ``all`` nor the bot."""
        if message.chat.kind != "group":
            return []
        own = self.self_id
        allowed = [qq for qq in dict.fromkeys(message.mentions) if mentionable(qq) and qq != own]
        dropped = [qq for qq in message.mentions if qq not in allowed]
        if dropped:  # the router never asks for these: whoever did, nobody is @-ed for it
            log.warning("not mentioning %s in %s", ", ".join(map(repr, dropped)), message.chat)
        return allowed

    async def send(self, message: Outgoing) -> str | None:
        """Send text and images as one message, each file as its own; the first message's id.

        Only real user ids are @-mentioned (`_mentions`), whoever built the message.
        """
        mentions = self._mentions(message)
        head: list[Segment] = []
        if message.reply_to:
            head.append(Segment.reply(message.reply_to))
        head.extend(Segment.at(qq) for qq in mentions)
        body: list[Segment] = []
        text = message.text
        if text:
            if mentions and not text[0].isspace():
                text = " " + text  # "@name text", as QQ clients show it
            body.append(Segment.text(text))
        body.extend(Segment.image(_image_file(image)) for image in message.images)
        batches = [head + body] if body else []
        # QQ delivers a file only as a message of its own.
        batches.extend(
            [Segment.file(name, _file_value(name, data))] for name, data in message.files
        )
        if not batches:
            return None
        first: str | None = None
        for number, segments in enumerate(batches):
            try:
                sent = await self._send_segments(message.chat, segments)
            except AdapterError as exc:
                if number and not exc.written:  # part of the message went: resending duplicates
                    raise AdapterError(f"{exc} (after part of the message was sent)") from exc
                raise
            first = first or sent
        return first

    async def _send_segments(self, chat: ChatRef, segments: list[Segment]) -> str | None:
        array = [seg.model_dump() for seg in segments]
        if chat.kind == "group":
            data = await self.transport.call(
                "send_group_msg", {"group_id": _num(chat.id), "message": array}
            )
        else:
            data = await self.transport.call(
                "send_private_msg", {"user_id": _num(chat.id), "message": array}
            )
        if not isinstance(data, dict) or data.get("message_id") is None:
            return None
        message_id = str(data["message_id"])
        self._sent[message_id] = None
        while len(self._sent) > _SENT_IDS_KEPT:
            self._sent.popitem(last=False)
        return message_id

    async def get_message(self, message_id: str) -> Incoming | None:
        """A message by id via ``get_msg``; None when the implementation does not know it."""
        try:
            data = await self.transport.call("get_msg", {"message_id": _num(message_id)})
        except ActionFailed as exc:  # the implementation answered: it does not have it
            log.info("get_msg %s: %s", message_id, exc)
            return None
        if not isinstance(data, dict):
            return None
        data = {**data, "post_type": "message"}
        data.setdefault("message_id", message_id)
        sender = data.get("sender") or {}
        data.setdefault("user_id", sender.get("user_id", 0))
        try:
            event = MessageEvent.model_validate(data)
        except ValidationError as exc:
            why = validation_summary(exc)
            log.warning("get_msg %s answered an unreadable message: %s", message_id, why)
            return None
        chat = self._chat_of(event) or ChatRef("private", str(event.user_id))
        return await self._incoming(event, chat)

    async def history(self, chat: ChatRef, count: int, before_seq: int = 0) -> list[HistoryItem]:
        """The last ``count`` messages before ``before_seq`` (0 = latest), oldest first."""
        params: dict[str, Any] = {"count": count}
        if before_seq:  # absent means "the latest" everywhere; 0 is refused by some
            params["message_seq"] = before_seq
        if chat.kind == "group":
            action = "get_group_msg_history"
            params["group_id"] = _num(chat.id)
        else:
            action = "get_friend_msg_history"
            params["user_id"] = _num(chat.id)
        data = await self.transport.call(action, params)
        raw = data.get("messages") if isinstance(data, dict) else data
        items: list[HistoryItem] = []
        for entry in raw if isinstance(raw, list) else []:
            item = self._history_item(entry)
            if item is not None and (not before_seq or item.seq < before_seq):
                items.append(item)
        items.sort(key=lambda item: (item.time, item.seq))
        return items[-count:] if count > 0 else []

    def _history_item(self, entry: Any) -> HistoryItem | None:
        if not isinstance(entry, dict):
            return None
        try:
            segments = parse_message(entry.get("message"))
            sender = Sender.model_validate(entry.get("sender") or {})
        except (ValidationError, ValueError):
            return None
        user = str(entry.get("user_id") or sender.user_id or "")
        message_id = str(entry.get("message_id", ""))
        seq: Any = entry.get("message_seq", entry.get("real_id", entry.get("message_id", 0)))
        try:
            seq_no = int(seq)
        except (TypeError, ValueError):
            seq_no = 0
        text = self._read_segments(segments)[0] if segments else entry.get("raw_message", "")
        return HistoryItem(
            message_id=message_id,
            seq=seq_no,
            sender_id=user,
            sender_name=self._name_of(sender, user),
            text=text,
            time=float(entry.get("time") or 0),
        )

    async def file_url(self, chat: ChatRef, file_id: str) -> str:
        """A download URL for a file (``get_private_file_url`` / ``get_group_file_url``)."""
        if chat.kind == "group":
            action, params = "get_group_file_url", {"group_id": _num(chat.id), "file_id": file_id}
        else:
            action, params = "get_private_file_url", {"user_id": _num(chat.id), "file_id": file_id}
        data = await self.transport.call(action, params)
        url = data.get("url") if isinstance(data, dict) else None
        if not url:
            raise AdapterError(f"OneBot action {action} answered no url for file {file_id}")
        return str(url)


def _file_value(name: str, data: str) -> str:
    """An `Outgoing` file payload (base64, data: URL or URL) as a OneBot ``file`` value."""
    if data.startswith("data:"):
        return "base64://" + data.partition(",")[2]
    if data.startswith(("http://", "https://", "file://", "base64://")):
        return data
    try:  # a clear error now rather than a broken upload on the phone
        base64.b64decode(data, validate=True)
    except ValueError as exc:
        raise AdapterError(f"file {name!r}: the payload is not base64 ({exc})") from None
    return "base64://" + data


if TYPE_CHECKING:  # mypy proves the class fits the port

    def _fits(settings: RunnerSettings) -> Adapter:
        return OneBotAdapter(settings)
