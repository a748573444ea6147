"""The clock panel in a real Jupyter kernel (nbclient): a task fires while the kernel is idle —
no cell running — and the panel's widgets change (comm updates reach the front end)."""

from __future__ import annotations

import asyncio
import json

import nbformat
from _kernel import output_text, write_config
from nbclient import NotebookClient

from ania_nb.testing import reply

CREATE = """\
from ania_nb.notebook.widgets.clock import ClockPanel

panel = ClockPanel.open_panels()[-1]
task = await panel.agent.clock.create(
    cron="@every 1s", title="tick", content="Say tick.", target="nb:default", run_once=True
)
print("created", task.id, panel.agent.clock.active)
"""


async def _widget_updates_while_idle(client: NotebookClient, *needles: str) -> list[dict]:
    """Read iopub with no cell running until widget updates have carried every needle."""
    updates: list[dict] = []
    missing = list(needles)
    async with asyncio.timeout(60):
        while True:
            msg = await client.kc.get_iopub_msg()
            content = msg["content"]
            if msg["msg_type"] == "execute_input":  # nothing may run meanwhile
                raise AssertionError(f"a cell ran while we waited: {content}")
            if msg["msg_type"] == "comm_msg" and content["data"].get("method") == "update":
                state = json.dumps(content["data"]["state"], ensure_ascii=False)
                updates.append(content["data"]["state"])
                missing = [n for n in missing if n not in state]
                if not missing:
                    return updates


async def test_a_task_fires_while_the_kernel_is_idle_and_the_panel_changes(llm, tmp_path):
    write_config(tmp_path, llm.base_url)
    llm.script(reply("**tick** from the clock"))
    sources = [
        "%load_ext ania_nb",
        "%ania clock",
        CREATE,
        "print(panel.text())\nprint('tasks left:', len(await panel.agent.clock.list()))",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    client = NotebookClient(nb, timeout=90, resources={"metadata": {"path": str(tmp_path)}})
    async with client.async_setup_kernel():
        for index in range(3):
            await client.async_execute_cell(nb.cells[index], index)
        assert "created 1 True" in output_text(nb.cells[2].outputs)
        # The kernel is idle now: the clock fires on its loop and the panel updates its widgets.
        updates = await _widget_updates_while_idle(
            client, "<strong>tick</strong> from the clock", "· 0 task(s) shown"
        )
        assert not llm.pending
        await client.async_execute_cell(nb.cells[3], 3)

    shown = nb.cells[1].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in shown)
    assert "◷ clock: active in this process" in output_text(shown)  # the plain-text fallback
    assert "No results yet." in output_text(shown)
    assert len(updates) >= 1
    final = output_text(nb.cells[3].outputs)
    assert "✓ success · tick (#1) · nb:default" in final
    assert "**tick** from the clock" in final
    assert "tasks left: 0" in final  # run-once: deleted after its run


def test_ania_clock_sub_commands_answer_like_slash_clock(llm, tmp_path):
    write_config(tmp_path, llm.base_url)
    sources = [
        "%load_ext ania_nb",
        '%ania clock add --once @daily | water | Don\'t forget: "water" the plants.',
        "%ania clock list",
        "%ania clock off 1",
        "%ania clock --session",
        "%ania clock help",
        "%ania clock add @every 1q | bad | x",
        "%ania clock info 1",
        "%ania",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    NotebookClient(
        nb, timeout=90, resources={"metadata": {"path": str(tmp_path)}}, allow_errors=True
    ).execute()
    out = [output_text(cell.outputs) for cell in nb.cells]
    assert out[1].startswith("created task ID=1, mode=once, cron=@daily, target=nb:default")
    assert "✅ [1] water | once | @daily → nb:default" in out[2]
    assert out[3].startswith("updated ID=1, state=disabled")
    assert "tasks of nb:default · 1 task(s) shown" in out[4]  # the panel, this session only
    assert "#1 water — @daily (once) · disabled · nb:default" in out[4]
    assert "%ania clock add [--once] <cron> | <title> | <content>" in out[5]  # notebook syntax
    assert out[6].startswith("Not created: schedule '@every 1q'")
    assert 'Don\'t forget: "water" the plants.' in out[7]  # the content as typed
    assert "clock [list|log|…]" in str(nb.cells[8].outputs)  # bare %ania: the usage
    assert not any(o.get("output_type") == "error" for cell in nb.cells for o in cell.outputs)
