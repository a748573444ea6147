"""Token usage accounting, summed over every LLM call of a run."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


@dataclass
class Usage:
    """Tokens used by a run.

    ``prompt/completion/total/cached`` are sums over all LLM calls; ``last_prompt_tokens`` is the
    prompt size of the most recent call (what the context window compares against its budget);
    ``iterations`` counts LLM calls of the tool loop, including the forced final answer.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    last_prompt_tokens: int = 0
    iterations: int = 0

    def add_call(self, raw: Any, *, count_iteration: bool = True) -> None:
        """Add the ``usage`` block of one chat completion (object or dict); None adds nothing."""
        if count_iteration:
            self.iterations += 1
        if raw is None:
            return
        get = raw.get if isinstance(raw, dict) else lambda k, d=None: getattr(raw, k, d)
        prompt = int(get("prompt_tokens", 0) or 0)
        completion = int(get("completion_tokens", 0) or 0)
        total = int(get("total_tokens", 0) or 0) or prompt + completion
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.total_tokens += total
        self.cached_tokens += _cached_tokens(raw, get)
        self.last_prompt_tokens = prompt

    def merge(self, other: Usage) -> None:
        """Add another run's token counts (not its iterations or last prompt size)."""
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.total_tokens += other.total_tokens
        self.cached_tokens += other.cached_tokens

    def to_dict(self) -> dict[str, int]:
        """Plain-dict form for storage and display."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "cached_tokens": self.cached_tokens,
            "last_prompt_tokens": self.last_prompt_tokens,
            "iterations": self.iterations,
        }


def _cached_tokens(raw: Any, get: Any) -> int:
    """Cached prompt tokens: ``prompt_tokens_details.cached_tokens`` or DeepSeek's field."""
    details = get("prompt_tokens_details", None)
    if details is not None:
        value = (
            details.get("cached_tokens")
            if isinstance(details, dict)
            else getattr(details, "cached_tokens", None)
        )
        if value:
            return int(value)
    hit = get("prompt_cache_hit_tokens", None)
    if hit is None and not isinstance(raw, dict):
        hit = (getattr(raw, "model_extra", None) or {}).get("prompt_cache_hit_tokens")
    return int(hit or 0)


class UsageAccumulator:
    """Thread- and task-safe running total for work outside the main loop (subagents, OCR)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._usage = Usage()

    def add(self, usage: Usage) -> None:
        """Add a finished piece of work's usage."""
        with self._lock:
            self._usage.merge(usage)

    def take(self) -> Usage:
        """Return the total so far and reset it."""
        with self._lock:
            usage, self._usage = self._usage, Usage()
            return usage
