"""The extension in real Jupyter kernels (nbclient): magics, `_`, --bg, %ania, and history that
survives a kernel restart."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from _kernel import output_text, write_config
from nbclient import NotebookClient

from ania_nb.testing import delay, reply


def _run(folder: Path, *cells: str, allow_errors: bool = False) -> list[dict]:
    """Execute cells in a fresh kernel started in ``folder``; return each cell's outputs."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    resources = {"metadata": {"path": str(folder)}}
    NotebookClient(nb, timeout=90, resources=resources, allow_errors=allow_errors).execute()
    return [cell.outputs for cell in nb.cells]


@pytest.fixture
def folder(tmp_path: Path, llm) -> Path:
    write_config(tmp_path, llm.base_url)
    return tmp_path


def test_agent_cell_interpolates_shows_a_view_and_sets_underscore(llm, folder):
    llm.script(reply("It is 42."))
    outputs = _run(
        folder,
        "%load_ext ania_nb",
        "x = 41",
        "%%agent\nWhat is {x} + 1?",
        "print(type(_).__name__, _.status, _.text)",
    )
    assert llm.requests[0].messages[-1]["content"].endswith("What is 41 + 1?")
    view = outputs[2]
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in view)
    assert "It is 42." in output_text(view)  # the plain-text fallback of the run view
    assert output_text(outputs[3]).strip() == "RunResult success It is 42."


def test_history_survives_a_kernel_restart(llm, folder):
    llm.script(reply("Noted: blue."), reply("You said blue."))
    _run(folder, "%load_ext ania_nb", "%%agent -q\nMy favourite colour is blue.")
    outputs = _run(folder, "%load_ext ania_nb", "%agent -q What is my favourite colour?", "_.text")
    second = llm.requests[1].messages
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[1]["content"].endswith("My favourite colour is blue.")
    assert "You said blue." in output_text(outputs[2])


def test_background_run_returns_at_once_and_finishes_later(llm, folder):
    llm.script(delay(0.5, reply("done in the background")))
    outputs = _run(
        folder,
        "%load_ext ania_nb",
        "%%agent --bg -q\nslow task",
        "print('cell returned')",
        "import asyncio\n"
        "for _i in range(200):\n"
        "    if getattr(_, 'text', None):\n"
        "        break\n"
        "    await asyncio.sleep(0.05)\n"
        "print(_.text)",
    )
    assert output_text(outputs[2]).strip() == "cell returned"
    assert output_text(outputs[3]).strip() == "done in the background"


def test_ania_management_commands(llm, folder):
    llm.script(reply("hello"))
    outputs = _run(
        folder,
        "%load_ext ania_nb",
        "%ania plan on",
        "%ania plan status",
        "%ania plan off",
        "%agent -q hi",
        "%ania history",
        "%ania tools",
        "%ania config",
        "%ania frobnicate",
        allow_errors=True,
    )
    assert "plan mode is on" in output_text(outputs[1])
    assert "plan mode is off" in output_text(outputs[3])
    history = output_text(outputs[5])
    assert "user:" in history and "assistant: hello" in history
    tools = output_text(outputs[6])
    assert "notebook_vars" in tools and "python" in tools and "total" in tools
    config = output_text(outputs[7])
    assert "llm.api_key = '***'" in config or "llm.api_key = '" in config
    assert "sk-scripted" not in config
    err = outputs[8]
    assert any("unknown %ania command" in str(o) for o in err)
