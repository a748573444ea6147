"""The extension in real Jupyter kernels (nbclient): magics, `_`, --bg, %ania, and history that
survives a kernel restart."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from _kernel import output_text, write_config
from nbclient import NotebookClient

from ania_nb.testing import delay, reply, tool_call


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
    # A finished run's output is its final state as static HTML (the widget is no longer needed
    # once nothing runs), with plain text beside it.
    [html] = [o["data"]["text/html"] for o in view if "text/html" in o.get("data", {})]
    assert "It is 42." in html and "What is 41 + 1?" in html
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
    assert "notebook_vars" in tools and "python" in tools and "tools sent to the model" in tools
    config = output_text(outputs[7])
    assert "llm.api_key = '***'" in config or "llm.api_key = '" in config
    assert "sk-scripted" not in config
    err = outputs[8]
    assert any("unknown %ania command" in str(o) for o in err)


def _execute(client, code: str) -> str:
    """Send one execute request (no waiting); return its message id."""
    return client.execute(code, stop_on_error=True)


def _collect(client, msg_id: str) -> tuple[str, list[dict]]:
    """Wait for a request's reply; return its status and its iopub outputs."""
    import queue

    outputs: list[dict] = []
    while True:
        try:
            msg = client.get_iopub_msg(timeout=60)
        except queue.Empty:  # pragma: no cover - a hung kernel
            raise AssertionError("the kernel went quiet") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
        if msg["msg_type"] in ("stream", "error", "display_data", "execute_result"):
            outputs.append({"output_type": msg["msg_type"], **msg["content"]})
    while True:
        reply_msg = client.get_shell_msg(timeout=60)
        if reply_msg["parent_header"].get("msg_id") == msg_id:
            return reply_msg["content"]["status"], outputs


def test_interrupt_stops_the_run_in_one_line_and_skips_the_queued_cells(llm, folder):
    """■ during a run: the run is stopped (``_`` says so, and the model is asked nothing more),
    one line, no traceback, and the cells queued after it (Run All) do not run."""
    import threading

    from jupyter_client.manager import start_new_kernel

    release = threading.Event()

    def held(request):
        if "slow question" in str(request.messages[-1]["content"]):
            release.wait(30)  # a run that went on after the interrupt would call the tool
            return reply(tool_calls=[tool_call("time")])
        return reply("answered")

    llm.responder = held
    manager, client = start_new_kernel(cwd=str(folder))
    try:
        assert _collect(client, _execute(client, "%load_ext ania_nb"))[0] == "ok"
        running = _execute(client, "%%agent -q\nslow question")
        queued = _execute(client, "print('queued cell ran')")
        llm.wait_for_requests(1, timeout=60)  # the run is waiting for the model
        manager.interrupt_kernel()
        status, outputs = _collect(client, running)
        assert status == "error"
        [error] = [o for o in outputs if o["output_type"] == "error"]
        assert error["traceback"] == ["■ interrupted: the run was stopped"]
        text = json.dumps(outputs)
        assert "CancelledError" not in text and "run_magic" not in text
        assert _collect(client, queued) == ("aborted", [])
        status, outputs = _collect(client, _execute(client, "print(_.status, _.error)"))
        assert output_text(outputs).startswith("stopped")
        release.set()  # the model's (late) answer to the stopped run asks for a tool
        assert _collect(client, _execute(client, "%%agent -q\nnext question"))[0] == "ok"
        assert len(llm.requests) == 2  # the stopped run asked nothing after its first request
        assert "next question" in str(llm.requests[1].messages[-1]["content"])
    finally:
        release.set()
        client.stop_channels()
        manager.shutdown_kernel(now=True)
