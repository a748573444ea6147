"""The model's knowledge tools: kb_search/add/list/delete and memory_save/search/forget.

Every tool is bound to one session: its scope is the session name [orig §6.2, §6.3].
kb_search also reads the ``global`` library, which is read-only to the model (managed through
``agent.knowledge`` and ``%ania kb``); no tool takes a scope argument, and ids naming another
scope's documents or memories are answered as unknown (another session's ids are not
revealed; a global document is named as read-only). Texts keep the original's markers;
what documents and memories say reaches the model neutralised (`ania_nb.engine.untrusted`:
no chat-template control tokens, no working prompt markers).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, Field, StringConstraints

from ania_nb.engine.untrusted import untrusted
from ania_nb.errors import ToolError
from ania_nb.session_keys import read_scopes
from ania_nb.text import cut
from ania_nb.tools.base import BaseTool, Tool, ToolContext

from .model import GLOBAL_SCOPE, Document, Hit, KnowledgeError, MemoryEntry

if TYPE_CHECKING:  # pragma: no cover
    from ania_nb.config import Config

    from . import Knowledge

__all__ = [
    "READ_ONLY_ERROR",
    "chunk_line",
    "document_line",
    "hits_text",
    "knowledge_tools",
    "memory_line",
]

READ_ONLY_ERROR = "the global knowledge base is read-only to you"
MAX_TITLE = 200
MAX_TAGS = 20
MAX_TAG = 64
MAX_SOURCE = 500
MAX_USER_ID = 128
MAX_QUERY = 2000
_ID = re.compile(r"^(?:[0-9a-f]{16}|[0-9a-f]{8})$")  # 8: stored before ids were derived

Tag = Annotated[str, StringConstraints(max_length=MAX_TAG)]
Tags = Annotated[
    list[Tag],
    Field(max_length=MAX_TAGS, description=f"Short keywords (at most {MAX_TAGS})."),
]


# ------------------------------------------------------------------ texts (pure)


def _date(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(ts))


def chunk_line(hit: Hit, limit: int | None = None) -> str:
    """``"title" (scope): chunk`` — the scope only when not global, the title only when set."""
    text = hit.text if limit is None else cut(hit.text, limit)
    label = " ".join(
        ([f'"{hit.title}"'] if hit.title else [])
        + ([f"({hit.scope})"] if hit.scope != GLOBAL_SCOPE else [])
    )
    return untrusted(f"{label}: {text}" if label else text)


def hits_text(hits: Sequence[Hit], query: str) -> str:
    """kb_search's answer: a header and one ``[id] "title" (scope): chunk`` entry per hit."""
    if not hits:
        return f'no material related to "{query}"'
    lines = [f"[{h.doc_id}] {chunk_line(h)}" for h in hits]
    return f"Knowledge base passages ({len(hits)}):\n" + "\n".join(lines)


def document_line(doc: Document) -> str:
    """One kb_list line: ``[id] "title" <tags> N chunks, M chars, from S, added DATE``."""
    parts = [f"[{doc.id}]", f'"{doc.title}"' if doc.title else "(untitled)"]
    if doc.tags:
        parts.append(f"<{','.join(doc.tags)}>")
    noun = "chunk" if doc.chunks == 1 else "chunks"
    facts = [f"{doc.chunks} {noun}", f"{doc.chars} chars"]
    if doc.source:
        facts.append(f"from {doc.source}")
    facts.append(f"added {_date(doc.created_at)}")
    return untrusted(" ".join(parts) + " " + ", ".join(facts))


def memory_line(entry: MemoryEntry) -> str:
    """``[id] (user_id) <tag1,tag2> content (saved YYYY-MM-DD)``, empty parts left out."""
    parts = [f"[{entry.id}]"]
    if entry.user_id:
        parts.append(f"({entry.user_id})")
    if entry.tags:
        parts.append(f"<{','.join(entry.tags)}>")
    parts.append(f"{entry.content} (saved {_date(entry.created_at)})")
    return untrusted(" ".join(parts))


def memories_text(found: Sequence[MemoryEntry], total: int, query: str) -> str:
    """memory_search's answer (``total``: how many memories the scope has)."""
    if total == 0:
        return "no memories yet"
    if not found:
        return (
            f'no memory related to "{query}"; call memory_search without a query to list all '
            f"{total} memories"
        )
    header = (
        f"Long-term memories ({total}):"
        if len(found) >= total
        else f"Related memories ({len(found)} of {total}):"
    )
    return header + "\n" + "\n".join(memory_line(e) for e in found)


# ------------------------------------------------------------------ shared


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """The store's refusals (blank content, full scope, bad scope name) as tool errors."""
    try:
        yield
    except KnowledgeError as exc:
        raise ToolError(str(exc)) from None


def _clean_id(value: str, what: str, lister: str) -> str:
    """A 16-hex (older: 8-hex) id as lists show it (brackets, case forgiven), else a refusal."""
    wanted = value.strip().strip("[]").strip().lower()
    if not _ID.match(wanted):
        raise ToolError(
            f"{value.strip()[:40]!r} is not a {what} id: ids are 16 hex characters (8 for older "
            f"ones) as {lister} shows them, e.g. 1a2b3c4d5e6f7a8b"
        )
    return wanted


def _clean_tags(tags: Sequence[str]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for tag in tags:
        if tag.strip():
            seen.setdefault(" ".join(tag.split()), None)
    return tuple(seen)


class _SessionTool:
    """What every knowledge tool shares: the store, the bound session, the settings."""

    description: str

    def __init__(self, knowledge: Knowledge, session: str, config: Config) -> None:
        """Bind the tool to ``session``'s scope."""
        self.knowledge = knowledge
        self.session = session
        self.config = config
        # The same bytes in every session (prompt caching): the scope is the chat the call is
        # made in, known at call time.
        self.description = f"{type(self).description} Scope: the current chat."

    def _writable(self) -> str:
        """The session's scope, refused when the session is called ``global``."""
        if self.session.strip() == GLOBAL_SCOPE:
            raise ToolError(f"{READ_ONLY_ERROR}; this session cannot store or delete anything")
        return self.session


# ------------------------------------------------------------------ kb_search


class KbSearchParams(BaseModel):
    """Parameters of kb_search."""

    query: Annotated[str, StringConstraints(max_length=MAX_QUERY)] = Field(
        description="What to look for: keywords or a question, in any language."
    )
    top_k: int = Field(
        5, strict=True, description="How many passages (default 5, at most 10; 0 or less = 5)."
    )


class KbSearchTool(_SessionTool, BaseTool[KbSearchParams]):
    """Search the knowledge base (this session's documents and the global library)."""

    description = (
        "Search the knowledge base for passages related to a query (keywords and meaning, "
        "across Chinese and English); covers this session's documents and the read-only "
        "global library. Each result starts with its document ID."
    )
    name = "kb_search"

    async def execute(self, params: KbSearchParams, ctx: ToolContext) -> str:
        """The best passages, best first."""
        query = params.query.strip()
        if not query:
            raise ToolError("query is empty: say what to look for")
        scopes = read_scopes(self.session)
        with _refusals():
            hits = await self.knowledge.kb.search(query, scopes, params.top_k)
        return hits_text(hits, query)


# ------------------------------------------------------------------ kb_add


class KbAddParams(BaseModel):
    """Parameters of kb_add."""

    title: Annotated[str, StringConstraints(max_length=MAX_TITLE)] = Field(
        description=f"A short title (at most {MAX_TITLE} characters)."
    )
    content: str = Field(
        description="The complete material (longer than the limit is cut, marked with …)."
    )
    tags: Tags = []
    source: Annotated[str, StringConstraints(max_length=MAX_SOURCE)] = Field(
        "", description="Where the material comes from (a URL, a file, a person)."
    )


class KbAddTool(_SessionTool, BaseTool[KbAddParams]):
    """Store a document in this session's knowledge base."""

    description = (
        "Store complete, reusable material (notes, facts, instructions) in this session's "
        "knowledge base so kb_search finds it later; an identical document is not stored twice."
    )
    name = "kb_add"
    side_effects = True

    async def execute(self, params: KbAddParams, ctx: ToolContext) -> str:
        """Add the document and name its ID."""
        scope = self._writable()
        content = params.content.strip()
        if not content:
            raise ToolError("content is empty: give the material to store")
        limit = self.config.kb.max_content_chars
        with _refusals():
            added = await self.knowledge.kb.add(
                scope,
                params.title.strip(),
                content,
                tags=_clean_tags(params.tags),
                source=params.source.strip(),
            )
        doc = added.document
        text = f"Added to the knowledge base (ID={doc.id}): {doc.title}"
        if not added.created:
            return text + "\n(an identical document was already stored; nothing was added)"
        if len(content) > limit:
            text += f"\n(the content was cut to {limit} characters; the rest was not stored)"
        return text


# ------------------------------------------------------------------ kb_list


class KbListParams(BaseModel):
    """Parameters of kb_list (none)."""


class KbListTool(_SessionTool, BaseTool[KbListParams]):
    """List the documents of this session's knowledge base (ID, title, size), newest first."""

    name = "kb_list"

    async def execute(self, params: KbListParams, ctx: ToolContext) -> str:
        """One line per document of the session; the global library only counted."""
        with _refusals():
            docs = await self.knowledge.kb.documents(self.session)
            scopes = await self.knowledge.kb.scopes()
        shared = scopes.get(GLOBAL_SCOPE, 0) if self.session != GLOBAL_SCOPE else 0
        note = (
            f"\nThe read-only global library has {shared} documents; kb_search covers them."
            if shared
            else ""
        )
        if not docs:
            return f"No documents in the knowledge base of {self.session} yet.{note}"
        head = f"Knowledge base of {self.session} ({len(docs)} documents):\n"
        return head + "\n".join(document_line(d) for d in docs) + note


# ------------------------------------------------------------------ kb_delete


class KbDeleteParams(BaseModel):
    """Parameters of kb_delete."""

    id: str = Field(description="The document's ID (16 hex characters, or 8, as kb_list shows it).")


class KbDeleteTool(_SessionTool, BaseTool[KbDeleteParams]):
    """Delete a document (all its chunks) from this session's knowledge base."""

    name = "kb_delete"
    side_effects = True

    async def execute(self, params: KbDeleteParams, ctx: ToolContext) -> str:
        """Delete the document if this session has it."""
        scope = self._writable()
        doc_id = _clean_id(params.id, "document", "kb_list")
        with _refusals():
            doc = next(
                (d for d in await self.knowledge.kb.documents(scope) if d.id == doc_id), None
            )
            if doc is None:
                shared = await self.knowledge.kb.documents(GLOBAL_SCOPE)
                if any(d.id == doc_id for d in shared):
                    raise ToolError(
                        f"document {doc_id} is in the global library: {READ_ONLY_ERROR}"
                    )
                raise ToolError(f"kb document not found: {doc_id} (kb_list shows this session's)")
            if not await self.knowledge.kb.delete(scope, doc_id):
                raise ToolError(f"kb document not found: {doc_id} (it was deleted meanwhile)")
        noun = "chunk" if doc.chunks == 1 else "chunks"
        return f"Deleted from the knowledge base (ID={doc.id}): {doc.title} ({doc.chunks} {noun})"


# ------------------------------------------------------------------ memory_save


class MemorySaveParams(BaseModel):
    """Parameters of memory_save."""

    content: str = Field(
        description="What to remember, self-contained (longer than the limit is cut with …)."
    )
    user_id: Annotated[str, StringConstraints(max_length=MAX_USER_ID)] = Field(
        "", description="The id of the person this is about (empty = nobody in particular)."
    )
    tags: Tags = []


class MemorySaveTool(_SessionTool, BaseTool[MemorySaveParams]):
    """Remember something for later conversations of this session."""

    description = (
        "Save a long-term memory (a preference, a fact about someone, a decision) that later "
        "conversations of this session can recall; an identical memory is not saved twice."
    )
    name = "memory_save"
    side_effects = True

    async def execute(self, params: MemorySaveParams, ctx: ToolContext) -> str:
        """Save the memory and name its ID."""
        scope = self._writable()
        if not params.content.strip():
            raise ToolError("content is empty: say what to remember")
        with _refusals():
            entry, _ = await self.knowledge.memory.save(
                scope,
                params.content,
                user_id=params.user_id.strip(),
                tags=_clean_tags(params.tags),
            )
        return f"Remembered (ID={entry.id}): {entry.content}"


# ------------------------------------------------------------------ memory_search


class MemorySearchParams(BaseModel):
    """Parameters of memory_search."""

    query: Annotated[str, StringConstraints(max_length=MAX_QUERY)] = Field(
        "", description="Keywords or a question; empty lists every memory, newest first."
    )


class MemorySearchTool(_SessionTool, BaseTool[MemorySearchParams]):
    """Recall this session's long-term memories related to a query (all without one)."""

    name = "memory_search"

    async def execute(self, params: MemorySearchParams, ctx: ToolContext) -> str:
        """Related memories best first, or all of them newest first."""
        query = params.query.strip()
        with _refusals():
            everything = await self.knowledge.memory.entries(self.session)
            if not query or not everything:
                return memories_text(everything, len(everything), query)
            found = await self.knowledge.memory.search(self.session, query)
        return memories_text(found, len(everything), query)


# ------------------------------------------------------------------ memory_forget


class MemoryForgetParams(BaseModel):
    """Parameters of memory_forget."""

    id: str = Field(
        description="The memory's ID (16 hex characters, or 8, as memory_search shows it)."
    )


class MemoryForgetTool(_SessionTool, BaseTool[MemoryForgetParams]):
    """Forget a long-term memory of this session (when it is wrong or outdated)."""

    name = "memory_forget"
    side_effects = True

    async def execute(self, params: MemoryForgetParams, ctx: ToolContext) -> str:
        """Delete the memory if this session has it."""
        scope = self._writable()
        memory_id = _clean_id(params.id, "memory", "memory_search")
        with _refusals():
            entries = await self.knowledge.memory.entries(scope)
            entry = next((e for e in entries if e.id == memory_id), None)
            if entry is None or not await self.knowledge.memory.forget(scope, memory_id):
                raise ToolError(f"memory not found: {memory_id}")
        return f"Forgotten (ID={entry.id}): {entry.content}"


def knowledge_tools(knowledge: Knowledge, session: str, config: Config) -> list[Tool]:
    """The kb tools (if ``kb.enable``) and memory tools (if ``memory.enable``) of ``session``."""
    kinds: list[type[_SessionTool]] = []
    if config.kb.enable:
        kinds += [KbSearchTool, KbAddTool, KbListTool, KbDeleteTool]
    if config.memory.enable:
        kinds += [MemorySaveTool, MemorySearchTool, MemoryForgetTool]
    return [kind(knowledge, session, config) for kind in kinds]  # type: ignore[misc]
