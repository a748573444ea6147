"""`KnowledgeStore`: the LanceDB database, its tables and the embedder that fills their vectors.

The database is where ``kb.uri`` points when the store opens: the ``knowledge`` folder of the
data directory by default, another folder, or an object store (``s3://bucket/prefix``, ``gs://``,
``az://``) opened with ``kb.storage_options``. The kb chunks and the memories are two tables of
that one database, so both move together.

Opening imports lancedb in a worker thread (it takes seconds) so the event loop keeps running.
When the configured embedder differs from the one recorded on a table, the table's vectors are
dropped and re-made in the background; until that ends, searches of the table are full-text
only. Rows added while the embedder was unreachable get their vectors the same way.

An endpoint embedder's tokens go to ``count_usage(session, model, tokens)`` (the Agent counts
them in its usage ledger): for the session whose run asked (`charged_session`), else for
``knowledge`` (a notebook cell, background re-embedding). ``subscribe`` hears every change of
the stored documents and memories made through this store (`KnowledgeChange`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.usage import Tokens, charged_session, charging
from .model import KnowledgeChange, KnowledgeError, ReembedProgress

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config
    from .embedders import Embedder, QueryVectorCache
    from .tables import LanceTable

log = logging.getLogger(__name__)
KB_TABLE = "kb_chunks"
MEMORY_TABLE = "memories"
UNCHARGED = "knowledge"  # the session embeddings outside any run count for

UsageCounter = Callable[[str, str, Tokens], Awaitable[None]]


class KnowledgeStore:
    """Tables and embedder of the knowledge base and memory; opened on first use."""

    retry_seconds = 30.0  # wait after the embedder failed before trying it again

    def __init__(self, settings: Callable[[], Config], data_dir: Path) -> None:
        self.settings = settings
        self.data_dir = data_dir
        self.embedder: Embedder | None = None
        self.queries: QueryVectorCache | None = None
        self.dim: int | None = None
        self.tables: dict[str, LanceTable] = {}
        self.progress: dict[str, ReembedProgress] = {}
        self._usable: dict[str, bool] = {}  # table → its vectors are the embedder's, all of them
        self._fills: dict[str, asyncio.Task[None]] = {}
        self._retry: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._opened = False
        self._closed = False
        self.count_usage: UsageCounter | None = None  # where an endpoint's tokens are counted
        self._listeners: list[Callable[[KnowledgeChange], object]] = []

    @property
    def config(self) -> Config:
        """The current settings."""
        return self.settings()

    def location(self) -> tuple[str, Path | None]:
        """Where the tables live now: the URI LanceDB opens and its local folder (None remote)."""
        from ..config import kb_folder

        uri = self.config.kb.uri.strip()
        folder = kb_folder(uri, self.data_dir)
        return (str(folder) if folder is not None else uri), folder

    def exists(self) -> bool:
        """Whether anything may be stored (checked without importing lancedb).

        A local folder is looked at; an object store is assumed to hold something (looking would
        need a request), so the first main turn opens it.
        """
        _, folder = self.location()
        if folder is None:
            return True
        return folder.is_dir() and any(folder.glob("*.lance"))

    async def open(self) -> None:
        """Connect, create missing tables and attach the embedder (idempotent)."""
        if self._opened:
            return
        async with self._lock:
            if self._opened:
                return
            if self._closed:
                raise KnowledgeError("the knowledge store was closed")
            tables = await asyncio.to_thread(importlib.import_module, "ania_nb.knowledge.tables")
            uri, folder = self.location()
            options = {k: v.get_secret_value() for k, v in self.config.kb.storage_options.items()}
            ann, index = self.config.kb.ann_threshold, tables.AnnSettings.of(self.config.kb)
            try:
                db = await tables.connect(uri, folder, options, self.config.kb.refresh_seconds)
                self.tables[KB_TABLE] = await tables.LanceTable.open(
                    db, KB_TABLE, tables.kb_fields(), ann, index
                )
                self.tables[MEMORY_TABLE] = await tables.LanceTable.open(
                    db, MEMORY_TABLE, tables.memory_fields(), ann, index
                )
            except KnowledgeError:  # a set-up step (an index, the primary key) said why
                self.tables.clear()
                raise
            except (OSError, ValueError, RuntimeError) as exc:  # lance's errors of the store
                self.tables.clear()
                raise tables.open_failure(uri, exc) from exc
            with charging(None):  # the dimension probe is the store's, not the opener's
                await self._attach_embedder()
            self._opened = True
            for table in self.tables.values():  # a build a crash cut off, many unindexed rows
                table.heal_soon()

    def table(self, name: str) -> LanceTable:
        """An opened table."""
        return self.tables[name]

    async def open_table(self, name: str) -> LanceTable:
        """The table ``name``, opening the store first if needed."""
        await self.open()
        return self.tables[name]

    # ------------------------------------------------------------------ embedder

    async def _attach_embedder(self) -> None:
        from .embedders import EmbeddingError, QueryVectorCache, make_embedder

        self.embedder = await asyncio.to_thread(make_embedder, self.config, self._embedded)
        if self.embedder is None:
            return
        self.queries = QueryVectorCache(self.embedder)
        try:
            dim = await self.embedder.dimension()
        except EmbeddingError as exc:
            log.warning("embedder %s unavailable, full-text only: %s", self.embedder.identity, exc)
            self._retry = asyncio.get_running_loop().create_task(self._attach_later())
            return
        await self._label_tables(dim)

    async def _embedded(self, model: str, tokens: Tokens) -> None:
        """Count an embeddings request's tokens for the session that asked."""
        if self.count_usage is not None:
            await self.count_usage(charged_session() or UNCHARGED, model, tokens)

    async def _attach_later(self) -> None:
        """Ask the embedder for its dimension every `retry_seconds` until it answers."""
        from .embedders import EmbeddingError

        assert self.embedder is not None
        while not self._closed:
            await asyncio.sleep(self.retry_seconds)
            try:
                dim = await self.embedder.dimension()
            except EmbeddingError:
                continue
            log.info("embedder %s reachable again", self.embedder.identity)
            await self._label_tables(dim)
            return

    async def _label_tables(self, dim: int) -> None:
        """Give the tables' vector columns to the embedder; re-embed what it has not made."""
        assert self.embedder is not None
        for name, table in self.tables.items():
            dropped = await table.relabel(self.embedder.identity, dim)
            if dropped and not await table.count():  # nothing to re-embed
                await table.mark_complete(True)
                dropped = False
            label = await table.vector_label()
            self._usable[name] = label is not None and label.complete and not dropped
            if dropped or not self._usable[name] or await table.count_missing():
                self._start_fill(name, dim=dim)
        self.dim = dim

    def vectors_usable(self, name: str) -> bool:
        """Whether searches of table ``name`` may use vectors now."""
        return self.embedder is not None and self.dim is not None and self._usable.get(name, False)

    def writes_vectors(self) -> bool:
        """Whether new rows get vectors (the embedder is attached to the tables)."""
        return self.embedder is not None and self.dim is not None

    async def document_vectors(self, texts: Sequence[str]) -> list[list[float]] | None:
        """Vectors of new rows; None (rows stay without, filled later) when the embedder fails."""
        if not self.writes_vectors() or not texts:
            return None
        from .embedders import EmbeddingError

        assert self.embedder is not None
        try:
            vectors = await self.embedder.embed(texts, timeout=self.config.embedding.timeout)
        except EmbeddingError as exc:
            log.warning("could not embed %d new rows (filled later): %s", len(texts), exc)
            for name in self.tables:
                self._start_fill(name, delay=self.retry_seconds)
            return None
        return [list(map(float, v)) for v in vectors]

    async def query_vector(
        self, text: str, embed_timeout: float | None = None
    ) -> list[float] | None:
        """The vector of a query (cached), or None: that query is then full-text only."""
        if self.queries is None or self.dim is None:
            return None
        timeout = embed_timeout or self.config.embedding.timeout
        vector = await self.queries.get(text, timeout=timeout)
        return None if vector is None else [float(x) for x in vector]

    # ------------------------------------------------------------------ re-embedding

    def _start_fill(self, name: str, delay: float = 0.0, dim: int | None = None) -> None:
        running = self._fills.get(name)
        dim = dim or self.dim
        if self._closed or dim is None or (running is not None and not running.done()):
            return
        progress = self.progress.setdefault(name, ReembedProgress(name))
        progress.running, progress.error = True, ""
        with charging(None):  # background work (the task copies this): no run's session pays
            self._fills[name] = asyncio.get_running_loop().create_task(self._fill(name, delay, dim))

    async def _fill(self, name: str, delay: float, dim: int) -> None:
        """Give every row of ``name`` a vector, in batches; retry after embedder failures."""
        from .embedders import EmbeddingError
        from .tables import TEXT

        table, progress = self.tables[name], self.progress[name]
        assert self.embedder is not None
        batch = self.config.embedding.batch_size
        try:
            if delay:
                await asyncio.sleep(delay)
            progress.done, progress.total = 0, await table.count_missing()
            while True:
                rows = await table.missing_vectors(batch)
                if not rows:
                    break
                try:
                    vectors = await self.embedder.embed(
                        [r[TEXT] or "" for r in rows], timeout=self.config.embedding.timeout
                    )
                except EmbeddingError as exc:
                    progress.error = str(exc)
                    log.warning("re-embedding %s paused: %s", name, exc)
                    await asyncio.sleep(self.retry_seconds)
                    continue
                await table.set_vectors([r["id"] for r in rows], vectors, dim)
                progress.done += len(rows)
                progress.total = max(progress.total, progress.done)
            await table.mark_complete(True)
            self._usable[name] = True
            progress.error = ""
            table.maintain_soon()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the table stays full-text only; say why
            progress.error = f"{type(exc).__name__}: {exc}"
            log.exception("re-embedding %s failed", name)
        finally:
            progress.running = False

    async def wait_filled(self) -> None:
        """Wait until background re-embedding has finished."""
        tasks = [t for t in self._fills.values() if not t.done()]
        if tasks:
            await asyncio.gather(*tasks)

    async def wait_upkeep(self) -> None:
        """Wait for index upkeep running in the background."""
        for table in self.tables.values():
            await table.wait_maintenance()

    async def upkeep(self) -> None:
        """Compact every table and fold new rows into its indices (ANN index once big enough).

        Safe while other processes write: Lance retries or refuses a conflicting compaction
        (logged, the next upkeep tries again), and their writes never wait for it (this
        process's do, table by table). Meant for one process at a time (the clock leader);
        each process also does it in the background after many writes of its own.
        """
        await self.open()
        for table in self.tables.values():
            await table.wait_maintenance()  # not two compactions of one table from one process
            await table.maintain()

    async def aclose(self) -> None:
        """Stop background work; stored data is already durable."""
        self._closed = True
        background = [*self._fills.values(), *([self._retry] if self._retry else [])]
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for table in self.tables.values():
            try:
                await table.wait_maintenance()
            except Exception:
                log.exception("index upkeep failed while closing")
        self.tables.clear()
        closer = getattr(self.embedder, "aclose", None)
        if closer is not None:
            await closer()
        self._opened = False

    # ------------------------------------------------------------------ changes

    def subscribe(self, listener: Callable[[KnowledgeChange], object]) -> Callable[[], None]:
        """Call ``listener(change)`` after every change of the stored entries.

        Returns the function that stops it.
        """
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def changed(self, change: KnowledgeChange) -> None:
        """Tell the listeners (a failing one is logged; the others still hear it)."""
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:
                log.exception("a knowledge listener failed on %s", change)

    def upkeep_errors(self) -> dict[str, str]:
        """Why the last background upkeep of each table failed, for tables where it did."""
        return {n: t.upkeep_error for n, t in self.tables.items() if t.upkeep_error}

    def status_parts(self) -> dict[str, Any]:
        """Embedder identity, dimension and progress, for `KnowledgeStatus`."""
        identity = self.embedder.identity if self.embedder is not None else "none"
        return {"embedder": identity, "dim": self.dim, "reembed": list(self.progress.values())}
