"""`RunResult`: what `Agent.chat` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .engine.loop import ToolCallResult
from .engine.usage import Usage
from .errors import RunError

RunStatus = Literal["success", "stopped", "timeout", "error", "denied", "interrupted"]


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
