"""The headless runner: the Agent served to a chat platform (``ania-nb serve``).

Layers: an `Adapter` (``onebot/``: OneBot v11 over forward or reverse WebSocket) turns platform
events into `Incoming` messages and `Outgoing` messages into actions; the router decides what
reaches the Agent (group mentions, approvals by reply, commands, notices) and delivers clock and
background results; ``serve.py`` wires config, logging, signals and a clean shutdown.
"""

from .model import Adapter, AdapterError, ChatRef, HistoryItem, Incoming, Outgoing

__all__ = ["Adapter", "AdapterError", "ChatRef", "HistoryItem", "Incoming", "Outgoing"]
