"""The embedded store: one SQLite file (WAL) whose every statement runs off the event loop.

``store = await Store.open(data_dir)`` opens ``<data_dir>/ania.db`` and exposes KV namespaces
(``store.kv(name)``), chat history (``store.history``), the run log (``store.runs``) and the op log
(``store.oplog``) and the usage counters (``store.usage``).
"""

from __future__ import annotations

from ._db import Database, Store
from .history import ChatHistory
from .journal import RunJournal
from .kv import KVNamespace
from .oplog import OpLog, OpRecord
from .runlog import RunLog, RunRecord, ToolCallRecord
from .usage import DayCount, UsageLedger

__all__ = [
    "ChatHistory",
    "Database",
    "DayCount",
    "KVNamespace",
    "OpLog",
    "OpRecord",
    "RunJournal",
    "RunLog",
    "RunRecord",
    "Store",
    "ToolCallRecord",
    "UsageLedger",
]
