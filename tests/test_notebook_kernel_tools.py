"""The cell tools in a real Jupyter kernel (jupyter_client): "fix the error above" sees the
cells and the traceback, and ``propose_cell`` reaches the front end as the cell's
``set_next_input`` payload (what JupyterLab turns into a new cell below)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _kernel import start_kernel, write_config

from ania_nb.testing import reply, tool_call


@pytest.fixture
def kernel(tmp_path: Path, llm):
    """A kernel started in a folder whose ania.toml points at the scripted server."""
    write_config(tmp_path, llm.base_url)
    manager, client = start_kernel(tmp_path)
    yield client
    client.stop_channels()
    manager.shutdown_kernel(now=True)


def execute(client, code: str) -> tuple[dict, str]:
    """Run one cell; return its execute_reply content and its stream/text output."""
    texts: list[str] = []

    def collect(msg: dict) -> None:
        content = msg["content"]
        if msg["msg_type"] == "stream":
            texts.append(content["text"])
        elif msg["msg_type"] in ("execute_result", "display_data"):
            texts.append(content["data"].get("text/plain", ""))
        elif msg["msg_type"] == "error":
            texts.append("\n".join(content["traceback"]))

    reply_msg = client.execute_interactive(code, timeout=90, output_hook=collect)
    return reply_msg["content"], "".join(texts)


def test_fix_the_error_above_sees_the_cells_and_proposes_a_cell(kernel, llm):
    fix = "def ratio(a, b):\n    return a / b if b else float('nan')"
    llm.script(
        reply(tool_calls=[tool_call("notebook_cells", {})]),
        reply(tool_calls=[tool_call("propose_cell", {"code": fix})]),
        reply("b is 0 in ratio(1, 0); the new cell below guards against it."),
    )
    for code in ("%load_ext ania_nb", "x = 6\nx * 7"):
        content, _ = execute(kernel, code)
        assert content["status"] == "ok", content
    failed, _ = execute(kernel, "def ratio(a, b):\n    return a / b\n\nratio(1, 0)")
    assert failed["status"] == "error"
    error_cell = failed["execution_count"]
    content, text = execute(kernel, "%%agent -q\nfix the error above")
    assert content["status"] == "ok", text
    assert "guards against it" in text

    seen = llm.requests[1].messages[-1]["content"]  # what notebook_cells gave the model
    assert "x = 6\nx * 7\nOut[" in seen and "]: 42" in seen
    assert f'File "Cell In[{error_cell}]", line 4, in <module>' in seen
    assert f'File "Cell In[{error_cell}]", line 2, in ratio' in seen
    assert "ZeroDivisionError: division by zero" in seen
    assert "%load_ext" in seen and "fix the error above" not in seen  # not its own cell
    assert [p for p in content["payload"] if p["source"] == "set_next_input"] == [
        {"source": "set_next_input", "text": fix, "replace": False}
    ]
    # The proposal ran nothing: ratio is still the old one.
    again, text = execute(kernel, "ratio(1, 0)")
    assert again["status"] == "error" and "ZeroDivisionError" in text


def test_propose_cell_works_in_plan_mode_where_python_is_blocked(kernel, llm):
    llm.script(
        reply(
            tool_calls=[
                tool_call("python", {"code": "import os"}),
                tool_call("propose_cell", {"code": "print('hello')"}),
            ]
        ),
        reply("proposed"),
    )
    for code in ("%load_ext ania_nb",):
        assert execute(kernel, code)[0]["status"] == "ok"
    content, _ = execute(kernel, "%%agent -q --plan\nsay hello")
    _, result = execute(kernel, "import json\nprint(json.dumps([c.error for c in _.tool_calls]))")
    python_error, propose_error = json.loads(result)
    assert python_error is not None and "plan mode" in python_error
    assert propose_error is None
    assert content["payload"] == [
        {"source": "set_next_input", "text": "print('hello')", "replace": False}
    ]
