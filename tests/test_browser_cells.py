"""The cell tools in a real JupyterLab (Debian's Chromium through Playwright): "fix the error
above" reads the failing cell through ``notebook_cells`` and ``propose_cell`` inserts the fix as a
new cell right below the agent cell, not run. Screenshot: ``test-artifacts/propose-cell.png``."""

from __future__ import annotations

import json
import re
from typing import Any

import nbformat
import pytest
import test_browser
from test_browser import ARTIFACTS, CHROMIUM, ROOT, Lab, Notebook

from ania_nb.testing import reply, tool_call

# The quickstart's fixtures: a JupyterLab server for this module, a fresh Chromium page per test.
lab = test_browser.lab
page = test_browser.page

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="Debian's Chromium is not installed at /usr/bin/chromium (apt-get install chromium)",
)
ERROR_CELL, AGENT_CELL = 2, 3
FIX = "def ratio(a, b):\n    return a / b if b else float('nan')\n\nratio(1, 0)"


def _notebook(lab: Lab, base_url: str) -> str:
    sources = [
        "%load_ext ania_nb",
        f"%ania config llm.base_url={base_url} llm.api_key=sk-scripted llm.model=scripted "
        f"store.data_dir={lab.root / 'data-cells'}",
        "def ratio(a, b):\n    return a / b\n\nratio(1, 0)",
        "%%agent\nfix the error above",
        # Filler, so the Notebook helper (made for the quickstart) finds enough cells.
        *["pass"] * 12,
    ]
    metadata = json.loads((ROOT / "notebooks" / "quickstart.ipynb").read_text())["metadata"]
    cells = [nbformat.v4.new_code_cell(source) for source in sources]
    notebook = nbformat.v4.new_notebook(cells=cells, metadata=metadata)
    (lab.root / "cells.ipynb").write_text(nbformat.writes(notebook))
    return f"{lab.url}/lab/workspaces/cells/tree/cells.ipynb?token={lab.token}"


def test_propose_cell_inserts_the_fix_below_the_agent_cell(lab: Lab, page: Any, llm):
    llm.script(
        reply(tool_calls=[tool_call("notebook_cells", {})]),
        reply(tool_calls=[tool_call("propose_cell", {"code": FIX})]),
        reply("ratio(1, 0) divides by zero; the cell below guards against it."),
    )
    notebook = Notebook(page, _notebook(lab, llm.base_url))
    notebook.run_through(ERROR_CELL)
    # Wait for the error: JupyterLab drops the cells queued behind a failing one.
    notebook.expect(notebook.output(ERROR_CELL)).to_contain_text("ZeroDivisionError")
    notebook.run_through(AGENT_CELL)
    output = notebook.output(AGENT_CELL)
    notebook.expect(output.get_by_text("the cell below guards against it")).to_be_visible()
    proposed = notebook.cells.nth(AGENT_CELL + 1)
    editor = proposed.locator(".jp-InputArea-editor")
    notebook.expect(editor).to_contain_text("return a / b if b else float('nan')")
    notebook.expect(editor).to_contain_text("ratio(1, 0)")
    # Not run: no execution count, no output; the old filler cell follows it.
    notebook.expect(proposed.locator(".jp-InputPrompt")).to_have_text(re.compile(r"^\[ \]:$"))
    notebook.expect(
        notebook.cells.nth(AGENT_CELL + 2).locator(".jp-InputArea-editor")
    ).to_have_text("pass")
    seen = llm.requests[1].messages[-1]["content"]  # what notebook_cells gave the model
    assert f'File "Cell In[{ERROR_CELL + 1}]", line 4, in <module>' in seen
    assert "ZeroDivisionError: division by zero" in seen
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "propose-cell.png"))
