"""Costs: tokens by model times configured prices; a model without a price has no cost."""

from __future__ import annotations

from collections.abc import Mapping

from ..config import ModelPrice
from ..engine.usage import Tokens, Usage

PER = 1_000_000  # prices are per million tokens


def price_of(tokens: Tokens, price: ModelPrice) -> float:
    """The cost of ``tokens`` at ``price`` (cached prompt tokens at the cached price if set)."""
    cached = min(tokens.cached, tokens.prompt)
    cached_price = price.input if price.cached is None else price.cached
    fresh = tokens.prompt - cached
    return (fresh * price.input + cached * cached_price + tokens.completion * price.output) / PER


def cost(by_model: Mapping[str, Tokens], prices: Mapping[str, ModelPrice]) -> float | None:
    """The cost of every model's tokens; None if nothing was used or any model is unpriced."""
    used = {m: t for m, t in by_model.items() if t.total or t.prompt or t.completion}
    if not used or any(m not in prices for m in used):
        return None
    return sum(price_of(t, prices[m]) for m, t in used.items())


def usage_cost(usage: Usage, prices: Mapping[str, ModelPrice]) -> float | None:
    """The cost of a run's tokens, its own and those of work it includes (subagents).

    None when any call's tokens were estimated (no usage reported): a cost is never a guess.
    """
    if usage.estimated_calls:
        return None
    merged: dict[str, Tokens] = {}
    for part in (usage.models, usage.included):
        for model, tokens in part.items():
            merged.setdefault(model, Tokens()).add(tokens)
    return cost(merged, prices)
