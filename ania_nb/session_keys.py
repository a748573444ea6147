"""Session keys: the one grammar of the names that say which conversation (or scope) is meant.

=====================  ===========  ==================================================
key                    kind         meaning
=====================  ===========  ==================================================
``g:<group id>``       ``group``    a group chat on a chat platform (the runner)
``f:<user id>``        ``private``  a private chat with one user (the runner)
``nb:<name>``          ``notebook`` a notebook's conversation (``nb:default``,
                                    ``nb:<8 hex>``, ``nb:<file stem>``)
``global``             ``global``   the scope every session shares (knowledge, teams);
                                    no conversation runs in it
anything else          ``other``    a session the API caller named (``Agent.chat``
                                    accepts any name)
=====================  ===========  ==================================================

A prefix with nothing after it (``g:``) is an ``other`` key, not a chat. ``<key>~<stamp>`` is
the archive of ``<key>``'s conversation (``%%agent --new``): `archive_key` builds it and
`archived_from` reads the key back; it parses like its key otherwise (``nb:a~…`` is a
notebook key). Standard library only: every layer may import this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULT_NOTEBOOK",
    "GLOBAL",
    "SessionKey",
    "SessionKind",
    "archive_key",
    "archived_from",
    "describe",
    "group_key",
    "is_group",
    "notebook_key",
    "parse",
    "private_key",
    "read_scopes",
]

SessionKind = Literal["group", "private", "notebook", "global", "other"]

GLOBAL = "global"
_PREFIXES: dict[str, SessionKind] = {"g": "group", "f": "private", "nb": "notebook"}
_PREFIX_OF: dict[SessionKind, str] = {kind: prefix for prefix, kind in _PREFIXES.items()}
_ARCHIVE = "~"


@dataclass(frozen=True)
class SessionKey:
    """A parsed session key: its ``kind`` and ``id`` (the part after the prefix).

    ``id`` is ``""`` for ``global`` and the whole key for ``other``; ``str(key)`` is the key.
    """

    kind: SessionKind
    id: str

    def __post_init__(self) -> None:
        if self.kind == "global":
            if self.id:
                raise ValueError(f"the global scope has no id, got {self.id!r}")
        elif self.kind == "other":
            kind = _split(self.id)[0]
            if kind != "other":
                raise ValueError(f"{self.id!r} is a {kind} key, not an other one")
        elif not self.id:
            raise ValueError(f"a {self.kind} session key needs an id")

    def __str__(self) -> str:
        if self.kind == "global":
            return GLOBAL
        if self.kind == "other":
            return self.id
        return f"{_PREFIX_OF[self.kind]}:{self.id}"

    @property
    def is_chat(self) -> bool:
        """Whether the key is a chat platform's conversation (a group or a private chat)."""
        return self.kind in ("group", "private")


def parse(key: str) -> SessionKey:
    """The kind and id of ``key`` (never raises: an unknown form is an ``other`` key)."""
    return SessionKey(*_split(key))


def _split(key: str) -> tuple[SessionKind, str]:
    if key == GLOBAL:
        return "global", ""
    prefix, _, rest = key.partition(":")
    kind = _PREFIXES.get(prefix)
    if kind is None or not rest:
        return "other", key
    return kind, rest


def group_key(group_id: str) -> str:
    """``g:<group id>``."""
    return str(SessionKey("group", group_id))


def private_key(user_id: str) -> str:
    """``f:<user id>``."""
    return str(SessionKey("private", user_id))


def notebook_key(name: str) -> str:
    """``nb:<name>``."""
    return str(SessionKey("notebook", name))


DEFAULT_NOTEBOOK = notebook_key("default")


def is_group(key: str) -> bool:
    """Whether ``key`` is a group chat (``g:<group id>``)."""
    return parse(key).kind == "group"


def read_scopes(key: str) -> list[str]:
    """The scopes a session reads (knowledge, teams): its own, then ``global`` (once)."""
    return [key] if key == GLOBAL else [key, GLOBAL]


def describe(key: str) -> str:
    """How a session key reads to the model: group chat, private chat, notebook session."""
    parsed = parse(key)
    if parsed.kind == "group":
        return f"the group chat {parsed.id} (session {key})"
    if parsed.kind == "private":
        return f"the private chat with {parsed.id} (session {key})"
    if parsed.kind == "notebook":
        return f"the notebook session {parsed.id!r} (session {key})"
    return f"session {key}"


def archive_key(key: str, stamp: str) -> str:
    """The name ``key``'s conversation is archived under: ``<key>~<stamp>``."""
    if not stamp or _ARCHIVE in stamp:
        raise ValueError(f"an archive stamp must be non-empty and without {_ARCHIVE!r}: {stamp!r}")
    return f"{key}{_ARCHIVE}{stamp}"


def archived_from(key: str) -> str:
    """The key an archive belongs to (``nb:a~20250101-120000`` → ``nb:a``); else ``key``."""
    return key.split(_ARCHIVE, 1)[0]
