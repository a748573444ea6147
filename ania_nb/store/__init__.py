"""The store: one SQLite file (the embedded default) or a PostgreSQL database, never blocking.

``store = await Store.open(data_dir)`` opens ``<data_dir>/ania.db`` (``url=`` a PostgreSQL
server instead: `ania_nb.store.postgres`) and exposes KV namespaces
(``store.kv(name)``), chat history (``store.history``), the run log (``store.runs``), the run
journal (``store.journal``), the op log (``store.oplog``), the usage ledger with its counters
(``store.usage``), the durable inbox and outbox of chat front ends (``store.inbox``,
``store.outbox``, see `ania_nb.store.mailbox`), the pending approvals (``store.approvals``) and
the subagents from launch to end (``store.children``).
`ania_nb.store.db` is the backend seam underneath (for code that keeps its own tables here),
`ania_nb.store.schema` the tables of both backends; `ania_nb.store.owner` says which process
owns a running record.
"""

from __future__ import annotations

from os import PathLike
from pathlib import Path

from .approvals import ApprovalLog, ApprovalRow
from .children import ChildLog, ChildRow
from .db import Database, open_database
from .history import ChatHistory
from .journal import RunJournal
from .kv import KVNamespace
from .mailbox import (
    Effect,
    Inbox,
    InboxEntry,
    InboxRow,
    InboxState,
    OutboxEntry,
    OutboxLog,
    OutboxRow,
)
from .oplog import OpLog, OpRecord
from .runlog import RunLog, RunRecord, ToolCallRecord
from .usage import DayCount, UsageLedger

__all__ = [
    "ApprovalLog",
    "ApprovalRow",
    "ChatHistory",
    "ChildLog",
    "ChildRow",
    "Database",
    "DayCount",
    "Effect",
    "Inbox",
    "InboxEntry",
    "InboxRow",
    "InboxState",
    "KVNamespace",
    "OpLog",
    "OpRecord",
    "OutboxEntry",
    "OutboxLog",
    "OutboxRow",
    "RunJournal",
    "RunLog",
    "RunRecord",
    "Store",
    "ToolCallRecord",
    "UsageLedger",
]


class Store:
    """The store: one database with its KV namespaces, chat history, run log, inbox and outbox."""

    def __init__(
        self,
        db: Database,
        *,
        data_dir: str | PathLike[str] = ".",
        run_log_max_entries: int = 10_000,
        run_log_max_per_session: int = 200,
    ) -> None:
        """Build the façade over an open database; use :meth:`open` instead."""
        self.db = db
        self.data_dir = Path(data_dir)  # this process's local files (the clock's lease)
        self.history = ChatHistory(db)
        self.runs = RunLog(
            db, max_entries=run_log_max_entries, max_per_session=run_log_max_per_session
        )
        self.journal = RunJournal(
            db, max_entries=self.runs.max_entries, max_per_session=self.runs.max_per_session
        )
        self.oplog = OpLog(db)
        self.usage = UsageLedger(db)
        self.outbox = OutboxLog(db)
        self.inbox = Inbox(db, self.outbox)  # its accepts mark the outbox's sent rows too
        self.approvals = ApprovalLog(db)
        self.children = ChildLog(db)

    @classmethod
    async def open(
        cls,
        data_dir: str | PathLike[str],
        *,
        url: str = "",
        run_log_max_entries: int = 10_000,
        run_log_max_per_session: int = 200,
    ) -> Store:
        """Open ``<data_dir>/ania.db`` (created if needed), or the PostgreSQL database ``url``.

        The run log keeps ``run_log_max_per_session`` records per session and
        ``run_log_max_entries`` in all (see `ania_nb.store.runlog.Retention`).
        """
        db = await open_database(data_dir, url)
        try:
            return cls(
                db,
                data_dir=data_dir,
                run_log_max_entries=run_log_max_entries,
                run_log_max_per_session=run_log_max_per_session,
            )
        except BaseException:
            await db.close()  # e.g. a bad run_log_max_entries must not leak the connection
            raise

    def kv(self, namespace: str) -> KVNamespace:
        """Return the key-value namespace ``namespace`` (``[a-z][a-z0-9_.-]{0,63}``)."""
        return KVNamespace(self.db, namespace)

    async def close(self) -> None:
        """Close the database; calling again is a no-op."""
        await self.db.close()
