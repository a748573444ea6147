"""Plain data of the knowledge base and memory: documents, hits, memories, errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..errors import UsageError
from ..session_keys import GLOBAL

GLOBAL_SCOPE = GLOBAL  # the scope every session reads (`ania_nb.session_keys`)


class KnowledgeError(UsageError):
    """A knowledge request was refused: blank content, full scope, unknown id, read-only scope.

    ``cause`` is set when the disk refused the write (see `ania_nb.errors.StoreError.cause`).
    """

    def __init__(self, message: str, *, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class SourceDoc:
    """A document before it is stored: what a file, a DataFrame row or `kb_add` gives."""

    title: str
    content: str
    source: str = ""
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Document:
    """A stored kb document (its chunks live in the chunk table)."""

    id: str  # 16 hex characters of scope and content (`kb.content_id`); 8 random ones before
    scope: str
    title: str
    source: str
    tags: tuple[str, ...]
    created_at: float  # epoch seconds
    chunks: int
    chars: int


@dataclass(frozen=True)
class AddResult:
    """The outcome of adding one document: the stored one, or the equal one already there."""

    document: Document
    created: bool  # False: a document with the same title and content existed (dedupe)


class IngestReport(list[AddResult]):
    """The documents an ingest added (a list of `AddResult`) and the files it had to skip."""

    def __init__(self, results: list[AddResult], skipped: list[tuple[str, str]]) -> None:
        super().__init__(results)
        self.skipped = skipped  # (path, why) of files that could not be read


@dataclass(frozen=True)
class Hit:
    """One kb search result: a chunk with its document and how well it matched.

    ``score`` ranks (0..1: vector similarity and keyword share mixed by ``kb.vector_weight``);
    ``similarity`` is the cosine similarity (None without vectors); ``match`` is the share of
    the query's keywords found in the chunk (0..1), which auto-inject gates on.
    """

    chunk_id: str
    doc_id: str
    scope: str
    title: str
    text: str
    source: str
    tags: tuple[str, ...]
    chunk_index: int
    score: float
    similarity: float | None = None
    match: float = 0.0


@dataclass(frozen=True)
class MemoryEntry:
    """One long-term memory of a scope."""

    id: str  # 16 hex characters of scope and content (`kb.content_id`); 8 random ones before
    scope: str
    content: str
    user_id: str = ""
    tags: tuple[str, ...] = ()
    created_at: float = 0.0
    score: float = 0.0  # set by searches


@dataclass(frozen=True)
class KnowledgeChange:
    """Entries of a scope were added or removed (``table``: kb or memory), by anyone here."""

    table: Literal["kb", "memory"]
    kind: Literal["added", "deleted"]
    scope: str
    ids: tuple[str, ...] = ()  # the documents or memories (empty: all of a cleared scope)


@dataclass
class ReembedProgress:
    """Progress of filling vectors after an embedder switch (or of a back-fill)."""

    table: str
    done: int = 0
    total: int = 0
    running: bool = False
    error: str = ""


@dataclass
class KnowledgeStatus:
    """What the knowledge store is doing: embedder, sizes, indices, background work."""

    embedder: str  # identity, "none" for full-text only
    dim: int | None
    chunks: int
    memories: int
    vector_index: str  # "" = flat search
    reembed: list[ReembedProgress] = field(default_factory=list)
    upkeep_running: bool = False  # compaction or an index build runs in the background
    upkeep_errors: dict[str, str] = field(default_factory=dict)  # table → why upkeep failed

    @property
    def vectors_ready(self) -> bool:
        """Whether searches use vectors now (no re-embedding running)."""
        return self.embedder != "none" and not any(p.running for p in self.reembed)
