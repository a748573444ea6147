"""OneBot v11 (QQ via NapCat, Lagrange, LLOneBot, go-cqhttp): the runner's first platform.

``models`` types the wire (segments in array and CQ-string form, events, action frames),
``transport`` carries it over forward or reverse WebSocket, and `OneBotAdapter` maps it onto the
platform-neutral `Adapter` port of ``ania_nb.runner.model``.
"""

from .adapter import OneBotAdapter
from .models import (
    ActionRequest,
    ActionResponse,
    MessageEvent,
    MetaEvent,
    Segment,
    Sender,
    escape,
    parse_cq,
    parse_event,
    parse_message,
    to_cq,
    unescape,
)
from .transport import ActionFailed, ForwardTransport, ReverseTransport, Transport

__all__ = [
    "ActionFailed",
    "ActionRequest",
    "ActionResponse",
    "ForwardTransport",
    "MessageEvent",
    "MetaEvent",
    "OneBotAdapter",
    "ReverseTransport",
    "Segment",
    "Sender",
    "Transport",
    "escape",
    "parse_cq",
    "parse_event",
    "parse_message",
    "to_cq",
    "unescape",
]
