"""Repeat detection: the same tool with the same arguments, giving the same result, again and again.

Small models loop (14 identical ``meme`` calls in one run were seen). Within one run, once a
call with given arguments has run ``limit`` times in a row with the same result, a further
identical call is not run: the model is told the earlier result instead. A call whose result
changes (polling a process that makes progress) never counts as a repeat — unless the tool has
side effects: creating a reminder seven times gives seven new ids, seven different results, and
seven reminders, so for such a tool every identical call counts whatever it returned.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from ..text import cut

__all__ = [
    "EFFECT_REPEAT_ERROR",
    "REPEAT_ERROR",
    "Claim",
    "RepeatGuard",
    "canonical_arguments",
    "repeat_text",
]

REPEAT_ERROR = (
    "not run: repeated call (same arguments and result {count} times; agent.max_repeat_calls)"
)
EFFECT_REPEAT_ERROR = (
    "not run: repeated call of a tool with side effects (same arguments {count} times; "
    "agent.max_repeat_calls)"
)
_RESULT_CHARS = 2000  # the repeated result is already in the conversation: a reminder suffices


def canonical_arguments(arguments: str) -> str:
    """Arguments text that is equal for equal JSON (key order and spacing do not matter)."""
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):  # not JSON, or nested too deep: compare the text
        return arguments.strip()
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def repeat_text(name: str, count: int, result: str, *, effectful: bool = False) -> str:
    """What the model is told instead of running a repeated call."""
    shown = cut(result, _RESULT_CHARS)
    if effectful:
        return (
            f"Not run: you already called {name} with these arguments {count} times in this "
            "request, and each call already did what it does (it changes things, so it is "
            f"not run again). The last result was:\n{shown}\nDo not call it again with these "
            "arguments; answer the user."
        )
    return (
        f"Not run: you already called {name} with these arguments {count} times in this "
        f"request and the result was the same each time. The result was:\n{shown}\n"
        "Use that result, call with different arguments, or answer the user."
    )


@dataclass
class _Streak:
    """Runs of one (tool, arguments) key: how many in a row gave the same result."""

    name: str
    same: int = 0
    result: str | None = None
    last: asyncio.Future[str] | None = None  # the result of the newest run, maybe still running
    skipped: int = 0
    effectful: bool = False  # a tool with side effects: a changed result does not reset


@dataclass(frozen=True)
class Claim:
    """The decision on one call: run it (and fill ``result``) or repeat (await ``result``)."""

    key: tuple[str, str]
    result: asyncio.Future[str]
    repeat: bool
    count: int  # identical runs in a row that a repeat refers to
    effectful: bool = False  # the tool has side effects (any identical call counts)


@dataclass
class RepeatGuard:
    """Per-run bookkeeping of identical calls; ``limit`` 0 turns it off."""

    limit: int = 3
    _streaks: dict[tuple[str, str], _Streak] = field(default_factory=dict)

    def claim(self, name: str, arguments: str, *, effectful: bool = False) -> Claim:
        """Decide a call now, in call order (so parallel duplicates of one round count too).

        ``effectful``: the tool has side effects, so its identical calls count whatever their
        results.
        """
        key = (name, canonical_arguments(arguments))
        streak = self._streaks.setdefault(key, _Streak(name, effectful=effectful))
        if self.limit and streak.same >= self.limit and streak.last is not None:
            streak.skipped += 1
            return Claim(key, streak.last, True, streak.same, streak.effectful)
        streak.same += 1
        streak.last = asyncio.get_running_loop().create_future()
        return Claim(key, streak.last, False, streak.same, streak.effectful)

    def ran(self, claim: Claim, result: str) -> None:
        """Note the result of a call that ran; a changed result starts a fresh streak.

        Not for a tool with side effects: each of its calls did something, whatever it said.
        """
        streak = self._streaks[claim.key]
        if streak.result is not None and result != streak.result and not streak.effectful:
            streak.same = 1
        streak.result = result
        if not claim.result.done():
            claim.result.set_result(result)

    def abandon(self, claim: Claim) -> None:
        """A call that was to run ended without a result: release the repeats waiting on it."""
        if not claim.repeat and not claim.result.done():
            claim.result.cancel()

    def warnings(self) -> list[str]:
        """One line per repeated call that was not run, for the run record."""
        return [
            f"{streak.name} was called {streak.skipped} more time(s) with the same arguments "
            f"after {streak.same} {'run(s)' if streak.effectful else 'identical result(s)'}; "
            "those calls were not run"
            for streak in self._streaks.values()
            if streak.skipped
        ]
