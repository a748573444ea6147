"""`Panel`, the base of the clock, knowledge and usage panels: guarded actions, the message line,
and ``close()``, which cancels every task the panel started — its ticker included."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ania_nb.config import Config
from ania_nb.knowledge import Knowledge
from ania_nb.notebook.widgets import UsagePanel
from ania_nb.notebook.widgets.clock import ClockPanel
from ania_nb.notebook.widgets.knowledge import KbPanel, MemoryList
from ania_nb.notebook.widgets.panel import Panel
from ania_nb.testing import reply

BOUND = 30  # seconds: only so a broken close() fails the test instead of hanging it


class Held:
    """A model that holds its answer until released (the test's cleanup releases it)."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def __call__(self, request: Any) -> Any:
        self.released.wait(BOUND)  # on the server's thread
        return reply("late")


async def ended(*tasks: asyncio.Task[Any]) -> None:
    async with asyncio.timeout(BOUND):
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
async def knowledge(tmp_path):
    config = Config.load().with_overrides({"embedding.provider": "none"})
    made = Knowledge(config, tmp_path / "data")
    yield made
    await made.aclose()


async def test_closing_the_clock_panel_cancels_its_ticker_and_a_run_in_flight(llm, make_agent):
    agent = make_agent(overrides={"clock.enable": True})
    task = await agent.clock.create(cron="@daily", title="t", content="c", target="nb:t")
    panel = await ClockPanel(agent).refresh()
    ticker = panel._ticker
    assert ticker is not None and not ticker.done()

    held = Held()
    llm.responder = held
    try:
        run = panel.run_now(task.id)
        await asyncio.to_thread(llm.wait_for_requests, 1, BOUND)  # the run waits on the model
        reload = panel._spawn(asyncio.Event().wait())  # a store read still in flight
        started = {ticker, run, reload}
        assert started <= {ticker, *panel.actions} and not any(t.done() for t in started)

        panel.close()
        await ended(*started)
        assert all(t.cancelled() for t in started)
        assert panel.actions == set() and panel._ticker is None
        assert panel.message == f"running #{task.id}…"  # nothing shown after the close
        after = panel.run_now(task.id)  # a button of a closed panel starts nothing
        await ended(after)
        assert after.cancelled()
        [entry] = await agent.clock.logs(task.id)
        assert entry.status == "interrupted"  # the run the panel started ended with it
    finally:
        held.released.set()


async def test_closing_the_knowledge_panels_cancels_their_actions(knowledge):
    await knowledge.kb.add("nb:t", "Deploying", "run make deploy")
    await knowledge.memory.save("nb:t", "Alice prefers short answers")
    kb = await KbPanel(knowledge, "nb:t").refresh()
    memories = await MemoryList(knowledge, "nb:t").refresh()
    started = [
        kb.search("deploy"),
        kb.add("Other", "more text"),
        kb.show_scope("global"),
        memories.forget("nope"),
        memories.show_scope("global"),
    ]
    kb.close()
    memories.close()
    await ended(*started)
    assert all(t.cancelled() for t in started)
    assert kb.actions == set() and memories.actions == set()
    assert kb.message == memories.message == ""  # neither finished nor failed: stopped
    assert [d.title for d in await knowledge.kb.documents("nb:t")] == ["Deploying"]


async def test_closing_the_usage_panel_cancels_a_refresh(llm, make_agent):
    agent = make_agent()
    await agent.start()
    panel = UsagePanel(agent.quota)
    refresh = panel.reload()
    panel.close()
    await ended(refresh)
    assert refresh.cancelled() and panel.report is None and panel.actions == set()


class Probe(Panel):
    """The smallest panel: a message line, rendered as plain text."""

    def __init__(self) -> None:
        import ipywidgets as w

        super().__init__()
        self.renders = 0
        self.widget = w.VBox([self.message_html])

    def _render(self) -> None:
        self.renders += 1

    def text(self) -> str:
        return self.message


async def test_actions_show_their_outcome_or_their_error_and_never_raise(caplog):
    from ania_nb.errors import UsageError

    panel = Probe()

    async def says(text: str) -> str:
        return text

    async def refuses() -> str:
        raise UsageError("no such thing")

    async def breaks() -> str:
        raise KeyError("b")

    await panel._act(says("done"))
    assert panel.message == "done" and "color:#555" in panel.message_html.value
    await panel._act(says(""))  # no text: the last message stays
    assert panel.message == "done"
    await panel._act(refuses())
    assert panel.message == "✗ no such thing" and "color:#c62828" in panel.message_html.value
    await panel._act(breaks())
    assert panel.message == "✗ KeyError: 'b'"
    assert "a Probe action failed" in caplog.text  # the unexpected one is logged, with its trace
    assert panel.renders == 4
    panel._set_message("<b>x</b>")
    assert "&lt;b&gt;" in panel.message_html.value  # escaped
    panel.close()
    panel.close()  # idempotent


async def test_rows_of_removed_entries_are_closed_and_the_others_reused(knowledge):
    """The knowledge panels' rows: one per entry, kept across renders, closed when it goes."""
    keep = (await knowledge.kb.add("nb:t", "Keep", "stays")).document
    drop = (await knowledge.kb.add("nb:t", "Drop", "goes")).document
    panel = await KbPanel(knowledge, "nb:t").refresh()
    kept, dropped = panel._doc_rows[keep.id], panel._doc_rows[drop.id]
    await ended(panel.delete(drop.id))
    assert panel.message == f"deleted [{drop.id}]"
    assert panel.doc_box.children == (kept,) and panel._doc_rows == {keep.id: kept}
    assert dropped.comm is None and all(c.comm is None for c in dropped.children)
    assert kept.comm is not None  # the same widgets, not rebuilt
    await ended(panel.delete(drop.id))
    assert panel.message == f"✗ no document [{drop.id}] in nb:t"

    await knowledge.memory.save("nb:t", "first")
    second, _ = await knowledge.memory.save("nb:t", "second")
    memories = await MemoryList(knowledge, "nb:t").refresh()
    row = memories._rows[second.id]
    row.children[1].click()  # its Forget button
    await ended(*memories.actions)
    assert memories.message == f"forgot [{second.id}]" and row.comm is None
    assert [e.content for e in memories.entries] == ["first"]
    panel.close()
    memories.close()
