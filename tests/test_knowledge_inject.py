"""Auto-inject on real LanceDB files: thresholds, scopes, cuts, memory budget, scene prompt.

Vectors come from the scripted server's `/v1/embeddings` (deterministic bigram vectors), so the
similarity gate and the inject timeout are tested over real HTTP.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from ania_nb.config import Config
from ania_nb.knowledge import GLOBAL_SCOPE, Knowledge
from ania_nb.knowledge.inject import (
    KB_HEADER,
    MEMORY_HEADER,
    Injection,
    auto_inject,
    memory_block,
    scene_prompt,
)
from ania_nb.knowledge.model import MemoryEntry
from ania_nb.testing import delay, reply

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

DEPLOY = "To deploy the service, run make deploy from the repository root."


def make_config(**overrides: Any) -> Config:
    values: dict[str, Any] = {"embedding.provider": "none"}
    values.update(overrides)
    return Config().with_overrides(values)


def endpoint_config(llm: Any, **overrides: Any) -> Config:
    return make_config(
        **{
            "embedding.provider": "endpoint",
            "embedding.base_url": llm.base_url,
            "embedding.api_key": llm.api_key,
            "embedding.model": "scripted-embed",
            **overrides,
        }
    )


def day(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(ts))


def inside(found: Injection | None) -> str:
    """The injected block between its start and end marker lines (which it must have)."""
    assert found is not None
    start, _, rest = found.block.partition("\n")
    body, _, end = rest.rpartition("\n")
    assert (start, end) == ("<knowledge>", "</knowledge>")
    return body


@pytest.fixture
async def knowledge(tmp_path: Path) -> Any:
    k = Knowledge(make_config(), tmp_path)
    yield k
    await k.aclose()


async def test_nothing_stored_means_nothing_injected_and_nothing_opened(tmp_path: Path) -> None:
    k = Knowledge(make_config(**{"memory.auto_inject": True}), tmp_path)
    assert await auto_inject(k, "nb:a", "how do I deploy?", k.store.config) is None
    assert not k.exists() and not (tmp_path / "knowledge").exists()
    await k.aclose()


async def test_matching_chunks_of_the_session_and_global_are_injected(
    knowledge: Knowledge,
) -> None:
    config = make_config()
    mine = (await knowledge.kb.add("nb:a", "Deploying", DEPLOY)).document
    shared = (
        await knowledge.kb.add(GLOBAL_SCOPE, "Deploy policy", "Deploy only on weekdays.")
    ).document
    await knowledge.kb.add("nb:other", "Their deploy", "deploy deploy deploy secrets")
    await knowledge.kb.add("nb:a", "Cooking", "Boil the pasta for nine minutes.")

    found = await auto_inject(knowledge, "nb:a", "deploy", config)
    assert isinstance(found, Injection)
    lines = inside(found).split("\n")
    assert lines[0] == KB_HEADER
    assert sorted(lines[1:]) == [
        '"Deploy policy": Deploy only on weekdays.',
        f'"Deploying" (nb:a): {DEPLOY}',
    ]
    assert {h.doc_id for h in found.hits} == {mine.id, shared.id}
    assert found.memories == []
    event = found.event()
    assert [c["doc_id"] for c in event["chunks"]] == [h.doc_id for h in found.hits]
    assert set(event["chunks"][0]) == {
        "doc_id", "chunk_id", "title", "scope", "score", "similarity", "match"
    }  # fmt: skip
    assert event["chunks"][0]["match"] == 1.0 and event["memories"] == []

    assert await auto_inject(knowledge, "nb:a", "quantum chromodynamics", config) is None
    assert await auto_inject(knowledge, "nb:a", "   ", config) is None


async def test_keyword_share_gate_and_switches(knowledge: Knowledge) -> None:
    await knowledge.kb.add("nb:a", "Deploying", DEPLOY)
    query = "deploy zebra"  # half of its keywords are in the chunk
    [hit] = await knowledge.kb.search(query, ["nb:a", GLOBAL_SCOPE])
    assert 0 < hit.match < 1
    at = make_config(**{"kb.inject_min_match": hit.match})
    above = make_config(**{"kb.inject_min_match": min(1.0, hit.match + 0.01)})
    assert (await auto_inject(knowledge, "nb:a", query, at)) is not None
    assert await auto_inject(knowledge, "nb:a", query, above) is None
    for off in ({"kb.auto_inject": False}, {"kb.enable": False}):
        assert await auto_inject(knowledge, "nb:a", "deploy", make_config(**off)) is None


async def test_top_k_and_the_cut_of_each_chunk(knowledge: Knowledge) -> None:
    for i in range(5):
        await knowledge.kb.add("nb:a", f"Note {i}", f"release checklist item {i}: " + "x" * 300)
    config = make_config(**{"kb.inject_top_k": 2, "kb.inject_chars": 60})
    found = await auto_inject(knowledge, "nb:a", "release checklist", config)
    assert found is not None and len(found.hits) == 2
    lines = inside(found).split("\n")
    assert lines[0] == KB_HEADER and len(lines) == 3
    for line, h in zip(lines[1:], found.hits, strict=True):
        passage = line.split("): ", 1)[1]
        assert len(passage) == 60 and passage.endswith("…")
        assert h.text.startswith(passage[:-1])


async def test_similarity_gate_with_endpoint_vectors(llm: Any, tmp_path: Path) -> None:
    base = endpoint_config(llm, **{"kb.inject_min_match": 1.0})  # keywords alone never qualify
    k = Knowledge(base, tmp_path)
    try:
        await k.kb.add("nb:a", "Deploying", DEPLOY)
        query = "deploying services from a repository"
        [hit] = await k.kb.search(query, ["nb:a"])
        assert hit.similarity is not None and hit.match < 1.0
        at = endpoint_config(
            llm, **{"kb.inject_min_match": 1.0, "kb.inject_min_similarity": hit.similarity}
        )
        above = endpoint_config(
            llm,
            **{"kb.inject_min_match": 1.0, "kb.inject_min_similarity": hit.similarity + 0.01},
        )
        found = await auto_inject(k, "nb:a", query, at)
        assert found is not None and found.hits[0].similarity == hit.similarity
        assert await auto_inject(k, "nb:a", query, above) is None
    finally:
        await k.aclose()


async def test_a_slow_endpoint_falls_back_to_keywords_within_the_inject_timeout(
    llm: Any, tmp_path: Path
) -> None:
    config = endpoint_config(llm, **{"embedding.inject_timeout": 0.2})
    k = Knowledge(config, tmp_path)
    try:
        await k.kb.add("nb:a", "Deploying", DEPLOY)
        llm.embeddings.script(delay(3))  # the query vector would come too late
        found = await auto_inject(k, "nb:a", "make deploy", config)
        assert found is not None and found.hits[0].similarity is None
        assert found.hits[0].match == 1.0
    finally:
        await k.aclose()


async def test_memories_join_when_enabled(knowledge: Knowledge) -> None:
    tea, _ = await knowledge.memory.save("nb:a", "Alice drinks green tea every morning")
    await knowledge.memory.save("nb:a", "Bob dislikes tea")
    await knowledge.memory.save("nb:a", "The tea shop closes at six")
    await knowledge.memory.save("nb:a", "Carol brings tea on Fridays")
    await knowledge.memory.save("nb:other", "tea secrets of another chat")
    await knowledge.kb.add("nb:a", "Tea", "Green tea is brewed at 80 degrees.")

    assert (await auto_inject(knowledge, "nb:a", "green tea", make_config())).memories == []

    on = {"memory.auto_inject": True}
    found = await auto_inject(knowledge, "nb:a", "green tea", make_config(**on))
    assert found is not None and len(found.memories) == 3  # inject_max 3
    kb_part, memory_part = inside(found).split("\n\n")
    assert kb_part.startswith(KB_HEADER)
    lines = memory_part.split("\n")
    assert lines[0] == MEMORY_HEADER
    assert (
        lines[1] == f"[{tea.id}] Alice drinks green tea every morning (saved {day(tea.created_at)})"
    )
    assert all("another chat" not in line for line in lines)
    assert found.event()["memories"][0] == {"id": tea.id, "content": tea.content}

    two = await auto_inject(knowledge, "nb:a", "tea", make_config(**on, **{"memory.inject_max": 2}))
    assert two is not None and len(two.memories) == 2
    unlimited = make_config(**on, **{"memory.inject_max": 0, "kb.enable": False})
    everything = await auto_inject(knowledge, "nb:a", "tea", unlimited)
    assert everything is not None and len(everything.memories) == 4  # 0 = all that fit
    assert inside(everything).startswith(MEMORY_HEADER)

    off_kb = make_config(**on, **{"kb.auto_inject": False})
    only_memory = await auto_inject(knowledge, "nb:a", "green tea", off_kb)
    assert only_memory is not None and only_memory.hits == []


def test_memory_budget_cuts_the_last_line_and_drops_the_rest() -> None:
    ts = 1_700_000_000.0
    entries = [MemoryEntry(f"0000000{i}", "nb:a", "m" * 100, created_at=ts) for i in range(4)]
    text, kept = memory_block(entries, 300)  # lines of 126: two whole, the third cut
    lines = text.split("\n")
    assert lines[0] == MEMORY_HEADER
    assert sum(len(line) for line in lines[1:]) == 300
    assert lines[-1].endswith("…") and len(kept) == len(lines) - 1 == 3
    assert kept == entries[:3]
    assert memory_block(entries, 30) == ("", [])  # not even one useful line fits
    assert memory_block([], 1500) == ("", [])


async def test_a_failing_search_is_logged_and_injects_nothing(
    knowledge: Knowledge, caplog: pytest.LogCaptureFixture
) -> None:
    await knowledge.kb.add("nb:a", "Deploying", DEPLOY)
    with caplog.at_level(logging.ERROR, logger="ania_nb.knowledge.inject"):
        assert await auto_inject(knowledge, "bad\x00scope", "deploy", make_config()) is None
    assert "auto-inject: the kb search of" in caplog.text


def test_scene_prompt_paragraphs_follow_the_switches() -> None:
    both = scene_prompt(make_config())
    assert both.startswith("【长期记忆】") and "\n\n【知识库】" in both
    assert "memory_save" in both and "kb_search" in both and "read but not change" in both
    assert "added automatically" in both  # kb.auto_inject is on by default
    only_kb = scene_prompt(make_config(**{"memory.enable": False}))
    assert only_kb.startswith("【知识库】") and "memory_save" not in only_kb
    quiet = scene_prompt(make_config(**{"memory.enable": False, "kb.auto_inject": False}))
    assert "added automatically" not in quiet
    assert scene_prompt(make_config(**{"memory.enable": False, "kb.enable": False})) == ""


async def test_agent_injects_into_the_turn_but_not_the_history(make_agent: Any, llm: Any) -> None:
    agent = make_agent(overrides={"agent.builtin_tools": True, "embedding.provider": "none"})
    await agent.knowledge.kb.add(GLOBAL_SCOPE, "Deploying", DEPLOY)
    llm.script(reply("use make deploy"), reply("you are welcome"))
    await agent.chat("how do I make deploy work?", session="nb:a")
    turn = "\n".join(str(m["content"]) for m in llm.requests[-1].messages)
    assert KB_HEADER in turn and f'"Deploying": {DEPLOY}' in turn
    await agent.chat("thanks", session="nb:a")
    later = json.dumps(llm.requests[-1].messages, ensure_ascii=False)
    assert "how do I make deploy work?" in later and KB_HEADER not in later
