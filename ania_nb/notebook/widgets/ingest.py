"""`IngestBar`: the progress of adding many documents to the knowledge base, in a notebook.

``reading files…`` then ``12/40 documents``, ending with the outcome (``added 3 document(s) (12
chunks), 1 already there``). `ingest_with_bar` and `dataframe_with_bar` add documents with a bar
following them: the knowledge panel shows one, ``%ania kb add`` displays one on its own. The
summaries (`added_summary`, `skipped_files`) need no front end.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._display import Displayable

if TYPE_CHECKING:  # pragma: no cover
    from ...knowledge import AddResult, Knowledge

Progress = Callable[[int, int], Any]


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

    def withdraw(self) -> None:
        """Hide the bar: the job failed and its error is said elsewhere (once, not twice)."""
        self.state = "idle"
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
    show_failure: bool = True,
) -> list[AddResult]:
    """`KnowledgeBase.ingest` with ``bar`` following it; the bar ends with the outcome."""
    label = str(spec) if isinstance(spec, str | Path) else ", ".join(map(str, spec))
    extra = {"base": base} if base is not None else {}

    def run(progress: Progress) -> Awaitable[list[AddResult]]:
        return knowledge.kb.ingest(scope, spec, progress=progress, **extra)

    return await with_bar(
        bar, f"adding {label} to {scope}", run, waiting="reading files…", show_failure=show_failure
    )


async def dataframe_with_bar(
    knowledge: Knowledge,
    scope: str,
    df: Any,
    column: str,
    bar: IngestBar,
    *,
    title_column: str | None = None,
    show_failure: bool = True,
) -> list[AddResult]:
    """`KnowledgeBase.ingest_dataframe` (one document per cell) with ``bar`` following it."""

    def run(progress: Progress) -> Awaitable[list[AddResult]]:
        return knowledge.kb.ingest_dataframe(
            scope, df, column, title_column=title_column, progress=progress
        )

    return await with_bar(
        bar, f"adding column {column!r} to {scope}", run, show_failure=show_failure
    )


async def with_bar(
    bar: IngestBar,
    label: str,
    run: Callable[[Progress], Awaitable[list[AddResult]]],
    *,
    waiting: str = "starting…",
    show_failure: bool = True,
) -> list[AddResult]:
    """Run an adding job with ``bar`` showing its progress and, at the end, its outcome.

    Without ``show_failure`` a failed job hides the bar: the caller says the error.
    """
    bar.start(label, waiting)
    try:
        results = await run(bar.update)
    except Exception as exc:
        if show_failure:
            bar.finish(f"✗ {exc}", failed=True)
        else:
            bar.withdraw()
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
