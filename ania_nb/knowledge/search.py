"""Hybrid ranking: full-text and vector candidates fused by a weighted linear combination.

Reciprocal-rank fusion was measured and rejected (bench/knowledge.py): it gives a same-language
keyword rank as much weight as a vector rank, so a query in one language about material in the
other loses its only good signal. A linear combination weighted toward the vector similarity
keeps it.

BM25 over character n-grams finds Chinese without a dictionary, but in English text some
n-grams of any query occur everywhere, and a BM25 score is only meaningful relative to the other
candidates. So the keyword score is the BM25 score normalised by the query's best one, scaled by
the share of the query's keywords the chunk really contains (``match``): a chunk sharing only
n-gram noise with the query keeps at most a quarter of its keyword score. ``score`` is in 0..1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

SearchMode = Literal["hybrid", "fts", "vector"]
MODES: tuple[str, ...] = ("hybrid", "fts", "vector")
NOISE_SHARE = 0.25  # keyword score left to a candidate that contains none of the query's words


@dataclass(frozen=True)
class Ranked:
    """A fused candidate: its row, the score that ranks it and its vector similarity."""

    row: dict[str, Any]
    score: float
    similarity: float | None
    match: float


def sql_string(value: str) -> str:
    """A SQL string literal (single quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


def scope_filter(scopes: Sequence[str]) -> str:
    """A WHERE clause matching rows of any of ``scopes``."""
    return f"scope IN ({', '.join(sql_string(s) for s in scopes)})"


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return float(sum(x * y for x, y in zip(a, b, strict=False)))


def fuse(
    text_rows: Sequence[dict[str, Any]],
    vector_rows: Sequence[dict[str, Any]],
    *,
    weight: float,
    query_vector: Sequence[float] | None,
    match: Callable[[dict[str, Any]], float],
) -> list[Ranked]:
    """Merge both candidate lists by row id into ranked candidates (unsorted).

    A keyword-only candidate gets its similarity from its stored vector when both exist; a
    vector-only candidate has keyword score 0. Without a query vector the keyword score ranks
    alone; without keyword candidates the similarity does.
    """
    best = max((float(r.get("_score") or 0.0) for r in text_rows), default=0.0)
    keyword = {
        r["id"]: (float(r.get("_score") or 0.0) / best if best > 0 else 0.0) for r in text_rows
    }
    similarity: dict[str, float] = {
        r["id"]: 1.0 - float(r["_distance"]) for r in vector_rows if r.get("_distance") is not None
    }
    rows: dict[str, dict[str, Any]] = {}
    for r in [*text_rows, *vector_rows]:
        rows.setdefault(r["id"], r)
    ranked: list[Ranked] = []
    for row_id, row in rows.items():
        sim = similarity.get(row_id)
        stored = row.get("vector")
        if sim is None and query_vector is not None and stored is not None:
            sim = _dot(query_vector, stored)
        share = match(row)
        kw = keyword.get(row_id, 0.0) * (NOISE_SHARE + (1.0 - NOISE_SHARE) * share)
        if query_vector is None:
            score = kw
        elif not text_rows:
            score = max(sim or 0.0, 0.0)
        else:
            score = weight * max(sim or 0.0, 0.0) + (1.0 - weight) * kw
        ranked.append(Ranked(row, score, sim, share))
    return ranked


def order(ranked: Sequence[Ranked], local_scope: str | None) -> list[Ranked]:
    """Best first; on equal scores the session's own rows before global ones."""
    return sorted(ranked, key=lambda r: (-round(r.score, 6), r.row.get("scope") != local_scope))
