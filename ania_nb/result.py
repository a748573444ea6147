"""`RunResult`: what `Agent.chat` returns."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from .engine.loop import ToolCallResult
from .engine.usage import Usage
from .errors import RunError

RunStatus = Literal["success", "stopped", "timeout", "error", "denied", "interrupted"]

# Tool call outcomes that make a successful run "finished · …" instead of a plain success: one
# vocabulary for the run widget, %ania log and `ania-nb runs`.
UNHAPPY_OUTCOMES = {
    "denied": "denied",
    "blocked": "blocked",
    "timeout": "not approved in time",
    "stopped": "stopped",
    "error": "failed",
}


def outcome_text(outcomes: Iterable[str]) -> str:
    """What went wrong with a run's calls: ``1 call denied, 2 calls failed`` ("" when none)."""
    counts = Counter(o for o in outcomes if o in UNHAPPY_OUTCOMES)
    return ", ".join(
        f"{counts[o]:,} call{'' if counts[o] == 1 else 's'} {word}"
        for o, word in UNHAPPY_OUTCOMES.items()
        if counts[o]
    )


def run_headline(status: str, outcomes: Iterable[str]) -> tuple[str, str]:
    """A run's state and words: its status, or ``finished`` / ``finished · 1 call denied``."""
    if status == "success":
        trouble = outcome_text(outcomes)
        if trouble:
            return "finished", f"finished · {trouble}"
    return status, status


@dataclass
class RunResult:
    """The outcome of one `Agent.chat` request.

    ``status`` is ``success``, ``stopped`` (cancelled), ``timeout``, ``error``, ``denied`` (a
    daily token quota is used up; nothing ran) or ``interrupted`` (suspended waiting for an
    approval at shutdown: it is asked again after a restart); ``error`` says why for all but
    ``success``.
    Several messages that queued while the session was busy are answered by one run, and every
    one of their callers receives the same result.
    """

    text: str
    status: RunStatus
    session: str
    usage: Usage = field(default_factory=Usage)
    tool_calls: list[ToolCallResult] = field(default_factory=list)
    run_id: int | None = None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    """What went wrong without failing the run (repeated calls not run, an answer that is only a
    tool call written as text); also in the run record's error field, prefixed ``warning:``."""
    notice: str = ""
    """What the run put before its reply for the person reading it (e.g. that a cheaper model
    answers because today's quota is used up); already part of ``text``."""

    @property
    def ok(self) -> bool:
        """True when the run succeeded."""
        return self.status == "success"

    def raise_for_status(self) -> RunResult:
        """Return self if the run succeeded, else raise `RunError` with the reason."""
        if self.status != "success":
            raise RunError(
                f"run {self.status}: {self.error or 'no reason given'}", session=self.session
            )
        return self

    def __str__(self) -> str:
        """The reply text (or the failure) for plain printing."""
        return self.text if self.ok else f"[{self.status}] {self.error or ''}".rstrip()
