"""Knowledge base and long-term memory on LanceDB (hybrid full-text + vector search).

>>> knowledge = Knowledge(config, data_dir)          # agent.knowledge in an Agent
>>> await knowledge.kb.add("nb:demo", "Deploying", "Run make deploy …")
>>> hits = await knowledge.kb.search("how do I deploy?", ["nb:demo", "global"])
>>> await knowledge.memory.save("nb:demo", "Alice prefers short answers", user_id="alice")

Nothing here imports lancedb until the store is first used (it costs seconds).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config import Config
from .embedders import Embedder, EmbeddingError, register_lancedb_function
from .kb import KnowledgeBase
from .memory import MemoryBook
from .model import (
    GLOBAL_SCOPE,
    AddResult,
    Document,
    Hit,
    IngestReport,
    KnowledgeChange,
    KnowledgeError,
    KnowledgeStatus,
    MemoryEntry,
    ReembedProgress,
    SourceDoc,
)
from .store import KB_TABLE, MEMORY_TABLE, KnowledgeStore

__all__ = [
    "GLOBAL_SCOPE",
    "AddResult",
    "Document",
    "Embedder",
    "EmbeddingError",
    "Hit",
    "IngestReport",
    "Knowledge",
    "KnowledgeBase",
    "KnowledgeChange",
    "KnowledgeError",
    "KnowledgeStatus",
    "MemoryBook",
    "MemoryEntry",
    "ReembedProgress",
    "SourceDoc",
    "register_lancedb_function",
]


class Knowledge:
    """The knowledge base (``kb``) and long-term memory (``memory``) of one data directory.

    ``config`` is a `Config` or a callable returning the current one (an Agent passes its
    own, so saved settings apply). Stored where ``kb.uri`` says: by default the folder
    ``<data_dir>/knowledge``, else another folder or an object store (``s3://…``).
    """

    def __init__(self, config: Config | Callable[[], Config], data_dir: str | Path) -> None:
        settings = config if callable(config) else (lambda: config)
        self.store = KnowledgeStore(settings, Path(data_dir))
        self.kb = KnowledgeBase(self.store)
        self.memory = MemoryBook(self.store)

    def exists(self) -> bool:
        """Whether anything was ever stored (answered without importing lancedb)."""
        return self.store.exists()

    async def open(self) -> Knowledge:
        """Open the tables now (else on first use); starts re-embedding if the embedder changed."""
        await self.store.open()
        return self

    async def status(self) -> KnowledgeStatus:
        """Embedder, sizes, vector index and background re-embedding."""
        await self.store.open()
        parts = self.store.status_parts()
        kb, memories = self.store.table(KB_TABLE), self.store.table(MEMORY_TABLE)
        return KnowledgeStatus(
            embedder=parts["embedder"],
            dim=parts["dim"],
            chunks=await kb.count(),
            memories=await memories.count(),
            vector_index=kb.vector_index,
            reembed=parts["reembed"],
            upkeep_running=any(t.upkeep_running for t in self.store.tables.values()),
            upkeep_errors=self.store.upkeep_errors(),
        )

    def subscribe(self, listener: Callable[[KnowledgeChange], object]) -> Callable[[], None]:
        """Call ``listener(change)`` whenever documents or memories are added or removed here.

        Returns the function that stops it. Listeners run on the event loop, right after the
        write; one that raises is logged.
        """
        return self.store.subscribe(listener)

    async def wait_reembedded(self) -> None:
        """Wait until vectors are filled after an embedder switch or an outage."""
        await self.store.open()
        await self.store.wait_filled()

    async def upkeep(self) -> None:
        """Compact the tables and refresh their indices (one process at a time; see the store)."""
        await self.store.upkeep()

    async def aclose(self) -> None:
        """Stop background work (stored data is durable after every call)."""
        await self.store.aclose()
