"""One chat as the router serves it: its state and the callbacks its runs get.

`ChatLink` holds what the router remembers about a chat (messages waiting for their reply, the
batch each run answers, the queued notice of the current busy period, a group's count of
messages not addressed to the bot) and builds the `Callbacks` of the runs that answer it: text,
images and files go to the chat, ``get_msg_history`` and ``get_private_file_url`` ask the
platform, ``load_images`` collects the images of the messages a run answers and of the messages
they reply to, and ``request_approval`` posts the request as a chat message.

**What the model reads of a chat message** (`model_text`)::

    [nickname:<name> id:<id>]: <first line of the text>
    | <second line>
    | <third line>

Only the first line of a message carries a sender line; every further line starts with
`CONTINUATION`, so no text a user controls can begin a line that looks like a real sender
line. ``<name>`` (the group card, else the nickname) is one line of at most `NAME_LIMIT`
characters without control, invisible or bidi characters and without ``[ ] :`` (brackets
become parentheses, colons spaces, look-alikes too), so the ``id:`` and the ``]: `` of the
line are always the real ones; ``<id>`` is the platform's user id (letters, digits, ``_ . @
-`` only). In the text, chat-template control tokens are removed and the markers of the
prompt format (``[nickname:``, ``[message_seq:``, ``<knowledge>``) are defused
(`ania_nb.engine.untrusted`). A queued batch numbers its messages (``1. [nickname:…``);
get_msg_history's answer puts ``[message_seq:<n>]`` on a line of its own before each message.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from .._preview import reveal
from ..engine.callbacks import ApprovalRequest, Callbacks, RunEvent
from ..engine.untrusted import defuse_markers, one_line, untrusted
from .model import Adapter, ChatRef, HistoryItem, Incoming, Outgoing, mentionable

if TYPE_CHECKING:  # pragma: no cover
    from ..agent import Agent
    from ..result import RunResult

log = logging.getLogger("ania_nb.runner")

REPLY_DEPTH = 3  # how far load_images follows a chain of replies
BATCHES_KEPT = 16  # run batches remembered per chat until their reply is sent

RESENT_MARK = "（重启后重新发送 · re-sent after a restart）"  # a card posted again
NAME_LIMIT = 32  # characters of a sender's name the model sees
ID_LIMIT = 32
CONTINUATION = "| "  # starts every line of a message after its first

Send = Callable[[Outgoing], Awaitable["str | None"]]

# A name may not contain the sender line's own brackets and colon, nor look-alikes of them.
_NAME_PUNCTUATION = str.maketrans(
    {
        **dict.fromkeys("[⟦〚【〔〖⁅❲", "("),
        **dict.fromkeys("]⟧〛】〕〗⁆❳", ")"),
        **dict.fromkeys(":∶꞉ː˸։׃⁚", " "),
    }
)
_NOT_ID = re.compile(r"[^0-9A-Za-z_.@-]")
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")  # tabs stay


def sender_name(name: str) -> str:
    """A user's name as the sender line shows it (see the module): one safe, short line."""
    cleaned = one_line(name, NAME_LIMIT * 2).translate(_NAME_PUNCTUATION)
    return one_line(defuse_markers(cleaned), NAME_LIMIT) or "用户"


def sender_prefix(name: str, user_id: str) -> str:
    """The sender line's prefix before a user's text [orig §13.2], names made safe."""
    safe_id = _NOT_ID.sub("", user_id)[:ID_LIMIT] or "?"
    return f"[nickname:{sender_name(name)} id:{safe_id}]: "


def message_body(text: str) -> str:
    """A message's text as the model reads it: neutralised, each further line marked."""
    lines = [_CONTROL_CHARS.sub("", line) for line in untrusted(text).splitlines()]
    if not lines:
        return ""
    return "\n".join([lines[0], *(f"{CONTINUATION}{line}".rstrip() for line in lines[1:])])


def model_text(message: Incoming) -> str:
    """A message as the model sees it: the sender prefix, then the text (see the module)."""
    return sender_prefix(message.sender_name, message.sender_id) + message_body(
        message.text.strip()
    )


def history_text(items: list[HistoryItem]) -> str:
    """``get_msg_history``'s answer: each message with its seq for paging back."""
    return "".join(
        f"[message_seq:{item.seq}]\n"
        f"{sender_prefix(item.sender_name, item.sender_id)}{message_body(item.text)}\n"
        for item in items
    )


def mentions_in(chat: ChatRef, users: Iterable[str], own: str | None) -> tuple[str, ...]:
    """Who a message to ``chat`` may @: ``users`` that are real ids, not the bot, each once.

    Real ids are `mentionable` ones (never ``all``); a private chat mentions nobody.
    """
    if chat.kind != "group":
        return ()
    return tuple(dict.fromkeys(u for u in users if mentionable(u) and u != own))


def approval_text(request: ApprovalRequest, limit: int, timeout: float, prefix: str) -> str:
    """The chat message of an approval request: what runs, who may answer, how."""
    mark = f"{prefix}:"
    askers = [r.removeprefix(mark) for r in request.requesters if r.startswith(mark)]
    if request.requester and request.requester.startswith(mark) and not askers:
        askers = [request.requester.removeprefix(mark)]
    shown = "、".join(reveal(asker) for asker in askers)
    who = "管理员" if request.admin_only or not askers else f"发起人（{shown}）或管理员"
    within = f"在 {timeout:g} 秒内" if not request.resent else "在原定时限内"
    resent = RESENT_MARK if request.resent else ""
    return (
        f"【工具审批】{resent}AI 请求执行工具：{request.tool_label}\n{request.text(limit)}\n"
        f"请{who}{within}回复「允许」或「拒绝」（请求 {request.id}）"
    )


class ChatLink:
    """The router's state of one chat and the callbacks of the runs that answer it."""

    def __init__(self, chat: ChatRef, agent: Agent, adapter: Adapter, send: Send) -> None:
        self.chat = chat
        self.agent = agent
        self.adapter = adapter
        self._send = send
        self.unaddressed = 0  # group messages not for the bot since the last addressed one
        self.noticed: object | None = None  # the session worker whose queued notice was sent
        self.stop_noticed = False  # a stop's notice went out (its dropped messages stay quiet)
        self.waiting: dict[int, Incoming] = {}  # id(callbacks) -> message awaiting its reply
        self.batches: OrderedDict[int, tuple[Incoming, ...]] = OrderedDict()  # run id -> batch
        # Results already sent, by id (a RunResult is not hashable); they go when freed.
        self._answered: weakref.WeakValueDictionary[int, RunResult] = weakref.WeakValueDictionary()

    @property
    def session(self) -> str:
        """The Agent session of this chat."""
        return self.chat.session

    @property
    def idle(self) -> bool:
        """Nothing to remember: the link can be dropped."""
        return not self.waiting and not self.unaddressed

    def mention_of(self, *users: str) -> tuple[str, ...]:
        """``users`` as the @-mentions of a message to this chat (see `mentions_in`)."""
        return mentions_in(self.chat, users, self.adapter.self_id)

    # ------------------------------------------------------------------ callbacks

    def callbacks(self, message: Incoming | None = None) -> Callbacks:
        """The callbacks of a run answering ``message`` (None: a clock or background run)."""
        file_url = self._file_url(message)
        return Callbacks(
            send_text=lambda text: self._send_text(text, message),
            send_image=self._send_image,
            send_file=self._send_file,
            get_msg_history=self._history,
            get_private_file_url=file_url,
            load_images=(lambda: self._load_images(message)) if message is not None else None,
            request_approval=self._request_approval,
            on_event=self._on_event,
        )

    async def _send_text(self, text: str, message: Incoming | None) -> None:
        if text.strip():
            mentions = self.mention_of(message.sender_id) if message is not None else ()
            await self._send(Outgoing(self.chat, text, mentions=mentions))

    # Images and files go straight to the adapter: a failure is the tool's error, so the model
    # does not tell the user something was sent that never arrived.
    async def _send_image(self, image: str) -> None:
        await self.adapter.send(Outgoing(self.chat, images=(image,)))

    async def _send_file(self, name: str, data: str) -> None:
        await self.adapter.send(Outgoing(self.chat, files=((name, data),)))

    async def _history(self, count: int, before_seq: int) -> str:
        items = await self.adapter.history(self.chat, count, before_seq)
        return history_text(items)

    def _file_url(self, message: Incoming | None) -> Callable[[str], Awaitable[str]] | None:
        """Private chats: the chat's files; groups: the files of the message's sender."""
        if self.chat.kind == "private":
            peer = self.chat
        elif message is not None:
            peer = ChatRef("private", message.sender_id)
        else:
            return None  # a group's clock run has no sender to ask about

        async def file_url(file_id: str) -> str:
            return await self.adapter.file_url(peer, file_id)

        return file_url

    async def _load_images(self, message: Incoming | None) -> list[str]:
        """Images of the messages the run answers and of the messages they reply to."""
        batch = self.current_batch() or ((message,) if message is not None else ())
        urls: list[str] = []
        seen: set[str] = set()
        for item in batch:
            await self._collect(item, urls, seen, REPLY_DEPTH)
        return list(dict.fromkeys(urls))

    async def _collect(
        self, message: Incoming, urls: list[str], seen: set[str], depth: int
    ) -> None:
        if message.message_id in seen:
            return
        seen.add(message.message_id)
        urls.extend(message.images)
        if depth <= 0 or not message.reply_to or message.reply_to in seen:
            return
        try:
            quoted = await self.adapter.get_message(message.reply_to)
        except Exception as exc:  # the quoted message is gone or the platform failed
            log.info("could not fetch quoted message %s: %s", message.reply_to, exc)
            return
        if quoted is not None:
            await self._collect(quoted, urls, seen, depth - 1)

    async def _request_approval(self, request: ApprovalRequest) -> None:
        limit = self.agent.config.runner.approval_chars
        text = approval_text(request, limit, self.agent.approvals.timeout, self.adapter.id_prefix)
        # Sent directly: if nobody can see the question, the AdapterError denies it at once
        # instead of leaving it to time out.
        await self.adapter.send(Outgoing(self.chat, text))

    def _on_event(self, event: RunEvent) -> None:
        if event.kind == "run_start" and event.data.get("run_id") is not None:
            batch = self.current_batch()
            if batch:
                self.batches[event.data["run_id"]] = batch
                while len(self.batches) > BATCHES_KEPT:
                    self.batches.popitem(last=False)

    def current_batch(self) -> tuple[Incoming, ...]:
        """The messages of this chat the session's running batch answers (oldest first)."""
        state = self.agent.sessions.get(self.session)
        if state is None:
            return ()
        found = (self.waiting.get(id(p.callbacks)) for p in state.batch)
        return tuple(m for m in found if m is not None)

    def first_answer(self, result: RunResult) -> bool:
        """True the first time a run's result is seen (a batch's messages share one result)."""
        if self._answered.get(id(result)) is result:
            return False
        self._answered[id(result)] = result
        return True

    def batch_of(self, result: RunResult, message: Incoming) -> tuple[Incoming, ...]:
        """The messages ``result`` answers (remembered at its run's start), else ``message``."""
        batch = self.batches.pop(result.run_id, None) if result.run_id is not None else None
        return batch or (message,)
