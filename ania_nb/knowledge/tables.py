"""LanceDB tables of the knowledge store: schemas, the embedder's identity, indices, queries.

Each kind of content (kb chunks, memories) is one table of the LanceDB database at ``kb.uri``
(by default the folder ``<data_dir>/knowledge``). The
``vector`` column's field metadata records which embedder made its vectors (``embedder``,
``dim``) and whether every row has been embedded since the last switch (``complete``), so
vectors of two embedders are never compared. lancedb and pyarrow are imported here, lazily by
the callers, because importing them costs seconds.

Several processes (replicas of ``ania-nb serve``) may share one database on object storage.
Lance commits with a conditional put and retries what does not conflict. New rows are written
with `LanceTable.insert_new`: a merge on ``id``, declared the table's (unenforced) primary key,
inserting only ids not stored yet. Lance records the inserted ids in the commit, so two
processes inserting one id at once conflict and the later one, retried, finds the row and
inserts nothing: ids made from the content (see `kb.content_id`) give dedupe across processes.
The merge runs without an index on ``id``: Lance's indexed merge path leaves the inserted ids
out of the commit (measured: duplicates again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

os.environ.setdefault("LANCE_LOG", "error")  # lance's Rust warnings would flood notebook cells

import lancedb
import pyarrow as pa
from lancedb.index import FTS, BTree, HnswSq, IvfFlat, IvfPq, IvfSq

from .._storage_cause import storage_cause, storage_text
from ..text import flatten
from .model import KnowledgeError
from .search import AnnSettings

log = logging.getLogger(__name__)

VECTOR = "vector"
TEXT = "search_text"  # what the full-text index sees: title, tags and the chunk
# n-grams of 1–3 characters: Chinese has no spaces, and single characters carry meaning.
NGRAM_MIN, NGRAM_MAX = 1, 3
OPTIMIZE_EVERY = 64  # writes between compactions (each add is a fragment; many slow queries)
# Rows an index may miss before opening the table folds them in (a process killed before its
# next upkeep leaves them; searches scan them flat meanwhile).
STALE_ROWS = 1000
PRIMARY_KEY = "id"
SET_UP_ATTEMPTS = 5  # of a one-time change (index, primary key) other processes may race
_PRIMARY_KEY_MARK = b"lance-schema:unenforced-primary-key:position"  # field metadata Lance sets


def kb_fields() -> list[pa.Field]:
    """Columns of the kb chunk table (document metadata repeated on every chunk)."""
    return [
        pa.field("id", pa.string(), nullable=False),  # <doc_id>:<chunk_index>
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("scope", pa.string(), nullable=False),
        pa.field("title", pa.string()),
        pa.field("source", pa.string()),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("created_at", pa.float64()),
        pa.field("chunk_index", pa.int32()),
        pa.field("chunks", pa.int32()),
        pa.field("chars", pa.int32()),
        pa.field("dedupe", pa.string()),
        pa.field("text", pa.string()),
        pa.field(TEXT, pa.string()),
    ]


def memory_fields() -> list[pa.Field]:
    """Columns of the memory table."""
    return [
        pa.field("id", pa.string(), nullable=False),
        pa.field("scope", pa.string(), nullable=False),
        pa.field("user_id", pa.string()),
        pa.field("content", pa.string()),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("created_at", pa.float64()),
        pa.field("dedupe", pa.string()),
        pa.field(TEXT, pa.string()),
    ]


def vector_field(identity: str, dim: int, complete: bool) -> pa.Field:
    """The vector column, labelled with the embedder that fills it."""
    meta = {"embedder": identity, "dim": str(dim), "complete": "1" if complete else "0"}
    return pa.field(VECTOR, pa.list_(pa.float32(), dim), nullable=True, metadata=meta)


@dataclass(frozen=True)
class VectorLabel:
    """What the vector column's metadata says."""

    identity: str
    dim: int
    complete: bool


class LanceTable:
    """One table: writes serialised by a lock, searches concurrent, indices kept up."""

    def __init__(self, table: Any, ann_threshold: int, ann: AnnSettings | None = None) -> None:
        self.table = table
        self.name: str = table.name
        self.lock = asyncio.Lock()  # check-then-write sequences and schema changes
        self.ann_threshold = ann_threshold
        self.ann = ann or AnnSettings()  # the index built; searches pass their own settings
        self._writes = 0
        self._maintenance: asyncio.Task[None] | None = None
        self.vector_index = ""
        self.upkeep_error = ""  # why the last background upkeep failed ("" = it did not)

    @classmethod
    async def open(
        cls,
        db: Any,
        name: str,
        fields: list[pa.Field],
        ann_threshold: int,
        ann: AnnSettings | None = None,
    ) -> LanceTable:
        """Open the table, creating it (with its full-text index) on first use."""
        try:
            table = await db.open_table(name)
        except ValueError:  # not there yet
            try:
                table = await db.create_table(name, schema=pa.schema(fields))
            except ValueError:  # another process created it meanwhile
                table = await db.open_table(name)
        opened = cls(table, ann_threshold, ann)
        await opened._ensure_primary_key()
        if not await opened.count():  # a new table: indexing nothing is instant
            await opened._ensure_text_index()
        opened.vector_index = await opened._vector_index_name()
        return opened

    async def _ensure_primary_key(self) -> None:
        """Declare ``id`` the primary key (tables made before replicas lack it)."""

        async def declared() -> bool:
            schema = await self.table.schema()
            return _PRIMARY_KEY_MARK in (schema.field(PRIMARY_KEY).metadata or {})

        await self._set_up("declaring its primary key", declared, self._declare_primary_key)

    async def _declare_primary_key(self) -> None:
        await self.table.set_unenforced_primary_key(PRIMARY_KEY)

    async def _set_up(
        self, what: str, done: Callable[[], Awaitable[bool]], do: Callable[[], Awaitable[None]]
    ) -> None:
        """Do a one-time change unless ``done``; a process doing it at once is not an error.

        Two replicas opening a new table both try: the later commit conflicts (or finds the
        index there), so the state is read again and the change is skipped or tried again.
        """
        for attempt in range(SET_UP_ATTEMPTS):
            if await done():
                return
            try:
                await do()
                return
            except (OSError, RuntimeError, ValueError) as exc:
                # A full or read-only disk is no race: trying again would fail the same way.
                if attempt == SET_UP_ATTEMPTS - 1 or storage_cause(exc) is not None:
                    with _writing(self.name, what):
                        raise
                await self.refresh()

    # ------------------------------------------------------------------ vectors

    async def vector_label(self) -> VectorLabel | None:
        """The embedder label of the vector column (None: no vector column yet)."""
        schema = await self.table.schema()
        if VECTOR not in schema.names:
            return None
        meta = {k.decode(): v.decode() for k, v in (schema.field(VECTOR).metadata or {}).items()}
        dim = schema.field(VECTOR).type.list_size
        return VectorLabel(meta.get("embedder", ""), dim, meta.get("complete") == "1")

    async def relabel(self, identity: str, dim: int) -> bool:
        """Make the vector column belong to ``identity``; True if the vectors were dropped."""
        label = await self.vector_label()
        if label is not None and label.identity == identity and label.dim == dim:
            return False
        async with self.lock:
            with _writing(self.name, "replacing the vector column"):
                if label is not None:
                    if self.vector_index:
                        await self.table.drop_index(self.vector_index)
                        self.vector_index = ""
                    await self.table.drop_columns([VECTOR])
                await self.table.add_columns(vector_field(identity, dim, complete=False))
        return True

    async def mark_complete(self, complete: bool) -> None:
        """Record whether every row has a vector of the current embedder."""
        label = await self.vector_label()
        if label is None:
            return
        meta = {"embedder": label.identity, "dim": str(label.dim)}
        meta["complete"] = "1" if complete else "0"
        with _writing(self.name, "labelling the vector column"):
            await self.table.update_field_metadata({"path": VECTOR, "metadata": meta})

    async def missing_vectors(self, limit: int) -> list[dict[str, Any]]:
        """Rows without a vector (id and text), at most ``limit``."""
        query = self.table.query().where(f"{VECTOR} IS NULL").select(["id", TEXT])
        return await query.limit(limit).to_list()  # type: ignore[no-any-return]

    async def count_missing(self) -> int:
        """How many rows have no vector."""
        return int(await self.table.count_rows(f"{VECTOR} IS NULL"))

    async def set_vectors(self, ids: Sequence[str], vectors: Any, dim: int) -> None:
        """Store vectors of existing rows (rows deleted meanwhile are skipped)."""
        schema = pa.schema(
            [  # Lance refuses a merge whose primary key column may be null
                pa.field(PRIMARY_KEY, pa.string(), nullable=False),
                pa.field(VECTOR, pa.list_(pa.float32(), dim)),
            ]
        )
        data = pa.table({PRIMARY_KEY: list(ids), VECTOR: list(vectors)}, schema=schema)
        async with self.lock:
            with _writing(self.name, "storing vectors"):
                merge = self.table.merge_insert(PRIMARY_KEY).when_matched_update_all()
                await merge.execute(data)
        self.wrote()

    # ------------------------------------------------------------------ rows

    async def insert_new(self, rows: list[dict[str, Any]]) -> int:
        """Insert the rows whose ``id`` is not stored yet, in one commit; how many were inserted.

        Rows another process inserted meanwhile (the same ids) are not written again.
        """
        if not rows:
            return 0
        # The table's schema: its ``id`` is not nullable, as Lance wants of a primary key, and
        # a vector of the wrong size fails here; "null" only lets rows without a vector pass.
        data = pa.Table.from_pylist(rows, schema=await self.table.schema())
        merge = self.table.merge_insert(PRIMARY_KEY).when_not_matched_insert_all()
        with _writing(self.name, f"adding {len(rows)} rows"):
            result = await merge.use_index(False).execute(data, on_bad_vectors="null")
        self.wrote()
        return int(result.num_inserted_rows)

    async def refresh(self) -> None:
        """Read the newest version from now on (what other processes committed too)."""
        await self.table.checkout_latest()

    async def delete(self, where: str) -> None:
        """Delete the rows matching ``where``."""
        with _writing(self.name, "deleting rows"):
            await self.table.delete(where)
        self.wrote()

    async def delete_counted(self, where: str, counting: str | None = None) -> int:
        """Delete the rows ``where`` matches, under the lock; returns the count first taken.

        The count is of ``counting`` (default: ``where``); when it is 0 nothing is deleted.
        """
        async with self.lock:
            await self.refresh()
            found = await self.count(counting or where)
            if found:
                await self.delete(where)
        return found

    async def scope_counts(self, where: str | None = None) -> dict[str, int]:
        """How many rows matching ``where`` each scope has, by scope name."""
        rows = await self.rows(where, ["scope"])
        return dict(sorted(Counter(r["scope"] for r in rows).items()))

    async def count(self, where: str | None = None) -> int:
        """How many rows match ``where``."""
        return int(await self.table.count_rows(where))

    async def rows(
        self, where: str | None, columns: Sequence[str], limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Rows matching ``where`` with ``columns``."""
        query = self.table.query().select(list(columns))
        if where:
            query = query.where(where)
        if limit is not None:
            query = query.limit(limit)
        return await query.to_list()  # type: ignore[no-any-return]

    async def text_search(
        self, text: str, where: str, limit: int, columns: Sequence[str]
    ) -> list[dict[str, Any]]:
        """Full-text (BM25 over n-grams) matches, best first, with ``_score``."""
        query = self.table.query().nearest_to_text(text).where(where)
        query = query.select([*columns, "_score"])
        return await query.limit(limit).to_list()  # type: ignore[no-any-return]

    async def vector_search(
        self,
        vector: Any,
        where: str,
        limit: int,
        columns: Sequence[str],
        ann: AnnSettings | None = None,
        *,
        exact: bool = False,
    ) -> list[dict[str, Any]]:
        """Nearest rows by cosine distance (``_distance`` = 1 − similarity).

        ``ann`` sets the ANN search parameters; ``exact`` searches flat despite an index.
        """
        query = self.table.query().nearest_to(vector).distance_type("cosine").where(where)
        if exact:
            query = query.bypass_vector_index()
        elif ann is not None:
            query = ann.apply(query)
        query = query.select([*columns, "_distance"])
        return await query.limit(limit).to_list()  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ upkeep

    def wrote(self) -> None:
        """Count a write; compact and refresh indices in the background now and then."""
        self._writes += 1
        if self._writes >= OPTIMIZE_EVERY:
            self.maintain_soon()

    def maintain_soon(self) -> None:
        """Start index upkeep in the background unless it is already running."""
        if self._maintenance is None or self._maintenance.done():
            self._writes = 0
            self._maintenance = asyncio.get_running_loop().create_task(self.maintain())

    def heal_soon(self) -> None:
        """Check the indices in the background and build or refresh what is missing or stale.

        Called on opening: a process killed during an index build (or before its next upkeep)
        left the table without its full-text or ANN index, or with many rows outside them.
        Searches go on meanwhile (flat over what no index covers).
        """
        if self._maintenance is None or self._maintenance.done():
            self._maintenance = asyncio.get_running_loop().create_task(self._heal())

    async def _heal(self) -> None:
        try:
            reason = await self.upkeep_needed()
        except Exception as exc:
            self._upkeep_failed(exc)
            return
        if reason:
            log.info("knowledge table %s: %s; upkeep runs in the background", self.name, reason)
            await self.maintain()

    async def upkeep_needed(self) -> str:
        """Why the table needs upkeep now: a missing or stale index ("" = it does not)."""
        indices = await self.table.list_indices()
        if not any(TEXT in i.columns for i in indices) and await self.count():
            return "no full-text index"
        if not any(VECTOR in i.columns for i in indices) and await self._wants_vector_index():
            return f"no ANN index past kb.ann_threshold ({self.ann_threshold} rows)"
        for index in indices:
            stats = await self.table.index_stats(index.name)
            missed = getattr(stats, "num_unindexed_rows", 0) if stats is not None else 0
            if missed >= STALE_ROWS:
                return f"{missed} rows outside the index {index.name}"
        return ""

    async def maintain(self) -> None:
        """Compact fragments, fold new rows into the indices and build the missing ones.

        A failure (a full disk, say) is logged as a warning and kept in `upkeep_error` (the
        ``%ania`` status shows it); the next upkeep tries again.
        """
        try:
            async with self.lock:
                with _writing(self.name, "compacting"):
                    await self.table.optimize()
            self.vector_index = await self._vector_index_name()  # another process may have built it
            if await self.count():
                await self._ensure_text_index()  # a table opened without it
            await self._ensure_vector_index()
        except Exception as exc:
            self._upkeep_failed(exc)
        else:
            self.upkeep_error = ""

    def _upkeep_failed(self, exc: Exception) -> None:
        """Keep and log why upkeep failed; a full disk is said as such (no Rust paths)."""
        self.upkeep_error = str(exc)
        if not isinstance(exc, KnowledgeError):  # an index build: not wrapped by `_writing`
            detail = flatten(_without_sources(str(exc)), 400)
            cause = storage_cause(exc)
            self.upkeep_error = (
                f"{type(exc).__name__}: {detail}"
                if cause is None
                else storage_text(cause, f"upkeep of {self.name} failed", detail)
            )
        log.warning(
            "upkeep of the knowledge table %s failed (tried again after more writes or at the "
            "next open): %s",
            self.name,
            self.upkeep_error,
        )

    @property
    def upkeep_running(self) -> bool:
        """Whether background upkeep (compaction, an index build) runs now."""
        return self._maintenance is not None and not self._maintenance.done()

    async def wait_maintenance(self) -> None:
        """Wait for running upkeep (tests and benchmarks)."""
        if self._maintenance is not None:
            await asyncio.shield(self._maintenance)

    async def _ensure_text_index(self) -> None:
        """The n-gram full-text index and the scope index (made once, by any process)."""
        text = FTS(
            base_tokenizer="ngram",
            ngram_min_length=NGRAM_MIN,
            ngram_max_length=NGRAM_MAX,
            stem=False,
            remove_stop_words=False,
        )
        for column, config in ((TEXT, text), ("scope", BTree())):

            async def indexed(column: str = column) -> bool:
                return any(column in i.columns for i in await self.table.list_indices())

            async def create(column: str = column, config: Any = config) -> None:
                await self.table.create_index(column, config=config, replace=False)

            await self._set_up(f"indexing {column}", indexed, create)

    async def _vector_index_name(self) -> str:
        indices = await self.table.list_indices()
        return next((i.name for i in indices if VECTOR in i.columns), "")

    async def _wants_vector_index(self) -> bool:
        """Whether the table is past ``ann_threshold`` vectors, all of the current embedder."""
        label = await self.vector_label()
        if label is None or not label.complete:
            return False
        return await self.count(f"{VECTOR} IS NOT NULL") >= self.ann_threshold

    async def _ensure_vector_index(self) -> None:
        """Past ``ann_threshold`` vectors, build the ANN index ``ann`` says (flat before)."""
        if self.vector_index or not await self._wants_vector_index():
            return
        log.info("building the ANN index of %s", self.name)
        async with self.lock:
            config = vector_index_config(self.ann)
            await self.table.create_index(VECTOR, config=config, replace=True)
        self.vector_index = await self._vector_index_name()
        log.info("built the ANN index of %s", self.name)


def vector_index_config(ann: AnnSettings) -> Any:
    """The LanceDB configuration of the ANN index ``ann`` names (cosine distance)."""
    kinds = {"ivf_hnsw_sq": HnswSq, "ivf_flat": IvfFlat, "ivf_sq": IvfSq, "ivf_pq": IvfPq}
    if ann.index not in kinds:
        raise KnowledgeError(f"kb.ann_index must be one of {', '.join(kinds)}, got {ann.index!r}")
    partitions = {"num_partitions": ann.partitions} if ann.partitions else {}
    return kinds[ann.index](distance_type="cosine", **partitions)


@contextlib.contextmanager
def _writing(table: str, what: str) -> Iterator[None]:
    """Lance's write failures as a `KnowledgeError` saying what happened (no Rust traceback)."""
    try:
        yield
    except (OSError, RuntimeError, ValueError) as exc:
        text = str(exc)
        cause = storage_cause(exc)
        if cause is not None:
            detail = flatten(_without_sources(text), 300)
            failed = f"{what} in the knowledge table {table} failed"
            raise KnowledgeError(storage_text(cause, failed, detail), cause=cause) from exc
        if "ncompatible transaction" in text or "onflict" in text or "contention" in text:
            raise KnowledgeError(
                f"{what} in the knowledge table {table} failed: another process (a replica "
                f"sharing kb.uri) committed a change this write cannot be combined with, and "
                f"Lance could not retry it; nothing of this write was stored, try again "
                f"({flatten(text.split(', /')[0], 300)})"
            ) from exc
        raise KnowledgeError(
            f"{what} in the knowledge table {table} failed: {flatten(_without_sources(text), 400)}"
        ) from exc


_RUST_SOURCE = re.compile(r",?\s*/\S+\.rs:\d+(?::\d+)?")  # where in the wheel's build tree


def _without_sources(text: str) -> str:
    """A Lance error's text without the Rust source locations it names (build-machine paths)."""
    return _RUST_SOURCE.sub("", text)


def open_failure(uri: str, exc: BaseException) -> KnowledgeError:
    """The `KnowledgeError` of tables that could not be opened at ``uri``."""
    what = f"cannot open the knowledge tables at {uri} (kb.uri)"
    detail = flatten(_without_sources(str(exc)), 400)
    cause = storage_cause(exc)
    if cause is None:
        return KnowledgeError(f"{what}: {detail}")
    return KnowledgeError(storage_text(cause, what, detail), cause=cause)


async def connect(
    uri: str, folder: Path | None, storage_options: dict[str, str], refresh_seconds: float
) -> Any:
    """Open the LanceDB database at ``uri``: a local ``folder`` (created) or an object store.

    Reads look for other processes' commits once ``refresh_seconds`` have passed since the
    last look (0: before every read).
    """
    if folder is not None:
        await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
    return await lancedb.connect_async(
        uri,
        storage_options=storage_options or None,
        read_consistency_interval=timedelta(seconds=refresh_seconds),
    )
