"""The run view of issue 19 in a real JupyterLab, driven by Debian's Chromium through Playwright.

The harness is `test_browser.py`'s (a JupyterLab server on 127.0.0.1 in a temporary folder,
Debian's Chromium). One notebook: a `python` call with 40 lines of code waits for approval (all
40 lines are in the card, the last one can be scrolled into view), then a denied call (the
header says "finished · 1 call denied", not success; the SVG icons have a size), then the
notebook is saved, its kernel shut down through the server's API and the page reloaded: the runs
are still there as static HTML, with no "Error displaying widget". Screenshots go to
``test-artifacts/``.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_browser import (
    ACTIVE,
    ARTIFACTS,
    CHROMIUM,
    WAIT_MS,
    Lab,
    lab,  # noqa: F401  (the module-scoped JupyterLab server fixture)
    page,  # noqa: F401  (a fresh headless Chromium page)
)

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's Chromium is not installed at /usr/bin/chromium (apt-get install chromium)",
)

LONG_CODE = "\n".join(f"value_{n} = {n} * 2  # line {n}" for n in range(1, 41))
SETUP = f"""import tempfile
from ania_nb.testing import ScriptedLLM, reply, tool_call

LONG_CODE = {LONG_CODE!r}
llm = ScriptedLLM().start()
scratch = tempfile.TemporaryDirectory(prefix="ania-view-")
llm.script(
    reply("Running it.", tool_calls=[tool_call("python", {{"code": LONG_CODE}})]),
    reply("Ran all **40** lines."),
    reply(tool_calls=[tool_call("python", {{"code": "import os\\nos.remove('data.csv')"}})]),
    reply("I did not delete it: the call was denied."),
)"""
CELLS = [
    "%load_ext ania_nb",
    SETUP,
    "%ania config llm.base_url={llm.base_url} llm.api_key=sk-scripted llm.model=scripted "
    "approval.timeout=120 store.data_dir={scratch.name}",
    "%%agent\nRun the long computation.",
    "%%agent\nDelete data.csv.",
]
LONG_CELL, DENY_CELL = 3, 4


def _notebook(server: Lab, name: str) -> str:
    cells = [
        {"cell_type": "code", "source": c, "metadata": {}, "outputs": [], "execution_count": None}
        for c in CELLS
    ]
    notebook = {
        "cells": cells,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (server.root / name).write_text(json.dumps(notebook), encoding="utf-8")
    return f"{server.url}/lab/workspaces/{Path(name).stem}/tree/{name}?token={server.token}"


def _api(server: Lab, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(f"{server.url}{path}?token={server.token}", method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    return json.loads(body) if body else None


class View:
    """The notebook open in JupyterLab: run cells with Shift+Enter, read their outputs."""

    def __init__(self, browser: Any, url: str) -> None:
        from playwright.sync_api import expect

        self.page, self.expect = browser, expect
        browser.goto(url)
        self.cells = browser.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")
        self.expect(self.cells.nth(len(CELLS) - 1)).to_be_visible()
        browser_tab = browser.get_by_role("tab", name=re.compile("File Browser"))
        if browser_tab.get_attribute("aria-selected") == "true":
            browser_tab.click()
        status_bar = browser.locator("#jp-main-statusbar")
        self.expect(status_bar).to_contain_text(re.compile(r"Python[^|]*\| Idle"))

    def run(self, index: int) -> None:
        """Run cell ``index`` alone (Ctrl+Enter keeps the selection on it)."""
        self.cells.nth(index).locator(".jp-InputPrompt").click()
        self.page.keyboard.press("Escape")
        self.expect(self.cells.nth(index)).to_have_class(ACTIVE)
        self.page.keyboard.press("Control+Enter")

    def output(self, index: int) -> Any:
        return self.cells.nth(index).locator(".jp-OutputArea")

    def button(self, index: int, label: str) -> Any:
        pattern = re.compile(rf"^\s*{re.escape(label)}\s*$")
        return self.output(index).locator("button", has_text=pattern)

    def shot(self, index: int, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / name
        self.cells.nth(index).screenshot(path=str(path))
        return path


def _icons_have_size(view: View, index: int) -> None:
    icons = view.output(index).locator("svg.ania-icon")
    view.expect(icons.first).to_be_visible()
    for i in range(icons.count()):
        box = icons.nth(i).bounding_box()
        if box is not None:  # inside a closed <details>: not laid out
            assert box["width"] >= 8 and box["height"] >= 8


def _saved_outputs(server: Lab, name: str) -> list[list[dict[str, Any]]]:
    content = _api(server, f"/api/contents/{name}")["content"]
    return [cell.get("outputs", []) for cell in content["cells"]]


def test_code_in_the_card_honest_header_icons_and_static_html_after_the_kernel_is_gone(
    lab: Lab,  # noqa: F811
    page: Any,  # noqa: F811
) -> None:
    name = "view.ipynb"
    view = View(page, _notebook(lab, name))
    for index in range(LONG_CELL):
        view.run(index)
        view.expect(view.cells.nth(index).locator(".jp-InputPrompt")).to_contain_text(
            re.compile(r"\[\d+\]")
        )

    # 1. A 40-line python call: every line is in the card, the last one scrolls into view.
    view.run(LONG_CELL)
    output = view.output(LONG_CELL)
    card = output.locator(".ania-approval")
    view.expect(card.get_by_text("Approval needed")).to_be_visible()
    code = card.locator(".ania-code[data-language=python]")
    view.expect(code).to_be_visible()
    view.expect(code).to_contain_text("value_1 = 1 * 2  # line 1")
    last = code.get_by_text("value_40 = 40 * 2")
    last.scroll_into_view_if_needed()
    view.expect(last).to_be_in_viewport()
    assert code.locator(".ania-lineno").count() == 40
    assert code.evaluate("e => e.scrollHeight > e.clientHeight")  # a scrollable block
    view.shot(LONG_CELL, "view-approval-40-lines.png")
    view.button(LONG_CELL, "Allow").click()
    view.expect(output.get_by_text("Ran all 40 lines.")).to_be_visible()
    view.expect(output.locator(".ania-status")).to_have_text("success")
    _icons_have_size(view, LONG_CELL)

    # 2. A denied call: the header says so instead of a green success.
    view.run(DENY_CELL)
    denied = view.output(DENY_CELL)
    view.expect(view.button(DENY_CELL, "Deny")).to_be_enabled()
    view.button(DENY_CELL, "Deny").click()
    view.expect(denied.locator(".ania-status")).to_have_text("finished · 1 call denied")
    view.expect(denied.get_by_text("I did not delete it")).to_be_visible()
    _icons_have_size(view, DENY_CELL)
    view.shot(DENY_CELL, "view-denied.png")

    # 3. Save, shut the kernel down, reload: the runs are static HTML, not widget errors.
    view.cells.nth(0).locator(".jp-InputPrompt").click()  # focus out of the widget's buttons
    view.page.keyboard.press("Escape")
    view.page.keyboard.press("Control+s")
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:
        outputs = _saved_outputs(lab, name)
        if outputs[DENY_CELL] and "finished" in json.dumps(outputs[DENY_CELL]):
            break
        assert time.monotonic() < deadline, "the notebook was not saved"
        time.sleep(0.2)
    for out in outputs[LONG_CELL] + outputs[DENY_CELL]:
        assert "application/vnd.jupyter.widget-view+json" not in out.get("data", {})
    for session in _api(lab, "/api/sessions"):
        if session["path"].endswith(name):
            _api(lab, f"/api/kernels/{session['kernel']['id']}", method="DELETE")
    page.reload()
    view = View(page, page.url)
    reopened = view.output(LONG_CELL)
    view.expect(reopened.get_by_text("Ran all 40 lines.")).to_be_visible()
    view.expect(view.output(DENY_CELL).locator(".ania-status")).to_have_text(
        "finished · 1 call denied"
    )
    tool_row = reopened.locator("details.ania-tool")
    tool_row.locator("summary").click()  # rows still expand without a kernel
    view.expect(tool_row.get_by_text("value_40 = 40 * 2")).to_be_attached()
    assert view.page.get_by_text("Error displaying widget").count() == 0
    _icons_have_size(view, DENY_CELL)
    view.shot(DENY_CELL, "view-reopened.png")
