"""The smaller attacks of issue 12: YAML bombs in SKILL.md, install leftovers after a crash,
lone surrogates in tool results, a reader URL that would leak the web token, and MCP tool
annotations deciding plan mode and approvals."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp_servers.support import stdio_entry, write_config

from ania_nb import Callbacks, ConfigError, tool
from ania_nb.config import Config
from ania_nb.skills import FrontmatterError, SkillManager, parse_frontmatter
from ania_nb.store import Store
from ania_nb.testing import reply, tool_call

# --- item 12: SKILL.md that makes the YAML parser recurse or explode ---------------------------

DEEP = 5000  # far past Python's recursion limit once PyYAML's composer recurses per level


def _laughs(levels: int = 9, fan: int = 10) -> str:
    """The "billion laughs": each level refers to the previous one ``fan`` times (10⁹ values)."""
    lines = ["lol0: &lol0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        lines.append(f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * fan) + "]")
    return "\n".join(lines)


BOMBS = {
    "nested-lists": ("name: " + "[" * DEEP + "]" * DEEP, "nests too deeply"),
    "nested-maps": ("name: " + "{a: " * DEEP + "1" + "}" * DEEP, "nests too deeply"),
    "block-maps": ("".join(" " * i + "a:\n" for i in range(340)) + " " * 340 + "b", "too deeply"),
    "billion-laughs": (_laughs(), "expands to more than"),
    "self-reference": ("a: &a [*a, *a]", "refers to itself"),
    "oversized": ("description: " + "x" * 70_000, "more than the limit"),
}


def bomb_skill(kind: str) -> str:
    block, _ = BOMBS[kind]
    return f"---\n{block}\nname: bomb\ndescription: explodes\n---\n# Body\n"


@pytest.mark.parametrize("kind", sorted(BOMBS))
def test_a_yaml_bomb_is_a_clear_frontmatter_error(kind: str) -> None:
    with pytest.raises(FrontmatterError, match=BOMBS[kind][1]):
        parse_frontmatter(bomb_skill(kind))


def test_honest_anchors_and_nesting_still_load() -> None:
    text = (
        "---\nname: fine\ndescription: ok\ndefaults: &d {retries: 3}\nprod: *d\n"
        "metadata:\n  a:\n    b: [1, [2, [3, {c: d}]]]\n---\nbody\n"
    )
    meta = parse_frontmatter(text)
    assert (meta.name, meta.description) == ("fine", "ok")


async def test_bombs_are_skipped_at_start_and_the_other_skills_load(llm, make_agent, tmp_path):
    skills = tmp_path / "skills"
    for kind in BOMBS:
        (skills / kind).mkdir(parents=True)
        (skills / kind / "SKILL.md").write_text(bomb_skill(kind), encoding="utf-8")
    (skills / "good").mkdir()
    (skills / "good" / "SKILL.md").write_text(
        "---\nname: good\ndescription: A well-formed skill.\n---\nDo it.\n", encoding="utf-8"
    )
    agent = make_agent(overrides={"skills.dir": str(skills)})
    llm.script(reply("hello"))
    result = await agent.chat("hi")
    assert result.ok
    assert agent.skills is not None and agent.skills.names() == ["good"]
    skipped = {e.path: e.reason for e in agent.skills.errors}
    assert set(skipped) == {f"{kind}/SKILL.md" for kind in BOMBS}
    for kind, (_, reason) in BOMBS.items():
        assert reason in skipped[f"{kind}/SKILL.md"]
    system = llm.requests[0].messages[0]["content"]
    assert "<name>good</name>" in system and "bomb" not in system


async def test_installing_a_bomb_is_refused_and_audited(llm, make_agent, tmp_path):
    skills = tmp_path / "skills"
    agent = make_agent(overrides={"skills.dir": str(skills), "skills.self_manage": True})
    llm.script(
        reply(tool_calls=[tool_call("skill_install", {"content": bomb_skill("nested-lists")})]),
        reply("could not install"),
    )

    async def allow(request):  # the notebook user clicks Allow on the admin card
        agent.answer_approval(request.id, allow=True)

    callbacks = Callbacks(request_approval=allow)
    result = await agent.chat("install this skill", session="nb:bomb", callbacks=callbacks)
    [call] = result.tool_calls
    assert call.outcome == "error"
    assert "SKILL.md is invalid" in call.result and "nests too deeply" in call.result
    assert not skills.exists() or [p.name for p in skills.iterdir()] == []  # no staging left
    store = await Store.open(agent.data_dir)
    try:
        [entry] = await store.oplog.list(action="skill_install")
    finally:
        await store.close()
    assert entry.session == "nb:bomb"
    assert entry.detail.startswith("failed (content): ") and "nests too deeply" in entry.detail


# --- item 12: crash-safe skill replace ------------------------------------------------------


def make_skill(folder: Path, name: str, version: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: version {version}\n---\n", encoding="utf-8"
    )
    return folder


def age(path: Path, seconds: float = 3600.0) -> None:
    """Make a folder look like it was last written ``seconds`` ago (a crashed install's)."""
    old = os.stat(path).st_mtime - seconds
    os.utime(path, (old, old))


async def test_a_replace_cut_between_its_renames_is_restored_at_start(tmp_path, caplog):
    root = tmp_path / "skills"
    # The crash left: the old version set aside, no skill under its name, the new one staged.
    make_skill(root / ".old-pdf-0123abcd", "pdf", "1")
    make_skill(root / ".upload-x1y2z3", "pdf", "2")
    age(root / ".upload-x1y2z3")
    make_skill(root / "other", "other", "1")
    manager = SkillManager(root)
    with caplog.at_level(logging.WARNING, logger="ania_nb.skills"):
        await manager.reload()
    assert manager.names() == ["other", "pdf"]
    assert manager.get("pdf").description == "version 1"  # type: ignore[union-attr]
    assert sorted(p.name for p in root.iterdir()) == ["other", "pdf"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "restored 'pdf' from .old-pdf-0123abcd" in logged
    assert "deleted leftover .upload-x1y2z3" in logged


async def test_leftovers_next_to_a_complete_skill_are_deleted(tmp_path, caplog):
    root = tmp_path / "skills"
    make_skill(root / "pdf", "pdf", "2")  # the replace finished; deleting the old copy did not
    make_skill(root / ".old-pdf-0123abcd", "pdf", "1")
    make_skill(root / ".del-gone-89abcdef", "gone", "1")  # a removal cut short stays removed
    manager = SkillManager(root)
    with caplog.at_level(logging.WARNING, logger="ania_nb.skills"):
        await manager.reload()
    assert manager.names() == ["pdf"]
    assert manager.get("pdf").description == "version 2"  # type: ignore[union-attr]
    assert sorted(p.name for p in root.iterdir()) == ["pdf"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "deleted leftover .old-pdf-0123abcd" in logged
    assert "deleted leftover .del-gone-89abcdef" in logged


async def test_a_fresh_staging_folder_is_left_to_the_install_that_owns_it(tmp_path):
    root = tmp_path / "skills"
    make_skill(root / ".upload-busy", "new", "1")  # another process is installing right now
    make_skill(root / ".upload-stale", "new", "0")
    age(root / ".upload-stale")
    manager = SkillManager(root)
    await manager.reload()
    assert sorted(p.name for p in root.iterdir()) == [".upload-busy"]
    shutil.rmtree(root / ".upload-stale", ignore_errors=True)


async def test_leftovers_are_handled_once_not_on_every_reload(tmp_path):
    root = tmp_path / "skills"
    make_skill(root / "pdf", "pdf", "1")
    manager = SkillManager(root)
    await manager.reload()
    # An install of this process stages here while another reload runs: never touched.
    make_skill(root / ".upload-mine", "pdf", "2")
    age(root / ".upload-mine")
    await manager.refresh()
    assert (root / ".upload-mine").is_dir()


_renames: list[tuple[str, str]] | None = None


def _watch_renames(event: str, args: tuple[Any, ...]) -> None:
    if event == "os.rename" and _renames is not None:
        _renames.append((Path(args[0]).name, Path(args[1]).name))


async def test_a_removal_sets_the_skill_aside_as_del_never_as_old(tmp_path):
    """A removal cut short must not look like an interrupted replace (which is restored)."""
    global _renames
    from ania_nb.skills import SkillInstaller

    root = tmp_path / "skills"
    make_skill(root / "pdf", "pdf", "1")
    make_skill(root / "keep", "keep", "1")
    manager = SkillManager(root)
    await manager.reload()
    if not getattr(_watch_renames, "installed", False):
        sys.addaudithook(_watch_renames)  # audit hooks cannot be removed; it is idle when None
        _watch_renames.installed = True  # type: ignore[attr-defined]
    _renames = []
    try:
        await SkillInstaller(manager).remove("pdf")
        [(source, aside)] = _renames
    finally:
        _renames = None
    assert source == "pdf" and aside.startswith(".del-pdf-")
    # Had the process died right after that rename, the next start finishes the removal.
    make_skill(root / aside, "pdf", "1")
    restarted = SkillManager(root)
    await restarted.reload()
    assert restarted.names() == ["keep"] and sorted(p.name for p in root.iterdir()) == ["keep"]


# --- item 12: lone surrogates in tool results -----------------------------------------------


async def test_a_tool_returning_a_lone_surrogate_is_replaced_not_fatal(llm, make_agent):
    @tool
    def broken_text() -> str:
        """Returns text that cannot be encoded as UTF-8."""
        return "before \ud800 after \udfff end"

    agent = make_agent(tools=[broken_text])
    llm.script(reply(tool_calls=[tool_call("broken_text")]), reply("done"))
    result = await agent.chat("call it")
    assert result.ok and result.text == "done"
    [call] = result.tool_calls
    assert call.outcome == "ok"
    sent = llm.requests[1].messages[-1]
    assert sent["role"] == "tool" and sent["content"] == "before \ufffd after \ufffd end"
    llm.script(reply("again"))
    assert (await agent.chat("and now?")).ok  # the stored history is clean too
    assert "before \ufffd after" in str(llm.requests[2].messages)


def annotated_server(tmp_path: Path, **fields: Any) -> Path:
    entry = stdio_entry("demo", **fields)
    entry["args"].append("--annotated")
    return write_config(tmp_path / "mcp.json", [entry])


def mcp_agent(make_agent, tmp_path: Path, **overrides: Any) -> Any:
    return make_agent(
        data_dir=tmp_path / "data",
        overrides={
            "mcp.config_file": str(annotated_server(tmp_path)),
            "mcp.lazy_load": False,
            "mcp.connect_timeout": 20.0,
            **overrides,
        },
    )


# --- item 12: web.reader_url = "" would send the token to every page ------------------------


@pytest.mark.parametrize("key", ["web.reader_url", "web.search_url"])
@pytest.mark.parametrize("value", ["", "   ", "r.jina.ai/", "file:///etc/passwd", "http://"])
def test_a_reader_url_that_is_not_a_service_address_is_refused(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=rf"{key}: .*empty is refused, it would send the web"):
        Config().with_overrides({key: value})


def test_a_self_hosted_reader_is_still_accepted() -> None:
    config = Config().with_overrides({"web.reader_url": " http://127.0.0.1:3000/ "})
    assert config.web.reader_url == "http://127.0.0.1:3000/"
    assert Config().web.reader_url == "https://r.jina.ai/"


async def test_an_agent_with_an_empty_reader_url_does_not_start(make_agent):
    with pytest.raises(ConfigError, match=r"web\.reader_url"):
        make_agent(overrides={"web.reader_url": ""})


# --- item 13: MCP annotations decide plan mode and approvals --------------------------------


async def test_plan_mode_blocks_unannotated_mcp_tools_and_lets_read_only_ones_run(
    llm, make_agent, tmp_path
):
    agent = mcp_agent(make_agent, tmp_path)
    await agent.start()  # eager MCP tools are there once started
    marker = tmp_path / "marked"
    llm.script(
        reply(
            tool_calls=[
                tool_call("mark", {"path": str(marker)}),
                tool_call("wipe", {"path": str(marker)}),
                tool_call("peek", {"path": str(marker)}),
            ]
        ),
        reply("planned"),
    )
    result = await agent.chat("plan it", plan=True)
    mark, wipe, peek = result.tool_calls
    assert (mark.outcome, mark.stage) == ("blocked", "plan")
    assert (wipe.outcome, wipe.stage) == ("blocked", "plan")
    assert peek.outcome == "ok" and peek.result == f"{marker} exists: False"
    assert not marker.exists()


async def test_a_destructive_mcp_tool_asks_and_a_denial_means_it_never_ran(
    llm, make_agent, tmp_path, inbox
):
    agent = mcp_agent(make_agent, tmp_path, **{"approval.enable": True})
    await agent.start()  # eager MCP tools are there once started
    wiped, marked = tmp_path / "wiped", tmp_path / "marked"
    llm.script(
        reply(
            tool_calls=[
                tool_call("wipe", {"path": str(wiped)}),
                tool_call("mark", {"path": str(marked)}),
            ]
        ),
        reply("ok"),
    )
    task = asyncio.create_task(agent.chat("go", callbacks=Callbacks(request_approval=inbox)))
    request = await inbox.wait_for(1)
    assert request.tool == "wipe" and str(wiped) in request.details
    agent.answer_approval(request.id, allow=False, approver="me")
    result = await task
    wipe, mark = result.tool_calls
    assert (wipe.outcome, wipe.stage) == ("denied", "human")
    assert not wiped.exists()
    # Un-annotated is not destructive: it runs without asking (approval.tools can add it).
    assert mark.outcome == "ok" and marked.exists()
    assert len(inbox.requests) == 1


async def test_an_allowed_destructive_call_runs_and_without_approvals_nobody_is_asked(
    llm, make_agent, tmp_path, inbox
):
    agent = mcp_agent(make_agent, tmp_path, **{"approval.enable": True})
    await agent.start()  # eager MCP tools are there once started
    wiped = tmp_path / "wiped"
    llm.script(reply(tool_calls=[tool_call("wipe", {"path": str(wiped)})]), reply("ok"))
    task = asyncio.create_task(agent.chat("go", callbacks=Callbacks(request_approval=inbox)))
    request = await inbox.wait_for(1)
    agent.answer_approval(request.id, allow=True, approver="me")
    [wipe] = (await task).tool_calls
    assert wipe.outcome == "ok" and wiped.read_text() == "wiped"

    other = tmp_path / "other"
    other.mkdir()
    plain = mcp_agent(make_agent, other)  # approval.enable is off
    await plain.start()
    again = other / "wiped"
    llm.script(reply(tool_calls=[tool_call("wipe", {"path": str(again)})]), reply("ok"))
    [call] = (await plain.chat("go", callbacks=Callbacks(request_approval=inbox))).tool_calls
    assert call.outcome == "ok" and again.exists() and len(inbox.requests) == 1


async def test_a_destructive_mcp_tool_refuses_a_call_that_skipped_the_gate(tmp_path):
    from ania_nb.config import MCPSettings
    from ania_nb.errors import ToolError
    from ania_nb.mcp import MCPRegistry
    from ania_nb.tools import ToolContext, ToolExecutor

    shared = ToolExecutor()
    settings = MCPSettings(
        config_file=annotated_server(tmp_path), lazy_load=False, connect_timeout=20.0
    )
    wiped = tmp_path / "wiped"
    async with MCPRegistry(settings, shared, approval_enabled=True):
        wipe = shared.get("wipe")
        assert wipe is not None and wipe.needs_approval({"path": str(wiped)})  # type: ignore[attr-defined]
        assert not shared.get("mark").needs_approval({})  # type: ignore[union-attr]
        assert shared.get("peek").side_effects is False  # type: ignore[union-attr]
        with pytest.raises(ToolError, match="marked destructive and needs a person's approval"):
            await wipe.invoke({"path": str(wiped)}, ToolContext())
        assert not wiped.exists()
        assert await wipe.invoke({"path": str(wiped)}, ToolContext(approved=True))
        assert wiped.exists()
