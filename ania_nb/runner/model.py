"""What the runner and a chat-platform adapter exchange: platform-neutral messages and the port.

An adapter (OneBot v11 first) turns platform events into `Incoming` messages and `Outgoing`
messages into platform actions; the `Router` (``router.py``) turns messages into Agent calls
and never sees a platform's wire format. Ids are the platform's, as strings; the router adds
the platform prefix (``qq:``) for senders and builds session keys (``g:<group>`` /
``f:<user>``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from .. import session_keys
from ..errors import ResourceError

ChatKind = Literal["group", "private"]

_USER_ID = re.compile(r"[1-9][0-9]{0,31}")


IMAGE_URL_SCHEMES = ("http://", "https://", "data:")


def image_url_allowed(url: str) -> bool:
    """Whether an image URL may go to or come from the platform as an image.

    Web and data: URLs only: never a local path or ``file://`` URL, which the platform's
    implementation would read from its own disk. Received image segments and the images of a
    model's Markdown (`ania_nb.runner.markdown`) follow this one rule.
    """
    return url.startswith(IMAGE_URL_SCHEMES)


def mentionable(user_id: str) -> bool:
    """Whether ``user_id`` may be @-mentioned: a real numeric user id (never ``all``).

    The router mentions only such ids, and the OneBot adapter builds ``at`` segments only for
    them (and never for the bot itself), whoever asks.
    """
    return _USER_ID.fullmatch(user_id) is not None


class AdapterError(ResourceError):
    """A platform action failed: not connected, timed out, or the platform said no.

    ``written`` says whether the request may have reached the platform: False only when it
    provably never left (not connected, the connection already closed), so sending it again
    cannot duplicate it; True (the default, the safe guess) when it was written and no answer
    came, or the platform answered with a failure (then ``refused`` is True too).
    """

    refused = False  # the platform answered with a failure (a subclass says so)

    def __init__(self, message: str, *, written: bool = True) -> None:
        super().__init__(message)
        self.written = written


@dataclass(frozen=True)
class ChatRef:
    """A conversation on the platform: a group, or a private chat with one user."""

    kind: ChatKind
    id: str

    @property
    def session(self) -> str:
        """The Agent session key: ``g:<group id>`` or ``f:<user id>``."""
        return str(session_keys.SessionKey(self.kind, self.id))

    @classmethod
    def from_session(cls, session: str) -> ChatRef | None:
        """The chat of a session key (None for other keys, e.g. ``nb:…``)."""
        key = session_keys.parse(session)
        if key.kind == "group" or key.kind == "private":
            return cls(key.kind, key.id)
        return None


@dataclass(frozen=True)
class Incoming:
    """One chat message as the router sees it.

    ``text`` is the message as plain text: mentions of others as ``@name``, images and files as
    short markers (``[图片]``, ``[文件 name id=…]``), the bot's own mention removed. ``mentioned``
    says whether the bot was @-mentioned; ``reply_to`` is the id of the message it replies to
    and ``replied_to_bot`` whether that message was the bot's. ``images`` are the image URLs
    (or data: URLs) of this message; ``files`` are ``(name, file id)`` pairs.
    """

    message_id: str
    chat: ChatRef
    sender_id: str
    sender_name: str
    text: str
    mentioned: bool = False
    reply_to: str | None = None
    replied_to_bot: bool = False
    images: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    time: float = 0.0
    from_self: bool = False  # sent by the bot's own account (e.g. from another device)


@dataclass(frozen=True)
class Outgoing:
    """A message to send: optional @-mentions first, then text, images and files.

    ``mentions`` are user ids; an adapter drops every one that is not `mentionable`, and all of
    them in private chats.

    ``images`` are base64 strings, data: URLs or http(s) URLs; ``files`` are ``(name, base64)``.
    ``reply_to`` quotes a message when the platform supports it.
    """

    chat: ChatRef
    text: str = ""
    mentions: tuple[str, ...] = ()
    images: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    reply_to: str | None = None


@dataclass(frozen=True)
class HistoryItem:
    """One message of a chat's history, for ``get_msg_history``."""

    message_id: str
    seq: int
    sender_id: str
    sender_name: str
    text: str
    time: float = 0.0


MessageHandler = Callable[[Incoming], Awaitable[None]]


class Adapter(Protocol):
    """A chat platform as the runner needs it (see the module docstring).

    ``start`` connects (or starts listening) and returns once the adapter is running; it keeps
    reconnecting by itself and hands every message to ``on_message`` (which must not block for
    long: the router only queues work). Actions raise `AdapterError`.
    """

    name: str  # e.g. "onebot"
    id_prefix: str  # sender ids become "<prefix>:<id>", e.g. "qq"

    @property
    def connected(self) -> bool:
        """Whether the platform is reachable right now."""
        ...

    @property
    def self_id(self) -> str | None:
        """The bot's own user id once known."""
        ...

    async def start(self, on_message: MessageHandler) -> None:
        """Connect or listen; messages go to ``on_message`` from then on."""
        ...

    async def wait_connected(self) -> None:
        """Return once the platform is reachable (at once if it is)."""
        ...

    async def wait_broken(self) -> str:
        """Return (why) only if the adapter stopped connecting for good by itself (a bug).

        No frame and no network failure may do that; the runner exits non-zero when it
        happens, so a supervisor restarts it.
        """
        ...

    async def send(self, message: Outgoing) -> str | None:
        """Send a message; returns its platform id when the platform tells it."""
        ...

    async def get_message(self, message_id: str) -> Incoming | None:
        """A message by id (for the images of a replied-to message); None when unknown."""
        ...

    async def history(self, chat: ChatRef, count: int, before_seq: int = 0) -> list[HistoryItem]:
        """The chat's last ``count`` messages (before ``before_seq`` when given), oldest first."""
        ...

    async def file_url(self, chat: ChatRef, file_id: str) -> str:
        """A download URL for a file sent in ``chat``."""
        ...

    async def aclose(self) -> None:
        """Stop: close connections or the listener; pending actions fail with `AdapterError`."""
        ...
