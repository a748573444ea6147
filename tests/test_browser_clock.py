"""The clock panel in a real JupyterLab (Debian's Chromium through Playwright): a task fires
while the kernel is idle and its result appears in the panel on the page; a row's "Run now"
button runs a task through the kernel's loop. Screenshot: ``test-artifacts/clock-panel.png``."""

from __future__ import annotations

import json
import re
from typing import Any

import nbformat
import pytest
import test_browser
from test_browser import ARTIFACTS, CHROMIUM, ROOT, Lab, Notebook

from ania_nb.testing import reply

# The quickstart's fixtures: a JupyterLab server for this module, a fresh Chromium page per test.
lab = test_browser.lab
page = test_browser.page

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's Chromium is not installed at /usr/bin/chromium (apt-get install chromium)",
)
PANEL_CELL = 5


def _notebook(lab: Lab, base_url: str) -> str:
    sources = [
        "%load_ext ania_nb",
        f"%ania config llm.base_url={base_url} llm.api_key=sk-scripted llm.model=scripted "
        f"store.data_dir={lab.root / 'data'}",
        "%ania clock add @hourly | report | Summarise the sales of the last hour.",
        "%ania clock add --once @every 3s | stretch | Remind the user to stretch.",
        "%ania clock list",
        "%ania clock",
        # Filler, so the Notebook helper (made for the quickstart) finds enough cells.
        *["pass"] * 12,
    ]
    metadata = json.loads((ROOT / "notebooks" / "clock.ipynb").read_text())["metadata"]
    cells = [nbformat.v4.new_code_cell(source) for source in sources]
    notebook = nbformat.v4.new_notebook(cells=cells, metadata=metadata)
    (lab.root / "clock.ipynb").write_text(nbformat.writes(notebook))
    return f"{lab.url}/lab/workspaces/clock/tree/clock.ipynb?token={lab.token}"


def test_the_panel_updates_while_idle_and_its_buttons_work(lab: Lab, page: Any, llm):
    llm.route("## Scheduled task", reply("**Time to stretch!** Stand up."))
    notebook = Notebook(page, _notebook(lab, llm.base_url))
    notebook.run_through(PANEL_CELL)  # then nothing runs: the kernel is idle
    panel = notebook.output(PANEL_CELL)
    notebook.expect(panel.get_by_text("#2 stretch")).to_be_visible()
    notebook.expect(panel.locator("strong", has_text="Time to stretch!")).to_be_visible()
    notebook.expect(panel.get_by_text("#2 stretch")).to_have_count(0)  # run-once: gone
    notebook.expect(panel.get_by_text(re.compile(r"1 task\(s\) shown"))).to_be_visible()

    llm.route("## Scheduled task", reply("Sales: **42** units."))
    notebook.button(PANEL_CELL, "Run now").click()
    notebook.expect(panel.get_by_text("ran #1: success")).to_be_visible()
    notebook.expect(panel.locator("strong", has_text="42")).to_be_visible()
    notebook.button(PANEL_CELL, "Disable").click()
    notebook.expect(notebook.button(PANEL_CELL, "Enable")).to_be_visible()
    assert [r.messages[-1]["content"].split("] ", 1)[-1] for r in llm.requests] == [
        "【定时任务】stretch\nRemind the user to stretch.",
        "【定时任务】report\nSummarise the sales of the last hour.",
    ]
    ARTIFACTS.mkdir(exist_ok=True)
    notebook.cells.nth(PANEL_CELL).screenshot(path=str(ARTIFACTS / "clock-panel.png"))
