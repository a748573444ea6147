"""SkillManager, frontmatter and the skill_read/skill_reload tools against real skill folders."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import ania_nb.skills as skills_pkg
from ania_nb.errors import ToolError, UsageError
from ania_nb.skills import (
    FrontmatterError,
    SkillLoadError,
    SkillManager,
    parse_frontmatter,
    skill_tools,
)
from ania_nb.tools import ToolContext, ToolExecutor

SHIPPED = Path(__file__).resolve().parent.parent / "skills"


def write_skill(
    root: Path,
    folder: str,
    name: str | None = None,
    description: str | None = "Does things.",
    body: str = "# Steps\n1. Do it.\n",
    extra: dict[str, str] | None = None,
) -> Path:
    """Write <root>/<folder>/SKILL.md (folder "" = single-file layout) plus extra files."""
    base = root / folder if folder else root
    base.mkdir(parents=True, exist_ok=True)
    meta = []
    if name is not None:
        meta.append(f"name: {name}")
    if description is not None:
        meta.append(f"description: {description}")
    text = ("---\n" + "\n".join(meta) + "\n---\n" if meta else "") + body
    (base / "SKILL.md").write_text(text, encoding="utf-8")
    for rel, content in (extra or {}).items():
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(content, encoding="utf-8")
    return base


async def loaded(root: Path, **kwargs: object) -> SkillManager:
    manager = SkillManager(root, **kwargs)  # type: ignore[arg-type]
    await manager.reload()
    return manager


async def call(manager: SkillManager, tool: str, **arguments: object) -> str:
    (found,) = [t for t in skill_tools(manager, self_manage=False) if t.name == tool]
    return await found.invoke(arguments, ToolContext())


# --- package and frontmatter ----------------------------------------------------------------


def test_all_is_sorted_and_exported() -> None:
    assert skills_pkg.__all__ == sorted(skills_pkg.__all__)
    for name in skills_pkg.__all__:
        assert getattr(skills_pkg, name) is not None


def test_frontmatter_reads_name_and_description_and_ignores_other_keys() -> None:
    text = (
        "\ufeff---\nname: pdf\ndescription: >\n  Fill PDF\n  forms.\nlicense: MIT\n"
        "allowed-tools: Bash(python:*)\nmetadata:\n  version: 2\n---\n# Body\n---\nmore\n"
    )
    meta = parse_frontmatter(text)
    assert (meta.name, meta.description) == ("pdf", "Fill PDF forms.")
    assert parse_frontmatter("# no frontmatter\n").name == ""
    assert parse_frontmatter("---\n---\nbody").description == ""
    assert parse_frontmatter("---\nname: 2048\n---\n").name == "2048"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("---\nname: x\ndescription: y\n", "no closing '---'"),
        ("---\nname: [oops\n---\n", "not valid YAML"),
        ("---\n- a\n- b\n---\n", "must be a YAML mapping"),
        ("---\ndescription: [1, 2]\n---\n", "'description' must be text"),
    ],
)
def test_broken_frontmatter_says_what_is_wrong(text: str, reason: str) -> None:
    with pytest.raises(FrontmatterError, match=reason):
        parse_frontmatter(text)


# --- loading ----------------------------------------------------------------------------------


async def test_folder_layout_with_references_and_files(tmp_path: Path) -> None:
    folder = write_skill(
        tmp_path,
        "pdf-tools",
        name="pdf",
        extra={
            "reference.md": "# Ref",
            "docs/forms.MARKDOWN": "# Forms",
            "scripts/fill.py": "print(1)",
            "run.sh": "echo hi",
            ".hidden/secret.md": "no",
            ".DS_Store": "junk",
        },
    )
    manager = await loaded(tmp_path)
    skill = manager.get("pdf")
    assert skill is not None
    assert skill.location == "pdf-tools/SKILL.md"
    assert skill.folder == folder.absolute()
    assert skill.path == (folder / "SKILL.md").absolute()
    assert list(skill.references) == ["docs/forms.MARKDOWN", "reference.md"]
    assert skill.references["reference.md"] == (folder / "reference.md").absolute()
    assert dict(skill.files) == {
        "run.sh": (folder / "run.sh").absolute(),
        "scripts/fill.py": (folder / "scripts/fill.py").absolute(),
    }
    assert all(p.is_absolute() for p in skill.files.values())
    assert manager.errors == []


async def test_single_file_layout_and_name_defaults(tmp_path: Path) -> None:
    root = tmp_path / "my-skills"
    write_skill(root, "", name=None, description="The only skill.")
    write_skill(root, "unnamed", name=None, description="Named after its folder.")
    manager = await loaded(root)
    assert manager.names() == ["my-skills", "unnamed"]
    single = manager.get("my-skills")
    assert single is not None and single.folder is None
    assert single.location == "SKILL.md"
    assert single.references == {} and single.files == {}


async def test_missing_folder_means_no_skills_and_no_prompt(tmp_path: Path) -> None:
    manager = await loaded(tmp_path / "absent")
    assert len(manager) == 0
    assert manager.errors == []
    assert manager.registry_prompt() == ""
    assert "No skills" in manager.listing()


async def test_a_file_where_the_folder_should_be_is_reported(tmp_path: Path) -> None:
    (tmp_path / "skills").write_text("oops")
    manager = await loaded(tmp_path / "skills")
    assert len(manager) == 0
    assert "not a folder" in manager.errors[0].reason


async def test_whitelist_keeps_only_listed_names(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        write_skill(tmp_path, name, name=name)
    manager = await loaded(tmp_path, whitelist=["c", "a", "zzz"])
    assert manager.names() == ["a", "c"]
    assert manager.whitelist == ("a", "c", "zzz")
    await manager.reload(whitelist=[])
    assert manager.names() == ["a", "b", "c"]
    with pytest.raises(UsageError, match="list of skill names"):
        SkillManager(tmp_path, whitelist="a")


async def test_broken_skills_are_reported_and_the_others_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_skill(tmp_path, "good", name="good")
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml" / "SKILL.md").write_text("---\nname: [x\n---\n", encoding="utf-8")
    (tmp_path / "open").mkdir()
    (tmp_path / "open" / "SKILL.md").write_text("---\nname: open\n", encoding="utf-8")
    (tmp_path / "binary").mkdir()
    (tmp_path / "binary" / "SKILL.md").write_bytes(b"\xff\xfe\x00bad")
    write_skill(tmp_path, "zz-last", name="last")
    with caplog.at_level(logging.WARNING, logger="ania_nb.skills"):
        manager = await loaded(tmp_path)
    assert manager.names() == ["good", "last"]
    errors = {e.path: e.reason for e in manager.errors}
    assert set(errors) == {"binary/SKILL.md", "open/SKILL.md", "yaml/SKILL.md"}
    assert "not UTF-8" in errors["binary/SKILL.md"]
    assert "no closing" in errors["open/SKILL.md"]
    assert "not valid YAML" in errors["yaml/SKILL.md"]
    assert all(isinstance(e, SkillLoadError) for e in manager.errors)
    assert "yaml/SKILL.md" in caplog.text


async def test_duplicate_names_keep_the_first_in_path_order(tmp_path: Path) -> None:
    write_skill(tmp_path, "b-copy", name="same", description="second")
    write_skill(tmp_path, "a-orig", name="same", description="first")
    manager = await loaded(tmp_path)
    skill = manager.get("same")
    assert skill is not None and skill.description == "first"
    (error,) = manager.errors
    assert error.path == "b-copy/SKILL.md"
    assert "duplicate skill name 'same'" in error.reason and "a-orig/SKILL.md" in error.reason


async def test_hidden_folders_such_as_install_staging_are_ignored(tmp_path: Path) -> None:
    write_skill(tmp_path, ".upload-123", name="half-installed")
    write_skill(tmp_path, "real", name="real")
    manager = await loaded(tmp_path)
    assert manager.names() == ["real"]


async def test_refresh_sees_edits_and_keeps_old_snapshots_intact(tmp_path: Path) -> None:
    write_skill(tmp_path, "one", name="one", description="v1")
    write_skill(tmp_path, "two", name="two")
    manager = await loaded(tmp_path)
    before = manager.skills
    prompt_before = manager.registry_prompt()

    write_skill(tmp_path, "one", name="one", description="v2")
    write_skill(tmp_path, "three", name="three")
    (tmp_path / "two" / "SKILL.md").unlink()
    await manager.refresh()

    assert manager.names() == ["one", "three"]
    one = manager.get("one")
    assert one is not None and one.description == "v2"
    # The old registry object was replaced, never mutated.
    assert list(before) == ["one", "two"] and before["one"].description == "v1"
    assert "v2" in manager.registry_prompt() and "v1" in prompt_before


async def test_reload_with_another_folder_then_refresh_uses_it(tmp_path: Path) -> None:
    write_skill(tmp_path / "first", "a", name="a")
    write_skill(tmp_path / "second", "b", name="b")
    manager = await loaded(tmp_path / "first")
    await manager.reload(tmp_path / "second")
    assert manager.dir == tmp_path / "second"
    write_skill(tmp_path / "second", "c", name="c")
    await manager.refresh()
    assert manager.names() == ["b", "c"]


# --- registry prompt --------------------------------------------------------------------------


async def test_registry_prompt_is_sorted_escaped_and_byte_identical(tmp_path: Path) -> None:
    write_skill(tmp_path, "zeta", name="zeta", description="Last <one> & co")
    write_skill(tmp_path, "alpha", name="alpha", description="|\n  Multi\n  line")
    manager = await loaded(tmp_path)
    prompt = manager.registry_prompt()
    assert prompt.startswith("<agent_skills_registry>\n<instruction>")
    assert prompt.endswith("</agent_skills_registry>")
    assert "skill_read" in prompt
    assert prompt.index("<name>alpha</name>") < prompt.index("<name>zeta</name>")
    assert "<description>Multi line</description>" in prompt
    assert "Last &lt;one&gt; &amp; co" in prompt
    assert manager.registry_prompt() is prompt  # cached per registry
    other = await loaded(tmp_path)
    assert other.registry_prompt().encode() == prompt.encode()
    await manager.refresh()
    assert manager.registry_prompt() == prompt


# --- tools ------------------------------------------------------------------------------------


def test_skill_tools_without_self_management(tmp_path: Path) -> None:
    manager = SkillManager(tmp_path)
    tools = skill_tools(manager, self_manage=False)
    assert [t.name for t in tools] == ["skill_read", "skill_reload"]
    assert not any(t.side_effects for t in tools)
    read = tools[0].definition()["function"]
    assert read["parameters"]["required"] == ["skill_name"]
    managed = skill_tools(manager, self_manage=True)
    assert [t.name for t in managed] == [
        "skill_install",
        "skill_list",
        "skill_read",
        "skill_reload",
        "skill_remove",
    ]
    effects = {t.name: t.side_effects for t in managed}
    assert effects["skill_install"] and effects["skill_remove"] and not effects["skill_list"]


async def test_skill_read_lists_reads_and_lists_attachments(tmp_path: Path) -> None:
    folder = write_skill(
        tmp_path,
        "csv",
        name="csv",
        description="CSV work.",
        extra={"guide.md": "# Guide text", "tools/clean.sh": "sed"},
    )
    write_skill(tmp_path, "b", name="b", description="Bee.")
    manager = await loaded(tmp_path)

    assert await call(manager, "skill_read", skill_name="") == "- b: Bee.\n- csv: CSV work."
    text = await call(manager, "skill_read", skill_name="csv")
    assert text.startswith("---\nname: csv\n")  # the full SKILL.md, frontmatter included
    assert "\n\n---\n\n## References" in text
    assert "- guide.md" in text
    assert f"- tools/clean.sh → {(folder / 'tools/clean.sh').absolute()}" in text
    assert await call(manager, "skill_read", skill_name="csv", file_name="guide.md") == (
        "# Guide text"
    )
    assert await call(manager, "skill_read", skill_name="b") == (
        (tmp_path / "b" / "SKILL.md").read_text(encoding="utf-8")
    )


async def test_skill_read_errors_name_the_valid_choices(tmp_path: Path) -> None:
    write_skill(tmp_path, "z", name="z", extra={"b.md": "", "a.md": "", "run.py": ""})
    write_skill(tmp_path, "y", name="y")
    manager = await loaded(tmp_path)
    with pytest.raises(ToolError, match=r"no skill named 'nope'; available skills: y, z$"):
        await call(manager, "skill_read", skill_name="nope")
    with pytest.raises(ToolError, match=r"has no reference 'c.md'; its references: a.md, b.md$"):
        await call(manager, "skill_read", skill_name="z", file_name="c.md")
    with pytest.raises(ToolError, match="not a reference document but a file at /"):
        await call(manager, "skill_read", skill_name="z", file_name="run.py")
    with pytest.raises(ToolError, match="has no reference documents"):
        await call(manager, "skill_read", skill_name="y", file_name="x.md")
    empty = await loaded(tmp_path / "none")
    with pytest.raises(ToolError, match="no skills are installed"):
        await call(empty, "skill_read", skill_name="x")


async def test_skill_read_truncates_long_skill_md_with_a_hint(tmp_path: Path) -> None:
    write_skill(tmp_path, "big", name="big", body="x" * 20000, extra={"more.md": "m"})
    manager = await loaded(tmp_path)
    text = await call(manager, "skill_read", skill_name="big")
    head, _, rest = text.partition("\n\n[SKILL.md truncated")
    note = rest[: rest.index(".]") + 2]
    # At most 16 000 characters, the hint included; the hint says where the rest starts.
    assert len(head) + len("\n\n[SKILL.md truncated") + len(note) == 16000
    total = len((tmp_path / "big" / "SKILL.md").read_text(encoding="utf-8"))
    assert note.startswith(f": showing {len(head)} of {total} characters.")
    assert "file_name" in rest and str((tmp_path / "big" / "SKILL.md").absolute()) in rest
    assert rest.rstrip().endswith("- more.md")  # the attachment list survives truncation


async def test_skill_reload_reports_count_names_and_broken(tmp_path: Path) -> None:
    write_skill(tmp_path, "b", name="b")
    manager = await loaded(tmp_path)
    write_skill(tmp_path, "a", name="a")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "SKILL.md").write_text("---\nname: [\n---\n", encoding="utf-8")
    text = await call(manager, "skill_reload")
    assert ": 2 skills: [a, b]" in text
    assert "\n- bad/SKILL.md: the frontmatter is not valid YAML" in text
    assert manager.names() == ["a", "b"]


async def test_tool_errors_reach_the_model_through_the_executor(tmp_path: Path) -> None:
    manager = await loaded(tmp_path)
    executor = ToolExecutor()
    for t in skill_tools(manager, self_manage=False):
        executor.add(t)
    outcome = await executor.execute("skill_read", '{"skill_name": "ghost"}')
    assert outcome.error is not None and "no skill named 'ghost'" in outcome.error


# --- shipped skills ---------------------------------------------------------------------------


async def test_shipped_skills_all_load_with_descriptions_and_references() -> None:
    manager = await loaded(SHIPPED)
    assert manager.errors == []
    assert 2 <= len(manager) <= 5
    for skill in manager.skills.values():
        assert skill.folder is not None and skill.folder.name == skill.name
        assert len(skill.description) >= 60, skill.name
        assert skill.references, f"{skill.name} ships no reference file"
        for path in skill.references.values():
            assert len(path.read_text(encoding="utf-8")) > 500
        assert "skill_read" in skill.content or "file_name" in skill.content
    assert manager.registry_prompt().count("<skill>") == len(manager)
