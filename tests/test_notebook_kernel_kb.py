"""The knowledge panel in a real Jupyter kernel (nbclient): ``%ania kb add`` moves a progress
bar while the cell runs, ``%ania kb`` shows the panel, and a search started from the panel
finishes while the kernel is idle — its results reach the front end as widget updates."""

from __future__ import annotations

import asyncio
import json

import nbformat
from _kernel import output_text, write_config
from nbclient import NotebookClient

SEARCH = """\
from ania_nb.notebook.widgets.knowledge import KbPanel

state = get_ipython().magics_manager.registry["AgentMagics"].state
panel = KbPanel(state.agent().knowledge, state.default_session)
await panel.refresh()
display(panel)
panel.search_box.value = "runbook step 7"  # what pressing Enter in the box does
print("searching", len(panel.actions))
"""


async def _updates_while_idle(client: NotebookClient, needle: str) -> list[dict]:
    """Read iopub with no cell running until a widget update carries ``needle``."""
    updates: list[dict] = []
    async with asyncio.timeout(60):
        while True:
            msg = await client.kc.get_iopub_msg()
            content = msg["content"]
            if msg["msg_type"] == "execute_input":  # nothing may run meanwhile
                raise AssertionError(f"a cell ran while we waited: {content}")
            if msg["msg_type"] == "comm_msg" and content["data"].get("method") == "update":
                updates.append(content["data"]["state"])
                if needle in json.dumps(content["data"]["state"], ensure_ascii=False):
                    return updates


async def _run_reading(client: NotebookClient, code: str) -> tuple[str, list[int]]:
    """Run ``code`` reading iopub ourselves: its text output and every integer widget value
    update (the progress bar's) sent while it ran."""
    msg_id = client.kc.execute(code)
    text: list[str] = []
    values: list[int] = []
    async with asyncio.timeout(60):
        while True:
            msg = await client.kc.get_iopub_msg()
            content = msg["content"]
            kind = msg["msg_type"]
            if kind == "comm_msg" and content["data"].get("method") == "update":
                value = content["data"]["state"].get("value")
                if type(value) is int:
                    values.append(value)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if kind == "stream":
                text.append(content["text"])
            elif kind in ("display_data", "update_display_data", "execute_result"):
                text.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                raise AssertionError("\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(text), values


async def test_kb_add_progress_panel_and_an_idle_search(llm, tmp_path):
    write_config(tmp_path, llm.base_url)
    with (tmp_path / "ania.toml").open("a") as config:
        config.write('[embedding]\nprovider = "none"\n')
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(70):  # two write batches: the bar moves during the cell
        (docs / f"step{i:02}.md").write_text(f"# Step {i}\n\nRunbook step {i}: check item {i}.")
    sources = ["%load_ext ania_nb", "%ania kb", SEARCH, "%ania memory"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    client = NotebookClient(nb, timeout=90, resources={"metadata": {"path": str(tmp_path)}})
    async with client.async_setup_kernel():
        await client.async_execute_cell(nb.cells[0], 0)
        added, values = await _run_reading(client, "%ania kb add docs/*.md")
        for index in (1, 2):
            await client.async_execute_cell(nb.cells[index], index)
        assert "searching 1" in output_text(nb.cells[2].outputs)
        # The kernel is idle now: the search finishes on its loop and the results show.
        updates = await _updates_while_idle(client, "1. 《Step 7》")
        await client.async_execute_cell(nb.cells[3], 3)

    assert any(0 < v < 70 for v in values) and values[-1] == 70, values  # the bar moved
    assert "added 70 document(s) (70 chunks)" in added  # the bar's final text
    assert "+ [" in added and "Step 69 · 1 chunk(s) · docs/step69.md" in added
    shown = nb.cells[1].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in shown)
    assert "📚 knowledge base · nb:default · 70 document(s), 70 chunk(s)" in output_text(shown)
    assert updates  # the idle search reached the front end
    assert "🧠 memories · nb:default · 0 entries" in output_text(nb.cells[3].outputs)
