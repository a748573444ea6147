"""Hybrid ranking: meaning and keyword share, combined linearly, over the candidates.

Measured on a labelled bilingual set (bench/knowledge.py, bench/RESULTS.md):

- Reciprocal-rank fusion was rejected: it gives a same-language keyword rank as much weight as a
  vector rank, so a query in one language about material in the other loses its only good
  signal (r@1 0.00 Chinese→English).
- BM25 over 1–3-character n-grams finds Chinese without a dictionary, but some n-grams of any
  query occur everywhere, so its best hit is often an accidental one. The keyword part is
  therefore the share of the query's words a chunk really contains (``match``), which is 0 for
  an accidental n-gram hit: ``score = w·similarity + (1 − w)·match`` (r@1 0.86, r@5 1.00 at
  w = 0.8, better than vectors alone, no loss on keyword queries).
- With vectors the full-text query only contributes candidates, and it is what costs at scale
  (581 ms at 100k chunks against 8 ms for the ANN vector search). So it runs while the table is
  small enough to have no ANN index, and after that only for queries naming something exact
  (:func:`wants_exact`: digits, identifiers, quoted text), which a vector may not place.
- Without vectors (``fts`` mode, no embedder, embedder down) the keyword score is BM25
  normalised by the query's best, times ``match``; it ranks alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

SearchMode = Literal["hybrid", "fts", "vector"]
MODES: tuple[str, ...] = ("hybrid", "fts", "vector")

# Tokens a vector may not place but a keyword index does: anything with a digit, identifiers
# with inner punctuation or case changes (snake_case, a.b, a/b, a::b, camelCase, HTTP), double
# quotes (an apostrophe is not a quote: "what's").
_EXACT = re.compile(r"\d|[A-Za-z][_.:/#@-]+[A-Za-z0-9]|[a-z][A-Z]|\b[A-Z]{2,}\b|[\"“”「」『』`]")


def wants_exact(query: str) -> bool:
    """Whether ``query`` names something exact (a number, an identifier, a quoted phrase)."""
    return _EXACT.search(query) is not None


# A quoted phrase, or a run of letters, digits and identifier punctuation.
_TERM = re.compile(r"[\"“「『`]([^\"”」』`]+)[\"”」』`]|[A-Za-z0-9][A-Za-z0-9_.:/#@-]*")


def exact_terms(query: str) -> str:
    """The parts of ``query`` that name something exact, for the full-text index; "" if none.

    ``ZQ-30417 是什么`` → ``ZQ-30417``; ``what does max_docs do`` → ``max_docs``; a quoted
    phrase is kept whole. The other words' n-grams are what makes the full-text search slow at
    scale (a letter or a common character is in most rows), and the vector list finds them.
    """
    terms: list[str] = []
    for found in _TERM.finditer(query):
        term = (found.group(1) or "").strip() or found.group(0).rstrip(".:/#@-")
        if term and (found.group(1) or wants_exact(term)) and term not in terms:
            terms.append(term)
    return " ".join(terms)


@dataclass(frozen=True)
class Ranked:
    """A fused candidate: its row, the score that ranks it and its vector similarity."""

    row: dict[str, Any]
    score: float
    similarity: float | None
    match: float


@dataclass(frozen=True)
class AnnSettings:
    """How the ANN index is built and asked (the ``kb.ann_*`` settings; 0 = LanceDB's default).

    Chosen by ``bench/knowledge.py --scale`` (bench/RESULTS.md): how much of the exact top 5 an
    ANN search finds at 100k chunks of the offline embedder depends on these more than on the
    kind of index.
    """

    index: str = "ivf_flat"
    partitions: int = 0
    nprobes: int = 0
    ef: int = 0
    refine_factor: int = 0

    @classmethod
    def of(cls, kb: Any) -> AnnSettings:
        """The settings of a ``KbSettings`` section."""
        return cls(kb.ann_index, kb.ann_partitions, kb.ann_nprobes, kb.ann_ef, kb.ann_refine_factor)

    def apply(self, query: Any) -> Any:
        """A LanceDB vector query with these search parameters set."""
        if self.nprobes:
            query = query.nprobes(self.nprobes)
        if self.ef:
            query = query.ef(self.ef)
        if self.refine_factor:
            query = query.refine_factor(self.refine_factor)
        return query


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

    With a query vector: ``weight·similarity + (1 − weight)·match``; a keyword-only candidate
    gets its similarity from its stored vector. Without one: ``bm25/best · match``.
    """
    best = max((float(r.get("_score") or 0.0) for r in text_rows), default=0.0)
    bm25 = {r["id"]: float(r.get("_score") or 0.0) for r in text_rows}
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
        if query_vector is None:
            score = (bm25.get(row_id, 0.0) / best if best > 0 else 0.0) * share
        else:
            score = weight * max(sim or 0.0, 0.0) + (1.0 - weight) * share
        ranked.append(Ranked(row, score, sim, share))
    return ranked


def order(ranked: Sequence[Ranked], local_scope: str | None) -> list[Ranked]:
    """Best first; on equal scores the session's own rows before global ones."""
    return sorted(ranked, key=lambda r: (-round(r.score, 6), r.row.get("scope") != local_scope))
