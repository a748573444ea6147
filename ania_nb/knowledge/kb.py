"""`KnowledgeBase`: documents cut into chunks per scope, found by keywords and meaning."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from ania_nb.text import cut

from .chunking import chunk_text, dedupe_key, match_share
from .model import (
    AddResult,
    Document,
    Hit,
    IngestReport,
    KnowledgeChange,
    KnowledgeError,
    SourceDoc,
)
from .search import (
    MODES,
    AnnSettings,
    Ranked,
    SearchMode,
    exact_terms,
    fuse,
    order,
    scope_filter,
    wants_exact,
)
from .search import sql_string as _q
from .store import KB_TABLE, KnowledgeStore

Progress = Callable[[int, int], Any]
DOC_COLUMNS = ["doc_id", "scope", "title", "source", "tags", "created_at", "chunks", "chars"]
HIT_COLUMNS = ["id", "doc_id", "scope", "title", "text", "source", "tags", "chunk_index"]
DEFAULT_TOP_K, MAX_TOP_K = 5, 10
WRITE_BATCH = 64  # documents per LanceDB commit when adding many
# A candidate with none of the query's words must be at least this similar to be shown at all.
MIN_SIMILARITY = 0.25


def clamp_top_k(top_k: int | None) -> int:
    """``top_k`` as searches use it: ≤0 or None → 5, at most 10."""
    if top_k is None or top_k <= 0:
        return DEFAULT_TOP_K
    return min(int(top_k), MAX_TOP_K)


def content_id(scope: str, key: str) -> str:
    """The id of a document or memory: 16 hex characters of its scope and dedupe key.

    Every process gives equal content in one scope the same id, so two replicas adding it at
    once insert one id and Lance keeps one (`tables.LanceTable.insert_new`). Ids stored
    before are 8 random hex characters; they stay, found by their dedupe key.
    """
    return hashlib.sha256(f"{scope}\n{key}".encode()).hexdigest()[:16]


def check_scope(scope: str) -> str:
    """A scope name as stored (non-empty, no control characters)."""
    if not isinstance(scope, str) or not scope.strip():
        raise KnowledgeError(f"scope must be a non-empty string, got {scope!r}")
    if any(ord(c) < 32 for c in scope):
        raise KnowledgeError(f"scope contains control characters: {scope!r}")
    return scope.strip()


def _document(row: dict[str, Any]) -> Document:
    return Document(
        id=row["doc_id"],
        scope=row["scope"],
        title=row["title"] or "",
        source=row["source"] or "",
        tags=tuple(row["tags"] or ()),
        created_at=float(row["created_at"] or 0.0),
        chunks=int(row["chunks"] or 0),
        chars=int(row["chars"] or 0),
    )


class KnowledgeBase:
    """kb documents: add (chunked, deduplicated, limited per scope), search, list, delete."""

    def __init__(self, store: KnowledgeStore) -> None:
        self.store = store

    async def _table(self) -> Any:
        return await self.store.open_table(KB_TABLE)

    # ------------------------------------------------------------------ writing

    async def add(
        self,
        scope: str,
        title: str,
        content: str,
        *,
        tags: Sequence[str] = (),
        source: str = "",
    ) -> AddResult:
        """Add one document (content cut at ``kb.max_content_chars``); equal ones are reused."""
        limit = self.store.config.kb.max_content_chars
        doc = SourceDoc(title, cut((content or "").strip(), limit), source, tuple(tags))
        return (await self.add_many(scope, [doc]))[0]

    async def add_many(
        self, scope: str, docs: Iterable[SourceDoc], *, progress: Progress | None = None
    ) -> list[AddResult]:
        """Add documents in few commits; a blank document or a full scope raises first.

        Documents are checked in order: a document equal to a stored one (title and content up
        to whitespace) returns the stored one with ``created=False``; past ``kb.max_docs``
        documents in the scope a `KnowledgeError` is raised and the documents before it stay.
        """
        scope = check_scope(scope)
        wanted = [_clean(d) for d in docs]
        table = await self._table()
        results: list[AddResult] = []
        for start in range(0, len(wanted), WRITE_BATCH):
            part = wanted[start : start + WRITE_BATCH]
            results.extend(await self._add_batch(table, scope, part))
            if progress is not None:
                progress(len(results), len(wanted))
        return results

    async def _add_batch(self, table: Any, scope: str, docs: list[SourceDoc]) -> list[AddResult]:
        kb = self.store.config.kb
        keys = [dedupe_key(d.title, d.content) for d in docs]
        pieces = [chunk_text(d.content, kb.chunk_chars, kb.chunk_overlap_chars) for d in docs]
        async with table.lock:  # one batch at a time here; other processes: by id, and _settle
            await table.refresh()
            known = await self._known(table, scope, keys)
            count = await self._count(table, scope)
            results: list[AddResult] = []
            new_keys: dict[str, str] = {}  # id → dedupe key of the documents written now
            rows: list[dict[str, Any]] = []
            full = False
            for doc, key, chunks in zip(docs, keys, pieces, strict=True):
                existing = known.get(key)
                if existing is not None:
                    results.append(AddResult(existing, created=False))
                    continue
                if count >= kb.max_docs:
                    full = True  # what came before is written, then the refusal raised
                    break
                document = Document(
                    content_id(scope, key), scope, doc.title, doc.source, doc.tags,
                    time.time(), len(chunks), len(doc.content),
                )  # fmt: skip
                rows.extend(_rows(document, key, chunks))
                known[key], new_keys[document.id] = document, key
                results.append(AddResult(document, created=True))
                count += 1
            await self._embed(table, rows)
            inserted = await table.insert_new(rows)
            try:
                if inserted < len(rows):  # another process stored some of them meanwhile
                    results = await self._theirs(table, scope, results, new_keys)
                if await self._settle(table, scope, results) or full:
                    raise KnowledgeError(f"kb full ({kb.max_docs}), delete some")
            finally:
                if inserted:  # open panels show the new documents (and any undone again)
                    self._changed("added", scope, tuple(new_keys))
        return results

    def _changed(self, kind: Literal["added", "deleted"], scope: str, ids: tuple[str, ...]) -> None:
        self.store.changed(KnowledgeChange("kb", kind, scope, ids))

    async def _count(self, table: Any, scope: str) -> int:
        return int(await table.count(f"scope = {_q(scope)} AND chunk_index = 0"))

    async def _theirs(
        self, table: Any, scope: str, results: list[AddResult], keys: dict[str, str]
    ) -> list[AddResult]:
        """``results`` with the documents another process stored first marked not created.

        A stored document is ours if it carries our ``created_at``; one of the same id and
        another dedupe key is a collision of ids, refused (the new document is not stored).
        """
        ours = {r.document.id: r.document.created_at for r in results if r.created}
        ids = ", ".join(_q(i) for i in keys)
        where = f"chunk_index = 0 AND doc_id IN ({ids})"
        stored = {r["doc_id"]: r for r in await table.rows(where, [*DOC_COLUMNS, "dedupe"])}
        theirs: dict[str, Document] = {}
        for doc_id, key in keys.items():
            row = stored.get(doc_id)
            if row is None or row["created_at"] == ours[doc_id]:
                continue  # ours (or deleted meanwhile by someone)
            if (row["scope"], row["dedupe"]) != (scope, key):
                raise KnowledgeError(_collision(doc_id, row["title"] or ""))
            theirs[doc_id] = _document(row)
        return [
            AddResult(theirs[r.document.id], created=False) if r.document.id in theirs else r
            for r in results
        ]

    async def _settle(self, table: Any, scope: str, results: list[AddResult]) -> bool:
        """Hold ``kb.max_docs`` against other processes: True if documents of ours were undone.

        Each process counts the scope after its commit and deletes as many of the documents
        it just added (last first) as the scope is over the limit. So at rest a scope never
        holds more: the last batch kept was counted within the limit with everything committed
        before it. Two processes undoing at once may both undo and leave room unused; a
        process dying between its commit and its count leaves its batch (≤ 64 documents) over.
        """
        await table.refresh()
        over = await self._count(table, scope) - self.store.config.kb.max_docs
        ours = [r.document.id for r in results if r.created]
        if over <= 0 or not ours:
            return False
        undone = ", ".join(_q(i) for i in ours[-over:])
        await table.delete(f"scope = {_q(scope)} AND doc_id IN ({undone})")
        return True

    async def _embed(self, table: Any, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        if self.store.writes_vectors():
            vectors = await self.store.document_vectors([r["search_text"] for r in rows])
            for i, row in enumerate(rows):
                row["vector"] = vectors[i] if vectors is not None else None
        elif await table.vector_label() is not None:
            for row in rows:
                row["vector"] = None

    async def _known(self, table: Any, scope: str, keys: list[str]) -> dict[str, Document]:
        wanted = ", ".join(_q(k) for k in set(keys))
        where = f"scope = {_q(scope)} AND chunk_index = 0 AND dedupe IN ({wanted})"
        rows = await table.rows(where, [*DOC_COLUMNS, "dedupe"])
        return {r["dedupe"]: _document(r) for r in rows}

    async def ingest(
        self,
        scope: str,
        spec: str | Path | Iterable[str | Path],
        *,
        progress: Progress | None = None,
        base: Path | None = None,
    ) -> IngestReport:
        """Add files (.md, .txt, .pdf, .ipynb; globs and folders too), one document each.

        Files are read and written 64 at a time; ``progress(files done, files)`` follows. A
        file that cannot be read (empty, encrypted, binary, too big) is skipped and listed in
        the report's ``skipped``; when no file at all can be read, its reason is raised.
        """
        from .ingest import expand_paths, read_document

        paths = await asyncio.to_thread(expand_paths, spec, base)
        added: list[AddResult] = []
        skipped: list[tuple[str, str]] = []
        for start in range(0, len(paths), WRITE_BATCH):  # read and write a batch at a time
            docs: list[SourceDoc] = []
            for path in paths[start : start + WRITE_BATCH]:
                try:
                    docs.append(await asyncio.to_thread(read_document, path))
                except KnowledgeError as exc:
                    skipped.append((str(path), str(exc)))
            added.extend(await self.add_many(scope, docs))
            if progress is not None:
                progress(min(start + WRITE_BATCH, len(paths)), len(paths))
        if not added and skipped:
            raise KnowledgeError(skipped[0][1])
        return IngestReport(added, skipped)

    async def ingest_dataframe(
        self,
        scope: str,
        df: Any,
        column: str,
        *,
        title_column: str | None = None,
        progress: Progress | None = None,
    ) -> list[AddResult]:
        """Add one document per non-blank cell of a DataFrame column."""
        from .ingest import dataframe_documents

        docs = dataframe_documents(df, column, title_column=title_column)
        return await self.add_many(scope, docs, progress=progress)

    async def delete(self, scope: str, doc_id: str) -> bool:
        """Delete a document and its chunks; False when the scope has no such document."""
        table = await self._table()
        where = f"scope = {_q(check_scope(scope))} AND doc_id = {_q(str(doc_id))}"
        deleted = bool(await table.delete_counted(where))
        if deleted:
            self._changed("deleted", scope, (str(doc_id),))
        return deleted

    async def clear(self, scope: str) -> int:
        """Delete every document of a scope; returns how many there were."""
        table = await self._table()
        where = f"scope = {_q(check_scope(scope))}"
        cleared = await table.delete_counted(where, f"{where} AND chunk_index = 0")
        if cleared:
            self._changed("deleted", scope, ())
        return cleared

    # ------------------------------------------------------------------ reading

    async def documents(self, scope: str) -> list[Document]:
        """The documents of a scope, newest first."""
        table = await self._table()
        rows = await table.rows(
            f"scope = {_q(check_scope(scope))} AND chunk_index = 0", DOC_COLUMNS
        )
        return sorted((_document(r) for r in rows), key=lambda d: (-d.created_at, d.id))

    async def scopes(self) -> dict[str, int]:
        """Every scope with documents, and how many it has."""
        return await (await self._table()).scope_counts("chunk_index = 0")

    async def chunk_count(self, scope: str | None = None) -> int:
        """How many chunks are stored (in one scope, or in all)."""
        table = await self._table()
        return int(await table.count(f"scope = {_q(scope)}" if scope else None))

    async def search(
        self,
        query: str,
        scopes: Sequence[str],
        top_k: int | None = DEFAULT_TOP_K,
        *,
        mode: SearchMode = "hybrid",
        embed_timeout: float | None = None,
    ) -> list[Hit]:
        """The chunks of ``scopes`` best matching ``query``; the first scope is the local one.

        ``hybrid`` scores vector candidates by meaning and keyword share (vectors only when the
        embedder is ready and answers within ``embed_timeout``, else full-text); full-text
        candidates join them while the table has no ANN index, then only for queries naming
        something exact (see `search.wants_exact`). ``fts`` and ``vector`` use one list.
        """
        if mode not in MODES:
            raise KnowledgeError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        query = (query or "").strip()
        scopes = [check_scope(s) for s in scopes]
        if not query or not scopes:
            return []
        k = clamp_top_k(top_k)
        table = await self._table()
        where = scope_filter(scopes)
        wanted = max(k * 4, 20)
        vector = None
        if mode != "fts" and self.store.vectors_usable(KB_TABLE):
            vector = await self.store.query_vector(query, embed_timeout)
        columns = [*HIT_COLUMNS, "vector"] if vector is not None else HIT_COLUMNS
        text_rows: list[dict[str, Any]] = []
        vector_rows: list[dict[str, Any]] = []
        text_query = _text_query(table, vector, query, mode, self.store.config.kb.exact_search)
        if text_query:
            text_rows = await _text_rows(table, text_query, where, wanted, columns)
        if vector is not None:
            ann = AnnSettings.of(self.store.config.kb)
            vector_rows = await table.vector_search(vector, where, wanted, HIT_COLUMNS, ann)
        ranked = fuse(
            text_rows,
            vector_rows,
            weight=self.store.config.kb.vector_weight,
            query_vector=vector,
            match=lambda row: match_share(query, f"{row['title'] or ''}\n{row['text'] or ''}"),
        )
        kept = [r for r in ranked if r.match > 0 or (r.similarity or 0.0) >= MIN_SIMILARITY]
        return [_hit(r) for r in order(kept, scopes[0])[:k]]


def _text_query(table: Any, vector: Any, query: str, mode: str, exact: str) -> str:
    """What a search asks the full-text index ("" = nothing; see the search module).

    Without vectors or an ANN index: the query. With both, a hybrid search asks only for a
    query naming something exact, and then (``kb.exact_search``) its exact terms, the query,
    or nothing.
    """
    if mode == "fts" or (mode == "hybrid" and (vector is None or not table.vector_index)):
        return query
    if mode != "hybrid" or exact == "off" or not wants_exact(query):
        return ""
    return (exact_terms(query) or query) if exact == "terms" else query


async def _text_rows(
    table: Any, query: str, where: str, limit: int, columns: list[str]
) -> list[dict[str, Any]]:
    """Full-text candidates; a query the index cannot parse finds nothing instead of failing."""
    try:
        return await table.text_search(query, where, limit, columns)  # type: ignore[no-any-return]
    except (ValueError, RuntimeError) as exc:
        import logging

        logging.getLogger(__name__).warning("full-text search failed for %r: %s", query, exc)
        return []


def _hit(ranked: Ranked) -> Hit:
    row, similarity = ranked.row, ranked.similarity
    title, text = row["title"] or "", row["text"] or ""
    return Hit(
        chunk_id=row["id"],
        doc_id=row["doc_id"],
        scope=row["scope"],
        title=title,
        text=text,
        source=row["source"] or "",
        tags=tuple(row["tags"] or ()),
        chunk_index=int(row["chunk_index"] or 0),
        score=round(ranked.score, 4),
        similarity=None if similarity is None else round(similarity, 4),
        match=round(ranked.match, 4),
    )


def _collision(doc_id: str, stored_title: str) -> str:
    return (
        f"a document was not stored: its id {doc_id} is taken by the document "
        f"{stored_title!r} (a hash collision); change its title a little and add it again"
    )


def _clean(doc: SourceDoc) -> SourceDoc:
    content = (doc.content or "").strip()
    if not content:
        what = f"document {doc.title!r}" if doc.title else "a document"
        raise KnowledgeError(f"{what} has no content")
    tags = tuple(t.strip() for t in doc.tags if t and t.strip())
    return SourceDoc((doc.title or "").strip(), content, (doc.source or "").strip(), tags)


def _rows(doc: Document, key: str, chunks: list[str]) -> list[dict[str, Any]]:
    head = "\n".join(p for p in (doc.title, " ".join(doc.tags)) if p)
    return [
        {
            "id": f"{doc.id}:{i}",
            "doc_id": doc.id,
            "scope": doc.scope,
            "title": doc.title,
            "source": doc.source,
            "tags": list(doc.tags),
            "created_at": doc.created_at,
            "chunk_index": i,
            "chunks": doc.chunks,
            "chars": doc.chars,
            "dedupe": key,
            "text": chunk,
            "search_text": f"{head}\n{chunk}" if head else chunk,
        }
        for i, chunk in enumerate(chunks)
    ]
