"""The embedded store: one SQLite file (WAL) whose every statement runs off the event loop.

``store = await Store.open(data_dir)`` opens ``<data_dir>/ania.db`` and exposes KV namespaces
(``store.kv(name)``), chat history (``store.history``), the run log (``store.runs``), the run
journal (``store.journal``), the op log (``store.oplog``), the usage counters (``store.usage``)
and the pending approvals (``store.approvals``). `ania_nb.store.db` is the database underneath
(for code that keeps its own tables here); `ania_nb.store.owner` says which process owns a
running record.
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path

from .approvals import ApprovalLog, ApprovalRow
from .db import DB_FILENAME, Database
from .history import ChatHistory
from .journal import RunJournal
from .kv import KVNamespace
from .oplog import OpLog, OpRecord
from .runlog import RunLog, RunRecord, ToolCallRecord
from .usage import DayCount, UsageLedger

__all__ = [
    "ApprovalLog",
    "ApprovalRow",
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


class Store:
    """The embedded store: one database file with its KV namespaces, chat history and run log."""

    def __init__(self, db: Database, *, run_log_max_entries: int = 200) -> None:
        """Build the façade over an open database; use :meth:`open` instead."""
        self.db = db
        self.history = ChatHistory(db)
        self.runs = RunLog(db, max_entries=run_log_max_entries)
        self.journal = RunJournal(db, max_entries=self.runs.max_entries)
        self.oplog = OpLog(db)
        self.usage = UsageLedger(db)
        self.approvals = ApprovalLog(db)

    @classmethod
    async def open(cls, data_dir: str | PathLike[str], *, run_log_max_entries: int = 200) -> Store:
        """Open ``<data_dir>/ania.db``, creating the directory and file if needed."""
        db = await Database.open(Path(data_dir) / DB_FILENAME)
        try:
            return cls(db, run_log_max_entries=run_log_max_entries)
        except BaseException:
            await db.close()  # e.g. a bad run_log_max_entries must not leak the connection
            raise

    def kv(self, namespace: str) -> KVNamespace:
        """Return the key-value namespace ``namespace`` (``[a-z][a-z0-9_.-]{0,63}``)."""
        return KVNamespace(self.db, namespace)

    async def close(self) -> None:
        """Close the database; calling again is a no-op."""
        await self.db.close()
