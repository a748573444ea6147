"""`MemoryAdapter`: an in-process chat platform implementing the runner's `Adapter` port.

A real implementation of the port, not a mock: it keeps every message it saw (received and
sent) per chat, so ``history`` and ``get_message`` answer from them, numbers messages with a
per-chat seq, and records what was sent. Tests feed messages with `receive` (built with
`private` / `group`) and wait for replies with `wait_sent`. ``fail_sends(n)`` makes the next n
sends fail with `AdapterError`, ``disconnect()`` makes every action fail until ``reconnect()``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ania_nb import tool
from ania_nb.runner.model import (
    Adapter,
    AdapterError,
    ChatRef,
    HistoryItem,
    Incoming,
    MessageHandler,
    Outgoing,
)

WAIT = 10.0  # seconds `wait_sent` waits before the test fails


class Refused(AdapterError):
    """The memory platform answered a send with a failure (``fail_sends``)."""

    refused = True


class MemoryAdapter:
    """The `Adapter` port in memory (see the module docstring)."""

    name = "memory"
    id_prefix = "qq"

    def __init__(self, self_id: str = "10000", self_name: str = "bot") -> None:
        self._self_id = self_id
        self.self_name = self_name
        self.sent: list[Outgoing] = []
        self.sent_ids: list[str] = []  # the platform ids of ``sent``, in order
        self.failed: list[Outgoing] = []  # sends that raised AdapterError
        self.file_requests: list[tuple[ChatRef, str]] = []
        self._messages: dict[str, Incoming] = {}
        self._chats: dict[ChatRef, list[HistoryItem]] = {}
        self._ids = itertools.count(1)
        self._seqs: dict[ChatRef, itertools.count[int]] = {}
        self._on_message: MessageHandler | None = None
        self._connected = False
        self._up = asyncio.Event()  # set while connected
        self._fail_sends = 0
        self._changed: asyncio.Condition | None = None

    # ------------------------------------------------------------------ the port

    @property
    def connected(self) -> bool:
        """Whether actions work right now."""
        return self._connected

    @property
    def self_id(self) -> str | None:
        """The bot's user id."""
        return self._self_id

    async def start(self, on_message: MessageHandler) -> None:
        """Connect: messages go to ``on_message`` from now on."""
        self._on_message = on_message
        self._connected = True
        self._up.set()

    async def send(self, message: Outgoing) -> str | None:
        """Record and keep the message; returns its id."""
        if not self._connected or self._fail_sends:
            self.failed.append(message)
            await self._notify()
            self._check()
            self._fail_sends -= 1
            raise Refused(f"send to {message.chat.session} failed (scripted)")
        text = message.text
        if message.mentions:
            text = " ".join(f"@{m}" for m in message.mentions) + " " + text
        markers = "".join("[图片]" for _ in message.images) + "".join(
            f"[文件 {name}]" for name, _ in message.files
        )
        kept = self._keep(
            Incoming(
                message_id="",
                chat=message.chat,
                sender_id=self._self_id,
                sender_name=self.self_name,
                text=text + markers,
                images=tuple(message.images),
                from_self=True,
            )
        )
        self.sent.append(message)
        self.sent_ids.append(kept.message_id)
        await self._notify()
        return kept.message_id

    async def get_message(self, message_id: str) -> Incoming | None:
        """A message it saw, by id."""
        self._check()
        return self._messages.get(message_id)

    async def history(self, chat: ChatRef, count: int, before_seq: int = 0) -> list[HistoryItem]:
        """The chat's last ``count`` messages (before ``before_seq``), oldest first."""
        self._check()
        items = self._chats.get(chat, [])
        if before_seq:
            items = [i for i in items if i.seq < before_seq]
        return items[-count:] if count > 0 else []

    async def file_url(self, chat: ChatRef, file_id: str) -> str:
        """A made-up download URL naming the chat and the file."""
        self._check()
        self.file_requests.append((chat, file_id))
        return f"http://127.0.0.1:9/files/{chat.kind}/{chat.id}/{file_id}"

    async def wait_broken(self) -> str:
        """Never returns: nothing in memory can break for good."""
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def wait_connected(self) -> None:
        """Return once actions work (at once if they do)."""
        await self._up.wait()

    async def aclose(self) -> None:
        """Disconnect."""
        self._connected = False
        self._up.clear()
        self._on_message = None

    # ------------------------------------------------------------------ for tests

    def private(self, user_id: str, text: str, *, nickname: str = "", **kw: object) -> Incoming:
        """A private message from ``user_id`` (not yet received)."""
        return self._new(ChatRef("private", user_id), user_id, text, nickname, kw)

    def group(
        self, group_id: str, user_id: str, text: str, *, nickname: str = "", **kw: object
    ) -> Incoming:
        """A group message (``mentioned=True`` for an @ of the bot; not yet received)."""
        return self._new(ChatRef("group", group_id), user_id, text, nickname, kw)

    async def receive(self, message: Incoming) -> Incoming:
        """The platform delivers ``message``: it is kept, then handed to the router."""
        kept = self._keep(message)
        if self._on_message is None:
            raise RuntimeError("MemoryAdapter.receive before start()")
        await self._on_message(kept)
        return kept

    def sent_to(self, chat: ChatRef) -> list[Outgoing]:
        """What was sent to ``chat``, in order."""
        return [m for m in self.sent if m.chat == chat]

    async def wait_sent(self, predicate: Callable[[Outgoing], bool] | None = None) -> Outgoing:
        """The first sent message matching ``predicate`` (waiting up to `WAIT` seconds)."""
        found: list[Outgoing] = []

        def check() -> bool:
            found[:] = [m for m in self.sent if predicate is None or predicate(m)]
            return bool(found)

        cond = self._condition()
        async with cond:
            await asyncio.wait_for(cond.wait_for(check), WAIT)
        return found[0]

    async def wait_failed(self) -> Outgoing:
        """The first send that failed (waiting up to `WAIT` seconds for one)."""
        cond = self._condition()
        async with cond:
            await asyncio.wait_for(cond.wait_for(lambda: bool(self.failed)), WAIT)
        return self.failed[0]

    def fail_sends(self, n: int) -> None:
        """Make the next ``n`` sends fail."""
        self._fail_sends = n

    def disconnect(self) -> None:
        """Every action fails until `reconnect`."""
        self._connected = False
        self._up.clear()

    def reconnect(self) -> None:
        """Actions work again."""
        self._connected = True
        self._up.set()

    # ------------------------------------------------------------------ internals

    def _new(
        self, chat: ChatRef, user: str, text: str, nickname: str, kw: dict[str, object]
    ) -> Incoming:
        base = Incoming(
            message_id="",
            chat=chat,
            sender_id=user,
            sender_name=nickname or f"user{user}",
            text=text,
        )
        return replace(base, **kw)  # type: ignore[arg-type]

    def _keep(self, message: Incoming) -> Incoming:
        seqs = self._seqs.setdefault(message.chat, itertools.count(1))
        seq = next(seqs)
        kept = replace(message, message_id=message.message_id or str(next(self._ids)))
        if kept.reply_to and not kept.replied_to_bot:
            quoted = self._messages.get(kept.reply_to)
            kept = replace(kept, replied_to_bot=quoted is not None and quoted.from_self)
        self._messages[kept.message_id] = kept
        self._chats.setdefault(kept.chat, []).append(
            HistoryItem(kept.message_id, seq, kept.sender_id, kept.sender_name, kept.text)
        )
        return kept

    def _check(self) -> None:
        if not self._connected:
            raise AdapterError(f"{self.name} is not connected", written=False)

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _notify(self) -> None:
        cond = self._condition()
        async with cond:
            cond.notify_all()


def _conforms(adapter: MemoryAdapter) -> Adapter:
    return adapter  # mypy checks that MemoryAdapter implements the port


def blocker() -> tuple[Any, asyncio.Event, asyncio.Event]:
    """A tool that waits until released, and the events: started, release."""
    started, release = asyncio.Event(), asyncio.Event()

    @tool
    async def wait_here() -> str:
        """Block until released."""
        started.set()
        await release.wait()
        return "released"

    return wait_here, started, release
