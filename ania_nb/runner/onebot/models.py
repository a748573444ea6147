"""OneBot v11 wire models: message segments (array and CQ-string form), events, action frames.

Only what the adapter reads is typed; everything else an implementation sends is kept as extra
fields (implementations such as NapCat add their own). Segment values are strings in the spec
but implementations send numbers too, so the helpers read them with `Segment.get`.

CQ strings (``message/string.md``): plain text escapes ``&`` ``[`` ``]``; parameter values also
escape ``,``. A code is ``[CQ:<type>,<key>=<value>,…]``: the type ends at the first ``,`` or
``]``, parameters split on ``,``, each at its first ``=``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

_TEXT_ESCAPES = (("&", "&amp;"), ("[", "&#91;"), ("]", "&#93;"))
_UNESCAPE = {"&amp;": "&", "&#91;": "[", "&#93;": "]", "&#44;": ","}
_UNESCAPE_RE = re.compile("|".join(re.escape(k) for k in _UNESCAPE))
_CQ_RE = re.compile(r"\[CQ:([^,\]]+)((?:,[^\]]*)?)\]")


def validation_summary(exc: ValidationError, limit: int = 3) -> str:
    """Which fields of a frame are wrong, without quoting the input (it may be huge or deep)."""
    problems = [
        f"{'.'.join(str(part) for part in error['loc']) or 'the frame'}: {error['msg']}"
        for error in exc.errors(include_url=False, include_input=False, include_context=False)
    ]
    more = f" (+{len(problems) - limit} more)" if len(problems) > limit else ""
    return "; ".join(problems[:limit]) + more


def escape(text: str, *, comma: bool = False) -> str:
    """Escape text for a CQ string (``comma=True`` for a CQ parameter value)."""
    for raw, escaped in _TEXT_ESCAPES:
        text = text.replace(raw, escaped)
    return text.replace(",", "&#44;") if comma else text


def unescape(text: str) -> str:
    """Undo `escape` (one pass, so ``&amp;#91;`` becomes the literal ``&#91;``)."""
    return _UNESCAPE_RE.sub(lambda m: _UNESCAPE[m.group(0)], text)


class Segment(BaseModel):
    """One message segment: ``{"type": …, "data": {…}}`` (``data`` may be null on the wire)."""

    model_config = ConfigDict(frozen=True)

    type: str
    data: dict[str, Any] = Field(default_factory=dict)

    @field_validator("data", mode="before")
    @classmethod
    def _null_data(cls, value: Any) -> Any:
        return {} if value is None else value

    def get(self, key: str, default: str = "") -> str:
        """A data value as a string (``default`` when absent, null, or not a string or number)."""
        value = self.data.get(key)
        if isinstance(value, str):
            return value
        # Numbers are common (ids); an object or a list here is junk, never text to show.
        return str(value) if isinstance(value, int | float) else default

    @classmethod
    def text(cls, text: str) -> Segment:
        """A plain-text segment."""
        return cls(type="text", data={"text": text})

    @classmethod
    def at(cls, qq: str) -> Segment:
        """An @-mention of user ``qq`` (the adapter never builds one for ``all``)."""
        return cls(type="at", data={"qq": qq})

    @classmethod
    def reply(cls, message_id: str) -> Segment:
        """A quote of message ``message_id``."""
        return cls(type="reply", data={"id": message_id})

    @classmethod
    def image(cls, file: str) -> Segment:
        """An image: ``base64://…``, ``http(s)://…`` or ``file://…``."""
        return cls(type="image", data={"file": file})

    @classmethod
    def file(cls, name: str, file: str) -> Segment:
        """A file upload (NapCat/Lagrange extension): ``file`` is ``base64://…`` or a path/URL."""
        return cls(type="file", data={"file": file, "name": name})


def parse_cq(message: str) -> list[Segment]:
    """Parse a CQ string into segments (text between codes becomes unescaped text segments)."""
    segments: list[Segment] = []
    pos = 0
    for match in _CQ_RE.finditer(message):
        if match.start() > pos:
            segments.append(Segment.text(unescape(message[pos : match.start()])))
        data: dict[str, Any] = {}
        for part in match.group(2)[1:].split(",") if match.group(2) else ():
            key, sep, value = part.partition("=")
            if key:
                data[key] = unescape(value) if sep else ""
        segments.append(Segment(type=match.group(1), data=data))
        pos = match.end()
    if pos < len(message):
        segments.append(Segment.text(unescape(message[pos:])))
    return segments


def to_cq(segments: list[Segment]) -> str:
    """Render segments as a CQ string (text escaped, parameter values escaped with commas)."""
    parts: list[str] = []
    for seg in segments:
        if seg.type == "text":
            parts.append(escape(seg.get("text")))
            continue
        params = "".join(
            f",{key}={escape('' if value is None else str(value), comma=True)}"
            for key, value in seg.data.items()
        )
        parts.append(f"[CQ:{seg.type}{params}]")
    return "".join(parts)


def parse_message(value: Any) -> list[Segment]:
    """A ``message`` value in any form the spec allows: CQ string, segment array, one segment."""
    if value is None:
        return []
    if isinstance(value, str):
        return parse_cq(value)
    if isinstance(value, dict):
        return [Segment.model_validate(value)]
    if isinstance(value, list):
        return [Segment.model_validate(item) for item in value]
    raise ValueError(
        f"a OneBot message is a string, a segment or a list, not {type(value).__name__}"
    )


class Sender(BaseModel):
    """The ``sender`` object of a message event (best effort: every field may be missing)."""

    model_config = ConfigDict(extra="allow")

    user_id: int | str | None = None
    nickname: str = ""
    card: str = ""
    role: str = ""

    @field_validator("nickname", "card", "role", mode="before")
    @classmethod
    def _null_str(cls, value: Any) -> Any:
        return "" if value is None else str(value)


class MessageEvent(BaseModel):
    """A ``message`` (or NapCat's ``message_sent``) event, private or group."""

    model_config = ConfigDict(extra="allow")

    time: float = 0.0
    self_id: int | str = 0
    post_type: Literal["message", "message_sent"] = "message"
    message_type: str
    sub_type: str = ""
    message_id: int | str
    user_id: int | str
    group_id: int | str | None = None
    message: list[Segment] = Field(default_factory=list)
    raw_message: str = ""
    sender: Sender = Field(default_factory=Sender)

    @field_validator("message", mode="before")
    @classmethod
    def _any_form(cls, value: Any) -> Any:
        return parse_message(value)

    @field_validator("sender", mode="before")
    @classmethod
    def _null_sender(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("sub_type", "raw_message", mode="before")
    @classmethod
    def _null_text(cls, value: Any) -> Any:
        return "" if value is None else value


class MetaEvent(BaseModel):
    """A ``meta_event``: ``lifecycle`` (connect/enable/disable) or ``heartbeat``."""

    model_config = ConfigDict(extra="allow")

    time: float = 0.0
    self_id: int | str = 0
    post_type: Literal["meta_event"] = "meta_event"
    meta_event_type: str = ""
    sub_type: str = ""


class ActionRequest(BaseModel):
    """An action call frame: ``{"action", "params", "echo"}``."""

    action: str
    params: dict[str, Any] = Field(default_factory=dict)
    echo: str


class ActionResponse(BaseModel):
    """An action result frame; ``message``/``wording`` are common extensions explaining failures."""

    model_config = ConfigDict(extra="allow")

    status: str
    retcode: int = 0
    data: Any = None
    echo: Any = None
    message: str = ""
    wording: str = ""

    @field_validator("message", "wording", mode="before")
    @classmethod
    def _null_text(cls, value: Any) -> Any:
        return "" if value is None else str(value)

    @property
    def ok(self) -> bool:
        """Whether the action succeeded (``async`` means accepted for later execution)."""
        return self.status in ("ok", "async")


def parse_event(payload: dict[str, Any]) -> MessageEvent | MetaEvent | None:
    """The typed event of a frame; None for event kinds the runner does not use (notice, …).

    Raises ``pydantic.ValidationError`` for a malformed message or meta event.
    """
    post_type = payload.get("post_type")
    if post_type in ("message", "message_sent"):
        return MessageEvent.model_validate(payload)
    if post_type == "meta_event":
        return MetaEvent.model_validate(payload)
    return None
