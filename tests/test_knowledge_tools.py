"""kb_* and memory_* tools on real LanceDB files: texts, scopes, global read-only, bad input.

The tools are invoked as the executor invokes them (argument dicts validated by their schema);
the end-to-end path through `Agent.chat` and the scripted server is at the bottom.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ania_nb.config import Config
from ania_nb.errors import ToolError
from ania_nb.knowledge import GLOBAL_SCOPE, Document, Hit, Knowledge, MemoryEntry
from ania_nb.knowledge.tools import (
    READ_ONLY_ERROR,
    chunk_line,
    document_line,
    hits_text,
    knowledge_tools,
    memories_text,
    memory_line,
)
from ania_nb.testing import reply, tool_call
from ania_nb.tools.base import ToolArgumentsError, ToolContext

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

KB_TOOLS = ["kb_search", "kb_add", "kb_list", "kb_delete"]
MEMORY_TOOLS = ["memory_save", "memory_search", "memory_forget"]
DEPLOY_TEXT = "To deploy, run make deploy from the repository root."


def make_config(**overrides: Any) -> Config:
    values: dict[str, Any] = {"embedding.provider": "none"}  # full-text: no model load
    values.update(overrides)
    return Config().with_overrides(values)


def day(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.localtime(ts))


class Tools:
    """The tools of one session, called by name with raw argument dicts."""

    def __init__(self, knowledge: Knowledge, session: str, config: Config) -> None:
        self.by_name = {t.name: t for t in knowledge_tools(knowledge, session, config)}
        self.session = session

    async def __call__(self, name: str, **arguments: Any) -> str:
        return await self.by_name[name].invoke(arguments, ToolContext(session=self.session))


@pytest.fixture
async def knowledge(tmp_path: Path) -> Any:
    k = Knowledge(make_config(), tmp_path)
    yield k
    await k.aclose()


@pytest.fixture
def tools(knowledge: Knowledge) -> Tools:
    return Tools(knowledge, "nb:a", make_config())


# ------------------------------------------------------------------ pure texts


def hit(title: str, scope: str, text: str, doc_id: str = "1a2b3c4d") -> Hit:
    return Hit(f"{doc_id}:0", doc_id, scope, title, text, "", (), 0, 0.5)


def test_chunk_line_names_the_scope_only_when_not_global() -> None:
    assert chunk_line(hit("Deploy", "nb:a", "run make")) == '"Deploy" (nb:a): run make'
    assert chunk_line(hit("Deploy", GLOBAL_SCOPE, "run make")) == '"Deploy": run make'
    assert chunk_line(hit("", GLOBAL_SCOPE, "bare")) == "bare"
    assert chunk_line(hit("T", GLOBAL_SCOPE, "x" * 50), 10) == '"T": ' + "x" * 9 + "…"


def test_hits_text_header_and_no_result_text() -> None:
    hits = [hit("A", "nb:a", "one", "aaaaaaaa"), hit("B", GLOBAL_SCOPE, "two", "bbbbbbbb")]
    assert (
        hits_text(hits, "q")
        == 'Knowledge base passages (2):\n[aaaaaaaa] "A" (nb:a): one\n[bbbbbbbb] "B": two'
    )
    assert hits_text([], "部署") == 'no material related to "部署"'


def test_memory_lines_leave_out_empty_parts() -> None:
    ts = 1_700_000_000.0
    full = MemoryEntry("0badcafe", "nb:a", "likes tea", "qq:1", ("drink", "pref"), ts)
    bare = MemoryEntry("deadbeef", "nb:a", "plain", created_at=ts)
    assert memory_line(full) == f"[0badcafe] (qq:1) <drink,pref> likes tea (saved {day(ts)})"
    assert memory_line(bare) == f"[deadbeef] plain (saved {day(ts)})"
    assert memories_text([], 0, "") == "no memories yet"
    assert memories_text([bare, full], 2, "").startswith("Long-term memories (2):\n[deadbeef]")
    assert memories_text([full], 2, "tea").startswith("Related memories (1 of 2):\n[0badcafe]")
    assert memories_text([], 2, "xyz") == (
        'no memory related to "xyz"; call memory_search without a query to list all 2 memories'
    )


def test_document_line() -> None:
    ts = 1_700_000_000.0
    doc = Document("1a2b3c4d", "nb:a", "Guide", "g.md", ("ops",), ts, 3, 1500)
    assert (
        document_line(doc)
        == f'[1a2b3c4d] "Guide" <ops> 3 chunks, 1500 chars, from g.md, added {day(ts)}'
    )
    bare = Document("1a2b3c4d", "nb:a", "", "", (), ts, 1, 9)
    assert document_line(bare) == f"[1a2b3c4d] (untitled) 1 chunk, 9 chars, added {day(ts)}"


# ------------------------------------------------------------------ which tools


def test_tools_follow_the_enable_switches(knowledge: Knowledge) -> None:
    def names(**overrides: Any) -> list[str]:
        return [t.name for t in knowledge_tools(knowledge, "g:qq:1", make_config(**overrides))]

    assert names() == KB_TOOLS + MEMORY_TOOLS
    assert names(**{"kb.enable": False}) == MEMORY_TOOLS
    assert names(**{"memory.enable": False}) == KB_TOOLS
    assert names(**{"kb.enable": False, "memory.enable": False}) == []
    [search] = [
        t for t in knowledge_tools(knowledge, "g:qq:1", make_config()) if t.name == "kb_search"
    ]
    assert search.description.endswith("Scope: the current chat.")  # no session: cacheable
    assert not search.side_effects
    assert all(
        t.side_effects
        for t in knowledge_tools(knowledge, "x", make_config())
        if t.name in {"kb_add", "kb_delete", "memory_save", "memory_forget"}
    )


@pytest.mark.parametrize(
    ("name", "arguments", "complaint"),
    [
        ("kb_search", {"query": "x", "top_k": "5"}, "field 'top_k'"),
        ("kb_search", {"query": "x", "top_k": True}, "field 'top_k'"),
        ("kb_search", {}, "field 'query' is required"),
        ("kb_search", {"query": ["a"]}, "field 'query'"),
        ("kb_add", {"title": "t", "content": 5}, "field 'content'"),
        ("kb_add", {"title": "t", "content": "c", "tags": "a,b"}, "field 'tags'"),
        ("kb_add", {"title": "t", "content": "c", "tags": [1]}, "field 'tags.0'"),
        ("kb_add", {"title": "t", "content": "c", "tags": ["t"] * 21}, "field 'tags'"),
        ("kb_add", {"title": "t" * 201, "content": "c"}, "field 'title'"),
        ("kb_add", {"title": "t", "content": "c", "scope": "global"}, "unknown argument 'scope'"),
        ("kb_delete", {"id": 12345678}, "field 'id'"),
        ("memory_save", {"content": None}, "field 'content'"),
        ("memory_save", {"content": "c", "user_id": 7}, "field 'user_id'"),
        ("memory_forget", {}, "field 'id' is required"),
    ],
)
async def test_wrong_types_are_refused_by_the_schema(
    tools: Tools, knowledge: Knowledge, name: str, arguments: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(ToolArgumentsError, match=complaint) as caught:
        await tools(name, **arguments)
    assert f"invalid arguments for tool '{name}'" in str(caught.value)
    assert not knowledge.exists()  # nothing was opened, let alone stored


# ------------------------------------------------------------------ kb tools


async def test_add_search_list_delete(tools: Tools, knowledge: Knowledge) -> None:
    added = await tools(
        "kb_add", title=" Deploying ", content="Run make deploy from the repo root.",
        tags=["ops", " ", "ops"], source="wiki",
    )  # fmt: skip
    [doc] = await knowledge.kb.documents("nb:a")
    assert added == f"Added to the knowledge base (ID={doc.id}): Deploying"
    assert (doc.title, doc.tags, doc.source) == ("Deploying", ("ops",), "wiki")

    found = await tools("kb_search", query="make deploy")
    line = f'[{doc.id}] "Deploying" (nb:a): Run make deploy from the repo root.'
    assert found == f"Knowledge base passages (1):\n{line}"
    assert await tools("kb_search", query="quantum chromodynamics") == (
        'no material related to "quantum chromodynamics"'
    )

    listed = await tools("kb_list")
    assert listed == f"Knowledge base of nb:a (1 documents):\n{document_line(doc)}"

    deleted = await tools("kb_delete", id=f"[{doc.id.upper()}]")  # as listed, case forgiven
    assert deleted == f"Deleted from the knowledge base (ID={doc.id}): Deploying (1 chunk)"
    assert await knowledge.kb.documents("nb:a") == []
    assert await tools("kb_list") == "No documents in the knowledge base of nb:a yet."
    with pytest.raises(ToolError, match=f"kb document not found: {doc.id}"):
        await tools("kb_delete", id=doc.id)


async def test_search_covers_the_session_and_global_only(
    tools: Tools, knowledge: Knowledge
) -> None:
    await knowledge.kb.add(GLOBAL_SCOPE, "Shared", "the vacation policy allows 25 days")
    await knowledge.kb.add("nb:other", "Secret", "the vacation budget is 9000")
    await tools("kb_add", title="Mine", content="my vacation starts in June")
    found = await tools("kb_search", query="vacation", top_k=10)
    assert '"Mine" (nb:a): my vacation starts in June' in found
    assert '"Shared": the vacation policy allows 25 days' in found
    assert "Secret" not in found and "9000" not in found
    assert found.startswith("Knowledge base passages (2):")
    assert "The read-only global library has 1 documents" in await tools("kb_list")


async def test_global_and_other_sessions_documents_cannot_be_deleted(
    tools: Tools, knowledge: Knowledge
) -> None:
    shared = (await knowledge.kb.add(GLOBAL_SCOPE, "Shared", "policy text")).document
    other = (await knowledge.kb.add("nb:other", "Theirs", "their text")).document
    with pytest.raises(
        ToolError, match=f"document {shared.id} is in the global library: {READ_ONLY_ERROR}"
    ):
        await tools("kb_delete", id=shared.id)
    with pytest.raises(ToolError) as caught:
        await tools("kb_delete", id=other.id)
    assert str(caught.value) == f"kb document not found: {other.id} (kb_list shows this session's)"
    assert "nb:other" not in str(caught.value)
    assert [d.id for d in await knowledge.kb.documents(GLOBAL_SCOPE)] == [shared.id]
    assert [d.id for d in await knowledge.kb.documents("nb:other")] == [other.id]


@pytest.mark.parametrize(
    "bad", ["", "  ", "xyz", "1a2b3c4d5", "1a2b3c4d5e6f7a8", "' OR '1'='1", "1a2b3c4g"]
)
async def test_malformed_ids_are_refused(tools: Tools, knowledge: Knowledge, bad: str) -> None:
    await knowledge.kb.add("nb:a", "Keep", "keep me")
    with pytest.raises(ToolError, match="is not a document id: ids are 16 hex characters"):
        await tools("kb_delete", id=bad)
    with pytest.raises(ToolError, match="is not a memory id"):
        await tools("memory_forget", id=bad)
    assert len(await knowledge.kb.documents("nb:a")) == 1


async def test_a_session_called_global_cannot_write(knowledge: Knowledge) -> None:
    shared = (await knowledge.kb.add(GLOBAL_SCOPE, "Shared", "policy text")).document
    tools = Tools(knowledge, GLOBAL_SCOPE, make_config())
    for name, arguments in [
        ("kb_add", {"title": "t", "content": "c"}),
        ("kb_delete", {"id": shared.id}),
        ("memory_save", {"content": "c"}),
        ("memory_forget", {"id": "1a2b3c4d"}),
    ]:
        with pytest.raises(ToolError, match=READ_ONLY_ERROR):
            await tools(name, **arguments)
    assert [d.id for d in await knowledge.kb.documents(GLOBAL_SCOPE)] == [shared.id]
    assert '"Shared": policy text' in await tools("kb_search", query="policy")


async def test_add_refusals_and_limits(tmp_path: Path) -> None:
    config = make_config(**{"kb.max_docs": 2, "kb.max_content_chars": 100})
    knowledge = Knowledge(config, tmp_path)
    tools = Tools(knowledge, "nb:a", config)
    try:
        with pytest.raises(ToolError, match="content is empty"):
            await tools("kb_add", title="t", content=" \n\t ")
        with pytest.raises(ToolError, match="query is empty"):
            await tools("kb_search", query="   ")
        huge = "word " * 200_000  # a megabyte
        text = await tools("kb_add", title="big", content=huge)
        assert text.endswith("(the content was cut to 100 characters; the rest was not stored)")
        [doc] = await knowledge.kb.documents("nb:a")
        assert doc.chars == 100
        again = await tools("kb_add", title="big", content=huge)
        assert again == (
            f"Added to the knowledge base (ID={doc.id}): big\n"
            "(an identical document was already stored; nothing was added)"
        )
        await tools("kb_add", title="second", content="two")
        with pytest.raises(ToolError) as caught:
            await tools("kb_add", title="third", content="three")
        assert str(caught.value) == "kb full (2), delete some"
        assert len(await knowledge.kb.documents("nb:a")) == 2
    finally:
        await knowledge.aclose()


# ------------------------------------------------------------------ memory tools


async def test_memory_save_search_forget(tools: Tools, knowledge: Knowledge) -> None:
    assert await tools("memory_search") == "no memories yet"
    saved = await tools(
        "memory_save", content=" Alice prefers green tea ", user_id="qq:1", tags=["drink"]
    )
    [entry] = await knowledge.memory.entries("nb:a")
    assert saved == f"Remembered (ID={entry.id}): Alice prefers green tea"
    assert (entry.user_id, entry.tags) == ("qq:1", ("drink",))
    assert await tools("memory_save", content="Alice  prefers green tea") == saved  # dedupe
    await tools("memory_save", content="Bob works at night")
    assert len(await knowledge.memory.entries("nb:a")) == 2

    listed = await tools("memory_search")
    assert listed.startswith("Long-term memories (2):\n[")
    assert listed.splitlines()[2] == memory_line(entry)  # newest first: Alice's is second
    related = await tools("memory_search", query="green tea")
    assert related == f"Related memories (1 of 2):\n{memory_line(entry)}"
    assert await tools("memory_search", query="submarine") == (
        'no memory related to "submarine"; '
        "call memory_search without a query to list all 2 memories"
    )

    assert (
        await tools("memory_forget", id=entry.id)
        == f"Forgotten (ID={entry.id}): Alice prefers green tea"
    )
    with pytest.raises(ToolError) as caught:
        await tools("memory_forget", id=entry.id)
    assert str(caught.value) == f"memory not found: {entry.id}"


async def test_memories_are_per_session(tools: Tools, knowledge: Knowledge) -> None:
    theirs, _ = await knowledge.memory.save("nb:other", "their secret plan")
    await knowledge.memory.save(GLOBAL_SCOPE, "a global note")
    assert await tools("memory_search", query="secret plan") == "no memories yet"
    await tools("memory_save", content="mine")
    assert "secret" not in await tools("memory_search")
    with pytest.raises(ToolError, match=f"memory not found: {theirs.id}"):
        await tools("memory_forget", id=theirs.id)
    assert [e.id for e in await knowledge.memory.entries("nb:other")] == [theirs.id]


async def test_memory_limits(tmp_path: Path) -> None:
    config = make_config(**{"memory.max_entries": 2, "memory.max_chars": 20})
    knowledge = Knowledge(config, tmp_path)
    tools = Tools(knowledge, "f:qq:9", config)
    try:
        with pytest.raises(ToolError, match="content is empty"):
            await tools("memory_save", content="   ")
        long = await tools("memory_save", content="x" * 100_000)
        assert long.endswith(": " + "x" * 19 + "…")
        await tools("memory_save", content="second")
        with pytest.raises(ToolError) as caught:
            await tools("memory_save", content="third")
        assert str(caught.value) == "memory full (2 entries), use memory_forget first"
        assert len(await knowledge.memory.entries("f:qq:9")) == 2
    finally:
        await knowledge.aclose()


# ------------------------------------------------------------------ through Agent.chat


async def call(agent: Any, llm: Any, session: str, name: str, args: dict | None = None) -> str:
    """The model calls one tool in ``session``; returns the tool message the model got back."""
    llm.script(reply(tool_calls=[tool_call(name, args or {})]), reply("ok"))
    await agent.chat(f"please use {name}", session=session)
    message = llm.requests[-1].messages[-1]
    assert message["role"] == "tool"
    return str(message["content"])


AGENT_OVERRIDES = {"agent.builtin_tools": True, "embedding.provider": "none"}


async def test_the_model_uses_the_tools_through_agent_chat(make_agent: Any, llm: Any) -> None:
    agent = make_agent(overrides=AGENT_OVERRIDES)
    added = await call(agent, llm, "nb:a", "kb_add", {"title": "Deploy", "content": DEPLOY_TEXT})
    [doc] = await agent.knowledge.kb.documents("nb:a")
    assert added == f"Added to the knowledge base (ID={doc.id}): Deploy"
    sent = {t["function"]["name"] for t in llm.requests[-1].body["tools"]}
    assert set(KB_TOOLS + MEMORY_TOOLS) <= sent
    system = llm.requests[-1].messages[0]
    assert system["role"] == "system" and "【知识库】" in system["content"]

    found = await call(agent, llm, "nb:a", "kb_search", {"query": "make deploy"})
    assert found == f'Knowledge base passages (1):\n[{doc.id}] "Deploy" (nb:a): {DEPLOY_TEXT}'
    elsewhere = await call(agent, llm, "nb:b", "kb_search", {"query": "make deploy"})
    assert elsewhere == 'no material related to "make deploy"'
    refused = await call(agent, llm, "nb:b", "kb_delete", {"id": doc.id})
    assert refused.startswith("Error executing tool:") and f"not found: {doc.id}" in refused
    bad = await call(agent, llm, "nb:a", "kb_search", {"query": "x", "top_k": "many"})
    assert "Error executing tool:" in bad and "top_k" in bad
    assert len(await agent.knowledge.kb.documents("nb:a")) == 1

    saved = await call(agent, llm, "f:qq:7", "memory_save", {"content": "likes jazz"})
    [entry] = await agent.knowledge.memory.entries("f:qq:7")
    assert saved == f"Remembered (ID={entry.id}): likes jazz"
    assert await call(agent, llm, "f:qq:8", "memory_search") == "no memories yet"


async def test_disabled_parts_give_no_tools(make_agent: Any, llm: Any) -> None:
    agent = make_agent(overrides={**AGENT_OVERRIDES, "kb.enable": False})
    llm.script(reply("hi"))
    await agent.chat("hello", session="nb:a")
    sent = {t["function"]["name"] for t in llm.requests[-1].body["tools"]}
    assert set(MEMORY_TOOLS) <= sent and not sent & set(KB_TOOLS)
    assert "【知识库】" not in llm.requests[-1].messages[0]["content"]


@pytest.mark.parametrize(
    "query",
    [
        '"unbalanced',
        "a AND (b OR",
        "\\",
        "*",
        "title:x",
        "'; DROP TABLE kb_chunks; --",
        "部署" * 900,
    ],
)
async def test_hostile_queries_find_nothing_or_something_but_never_break(
    tools: Tools, knowledge: Knowledge, query: str
) -> None:
    await tools("kb_add", title="Deploy", content="run make deploy")
    await tools("memory_save", content="likes jazz")
    found = await tools("kb_search", query=query)
    assert found.startswith(("Knowledge base passages", "no material related to"))
    recalled = await tools("memory_search", query=query)
    assert recalled.startswith(("Related memories", "Long-term memories", "no memory related to"))
    assert len(await knowledge.kb.documents("nb:a")) == 1
    assert len(await knowledge.memory.entries("nb:a")) == 1
