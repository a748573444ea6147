"""`MemoryBook`: long-term memories per scope, kept in the LanceDB ``memories`` table.

A scope holds at most ``memory.max_entries`` short entries, so a search reads the scope's rows
and scores them here: the share of the query's keywords found in the content and tags, mixed
with the vector similarity when the embedder is ready (weights as in the kb).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

from ania_nb.text import cut

from .chunking import collapse_ws, match_share
from .kb import check_scope, content_id
from .model import KnowledgeChange, KnowledgeError, MemoryEntry
from .search import sql_string
from .store import MEMORY_TABLE, KnowledgeStore

COLUMNS = ["id", "scope", "user_id", "content", "tags", "created_at"]
# Without a keyword in common, a memory must be at least this similar to count as related.
MIN_SIMILARITY = 0.35  # as kb.inject_min_similarity: off-topic queries peak at 0.30-0.32


def _entry(row: dict[str, Any], score: float = 0.0) -> MemoryEntry:
    return MemoryEntry(
        id=row["id"],
        scope=row["scope"],
        content=row["content"] or "",
        user_id=row["user_id"] or "",
        tags=tuple(row["tags"] or ()),
        created_at=float(row["created_at"] or 0.0),
        score=round(score, 4),
    )


def _newest_first(entries: list[MemoryEntry]) -> list[MemoryEntry]:
    return sorted(entries, key=lambda e: (-e.created_at, e.id))


class MemoryBook:
    """Save, search, list and forget the memories of a scope."""

    def __init__(self, store: KnowledgeStore) -> None:
        self.store = store

    async def _table(self) -> Any:
        return await self.store.open_table(MEMORY_TABLE)

    async def save(
        self, scope: str, content: str, *, user_id: str = "", tags: Sequence[str] = ()
    ) -> tuple[MemoryEntry, bool]:
        """Keep a memory (cut at ``memory.max_chars``); an equal one is returned, not repeated.

        Returns the entry and whether it is new. A full scope raises `KnowledgeError`.
        """
        scope = check_scope(scope)
        settings = self.store.config.memory
        text = cut((content or "").strip(), settings.max_chars)
        if not text:
            raise KnowledgeError("content is empty")
        key = hashlib.sha256(collapse_ws(text).encode()).hexdigest()
        tag_list = [t.strip() for t in tags if t and t.strip()]
        table = await self._table()
        where = f"scope = {sql_string(scope)}"
        async with table.lock:  # one save at a time here; other processes: by id and recount
            await table.refresh()
            same = await table.rows(f"{where} AND dedupe = {sql_string(key)}", COLUMNS, limit=1)
            if same:
                return _entry(same[0]), False
            count = await table.count(where)
            if count >= settings.max_entries:
                raise KnowledgeError(f"memory full ({count} entries), use memory_forget first")
            entry = MemoryEntry(
                content_id(scope, key), scope, text, (user_id or "").strip(), tuple(tag_list),
                time.time(),
            )  # fmt: skip
            row: dict[str, Any] = {
                "id": entry.id,
                "scope": scope,
                "user_id": entry.user_id,
                "content": text,
                "tags": tag_list,
                "created_at": entry.created_at,
                "dedupe": key,
                "search_text": " ".join([text, *tag_list]),
            }
            if self.store.writes_vectors():
                vectors = await self.store.document_vectors([row["search_text"]])
                row["vector"] = vectors[0] if vectors else None
            elif await table.vector_label() is not None:
                row["vector"] = None
            if not await table.insert_new([row]):  # another process saved this id meanwhile
                return await self._stored(table, scope, key, entry.id), False
            await table.refresh()  # the limit, held as the kb holds kb.max_docs (see kb._settle)
            count = await table.count(where)
            if count > settings.max_entries:
                await table.delete(f"{where} AND id = {sql_string(entry.id)}")
                raise KnowledgeError(f"memory full ({count - 1} entries), use memory_forget first")
        self.store.changed(KnowledgeChange("memory", "added", scope, (entry.id,)))
        return entry, True

    async def _stored(self, table: Any, scope: str, key: str, memory_id: str) -> MemoryEntry:
        """The memory another process stored under ``memory_id``; a collision is refused."""
        rows = await table.rows(f"id = {sql_string(memory_id)}", [*COLUMNS, "dedupe"], limit=1)
        if not rows or (rows[0]["scope"], rows[0]["dedupe"]) != (scope, key):
            raise KnowledgeError(
                f"the memory was not saved: its id {memory_id} is taken by another memory "
                "(a hash collision); word it a little differently and save it again"
            )
        return _entry(rows[0])

    async def entries(self, scope: str) -> list[MemoryEntry]:
        """Every memory of a scope, newest first."""
        table = await self._table()
        rows = await table.rows(f"scope = {sql_string(check_scope(scope))}", COLUMNS)
        return _newest_first([_entry(r) for r in rows])

    async def search(
        self,
        scope: str,
        query: str = "",
        *,
        limit: int | None = None,
        embed_timeout: float | None = None,
    ) -> list[MemoryEntry]:
        """Memories related to ``query``, best first (all of them, newest first, without one)."""
        query = (query or "").strip()
        if not query:
            everything = await self.entries(scope)
            return everything[:limit] if limit else everything
        table = await self._table()
        vector = None
        if self.store.vectors_usable(MEMORY_TABLE):
            vector = await self.store.query_vector(query, embed_timeout)
        columns = [*COLUMNS, "vector"] if vector is not None else COLUMNS
        rows = await table.rows(f"scope = {sql_string(check_scope(scope))}", columns)
        weight = self.store.config.kb.vector_weight
        found: list[MemoryEntry] = []
        for row in rows:
            match = match_share(query, " ".join([row["content"] or "", *(row["tags"] or ())]))
            similarity = None
            if vector is not None and row.get("vector") is not None:
                similarity = float(sum(a * b for a, b in zip(vector, row["vector"], strict=False)))
            if match <= 0 and (similarity is None or similarity < MIN_SIMILARITY):
                continue
            score = match if similarity is None else weight * similarity + (1 - weight) * match
            found.append(_entry(row, score))
        found.sort(key=lambda e: (-e.score, -e.created_at))
        return found[:limit] if limit else found

    async def forget(self, scope: str, memory_id: str) -> bool:
        """Delete a memory; False when the scope has no such memory."""
        table = await self._table()
        where = f"scope = {sql_string(check_scope(scope))} AND id = {sql_string(str(memory_id))}"
        forgotten = bool(await table.delete_counted(where))
        if forgotten:
            self.store.changed(KnowledgeChange("memory", "deleted", scope, (str(memory_id),)))
        return forgotten

    async def clear(self, scope: str) -> int:
        """Forget every memory of a scope; returns how many there were."""
        table = await self._table()
        cleared = await table.delete_counted(f"scope = {sql_string(check_scope(scope))}")
        if cleared:
            self.store.changed(KnowledgeChange("memory", "deleted", scope, ()))
        return cleared

    async def scopes(self) -> dict[str, int]:
        """Every scope with memories, and how many it has."""
        return await (await self._table()).scope_counts()
