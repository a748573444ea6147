"""`TodoView` (live from todo_write events, and from the store on refresh) and `LogView`
(recent runs of a real Agent as a table, refreshed by its button)."""

from __future__ import annotations

import sys

from ania_nb import Callbacks, RunEvent, tool
from ania_nb.notebook.widgets import LogView, TodoView
from ania_nb.testing import error, reply, tool_call, usage

PLAN = [
    {"content": "load the data", "status": "completed", "activeForm": "Loading the data"},
    {"content": "fit the model", "status": "in_progress", "activeForm": "Fitting the model"},
    {"content": "plot residuals", "status": "pending", "activeForm": ""},
]


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def todo_agent(make_agent):
    return make_agent(overrides={"agent.builtin_tools": True})  # todo_write is a built-in


def test_importing_the_widgets_does_not_import_ipywidgets():
    import subprocess

    code = (
        "import sys, ania_nb.notebook.widgets as w; "
        "assert sorted(w.__all__) == w.__all__; print('ipywidgets' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


async def test_todo_view_follows_todo_write_events_live(llm, make_agent):
    agent = todo_agent(make_agent)
    first = [dict(item, status="pending") for item in PLAN]
    llm.script(
        reply(tool_calls=[tool_call("todo_write", {"todos": first})]),
        reply(tool_calls=[tool_call("todo_write", {"todos": PLAN})]),
        reply("Working on it."),
    )
    view = TodoView(agent, "nb:t")
    assert view.todos == [] and view.list.children == ()
    assert view.text() == "Todos for nb:t: none"
    seen: list[int] = []
    view.list.observe(lambda change: seen.append(len(change["new"])), names="children")
    result = await agent.chat("plan it", session="nb:t", callbacks=view.callbacks)
    assert result.ok and seen == [3]  # rows created once, then reused
    assert view.todos == PLAN
    assert view.in_progress == PLAN[1]
    rows = [row.value for row in view.list.children]
    assert "● load the data" in rows[0] and "line-through" in rows[0]
    assert "◐ fit the model — Fitting the model…" in rows[1] and "background:#fff3cd" in rows[1]
    assert "○ plot residuals" in rows[2] and "background" not in rows[2]
    assert "(1/3 done)" in view.heading.value
    assert view.text().splitlines() == [
        "Todos for nb:t (1/3 done)",
        "  ● load the data",
        "  ◐ fit the model — Fitting the model…",
        "  ○ plot residuals",
    ]
    assert view._repr_mimebundle_()["text/plain"] == view.text()


async def test_todo_view_ignores_other_sessions_and_shrinks_when_cleared(make_agent):
    view = TodoView(make_agent(), "nb:mine")
    view.callbacks_hook(RunEvent("todos", "nb:other", {"todos": PLAN}))
    view.callbacks_hook(RunEvent("usage", "nb:mine", {"total_tokens": 3}))
    assert view.todos == [] and view.list.children == ()
    view.callbacks_hook(RunEvent("todos", "nb:mine", {"todos": PLAN}))
    assert len(view.list.children) == 3
    kept = view.list.children[0]
    view.callbacks_hook(RunEvent("todos", "nb:mine", {"todos": PLAN[:1]}))
    assert view.list.children == (kept,) and view.in_progress is None
    view.callbacks_hook(RunEvent("todos", "nb:mine", {"todos": []}))
    assert view.list.children == () and view.text() == "Todos for nb:mine: none"


async def test_todo_view_refresh_reads_the_stored_list(llm, make_agent):
    agent = todo_agent(make_agent)
    llm.script(reply(tool_calls=[tool_call("todo_write", {"todos": PLAN})]), reply("Planned."))
    assert (await agent.chat("plan", session="nb:r")).ok  # no view attached during the run
    view = TodoView(agent, "nb:r")
    assert view.todos == []
    assert await view.refresh() == PLAN
    assert [row.value.count("◐") for row in view.list.children] == [0, 1, 0]
    empty = TodoView(agent, "nb:never")
    assert await empty.refresh() == [] and empty.list.children == ()


async def test_log_view_lists_recent_runs_with_status_tokens_and_tools(llm, make_agent):
    agent = make_agent(tools=[add])
    llm.script(
        reply(
            tool_calls=[tool_call("add", {"a": 1, "b": 2}), tool_call("add", {"a": 3, "b": 4})],
            usage=usage(100, 10, cached=64),
        ),
        reply("3 and 7", usage=usage(120, 5, cached=96)),
        error(400, "context too long"),
    )
    assert (await agent.chat("add pairs please", session="nb:l")).ok
    failed = await agent.chat("a second question\nover two lines", session="nb:l2")
    assert failed.status == "error"

    view = LogView(agent, limit=20)
    assert view.rows == [] and "0 shown" in view.text()
    records = await view.refresh()
    assert [r.status for r in records] == ["error", "success"]
    newest, oldest = view.rows
    assert newest[2:4] == ("nb:l2", "✗ error")
    assert newest[5:] == ("0", "0", "a second question over two lines")
    assert oldest[0] == str(records[1].id) and oldest[2:4] == ("nb:l", "✓ success")
    assert oldest[5:] == ("235 (160 cached)", "2: add×2", "add pairs please")
    assert oldest[4].endswith(("ms", " s"))
    assert "<td" in view.table.value and "add×2" in view.table.value
    assert view.table.value.count("<tr>") == 3  # header + two runs
    lines = view.text().splitlines()
    assert lines[0] == "Recent runs: 2 shown (newest first)"
    assert lines[1].split() == [
        "#",
        "started",
        "session",
        "status",
        "duration",
        "tokens",
        "tools",
        "input",
    ]
    assert lines[3].index("2: add×2") == lines[1].index("tools")  # aligned columns

    only = LogView(agent, session="nb:l")
    assert [r.session for r in await only.refresh()] == ["nb:l"]
    assert only.text().startswith("Recent runs in nb:l: 1 shown")


async def test_log_view_refresh_button_reloads(llm, make_agent):
    agent = make_agent()
    llm.script(reply("one"), reply("two"))
    await agent.chat("first", session="nb:b")
    view = LogView(agent, limit=5)
    await view.refresh()
    assert len(view.rows) == 1
    await agent.chat("second", session="nb:b", callbacks=Callbacks())
    view.refresh_button.click()
    assert view.refresh_task is not None
    await view.refresh_task
    assert [row[7] for row in view.rows] == ["second", "first"]
    assert "2 shown" in view.heading.value
