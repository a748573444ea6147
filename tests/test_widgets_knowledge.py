"""`KbPanel` and `MemoryList` on a real `Knowledge` (LanceDB files in tmp_path): scopes with
counts, documents with chunk counts, search with scores, add/delete buttons, the ingest progress
bar, the memory list's Forget button; the run widget's ``knowledge`` line; ``%ania kb`` and
``%ania memory`` in a live IPython shell."""

from __future__ import annotations

import asyncio
import re

import pytest

from ania_nb import RunEvent
from ania_nb.config import Config
from ania_nb.knowledge import Knowledge, KnowledgeChange, SourceDoc
from ania_nb.notebook.widgets import RunView
from ania_nb.notebook.widgets.knowledge import KbPanel, MemoryList
from ania_nb.testing import reply, tool_call

DEPLOY = "Deploying the service: run make deploy, then check the health endpoint on port 8080."
TEA = "绿茶的冲泡方法：水温八十度左右，浸泡两到三分钟，不要用沸水。"


@pytest.fixture
async def knowledge(tmp_path):
    """A real knowledge store, full-text only (no embedder) unless a test says otherwise."""
    made: list[Knowledge] = []

    def make(provider: str = "none", **overrides) -> Knowledge:
        config = Config.load().with_overrides({"embedding.provider": provider, **overrides})
        made.append(Knowledge(config, tmp_path / "data"))
        return made[-1]

    yield make
    for item in made:
        await item.aclose()


async def settled(panel) -> None:
    """Wait (bounded) for every action the panel started."""
    async with asyncio.timeout(30):
        await panel.wait_actions()


async def test_panel_shows_scopes_documents_and_chunk_counts(knowledge):
    k = knowledge(**{"kb.chunk_chars": 100, "kb.chunk_overlap_chars": 10})
    long = "\n".join(f"line {i}: the deploy checklist item number {i}" for i in range(12))
    await k.kb.add("nb:t", "Checklist", long, tags=["ops"], source="docs/check.md")
    await k.kb.add("nb:t", "Deploying", DEPLOY)
    await k.kb.add("global", "绿茶", TEA)
    await k.kb.add("nb:other", "Elsewhere", "not this notebook's")

    panel = await KbPanel(k, "nb:t").refresh()
    labels = [label for label, _ in panel.scope_picker.options]
    assert labels == ["global (1)", "nb:other (1)", "nb:t (2)"]
    assert panel.scope_picker.value == "nb:t"
    docs = {d.title: d for d in panel.documents}
    assert [d.title for d in panel.documents] == ["Deploying", "Checklist"]  # newest first
    assert docs["Checklist"].chunks > 1 and docs["Deploying"].chunks == 1
    chunks = docs["Checklist"].chunks + 1
    text = panel.text()
    assert text.splitlines()[0] == f"📚 knowledge base · nb:t · 2 document(s), {chunks} chunk(s)"
    line = next(x for x in text.splitlines() if "Checklist" in x)
    assert f"[{docs['Checklist'].id}] Checklist · {docs['Checklist'].chunks} chunks" in line
    assert "#ops" in line and "docs/check.md" in line
    assert len(panel.doc_box.children) == 2
    assert f"{docs['Checklist'].chunks} chunks" in panel.doc_box.children[1].children[0].value
    # Sizes are the text's characters, said so (it said "42 B of text" for 43 characters).
    assert docs["Deploying"].chars == len(DEPLOY)
    assert f"· {len(DEPLOY)} characters ·" in next(x for x in text.splitlines() if "Deploying" in x)
    deploying_html = panel.doc_box.children[0].children[0].value
    assert f"{len(DEPLOY)} characters" in deploying_html and " B" not in deploying_html
    assert panel._repr_mimebundle_()["text/plain"] == text

    panel.scope_picker.value = "global"  # the dropdown switches the scope
    await settled(panel)
    assert panel.scope == "global" and [d.title for d in panel.documents] == ["绿茶"]
    assert "Elsewhere" not in panel.text()
    panel.close()


async def test_an_empty_store_offers_the_session_and_global(knowledge):
    panel = await KbPanel(knowledge(), "nb:fresh").refresh()
    assert [v for _, v in panel.scope_picker.options] == ["global", "nb:fresh"]
    assert "0 document(s), 0 chunk(s)" in panel.text() and "(no documents)" in panel.text()
    assert "  (full-text only (no embedder) · 0 chunks · flat search)" in panel.text()
    panel.close()


async def test_add_and_delete_buttons_change_the_store(knowledge):
    k = knowledge()
    panel = await KbPanel(k, "nb:t").refresh()
    panel.title_box.value = "Deploying"
    panel.content_box.value = DEPLOY
    panel.add_button.click()
    await settled(panel)
    (doc,) = await k.kb.documents("nb:t")
    assert doc.title == "Deploying" and [d.id for d in panel.documents] == [doc.id]
    assert panel.message == f"added [{doc.id}] Deploying (1 chunks)"
    assert panel.title_box.value == "" and panel.content_box.value == ""
    assert "nb:t (1)" in [label for label, _ in panel.scope_picker.options]

    await panel.add("Deploying", "  " + DEPLOY.replace(" ", "  "))  # same up to whitespace
    assert panel.message == f"already there: [{doc.id}] Deploying"
    await panel.add("Empty", "   ")
    assert panel.message.startswith("✗ ") and "no content" in panel.message
    assert "color:#c62828" in panel.message_html.value
    assert len(await k.kb.documents("nb:t")) == 1  # a refused add stores nothing

    row = panel.doc_box.children[0]
    row.children[1].click()  # Delete
    await settled(panel)
    assert await k.kb.documents("nb:t") == [] and panel.documents == []
    assert panel.doc_box.children == () and panel.message == f"deleted [{doc.id}]"
    await panel.delete(doc.id)
    assert panel.message == f"✗ no document [{doc.id}] in nb:t"
    panel.close()


async def test_search_ranks_hits_of_the_scope_and_global_with_their_scores(knowledge):
    k = knowledge("offline")
    await k.kb.add("nb:t", "Deploying", DEPLOY)
    await k.kb.add("nb:t", "Lunch", "The canteen serves noodles on Fridays.")
    await k.kb.add("global", "绿茶", TEA)
    await k.kb.add("nb:other", "Deploy elsewhere", "make deploy in another notebook")
    panel = await KbPanel(k, "nb:t").refresh()
    assert "embedder usem3:" in panel.text() and "(512-d) · 4 chunks" in panel.text()

    panel.search_box.value = "make deploy health endpoint"  # what pressing Enter does
    await settled(panel)
    assert panel.hits and panel.hits[0].title == "Deploying"
    assert {h.scope for h in panel.hits} <= {"nb:t", "global"}  # never another session's
    top = panel.hits[0]
    assert top.similarity is not None and top.match > 0.5
    lines = panel.text().splitlines()
    assert f"Search 'make deploy health endpoint' (hybrid): {len(panel.hits)} result(s)" in lines
    first = next(x for x in lines if x.startswith("  1. "))
    assert first.startswith(f"  1. 《Deploying》 [{top.doc_id}#0] nb:t · score {top.score:.3f}")
    assert f"similarity {top.similarity:.3f} · match {top.match:.2f}" in first
    assert "make deploy" in first  # the chunk's first words
    assert "similarity" in panel.results.value and "1. 《Deploying》" in panel.results.value

    await panel.search("绿茶 水温", mode="fts")  # Chinese keywords, full-text only
    assert panel.mode == "fts" and panel.hits[0].scope == "global"
    assert panel.hits[0].similarity is None and "similarity" not in panel.text()

    await panel.search("zzzqqq xxwwyy", mode="fts")
    assert panel.hits == [] and "nothing found" in panel.results.value
    await panel.search("")
    assert panel.results.value == "" and "Search" not in panel.text()
    panel.close()


async def test_ingest_shows_a_progress_bar_and_refuses_a_bad_path(knowledge, tmp_path):
    k = knowledge()
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(70):  # more than one write batch: the bar moves before the end
        (docs / f"note{i:02}.md").write_text(f"# Note {i}\n\nStep {i} of the runbook: item {i}.")
    panel = await KbPanel(k, "nb:t").refresh()
    seen: list[tuple[int, int]] = []
    panel.progress.bar.observe(lambda c: seen.append((c["new"], panel.progress.bar.max)), "value")

    panel.path_box.value = str(docs / "*.md")
    panel.ingest_button.click()
    await asyncio.sleep(0)  # the click started a task: let it reach its first await
    # The bar shows before any file is read.
    assert panel.progress.state == "reading" and panel.progress.widget.layout.display == "flex"
    assert panel.ingest_button.disabled is True
    assert "reading files…" in panel.text()
    await settled(panel)
    assert any(0 < done < total for done, total in seen), seen  # a partial step was shown
    assert seen[-1] == (70, 70) and panel.progress.state == "finished"
    assert panel.progress.bar.bar_style == "success" and not panel.ingest_button.disabled
    assert panel.message == "added 70 document(s) (70 chunks)"
    assert len(panel.documents) == 70 and "Note 5" in panel.text()

    await panel.ingest(str(docs / "note0*.md"))  # again: deduplicated
    assert panel.message == "added 0 document(s) (0 chunks), 10 already there"
    await panel.ingest(str(tmp_path / "missing" / "*.md"))
    assert panel.message.startswith("✗ ") and "missing" in panel.message
    assert panel.progress.state == "failed" and panel.progress.bar.bar_style == "danger"
    assert len(await k.kb.documents("nb:t")) == 70
    panel.close()


async def test_a_dataframe_column_is_added_with_the_progress_bar(knowledge):
    import pyarrow as pa

    k = knowledge()
    table = pa.table(
        {"name": [f"Tip {i}" for i in range(66)], "text": [f"tip number {i}" for i in range(66)]}
    )
    panel = await KbPanel(k, "nb:t").refresh()
    seen: list[tuple[int, int]] = []
    panel.progress.bar.observe(lambda c: seen.append((c["new"], panel.progress.bar.max)), "value")
    await panel.ingest_dataframe(table, "text", title_column="name")
    assert panel.message == "added 66 document(s) (66 chunks)"
    assert any(0 < done < total for done, total in seen) and seen[-1] == (66, 66), seen
    assert {d.title for d in panel.documents} == {f"Tip {i}" for i in range(66)}
    assert {d.source for d in panel.documents} == {"dataframe"}
    await panel.ingest_dataframe(table, "body")
    assert panel.message.startswith("✗ no column 'body'") and panel.progress.state == "failed"
    panel.close()


async def test_memory_list_shows_newest_first_and_forgets(knowledge):
    k = knowledge()
    first, _ = await k.memory.save("nb:t", "Alice prefers short answers", user_id="alice")
    second, _ = await k.memory.save("nb:t", "项目代号是青鸟", tags=["project"])
    await k.memory.save("nb:other", "someone else's note")
    view = await MemoryList(k, "nb:t").refresh()
    assert [e.id for e in view.entries] == [second.id, first.id]
    lines = view.text().splitlines()
    assert lines[0] == "🧠 memories · nb:t · 2 entries"
    assert lines[1].startswith(f"  [{second.id}] 项目代号是青鸟 · #project")
    assert lines[2].startswith(f"  [{first.id}] Alice prefers short answers · user alice")
    assert [label for label, _ in view.scope_picker.options] == [
        "global (0)",
        "nb:other (1)",
        "nb:t (2)",
    ]

    view.entry_box.children[1].children[1].click()  # Forget Alice's
    await settled(view)
    assert [e.id for e in await k.memory.entries("nb:t")] == [second.id]
    assert view.message == f"forgot [{first.id}]" and "1 entry" in view.text()
    await view.forget(first.id)
    assert view.message == f"✗ no memory [{first.id}] in nb:t"
    await view.show_scope("nb:other")
    assert [e.content for e in view.entries] == ["someone else's note"]
    view.close()


def test_the_run_view_shows_what_was_auto_injected(make_agent):
    view = RunView(make_agent(), session="nb:t", prompt="how do I deploy?")
    chunk = {"doc_id": "d1", "title": "Deploying", "scope": "nb:t", "similarity": 0.71}
    view.on_event(
        RunEvent(
            "knowledge",
            "nb:t",
            {
                "chunks": [
                    {**chunk, "chunk_id": "d1:0", "score": 0.8123, "match": 0.5},
                    {**chunk, "chunk_id": "d1:1", "score": 0.61, "match": 0.25},
                    {"doc_id": "g2", "chunk_id": "g2:0", "title": "绿茶", "scope": "global",
                     "score": 0.5, "similarity": None, "match": 1.0},
                ],
                "memories": [{"id": "m1", "content": "Alice prefers short answers"}],
            },
        )
    )  # fmt: skip
    view.on_event(RunEvent("knowledge", "nb:other", {"chunks": [{"title": "Not mine"}]}))
    expected = (
        "📚 injected: 《Deploying》 ×2 (score 0.81), 《绿茶》 (score 0.50) · "
        "🧠 1 memory: “Alice prefers short answers”"
    )
    assert view.text().splitlines()[2] == f"  {expected}"
    assert "Not mine" not in view.text()
    (item,) = view.items
    # The HTML line has SVG icons in place of the emoji (no emoji font needed in the browser).
    shown = item.widget.value
    assert expected.replace("📚", "").replace("🧠", "") in re.sub(r"<svg.*?</svg>", "", shown)
    assert "similarity 0.710" in shown and "📚" not in shown
    view.close()


async def test_a_real_turn_shows_its_injected_chunks(llm, make_agent):
    agent = make_agent(overrides={"agent.builtin_tools": True, "embedding.provider": "none"})
    doc = (await agent.knowledge.kb.add("nb:t", "Deploying", DEPLOY)).document
    llm.script(reply("run make deploy"))
    view = RunView(agent, session="nb:t", prompt="make deploy health endpoint")
    view.finish(await agent.chat(view.prompt, session="nb:t", callbacks=view.callbacks))
    line = next(x for x in view.text().splitlines() if "📚" in x)
    assert line.startswith("  📚 injected: 《Deploying》 (score ")
    assert doc.id in view.items[0].widget.value  # the chunk id in the tooltip
    view.close()


# ------------------------------------------------------------------ following changes


async def followed(panel, until) -> None:
    """Wait (bounded) until the panel's own refreshes made ``until()`` true."""
    async with asyncio.timeout(30):
        while not until():
            await panel.wait_actions()
            await asyncio.sleep(0.01)


async def test_the_panels_follow_adds_and_deletes_made_elsewhere(knowledge):
    k = knowledge()
    panel = await KbPanel(k, "nb:t").refresh()
    memories = await MemoryList(k, "nb:t").refresh()
    refreshes = {"kb": 0, "memory": 0}
    for name, shown in (("kb", panel), ("memory", memories)):
        original = shown.refresh

        async def counted(name=name, original=original):
            refreshes[name] += 1
            return await original()

        shown.refresh = counted

    doc = (await k.kb.add("nb:t", "Deploying", DEPLOY)).document  # another cell, no click
    await followed(panel, lambda: [d.title for d in panel.documents] == ["Deploying"])
    assert "1 document(s)" in panel.text() and doc.id in panel.doc_box.children[0].children[0].value
    assert refreshes == {"kb": 1, "memory": 0}  # a kb change leaves the memory list alone

    notes = [SourceDoc(f"Note {i}", f"note number {i} of the deploy checklist") for i in range(5)]
    await k.kb.add_many("nb:t", notes)  # an ingest: one change per commit of 64 documents
    await followed(panel, lambda: len(panel.documents) == 6)
    assert refreshes["kb"] == 2
    for _ in range(5):  # a burst of changes within one turn of the loop: one refresh
        panel.on_change(KnowledgeChange("kb", "added", "nb:t"))
    await settled(panel)
    assert refreshes["kb"] == 3

    await k.kb.add("global", "绿茶", TEA)  # another scope: the dropdown's counts follow
    await followed(
        panel, lambda: "global (1)" in [label for label, _ in panel.scope_picker.options]
    )
    assert await k.kb.delete("nb:t", doc.id)
    await followed(panel, lambda: doc.id not in {d.id for d in panel.documents})

    entry, _ = await k.memory.save("nb:t", "Alice prefers short answers")
    await followed(memories, lambda: [e.id for e in memories.entries] == [entry.id])
    await k.memory.clear("nb:t")
    await followed(memories, lambda: not memories.entries)

    panel.close()
    memories.close()
    seen = list(panel.documents)
    await k.kb.add("nb:t", "After", "added after the panel was closed")
    await asyncio.sleep(panel.follow_delay * 2)
    assert panel.documents == seen and not panel.actions  # a closed panel does nothing more
    assert not k.store._listeners


async def test_the_panel_shows_what_the_ai_adds_and_deletes(llm, make_agent):
    agent = make_agent(overrides={"agent.builtin_tools": True, "embedding.provider": "none"})
    panel = await KbPanel(agent.knowledge, "nb:t").refresh()
    assert panel.documents == []
    llm.script(
        reply(tool_calls=[tool_call("kb_add", {"title": "Deploying", "content": DEPLOY})]),
        reply("stored it"),
    )
    assert (await agent.chat("remember how we deploy", session="nb:t")).ok
    await followed(panel, lambda: [d.title for d in panel.documents] == ["Deploying"])
    doc_id = panel.documents[0].id
    llm.script(reply(tool_calls=[tool_call("kb_delete", {"id": doc_id})]), reply("gone"))
    assert (await agent.chat("forget it", session="nb:t")).ok
    await followed(panel, lambda: panel.documents == [])
    assert "(no documents)" in panel.text()
    panel.close()


# ------------------------------------------------------------------ %ania kb / %ania memory


@pytest.fixture
def shell(llm, tmp_path, monkeypatch):
    """A shell with ania_nb loaded and its Agent on the scripted server, full-text kb."""
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)  # the default session: nb:default
    monkeypatch.chdir(tmp_path)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "ania_nb")
    state = ip.magics_manager.registry["AgentMagics"].state
    state.overrides.update(
        {
            "llm.base_url": llm.base_url,
            "llm.api_key": llm.api_key,
            "llm.model": "scripted",
            "store.data_dir": str(tmp_path / "data"),
            "skills.dir": str(tmp_path / "no-skills"),
            "mcp.config_file": str(tmp_path / "no-mcp.json"),
            "embedding.provider": "none",
        }
    )
    yield ip
    if "AgentMagics" in ip.magics_manager.registry:
        ip.run_line_magic("unload_ext", "ania_nb")


def run(ip, code: str):
    """Run one cell; return its captured output (stdout, displays); errors are returned too."""
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        result = ip.run_cell(code)
    return result, captured


def shown_text(captured) -> str:
    return "".join(o.data.get("text/plain", "") for o in captured.outputs)


def test_ania_kb_commands_add_search_delete_and_show_the_panel(shell, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "deploy.md").write_text(f"# Deploying\n\n{DEPLOY}\n")
    (docs / "tea.txt").write_text(TEA)
    (docs / "empty.md").write_text("")  # skipped, listed; the others are added
    (tmp_path / "faq.md").write_text("# FAQ\n\nThe office opens at nine o'clock.\n")

    result, out = run(shell, "%ania kb add docs/*")
    assert result.success, result.error_in_exec
    summary = "added 2 document(s) (2 chunks), 1 file(s) skipped: 'docs/empty.md' has no text"
    assert summary in shown_text(out)  # the bar's final text
    assert "  ! skipped 'docs/empty.md' has no text to add" in out.stdout
    assert re.search(r"\+ \[\w{16}\] Deploying · 1 chunk\(s\) · docs/deploy.md", out.stdout)
    run(shell, "%ania kb add faq.md --scope global")

    shell.user_ns["tips"] = {"text": ["Water the plants on Mondays."], "who": ["Ops"]}
    _, out = run(shell, "%ania kb add-df tips text --title who --scope global")
    assert "added 1 document(s) (1 chunks)" in shown_text(out) and "] Ops · 1 chunk" in out.stdout
    result, _ = run(shell, "%ania kb add-df nope text")
    assert "no variable 'nope' in the notebook" in str(result.error_in_exec)

    _, out = run(shell, "%ania kb search what's the deploy health endpoint?")  # apostrophe kept
    assert out.stdout.startswith("1. 《Deploying》 [")
    _, out = run(shell, "%ania kb search office nine --scope global")
    assert out.stdout.startswith("1. 《FAQ》") and "global" in out.stdout
    _, out = run(shell, "%ania kb search zzzqqq")
    assert out.stdout.strip() == "nothing found in nb:default + global for 'zzzqqq'"

    _, out = run(shell, "%ania kb")
    panel_text = shown_text(out)
    assert "📚 knowledge base · nb:default · 2 document(s), 2 chunk(s)" in panel_text
    doc_id = re.search(r"\[(\w{16})\] Deploying", panel_text).group(1)
    _, out = run(shell, "%ania kb global")
    assert "· global · 2 document(s)" in shown_text(out)

    _, out = run(shell, f"%ania kb delete {doc_id}")
    assert out.stdout.strip() == f"deleted document {doc_id} from nb:default"
    result, out = run(shell, f"%ania kb delete {doc_id}")
    assert not result.success and f"no document '{doc_id}' in nb:default" in out.stdout + str(
        result.error_in_exec
    )
    result, _ = run(shell, "%ania kb add nothing/*.md")
    assert not result.success and "nothing" in str(result.error_in_exec)
    result, _ = run(shell, "%ania kb frobnicate x")
    assert not result.success and "unknown %ania kb command 'frobnicate'" in str(
        result.error_in_exec
    )


def test_ania_memory_lists_and_forgets(shell):
    state = shell.magics_manager.registry["AgentMagics"].state
    memory = state.agent().knowledge.memory
    entry, _ = state.run_sync(memory.save("nb:default", "Alice prefers short answers"))
    _, out = run(shell, "%ania memory")
    assert "🧠 memories · nb:default · 1 entry" in shown_text(out)
    assert f"[{entry.id}] Alice prefers short answers" in shown_text(out)
    _, out = run(shell, f"%ania memory forget {entry.id}")
    assert out.stdout.strip() == f"forgot memory {entry.id} of nb:default"
    result, _ = run(shell, f"%ania memory forget {entry.id}")
    assert not result.success and "no memory" in str(result.error_in_exec)
    _, out = run(shell, "%ania memory")
    assert "0 entries" in shown_text(out) and "(no memories)" in shown_text(out)
