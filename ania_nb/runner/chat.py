"""One chat as the router serves it: its state and the callbacks its runs get.

`ChatLink` holds what the router remembers about a chat (the queued and overflow notices of the
current busy period, the shutdown notice, a group's count of messages not addressed to the bot)
and builds the `Callbacks` of the runs that answer it: text, images and files go to the chat
through the durable outbox, ``get_msg_history`` and ``get_private_file_url`` ask the platform,
``load_images`` collects the images of the messages a run answers (kept with their inbox rows,
so a run after a restart has them too) and of the messages they reply to, and
``request_approval`` posts the request as a chat message.

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
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from .._preview import reveal
from ..catalogue import Language, language_for, say
from ..engine.callbacks import ApprovalRequest, Callbacks
from ..engine.untrusted import defuse_markers, one_line, untrusted
from ..text import cut
from .model import Adapter, AdapterError, ChatRef, HistoryItem, Incoming, mentionable

if TYPE_CHECKING:  # pragma: no cover
    from ..agent import Agent
    from ..orchestration.delivery import Posted

log = logging.getLogger("ania_nb.runner")

REPLY_DEPTH = 3  # how far load_images follows a chain of replies

NAME_LIMIT = 32  # characters of a sender's name the model sees
ID_LIMIT = 32
CONTINUATION = "| "  # starts every line of a message after its first


class Post(Protocol):
    """The router's `_post`: store a message for a chat in the outbox; the row's state."""

    def __call__(
        self,
        chat: ChatRef,
        kind: str,
        text: str = "",
        mentions: tuple[str, ...] = (),
        *,
        images: tuple[str, ...] = (),
        files: tuple[tuple[str, str], ...] = (),
        answers: tuple[int, ...] = (),
        wait: bool = False,
        model: bool = False,
    ) -> Awaitable[Posted]:
        """Post; with ``wait``, the row's final state."""
        ...


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


def approval_body(request: ApprovalRequest, language: Language, limit: int | None = None) -> str:
    """What a chat shows of a request (`ApprovalRequest.text`), cut at ``limit`` characters.

    The headline is the tool's own summary and stays as the tool wrote it (it may carry a
    warning such as "REPLACES the installed skill"); the argument lines around it are worded in
    ``language`` by the gate, and so is the note of a cut.
    """
    full = request.text()
    if limit is None:
        return full

    def more(rest: int) -> str:
        return say("approval.more", language, count=rest, id=request.id)

    return cut(full, limit, marker=more)


def approval_text(
    request: ApprovalRequest, limit: int, timeout: float, prefix: str, language: Language = "zh"
) -> str:
    """The chat message of an approval request: what runs, who may answer, how."""
    mark = f"{prefix}:"
    askers = [r.removeprefix(mark) for r in request.requesters if r.startswith(mark)]
    if request.requester and request.requester.startswith(mark) and not askers:
        askers = [request.requester.removeprefix(mark)]
    shown = say("approval.names_join", language).join(reveal(asker) for asker in askers)
    if request.admin_only or not askers:
        who = say("approval.who_admin", language)
    else:
        who = say("approval.who_requester", language, names=shown)
    if request.resent:
        within = say("approval.within_resent", language)
    else:
        within = say("approval.within", language, seconds=f"{timeout:g}")
    return say(
        "approval.card",
        language,
        resent=say("approval.resent", language) if request.resent else "",
        tool=request.tool_label,
        body=approval_body(request, language, limit),
        who=who,
        within=within,
        id=request.id,
    )


def incoming_meta(message: Incoming) -> dict[str, Any]:
    """What the inbox keeps of a message for its run: enough to rebuild it after a restart."""
    return {
        "message_id": message.message_id,
        "sender_id": message.sender_id,
        "sender_name": message.sender_name,
        "text": message.text,
        "reply_to": message.reply_to,
        "images": list(message.images),
        "files": [list(f) for f in message.files],
        "time": message.time,
    }


def incoming_from_meta(meta: dict[str, Any], chat: ChatRef) -> Incoming:
    """The message `incoming_meta` kept (what a recovered run's callbacks need of it)."""
    return Incoming(
        message_id=str(meta.get("message_id") or ""),
        chat=chat,
        sender_id=str(meta.get("sender_id") or ""),
        sender_name=str(meta.get("sender_name") or ""),
        text=str(meta.get("text") or ""),
        reply_to=meta.get("reply_to"),
        images=tuple(str(i) for i in meta.get("images") or ()),
        files=tuple((str(f[0]), str(f[1])) for f in meta.get("files") or ()),
        time=float(meta.get("time") or 0.0),
    )


class ChatLink:
    """The router's state of one chat and the callbacks of the runs that answer it."""

    def __init__(self, chat: ChatRef, agent: Agent, adapter: Adapter, post: Post) -> None:
        self.chat = chat
        self.agent = agent
        self.adapter = adapter
        self._post = post
        self.unaddressed = 0  # group messages not for the bot since the last addressed one
        self.noticed: object | None = None  # the session worker whose queued notice was sent
        self.overflowed: object | None = None  # the worker whose overflow notice was sent
        self.held_noticed = False  # the shutdown notice went out (messages are stored)

    @property
    def session(self) -> str:
        """The Agent session of this chat."""
        return self.chat.session

    @property
    def language(self) -> Language:
        """The language of what this chat is sent (``ui.language``, else the runner's zh)."""
        return language_for(self.agent.config.ui.language, self.session)

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
        )

    # Everything goes through the outbox; a run's text is best effort (logged), while images,
    # files and approval cards await their row: a failure is the tool's error, so the model
    # does not tell the user something was sent that never arrived.
    async def _send_text(self, text: str, message: Incoming | None) -> None:
        if text.strip():
            mentions = self.mention_of(message.sender_id) if message is not None else ()
            # The model's own words: Markdown, flattened per runner.markdown when rendered.
            posted = await self._post(self.chat, "text", text, mentions, wait=True, model=True)
            if not posted.sent:
                log.warning("a run's message to %s was not sent: %s", self.session, posted.error)

    async def _send_image(self, image: str) -> None:
        await self._sent_or_raise(
            "image", await self._post(self.chat, "image", images=(image,), wait=True)
        )

    async def _send_file(self, name: str, data: str) -> None:
        posted = await self._post(self.chat, "file", files=((name, data),), wait=True)
        await self._sent_or_raise("file", posted)

    async def _sent_or_raise(self, what: str, posted: Posted) -> None:
        if not posted.sent:
            raise AdapterError(
                f"the {what} could not be sent to {self.session} ({posted.state}: {posted.error})"
            )

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
        timeout = self.agent.approvals.timeout
        text = approval_text(request, limit, timeout, self.adapter.id_prefix, self.language)
        # If nobody can see the question, the AdapterError denies it at once instead of
        # leaving it to time out.
        await self._sent_or_raise(
            "approval request", await self._post(self.chat, "approval", text, wait=True)
        )

    def current_batch(self) -> tuple[Incoming, ...]:
        """The messages of this chat the session's running batch answers (oldest first)."""
        state = self.agent.sessions.get(self.session)
        if state is None:
            return ()
        return tuple(incoming_from_meta(p.meta, self.chat) for p in state.batch if p.meta)
