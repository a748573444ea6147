"""Token usage accounting, summed over every LLM call of a run."""

from __future__ import annotations

import contextvars
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .messages import Message, estimate_tokens

if TYPE_CHECKING:
    from ._llm_wire import Completion

# The session the work running now is counted for: set by the run path for each run (its tool
# calls inherit it), read by what counts tokens outside the model calls (an embeddings endpoint).
_charged: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "ania_charged_session", default=None
)


def charged_session() -> str | None:
    """The session the work running now counts for (None: no run, e.g. a notebook cell)."""
    return _charged.get()


@contextmanager
def charging(session: str | None) -> Iterator[None]:
    """Count the work inside the block (and the tasks it starts) for ``session``."""
    token = _charged.set(session)
    try:
        yield
    finally:
        _charged.reset(token)


@dataclass
class Tokens:
    """Token counts of some LLM calls: prompt, completion, cached prompt and total."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    total: int = 0

    def add(self, other: Tokens) -> None:
        """Add ``other``'s counts."""
        self.prompt += other.prompt
        self.completion += other.completion
        self.cached += other.cached
        self.total += other.total


@dataclass
class Usage:
    """Tokens used by a run.

    ``prompt/completion/total/cached`` are sums over all LLM calls; ``last_prompt_tokens`` is the
    prompt size of the most recent call (what the context window compares against its budget);
    ``iterations`` counts LLM calls of the tool loop, including the forced final answer.

    ``models`` splits the run's own calls by the model asked; ``included`` holds work that has
    its own run record (subagents, team members, clock children, background work), added to the
    sums for the user but counted by quotas under that record. ``cost`` is set at the end of a
    run when ``pricing`` covers every model used (else None: never a guess).

    ``estimated_calls`` counts calls whose provider reported no usage (or a runaway reply the
    client cut): their tokens are estimated from the text, so quotas still see them, and no cost
    is given for a run that has any.

    ``calls`` lists the own calls one by one, ``(model, tokens)``, in the order they were
    answered; the first ``counted_calls`` of them are in the store's usage ledger already (the
    run path counts them with the step that stores each call's result: see `uncounted`).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    last_prompt_tokens: int = 0
    iterations: int = 0
    models: dict[str, Tokens] = field(default_factory=dict)
    included: dict[str, Tokens] = field(default_factory=dict)
    cost: float | None = None
    estimated_calls: int = 0
    calls: list[tuple[str, Tokens]] = field(default_factory=list, repr=False)
    counted_calls: int = field(default=0, repr=False)

    def add_call(self, raw: Any, *, model: str = "", count_iteration: bool = True) -> None:
        """Add the ``usage`` block of one chat completion (object or dict) asked of ``model``.

        None adds nothing; ``total_tokens`` is at least prompt + completion (a provider that
        reports less does not get to count less).
        """
        if count_iteration:
            self.iterations += 1
        if raw is None:
            return
        get = raw.get if isinstance(raw, dict) else lambda k, d=None: getattr(raw, k, d)
        prompt = _count(get("prompt_tokens", 0))
        completion = _count(get("completion_tokens", 0))
        total = max(_count(get("total_tokens", 0)), prompt + completion)
        tokens = Tokens(prompt, completion, _cached_tokens(raw, get), total)
        self._add_own(model, tokens)
        self.last_prompt_tokens = prompt

    def add_completion(
        self,
        completion: Completion,
        sent: Sequence[Message],
        definitions: Sequence[dict[str, Any]] | None = None,
        *,
        count_iteration: bool = True,
    ) -> None:
        """Add one answered call: its reported usage, or an estimate when it reported none."""
        model = completion.asked or completion.model
        self.add_call(completion.usage, model=model, count_iteration=count_iteration)
        if completion.usage is None:  # none reported (or a runaway cut): quotas count an estimate
            self.add_estimate(estimate_call(sent, definitions, completion.message), model=model)

    def add_estimate(self, tokens: Tokens, *, model: str = "") -> None:
        """Add the estimated tokens of a call that came without usage (see `estimated_calls`).

        The context window keeps its own estimate: ``last_prompt_tokens`` is left as it was.
        """
        self.estimated_calls += 1
        self._add_own(model, tokens)

    def merge(self, other: Usage) -> None:
        """Add work that belongs to this run's record (a compaction, say); not its iterations."""
        self._add_sums(other.tokens())
        _add_models(self.models, other.models)
        _add_models(self.included, other.included)
        self.estimated_calls += other.estimated_calls
        self.calls.extend(other.uncounted())

    def include(self, other: Usage) -> None:
        """Add work recorded under its own run record (a subagent): shown here, counted there."""
        self._add_sums(other.tokens())
        _add_models(self.included, other.models)
        _add_models(self.included, other.included)
        self.estimated_calls += other.estimated_calls

    def tokens(self) -> Tokens:
        """The sums as `Tokens`."""
        return Tokens(
            self.prompt_tokens, self.completion_tokens, self.cached_tokens, self.total_tokens
        )

    def own(self) -> dict[str, Tokens]:
        """Tokens of this run's own calls by model (what its record counts toward quotas)."""
        return {m: t for m, t in self.models.items() if t.total or t.prompt or t.completion}

    def uncounted(self) -> list[tuple[str, Tokens]]:
        """The own calls not counted in the usage ledger yet, ``(model, tokens)`` in order."""
        return self.calls[self.counted_calls :]

    def mark_counted(self, calls: int) -> None:
        """Note that the next ``calls`` of `uncounted` are in the ledger now."""
        self.counted_calls = min(len(self.calls), self.counted_calls + calls)

    @property
    def own_tokens(self) -> int:
        """Total tokens of this run's own calls."""
        return sum(t.total for t in self.models.values())

    def _add_own(self, model: str, tokens: Tokens) -> None:
        """Add one own call: to the sums, its model's tally and the list of calls."""
        self._add_sums(tokens)
        self.models.setdefault(model, Tokens()).add(tokens)
        self.calls.append((model, tokens))

    def _add_sums(self, tokens: Tokens) -> None:
        self.prompt_tokens += tokens.prompt
        self.completion_tokens += tokens.completion
        self.total_tokens += tokens.total
        self.cached_tokens += tokens.cached

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


def estimate_call(
    messages: Sequence[Message], definitions: Sequence[dict[str, Any]] | None, reply: Message
) -> Tokens:
    """Tokens of a call whose provider reported none, estimated like the context window does."""
    tools = json.dumps(list(definitions or ()), ensure_ascii=False)
    prompt = estimate_tokens([*messages, {"role": "system", "content": tools}])
    completion = estimate_tokens([reply])
    return Tokens(prompt, completion, 0, prompt + completion)


def _add_models(into: dict[str, Tokens], more: Mapping[str, Tokens]) -> None:
    for model, tokens in more.items():
        into.setdefault(model, Tokens()).add(tokens)


def _count(value: Any) -> int:
    """A token count from a provider's field: non-negative int, anything else 0."""
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


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
            return _count(value)
    hit = get("prompt_cache_hit_tokens", None)
    if hit is None and not isinstance(raw, dict):
        hit = (getattr(raw, "model_extra", None) or {}).get("prompt_cache_hit_tokens")
    return _count(hit)
