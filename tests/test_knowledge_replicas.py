"""Knowledge shared by replicas: processes adding to one LanceDB on object storage at once.

The slow tests start two real processes (tests/_kb_replica_worker.py) on moto's S3 server
(the `s3_server` fixture), release them together and check what the store promises across
processes: equal documents and memories are stored once (ids made from scope and content,
inserted by a merge Lance conflict-checks on the primary key), none is lost, a document's
chunks are all there, and ``kb.max_docs`` / ``memory.max_entries`` hold. The fast tests cover
the ids, data stored before they were derived, two stores of one process racing, the error
of a conflict Lance cannot retry, and upkeep while another store writes.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from _s3 import BUCKET, s3_options

from ania_nb.config import Config
from ania_nb.knowledge import Knowledge, KnowledgeError, SourceDoc
from ania_nb.knowledge.chunking import dedupe_key
from ania_nb.knowledge.kb import content_id

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

WORKER = Path(__file__).with_name("_kb_replica_worker.py")
LINE_TIMEOUT_S = 300  # two interpreters importing lancedb on a loaded 2-core machine
SCOPE = "g:replicas"
LONG = " ".join(f"Paragraph {i} of the runbook says to check the canary first." for i in range(40))


def s3_config(endpoint: str, **overrides: Any) -> dict[str, Any]:
    """Overrides of both replicas: the bucket, full-text only (no embedder to wait for)."""
    return {
        "embedding.provider": "none",
        "kb.uri": f"s3://{BUCKET}/shared",
        "kb.storage_options": s3_options(endpoint),
        "kb.chunk_chars": 200,  # the long documents have several chunks
        **overrides,
    }


async def _line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    raw = await asyncio.wait_for(proc.stdout.readline(), LINE_TIMEOUT_S)
    if not raw:
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode(errors="replace")
        raise AssertionError(f"worker {proc.pid} ended early ({await proc.wait()}): {err[-3000:]}")
    return raw.decode().strip()


async def replicas(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run one worker per spec; release them together for each call; their reports.

    Each replica gets its next call's line at the same moment, so every document (and
    memory) of one step is added by both at once: for the shared ones a race on every step.
    """
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            json.dumps(spec),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for spec in specs
    ]
    reports: list[dict[str, Any]] = [{"docs": [], "memories": []} for _ in specs]
    try:
        for proc in procs:
            assert await _line(proc) == "ready"
        for _ in range(len(specs[0]["docs"]) + len(specs[0]["memories"])):
            for proc in procs:  # every line written before any is flushed: they start together
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
            for proc in procs:
                assert proc.stdin is not None
                await proc.stdin.drain()
            for proc, report in zip(procs, reports, strict=True):
                step = json.loads(await _line(proc))
                what = "title" if step["kind"] == "doc" else "content"
                item = step["item"][0] if step["kind"] == "doc" else step["item"]
                report["docs" if step["kind"] == "doc" else "memories"].append(
                    {what: item, **{k: v for k, v in step.items() if k not in ("kind", "item")}}
                )
        for proc in procs:
            assert await asyncio.wait_for(proc.wait(), LINE_TIMEOUT_S) == 0
        return reports
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def doc(name: str) -> list[str]:
    """A document (title, content); every third one long enough for several chunks."""
    body = f"{name}: how the service named {name} is deployed and rolled back."
    return [f"Runbook {name}", f"{body} {LONG}" if int(name.rsplit("-", 1)[1]) % 3 == 0 else body]


async def stored(config: dict[str, Any], data_dir: Path) -> tuple[Knowledge, list[dict[str, Any]]]:
    """A third process's view (this one): the store and every chunk row of the kb table."""
    knowledge = Knowledge(Config().with_overrides(config), data_dir)
    table = await knowledge.store.open_table("kb_chunks")
    await table.refresh()
    rows = await table.rows(None, ["id", "doc_id", "scope", "dedupe", "chunk_index", "chunks"])
    return knowledge, rows


async def test_two_replicas_adding_the_same_and_different_documents_store_each_once(
    s3_server: str, tmp_path: Path
) -> None:
    config = s3_config(s3_server)
    shared = [doc(f"shared-{i}") for i in range(16)]
    memories = [f"The on-call rota of team {i} changes on Mondays." for i in range(6)]
    specs = [
        {
            "config": config,
            "data_dir": str(tmp_path / name),
            "scope": SCOPE,
            "docs": [*shared, *(doc(f"{name}-{i}") for i in range(6))],
            "memories": [
                *memories,
                *(f"{name} prefers short answers, note {i}." for i in range(3)),
            ],
        }
        for name in ("a", "b")
    ]
    reports = await replicas(specs)

    knowledge, rows = await stored(config, tmp_path / "reader")
    try:
        documents = await knowledge.kb.documents(SCOPE)
        saved = await knowledge.memory.entries(SCOPE)
    finally:
        await knowledge.aclose()
    # 0 lost: every title either replica added is there; 0 duplicates: each once
    titles = Counter(d.title for d in documents)
    wanted = {title for spec in specs for title, _ in spec["docs"]}
    assert set(titles) == wanted and len(documents) == len(wanted) == 16 + 2 * 6, (
        titles.most_common(3)
    )
    assert max(Counter(r["id"] for r in rows).values()) == 1  # no chunk row twice
    assert max(Counter(r["dedupe"] for r in rows if r["chunk_index"] == 0).values()) == 1
    # no half documents: every chunk of every document is there
    chunks = Counter(r["doc_id"] for r in rows)
    assert all(chunks[d.id] == d.chunks for d in documents)
    assert any(d.chunks > 1 for d in documents)
    # both replicas were told the same id for a shared document, created by exactly one
    by_title = {d.title: d.id for d in documents}
    for title, _ in shared:
        told = [next(r for r in report["docs"] if r["title"] == title) for report in reports]
        assert {r["id"] for r in told} == {by_title[title]}
        assert sorted(r["created"] for r in told) == [False, True], told
    contents = Counter(m.content for m in saved)
    assert len(saved) == 6 + 2 * 3 and max(contents.values()) == 1
    for content in memories:
        told = [
            next(r for r in report["memories"] if r["content"] == content) for report in reports
        ]
        assert len({r["id"] for r in told}) == 1
        assert sorted(r["created"] for r in told) == [False, True], told


async def test_two_replicas_filling_one_scope_never_exceed_max_docs_or_max_entries(
    s3_server: str, tmp_path: Path
) -> None:
    # odd limits: each step both add one, so both cross the limit in the same step
    config = s3_config(s3_server, **{"kb.max_docs": 11, "memory.max_entries": 5})
    specs = [
        {
            "config": config,
            "data_dir": str(tmp_path / name),
            "scope": SCOPE,
            "docs": [doc(f"{name}-{i}") for i in range(9)],
            "memories": [f"{name} keeps note number {i}." for i in range(5)],
        }
        for name in ("a", "b")
    ]
    reports = await replicas(specs)

    knowledge, _ = await stored(config, tmp_path / "reader")
    try:
        documents = await knowledge.kb.documents(SCOPE)
        saved = await knowledge.memory.entries(SCOPE)
    finally:
        await knowledge.aclose()
    assert len(documents) <= 11 and len(saved) <= 5
    created = {r["id"] for report in reports for r in report["docs"] if r.get("created")}
    refused = [r for report in reports for r in report["docs"] if "refused" in r]
    assert created == {d.id for d in documents}  # what was reported added is there, only that
    assert refused and all(r["refused"] == "kb full (11), delete some" for r in refused)
    assert {r["title"] for r in refused}.isdisjoint(d.title for d in documents)
    kept = {r["id"] for report in reports for r in report["memories"] if r.get("created")}
    assert kept == {m.id for m in saved}
    assert all(
        "memory full" in r["refused"] for rs in reports for r in rs["memories"] if "refused" in r
    )


# ---------------------------------------------------------------------------- fast


def test_an_id_is_16_hex_of_the_scope_and_the_content_up_to_whitespace() -> None:
    key = dedupe_key("Deploying", "Run  make\n deploy")
    assert content_id("nb:a", key) == content_id(
        "nb:a", dedupe_key(" Deploying ", "Run make deploy")
    )
    assert content_id("nb:a", key) != content_id("nb:b", key)
    assert content_id("nb:a", key) != content_id("nb:a", dedupe_key("Deploying", "Run make"))
    assert len(content_id("nb:a", key)) == 16 and int(content_id("nb:a", key), 16) >= 0


def local(tmp_path: Path, **overrides: Any) -> Knowledge:
    """A store on a folder shared by every store the test opens (as replicas share kb.uri)."""
    values = {"embedding.provider": "none", "kb.uri": str(tmp_path / "kb"), **overrides}
    return Knowledge(Config().with_overrides(values), tmp_path / "data")


async def test_two_stores_adding_the_same_documents_at_once_keep_one_of_each(
    tmp_path: Path,
) -> None:
    first, second = local(tmp_path), local(tmp_path)
    docs = [doc(f"race-{i}") for i in range(15)]

    async def add_all(knowledge: Knowledge) -> list[Any]:
        return [await knowledge.kb.add(SCOPE, title, content) for title, content in docs]

    try:
        await asyncio.gather(first.open(), second.open())
        ones, twos = await asyncio.gather(add_all(first), add_all(second))
        documents = await first.kb.documents(SCOPE)
    finally:
        await asyncio.gather(first.aclose(), second.aclose())
    assert sorted(d.title for d in documents) == sorted(title for title, _ in docs)
    for one, two in zip(ones, twos, strict=True):
        assert one.document.id == two.document.id
        assert sorted([one.created, two.created]) == [False, True]


async def test_two_stores_adding_the_same_documents_in_batches_keep_one_of_each(
    tmp_path: Path,
) -> None:
    """The issue's case (65 duplicates of 100 before): `add_many`, 64 a commit, at once."""
    first, second = local(tmp_path), local(tmp_path)
    docs = [SourceDoc(f"Batch {i}", f"Short document number {i}.") for i in range(80)]
    try:
        await asyncio.gather(first.open(), second.open())
        ones, twos = await asyncio.gather(
            first.kb.add_many(SCOPE, docs), second.kb.add_many(SCOPE, docs)
        )
        documents = await first.kb.documents(SCOPE)
    finally:
        await asyncio.gather(first.aclose(), second.aclose())
    assert len(documents) == 80 and len({d.title for d in documents}) == 80
    for one, two in zip(ones, twos, strict=True):
        assert one.document == two.document  # both told the stored one, created_at too
        assert sorted([one.created, two.created]) == [False, True]


async def test_documents_and_memories_stored_before_ids_were_derived_keep_working(
    tmp_path: Path,
) -> None:
    """A table as the old code wrote it: no primary key declared, 8 random hex ids."""
    import lancedb
    import pyarrow as pa

    from ania_nb.knowledge.kb import _rows
    from ania_nb.knowledge.model import Document
    from ania_nb.knowledge.tables import kb_fields, memory_fields

    db = await lancedb.connect_async(str(tmp_path / "kb"))
    key = dedupe_key("Old", "stored long ago")
    old = Document("1a2b3c4d", SCOPE, "Old", "", (), 1.0, 1, 15)
    kb = await db.create_table("kb_chunks", schema=pa.schema(kb_fields()))
    await kb.add(_rows(old, key, ["stored long ago"]))
    memories = await db.create_table("memories", schema=pa.schema(memory_fields()))
    memory = {"id": "5e6f7a8b", "scope": SCOPE, "user_id": "", "content": "Old note",
              "tags": [], "created_at": 1.0, "dedupe": _memory_key("Old note"),
              "search_text": "Old note"}  # fmt: skip
    await memories.add([memory])

    knowledge = local(tmp_path)
    try:
        again = await knowledge.kb.add(SCOPE, "Old", "stored   long ago")
        assert (again.document.id, again.created) == ("1a2b3c4d", False)  # found by its key
        entry, new = await knowledge.memory.save(SCOPE, "Old  note")
        assert (entry.id, new) == ("5e6f7a8b", False)
        fresh = await knowledge.kb.add(SCOPE, "New", "stored today")
        assert fresh.created and len(fresh.document.id) == 16
        assert {d.id for d in await knowledge.kb.documents(SCOPE)} == {
            "1a2b3c4d",
            fresh.document.id,
        }
        assert await knowledge.kb.delete(SCOPE, "1a2b3c4d")
        assert await knowledge.memory.forget(SCOPE, "5e6f7a8b")
        schema = await knowledge.store.table("kb_chunks").table.schema()
        assert schema.field("id").metadata  # the primary key is declared now
    finally:
        await knowledge.aclose()


def _memory_key(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


async def test_a_conflict_lance_cannot_retry_is_a_clear_error_and_stores_nothing(
    tmp_path: Path,
) -> None:
    """Another process restores an old version between this one's read and its write.

    The handle is one that never looks for newer versions (lancedb's default), so the write
    is planned on the version before the restore, as a write racing the restore would be.
    """
    import lancedb

    from ania_nb.knowledge import tables

    knowledge = local(tmp_path)
    try:
        await knowledge.kb.add(SCOPE, "First", "one")
    finally:
        await knowledge.aclose()
    columns = [f.name for f in tables.kb_fields()]
    behind = await (await lancedb.connect_async(str(tmp_path / "kb"))).open_table("kb_chunks")
    table = tables.LanceTable(behind, ann_threshold=20000)
    row = (await table.rows(None, columns))[0]
    other = await (await lancedb.connect_async(str(tmp_path / "kb"))).open_table("kb_chunks")
    await other.checkout(await other.version() - 1)
    await other.restore()
    with pytest.raises(KnowledgeError) as caught:
        await table.insert_new([dict(row, id="y:0", doc_id="y")])
    message = str(caught.value)
    assert "another process (a replica sharing kb.uri) committed a change" in message
    assert "Restore" in message and "nothing of this write was stored" in message
    assert ".cargo" not in message and "Traceback" not in message
    await other.checkout_latest()
    assert await other.count_rows("doc_id = 'y'") == 0


async def test_upkeep_compacts_while_another_store_writes(tmp_path: Path) -> None:
    leader, writer = local(tmp_path), local(tmp_path)
    try:
        for i in range(12):
            await writer.kb.add(SCOPE, f"Before {i}", f"written before upkeep {i}")
        await leader.open()
        before = (await leader.store.table("kb_chunks").table.stats())["fragment_stats"][
            "num_fragments"
        ]

        async def write_more() -> None:
            for i in range(12):
                await writer.kb.add(SCOPE, f"During {i}", f"written during upkeep {i}")

        await asyncio.gather(leader.upkeep(), write_more())
        kb = leader.store.table("kb_chunks")
        await kb.refresh()
        after = (await kb.table.stats())["fragment_stats"]["num_fragments"]
        titles = {d.title for d in await leader.kb.documents(SCOPE)}
    finally:
        await asyncio.gather(leader.aclose(), writer.aclose())
    assert titles == {f"Before {i}" for i in range(12)} | {f"During {i}" for i in range(12)}
    assert after < before + 12, (before, after)
