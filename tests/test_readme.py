"""The README's commands and examples, run as they are written, so that they cannot drift.

The set-up block's two commands are parsed the way `.ci/run` reads them (`.ci/readme-setup`);
the "Use it from Python" cell runs in-process against the scripted model (its endpoint
swapped in), and the "Testing with the scripted model" script runs unchanged.
"""

from __future__ import annotations

import ast
import asyncio
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    """The text of the README section whose heading is ``## <title>``."""
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else len(README)]


def code_blocks(text: str, language: str) -> list[str]:
    """The fenced blocks of one language, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.S | re.M)


def setup_commands() -> list[str]:
    """The set-up block's lines without their trailing comments (as `.ci/readme-setup`)."""
    [block, *_] = code_blocks(section("Set-up"), "bash")
    return [re.sub(r"\s+#[^\"]*$", "", line) for line in block.splitlines()]


def test_the_set_up_is_two_commands_in_a_venv_the_second_running_every_test():
    install, tests = setup_commands()
    steps = [s.strip() for s in install.split("&&")]
    assert steps[:2] == ["python3 -m venv .venv", ". .venv/bin/activate"]  # PEP 668-proof
    assert 'pip install -e ".[dev]"' in steps and steps[-1] == "ania-nb demo"
    assert [s.strip() for s in tests.split("&&")] == [". .venv/bin/activate", "python -m pytest -q"]
    assert "python3 -m pip install" not in README  # outside a venv: refused on Debian's Python


def test_ci_runs_exactly_the_readmes_set_up_lines():
    printed = subprocess.run(
        [str(ROOT / ".ci" / "readme-setup")], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert printed == setup_commands()
    run = (ROOT / ".ci" / "run").read_text()
    assert "mapfile -t setup < <(.ci/readme-setup)" in run
    assert 'eval "${setup[0]}"' in run and 'eval "${setup[1]}"' in run


async def test_the_use_it_from_python_cell_runs_against_a_local_model(llm, tmp_path, monkeypatch):
    [cell] = code_blocks(section("Use it from Python"), "python")
    assert "await agent.chat(" in cell and "asyncio.run(main())" in section("Use it from Python")
    # The cell names a hosted endpoint; the scripted server stands in for it.
    local = re.sub(
        r'base_url="[^"]+", api_key="[^"]+", model="[^"]+"',
        f'base_url="{llm.base_url}", api_key="{llm.api_key}", model="any"',
        cell,
    )
    assert local != cell
    from ania_nb.testing import reply, tool_call

    llm.script(
        reply(tool_calls=[tool_call("word_count", {"text": "to be or not to be"})]),
        reply("6 words."),
    )
    monkeypatch.chdir(tmp_path)  # the default data directory, ./.ania, goes here
    namespace: dict[str, Any] = {}
    code = compile(local, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    await eval(code, namespace)  # the README's own cell
    result = namespace["result"]
    assert (result.text, result.status) == ("6 words.", "success")
    assert [c.result for c in result.tool_calls] == ["6"]


def test_the_scripted_model_example_runs_unchanged(tmp_path, monkeypatch):
    [script] = code_blocks(section("Testing with the scripted model"), "python")
    assert "asyncio.run(main())" in script
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError, match="no running event loop"):
        asyncio.get_running_loop()  # a plain test: the script's asyncio.run owns the loop
    exec(compile(script, "README.md", "exec"), {"__name__": "__readme__"})
