"""The notebook's conversation in a real JupyterLab server, and the kernel's Interrupt in Chromium.

History: notebooks are created, renamed (``PATCH /api/contents`` then ``PATCH /api/sessions``, as
JupyterLab does on a first save), closed, reopened and their kernels restarted through the
server's REST API; cells run in the server's own kernels (jupyter_client on their connection
files). Interrupt: the quickstart in Chromium, ■ pressed while the approval card waits.
"""

from __future__ import annotations

import json
import queue
import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_browser
from _kernel import ready_client, write_config
from test_browser import AGENT_CELL, CHROMIUM, Lab, _open_at_approval, _screenshot

from ania_nb.testing import reply

# The quickstart's fixtures: a JupyterLab server for this module, a fresh Chromium page per test.
lab = test_browser.lab
page = test_browser.page

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="the lab fixture lives with the browser tests (needs chromium)"
)


def _api(lab: Lab, method: str, path: str, body: Any = None) -> Any:
    """Call the server's REST API; return the decoded JSON answer (None when empty)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{lab.url}/api/{path}?token={lab.token}",
        data=data,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def _notebook(cell_ids: list[str]) -> dict[str, Any]:
    cells = [
        {"cell_type": "code", "id": cid, "metadata": {}, "outputs": [], "source": "",
         "execution_count": None}
        for cid in cell_ids
    ]  # fmt: skip
    spec = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    return {"cells": cells, "metadata": {"kernelspec": spec}, "nbformat": 4, "nbformat_minor": 5}


class Kernel:
    """A notebook's session on the server and a client of its kernel."""

    def __init__(self, lab: Lab, path: str) -> None:
        self.lab = lab
        self.session = _api(
            lab,
            "POST",
            "sessions",
            {
                "path": path,
                "name": Path(path).name,
                "type": "notebook",
                "kernel": {"name": "python3"},
            },
        )
        self.client = self._connect()

    def _connect(self) -> Any:
        kernel_id = self.session["kernel"]["id"]
        return ready_client(self.lab.root.parent / "runtime" / f"kernel-{kernel_id}.json")

    def run(self, code: str, cell_id: str) -> str:
        """Execute ``code`` as cell ``cell_id`` (JupyterLab sends it); return its text output."""
        msg = self.client.session.msg(
            "execute_request",
            {"code": code, "silent": False, "store_history": True, "user_expressions": {},
             "allow_stdin": False, "stop_on_error": True},
        )  # fmt: skip
        msg["metadata"]["cellId"] = cell_id
        self.client.shell_channel.send(msg)
        texts: list[str] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                out = self.client.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if out["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
                continue
            kind, content = out["msg_type"], out["content"]
            if kind == "status" and content["execution_state"] == "idle":
                return "".join(texts)
            if kind == "stream":
                texts.append(content["text"])
            elif kind == "error":
                texts.append("\n".join(content["traceback"]))
            elif kind in ("execute_result", "display_data"):
                texts.append(content["data"].get("text/plain", ""))
        raise AssertionError(f"no answer to {code!r} within 90 s")

    def restart(self) -> None:
        """Restart the kernel through the server (the kernel id stays)."""
        _api(self.lab, "POST", f"kernels/{self.session['kernel']['id']}/restart")
        # The old client's heartbeat saw the kernel go: a new client on the same connection file.
        self.client.stop_channels()
        self.client = self._connect()

    def close(self) -> None:
        """Close the notebook: its session and kernel go."""
        self.client.stop_channels()
        _api(self.lab, "DELETE", f"sessions/{self.session['id']}")


@pytest.fixture
def folder(lab: Lab, llm: Any) -> Iterator[str]:
    """A folder of the lab with an ania.toml pointing at the scripted model."""
    name = f"s-{uuid.uuid4().hex[:6]}"
    (lab.root / name).mkdir()
    write_config(lab.root / name, llm.base_url)
    yield name


def _asked(llm: Any) -> list[str]:
    """The user prompts the model saw in its last request (the conversation so far)."""
    return [
        m["content"].split("] ", 1)[-1] for m in llm.requests[-1].messages if m["role"] == "user"
    ]


def _rename(lab: Lab, kernel: Kernel | None, old: str, new: str) -> None:
    """Rename as JupyterLab does: the file, then the session that has it open."""
    _api(lab, "PATCH", f"contents/{old}", {"path": new})
    if kernel is not None:
        kernel.session = _api(
            lab, "PATCH", f"sessions/{kernel.session['id']}", {"path": new, "name": Path(new).name}
        )


def test_the_conversation_follows_renames_restarts_and_reopens_only(lab: Lab, llm: Any, folder):
    llm.script(*(reply(f"answer {i}") for i in range(6)))
    untitled = f"{folder}/Untitled.ipynb"
    _api(lab, "PUT", f"contents/{untitled}", {"type": "notebook", "content": _notebook(["a1"])})
    first = Kernel(lab, untitled)
    first.run("%load_ext ania_nb", "a0")
    first.run("%%agent -q\nMy favourite colour is blue.", "a1")
    # JupyterLab's first save: Untitled.ipynb becomes analysis.ipynb; then the notebook is closed.
    _rename(lab, first, untitled, f"{folder}/analysis.ipynb")
    first.close()

    # A new notebook reusing the name starts its own conversation.
    _api(lab, "PUT", f"contents/{untitled}", {"type": "notebook", "content": _notebook([])})
    other = Kernel(lab, untitled)
    other.run("%load_ext ania_nb", "b0")
    other.run("%%agent -q\nWhat is my favourite colour?", "b1")
    assert _asked(llm) == ["What is my favourite colour?"]
    other.close()

    # Reopened under its new name (a new kernel): the earlier turns are there.
    analysis = Kernel(lab, f"{folder}/analysis.ipynb")
    analysis.run("%load_ext ania_nb", "a0")
    analysis.run("%%agent -q\nWhat is my favourite colour?", "a2")
    assert _asked(llm) == ["My favourite colour is blue.", "What is my favourite colour?"]

    # A kernel restart, then a rename while the kernel runs: still the same conversation.
    analysis.restart()
    analysis.run("%load_ext ania_nb", "a0")
    analysis.run("%%agent -q\nAnd after a restart?", "a3")
    assert len(_asked(llm)) == 3
    _rename(lab, analysis, f"{folder}/analysis.ipynb", f"{folder}/final.ipynb")
    analysis.run("%%agent -q\nAnd after a rename?", "a4")
    assert _asked(llm)[0] == "My favourite colour is blue." and len(_asked(llm)) == 4
    listing = analysis.run("%ania history list", "a5")
    mine = next(line for line in listing.splitlines() if line.startswith("* nb:"))
    assert mine.split()[-2:] == ["8", "final.ipynb"], listing
    analysis.close()


def test_new_keeps_the_old_conversation_and_clear_deletes(lab: Lab, llm: Any, folder):
    llm.script(reply("one"), reply("two"))
    path = f"{folder}/keep.ipynb"
    _api(lab, "PUT", f"contents/{path}", {"type": "notebook", "content": _notebook(["k1"])})
    kernel = Kernel(lab, path)
    try:
        kernel.run("%load_ext ania_nb", "k0")
        kernel.run("%%agent -q\nfirst topic", "k1")
        said = kernel.run("%%agent -q --new\nsecond topic", "k2")
        archived = re.search(r"kept as (nb:\S+~\S+)", said)
        assert archived, said
        assert _asked(llm) == ["second topic"]
        listing = kernel.run("%ania history list", "k3")
        assert re.search(rf"^  {re.escape(archived[1])}\s+2\s+keep\.ipynb$", listing, re.M), listing
        assert "first topic" in kernel.run(f"%ania history show {archived[1]}", "k4")
        assert "removed 2 messages" in kernel.run(f"%ania history clear {archived[1]}", "k5")
        assert archived[1] not in kernel.run("%ania history list", "k6")
        assert "second topic" in kernel.run("%ania history show", "k7")
    finally:
        kernel.close()


def test_interrupt_during_an_approval_stops_the_run_in_one_line(lab: Lab, page: Any):
    notebook = _open_at_approval(lab, page, "interrupt.ipynb")
    notebook.select(AGENT_CELL)
    page.keyboard.press("i")
    page.keyboard.press("i")  # JupyterLab's I, I: interrupt the kernel

    output = notebook.output(AGENT_CELL)
    notebook.expect(output).to_contain_text("■ interrupted: the run was stopped")
    row = output.get_by_text(re.compile(r"python\(code=.*→ stopped"))
    notebook.expect(row.first).to_be_visible()
    _screenshot(notebook, AGENT_CELL, "interrupted-approval.png")
    text = output.inner_text()
    assert "CancelledError" not in text and "Traceback" not in text and "run_magic" not in text
    assert text.count("interrupted") == 1


def test_first_save_rename_in_the_browser_keeps_the_conversation(lab: Lab, page: Any, llm, folder):
    """A notebook made with the launcher, asked once, saved (JupyterLab asks for its name on
    the first save of an Untitled notebook), asked again: the second run sees the first."""
    from playwright.sync_api import expect

    llm.script(reply("Noted."), reply("Blue."))
    page.goto(f"{lab.url}/lab/workspaces/{folder}/tree/{folder}?token={lab.token}")
    page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
    expect(page.get_by_role("tab", name=re.compile(r"Untitled\.ipynb"))).to_be_visible()
    expect(page.locator("#jp-main-statusbar")).to_contain_text(re.compile(r"Python[^|]*\| Idle"))
    cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")

    def run_cell(index: int, source: str) -> None:
        cells.nth(index).locator(".cm-content").click()
        page.keyboard.type(source)
        page.keyboard.press("Shift+Enter")
        expect(cells.nth(index).locator(".jp-InputPrompt")).to_have_text(f"[{index + 1}]:")

    run_cell(0, "%load_ext ania_nb")
    run_cell(1, "%%agent -q\nMy favourite colour is blue.")
    assert _asked(llm) == ["My favourite colour is blue."]

    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    name = page.locator(".jp-Dialog input[type='text'], .jp-Dialog input:not([type])").first
    expect(name).to_be_visible()
    name.fill("analysis.ipynb")
    page.keyboard.press("Enter")
    expect(page.get_by_role("tab", name=re.compile(r"analysis\.ipynb"))).to_be_visible()
    expect(page.locator(".jp-Dialog")).to_have_count(0)
    assert (lab.root / folder / "analysis.ipynb").exists()
    assert not (lab.root / folder / "Untitled.ipynb").exists()

    run_cell(2, "%%agent -q\nWhat is my favourite colour?")
    assert _asked(llm) == ["My favourite colour is blue.", "What is my favourite colour?"]
