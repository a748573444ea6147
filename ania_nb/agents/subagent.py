"""The subagent runtime: one-shot workers of the main agent [orig §5.2].

A subagent is a `OneShotJob` of kind ``subagent``: no history, the subagent prompt plus the
target session's prompt (its scene), the session's tools minus subagent, team and todo tools
(no recursion), the subagent model and round limit, admin-only approvals, ``SubagentStop``
after every run (all done by `AgentHost.run_one_shot`). This module adds what every caller
needs around that: the time budget (`child_budget`), the run itself with its usage and live
events (`run_subagent`), and the text handed back (`format_result`).

The budget is computed in a fixed order, fixing the original's: the requested timeout is
clamped to 1800 s *first*, then shrunk to leave the parent 30 s before its own deadline; with
30 s or less left nothing starts (`BudgetError`, a tool error the model reads).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..engine.callbacks import NO_CALLBACKS, Callbacks, RunEvent
from ..engine.usage import Usage
from ..errors import ToolError
from ..orchestration.oneshot import OneShotJob
from ..text import cut

if TYPE_CHECKING:  # pragma: no cover
    from ..orchestration.host import AgentHost
    from ..result import RunResult
    from ..tools import Role

__all__ = [
    "MAX_TIMEOUT",
    "PARENT_RESERVE",
    "SUBAGENT_PROMPT",
    "TASK_PREFIX",
    "BudgetError",
    "SubagentOutcome",
    "child_budget",
    "clamp_timeout",
    "compose_prompt",
    "failure_text",
    "format_result",
    "run_subagent",
    "subagent_prompt",
    "truncate_result",
]

MAX_TIMEOUT = 1800.0  # no child may ask for more seconds than this
PARENT_RESERVE = 30.0  # seconds the parent keeps for itself after its children's deadline
TASK_PREFIX = "【子代理任务】\n"  # the model-facing marker of a subagent's input

SUBAGENT_PROMPT = (
    "## Subagent\n"
    "You are a subagent: a worker the main agent started for one self-contained task. You have "
    "no chat history and nobody to ask; everything you need is in the task and your tools. "
    "Your final reply is returned to the main agent as your result, so make it complete and to "
    "the point: the findings, facts or output the task asks for, with no greetings, small talk "
    "or questions back. Your intermediate messages are not sent to anyone."
)


class BudgetError(ToolError):
    """A child cannot start: its parent has too little time left."""


def clamp_timeout(requested: float | None, default: float) -> float:
    """The requested seconds (None or ≤0: ``default``), clamped to at most `MAX_TIMEOUT`."""
    seconds = default if requested is None or requested <= 0 else float(requested)
    return min(seconds, MAX_TIMEOUT)


def child_budget(
    requested: float | None,
    default: float,
    deadline: float | None,
    *,
    shrink: bool = True,
    what: str = "subagent",
    now: Callable[[], float] = time.monotonic,
) -> float:
    """Seconds a child may run: clamp first, then leave the parent `PARENT_RESERVE` seconds.

    ``deadline`` is the parent's (on the ``now`` clock, ``time.monotonic()``, which tests
    replace; None or 0 = none). With ``shrink=False`` (background children outlive their
    launcher) the deadline is only checked. Raises `BudgetError` when the parent has
    `PARENT_RESERVE` seconds or less left.
    """
    budget = clamp_timeout(requested, default)
    if not deadline:
        return budget
    left = deadline - now()
    if left <= PARENT_RESERVE:
        raise BudgetError(
            f"cannot start {what}: not enough remaining time (this request has "
            f"{max(left, 0.0):.0f} s left and needs more than {PARENT_RESERVE:.0f} s); "
            "do the work yourself or answer without it"
        )
    return min(budget, left - PARENT_RESERVE) if shrink else budget


async def check_quota(host: AgentHost, session: str, what: str = "subagent") -> None:
    """`ToolError` (the model's tool result) when a daily token quota refuses new work."""
    denied = await host.quota_denial(session)
    if denied is not None:
        raise ToolError(f"{what} not started: {denied}")


def subagent_prompt() -> str:
    """The role part of a subagent's system prompt."""
    return SUBAGENT_PROMPT


def compose_prompt(base: str, scene: str) -> str:
    """A child's system prompt: its role (``base``), then the session's prompt (``scene``)."""
    return f"{base}\n\n{scene}" if scene.strip() else base


def truncate_result(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, noting the original length when it was cut."""
    note = f"\n… (result too long, cut; the original has {len(text)} characters)"
    return cut(text, limit, marker=note)


@dataclass
class SubagentOutcome:
    """How one subagent run went (the result is None when it never returned one)."""

    task: str
    result: RunResult | None = None
    error: str = ""
    elapsed: float = 0.0
    usage: Usage = field(default_factory=Usage)
    cancelled: bool = False

    @property
    def status(self) -> str:
        """success, timeout, error or stopped."""
        if self.cancelled:
            return "stopped"
        if self.result is None:
            return "error"
        return self.result.status

    @property
    def ok(self) -> bool:
        """Whether the subagent finished successfully."""
        return self.status == "success"

    @property
    def text(self) -> str:
        """The subagent's final reply, in full ("" if none)."""
        return self.result.text if self.result is not None else ""

    def end_data(self) -> dict[str, Any]:
        """The data of the ``child_end`` event."""
        return {
            "status": self.status,
            "text": self.text,
            "error": self.error,
            "elapsed": round(self.elapsed, 3),
            "usage": self.usage.to_dict(),
        }


def format_result(
    outcome: SubagentOutcome, max_len: int, *, header: str = "[Subagent finished]"
) -> str:
    """Metadata line (time, LLM rounds, tokens, cut or not), a new line, the (cut) reply."""
    reply = outcome.text.strip()
    cut = len(reply) > max_len
    meta = (
        f"took {outcome.elapsed:.1f}s · LLM rounds {outcome.usage.iterations} · "
        f"tokens {outcome.usage.total_tokens}"
    )
    if cut:
        meta += " · result truncated"
    body = truncate_result(reply, max_len) if reply else "(the subagent returned nothing)"
    return f"{header} {meta}\n{body}".lstrip()


def failure_text(outcome: SubagentOutcome, timeout: float) -> str:
    """Why a subagent did not succeed, for the model."""
    if outcome.status == "timeout":
        return f"subagent timed out ({timeout:.0f} s), aborted"
    if outcome.status == "stopped":
        return "subagent was cancelled"
    return f"subagent failed: {outcome.error or outcome.status}"


async def run_subagent(
    host: AgentHost,
    session: str,
    task: str,
    budget: float,
    *,
    kind: Literal["subagent", "team_member"] = "subagent",
    system_prompt: str | None = None,
    callbacks: Callbacks = NO_CALLBACKS,
    on_event: Callable[[RunEvent], Any] | None = None,
    usage: Usage | None = None,
    max_iterations: int | None = None,
    outcome: SubagentOutcome | None = None,
    role: Role = "member",
    hidden: frozenset[str] = frozenset(),
) -> SubagentOutcome:
    """Run one subagent on ``task`` for ``session`` within ``budget`` seconds (see `child_budget`).

    ``kind="team_member"`` with the member's ``system_prompt`` runs a team member (default:
    the subagent prompt). ``callbacks`` are the front end's (images, files and approvals pass);
    ``on_event`` gets the child's live events. The child's tokens land in the outcome's usage
    (and in ``usage`` when given, even when the run is cancelled). Pass ``outcome`` to fill one
    the caller holds (it stays complete when cancellation propagates). A failed run is in the
    outcome, never raised. ``role`` is the role of the run that started the child (it may use
    the tools that role may use); ``hidden`` are tools the child may not see besides its kind's.
    """
    if system_prompt is None:
        system_prompt = compose_prompt(SUBAGENT_PROMPT, host.system_prompt_for(session))
    outcome = outcome if outcome is not None else SubagentOutcome(task)
    job = OneShotJob(
        kind=kind,
        session=session,
        text=TASK_PREFIX + task,
        system_prompt=system_prompt,
        timeout=budget,
        callbacks=callbacks,
        on_event=on_event,
        usage=outcome.usage,
        max_iterations=max_iterations,
        role=role,
        hidden=hidden,
    )
    started = time.monotonic()
    try:
        outcome.result = await host.run_one_shot(job)
        if not outcome.result.ok:
            outcome.error = outcome.result.error or outcome.result.status
    except asyncio.CancelledError:
        outcome.cancelled = True
        outcome.error = "cancelled"
        raise
    except Exception as exc:  # a crash is this child's failure, not its parent's
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        outcome.elapsed = time.monotonic() - started
        if usage is not None:
            usage.include(outcome.usage)
    return outcome


def child_event(
    session: str,
    call_id: str,
    child_id: str,
    label: str,
    kind: str,
    data: dict[str, Any],
    *,
    background: bool = False,
) -> RunEvent:
    """A ``child`` event: one event of a child run, shown nested under its parent's tool call."""
    payload = {
        "call_id": call_id,
        "child_id": child_id,
        "label": label,
        "kind": kind,
        "data": data,
        "background": background,
    }
    return RunEvent("child", session, payload)
