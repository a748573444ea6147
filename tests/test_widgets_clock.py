"""`ClockPanel` on a real Agent and its real clock: rows follow task events, buttons call the
clock, scheduled runs and their delivered text enter the feed, media reach the panel through
the outbox's ``callbacks_for``, and a closed panel stops listening."""

from __future__ import annotations

import asyncio
import base64
import os
import sys
from pathlib import Path

import pytest
from _media import PNG
from _waits import until as wait_until

from ania_nb import ToolContext, tool
from ania_nb.notebook.widgets.clock import ClockPanel, panel_callbacks
from ania_nb.testing import delay, reply, tool_call


def clock_agent(make_agent, **overrides):
    return make_agent(overrides={"clock.enable": True, **overrides})


async def until(agent, condition) -> None:
    """Wait until ``condition()`` holds, re-checking after each clock event and delivery.

    The panels subscribed first, so they have seen each event when the check runs.
    """
    changed = asyncio.Event()
    stops = [
        agent.clock.subscribe(lambda _: changed.set()),
        agent.outbox.subscribe(lambda _: changed.set()),
    ]
    try:
        async with asyncio.timeout(10):
            while not condition():
                await changed.wait()
                changed.clear()
    finally:
        for stop in stops:
            stop()


async def test_rows_follow_task_events_and_text_matches(make_agent):
    agent = clock_agent(make_agent)
    panel = await ClockPanel(agent).refresh()
    assert panel.tasks == {} and panel.task_box.children == ()
    assert "No results yet." in panel.text()
    assert panel._repr_mimebundle_()["text/plain"] == panel.text()

    task = await agent.clock.create(
        cron="@daily", title="morning report", content="Summarise the news", target="nb:t"
    )
    assert list(panel.tasks) == [task.id]  # the task_created event, no reload
    (row,) = panel.task_box.children
    assert "morning report" in row.children[0].value and "@daily" in row.children[0].value
    assert row.children[1].description == "Disable"
    line = next(line for line in panel.text().splitlines() if f"#{task.id}" in line)
    assert "morning report — @daily" in line and "next " in line and "nb:t" in line

    await agent.clock.update(task.id, enabled=False)
    assert panel.tasks[task.id].enabled is False
    assert row.children[1].description == "Enable"
    assert "disabled" in panel.text()

    second = await agent.clock.create(cron="@hourly", title="b", content="x", target="nb:t")
    assert list(panel.tasks) == [task.id, second.id]  # creation order
    await agent.clock.delete(task.id)
    assert list(panel.tasks) == [second.id]
    assert len(panel.task_box.children) == 1
    assert f"#{task.id}" not in panel.text()
    panel.close()


async def test_refresh_loads_existing_tasks_and_log(llm, make_agent):
    agent = clock_agent(make_agent)
    task = await agent.clock.create(cron="@daily", title="t", content="c", target="nb:t")
    llm.script(reply("logged before the panel"))
    await agent.clock.run_now(task.id)
    panel = await ClockPanel(agent).refresh()
    assert list(panel.tasks) == [task.id]
    assert [item.text for item in panel.feed] == ["logged before the panel"]
    assert panel.feed[0].status == "success" and panel.feed[0].manual

    fresh = ClockPanel(agent)  # a run finishes before the panel has loaded the log
    llm.script(reply("newer"))
    await agent.clock.run_now(task.id)
    assert [item.text for item in fresh.feed] == ["newer"]
    await fresh.refresh()
    assert [item.text for item in fresh.feed] == ["newer", "logged before the panel"]
    panel.close()
    fresh.close()


async def test_buttons_call_the_clock_api(llm, make_agent):
    agent = clock_agent(make_agent)
    task = await agent.clock.create(cron="@daily", title="t", content="c", target="nb:t")
    panel = await ClockPanel(agent).refresh()
    toggle, run, delete = panel._rows[task.id].widget.children[1:]

    toggle.click()
    await panel.wait_actions()
    stored = await agent.clock.get(task.id)
    assert stored is not None and stored.enabled is False and stored.updater == "panel"
    assert toggle.description == "Enable" and panel.message == f"disabled #{task.id}"
    toggle.click()
    await panel.wait_actions()
    assert (await agent.clock.get(task.id)).enabled is True

    llm.script(reply("The answer is **42**."))
    run.click()
    await panel.wait_actions()
    assert panel.message == f"ran #{task.id}: success"
    (item,) = panel.feed
    assert item.status == "success" and item.manual and item.text == "The answer is **42**."
    assert "<strong>42</strong>" in panel._feed_widgets[item.key].value  # Markdown rendered
    assert llm.requests[-1].messages[-1]["content"].endswith("【定时任务】t\nc")

    delete.click()
    await panel.wait_actions()
    assert await agent.clock.get(task.id) is None
    assert panel.tasks == {} and panel.task_box.children == ()
    assert panel.message.startswith(f"deleted #{task.id}")

    panel.run_now(task.id)  # a task someone else deleted: said on the panel, nothing raised
    await panel.wait_actions()
    assert panel.message.startswith("✗ ") and task.id in panel.message
    panel.close()


async def test_a_scheduled_run_fires_and_its_full_delivered_text_enters_the_feed(llm, make_agent):
    agent = clock_agent(make_agent)
    await agent.start()
    assert agent.clock.active
    panel = await ClockPanel(agent).refresh()
    assert agent.clock.status_text() in panel.header.value
    long_reply = "# Report\n\n" + " ".join(f"w{i}" for i in range(400))  # over 1000 characters
    llm.script(reply(long_reply))
    statuses: list[str] = []
    panel.header.observe(lambda change: statuses.append(change["new"]), names="value")
    task = await agent.clock.create(
        cron="@every 1s", title="tick", content="report", target="nb:t", run_once=True
    )
    await until(agent, lambda: any(i.delivered for i in panel.feed))
    await until(agent, lambda: task.id not in panel.tasks)  # run-once: deleted after its run
    # On a loaded machine the 1 s schedule can fire again before the run-once job is dropped
    # (it is once the run's entry is written): that fire is logged as skipped, nothing runs.
    (item,) = [i for i in panel.feed if i.status != "skipped"]
    assert item.status == "success" and not item.manual and item.task_id == task.id
    assert item.text == long_reply.strip()  # the full delivered text
    assert "<h1>Report</h1>" in panel._feed_widgets[item.key].value
    entry = next(e for e in await agent.clock.logs(task_id=task.id) if e.status == "success")
    assert len(entry.reply or "") <= 1000 < len(item.text)  # the log keeps a cut copy
    assert "# Report" in panel.text() and f"tick (#{task.id})" in panel.text()
    assert statuses  # the header was re-rendered by the events
    panel.close()


async def test_a_repeating_task_row_shows_its_last_status_and_next_run(llm, make_agent):
    agent = clock_agent(make_agent)
    await agent.start()
    panel = await ClockPanel(agent).refresh()
    llm.script(reply("first"), reply("second"))
    task = await agent.clock.create(cron="@every 1s", title="r", content="c", target="nb:t")
    async with asyncio.timeout(10):
        await panel.wait_until(lambda p: any(i.status == "success" for i in p.feed))
    await panel.wait_actions()  # the row's store read after the run
    shown = panel.tasks[task.id]
    assert shown.last_status in ("success", "running") and shown.last_run_at is not None
    assert shown.next_run_at is not None and shown.next_run_at > task.next_run_at
    await agent.clock.update(task.id, enabled=False)
    panel.close()
    with pytest.raises(RuntimeError, match="closed"):
        await panel.wait_until(lambda p: False)


ROOT = str(Path(__file__).resolve().parents[1])
HOLDER = """
import asyncio, sys
from ania_nb import Agent

async def main():
    data_dir, base_url = sys.argv[1:3]
    overrides = {"llm.stream": False, "agent.builtin_tools": False,
                 "skills.dir": data_dir + "/no-skills", "mcp.config_file": data_dir + "/no.json"}
    agent = Agent(base_url=base_url, api_key="sk", model="scripted", data_dir=data_dir,
                  overrides=overrides)
    await agent.start()
    print("ACTIVE", agent.clock.active, flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    task = await agent.clock.create(cron="@daily", title="elsewhere", content="x", target="nb:t")
    print("TASK", task.id, flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    print("RAN", (await agent.clock.run_now(task.id)).status, flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    await agent.aclose()

asyncio.run(main())
"""


async def test_a_standby_panel_follows_the_holder_process_and_the_takeover(
    llm, make_agent, tmp_path
):
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLDER,
        str(tmp_path / "data"),
        llm.base_url,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert holder.stdin is not None and holder.stdout is not None

    async def said(prefix: str) -> str:
        async with asyncio.timeout(30):
            line = (await holder.stdout.readline()).decode()
        assert line.startswith(prefix), line
        return line[len(prefix) :].strip()

    async def tell() -> None:
        holder.stdin.write(b"go\n")
        await holder.stdin.drain()

    try:
        assert await said("ACTIVE") == "True"
        standby = clock_agent(make_agent)  # the same data directory, in this process
        standby.clock.poll_interval = 0.05
        await standby.start()
        assert not standby.clock.active
        panel = await ClockPanel(standby).refresh()
        panel.lease_tick = 0.05
        assert "standby" in panel.header.value and "#ef6c00" in panel.header.value
        assert panel.text().startswith("◷ clock: standby")

        await tell()
        task_id = await said("TASK")
        async with asyncio.timeout(10):
            await panel.wait_until(lambda p: task_id in p.tasks)  # polled from the store
        llm.script(reply("ran in the holder"))
        await tell()
        assert await said("RAN") == "success"
        async with asyncio.timeout(10):  # announced from the log: no refresh
            await panel.wait_until(lambda p: bool(p.feed) and p.feed[0].text == "ran in the holder")
        assert panel.feed[0].task_id == task_id and panel.feed[0].manual

        await tell()  # the holder closes: the lease is free, the standby takes over
        async with asyncio.timeout(30):
            await holder.wait()
            await panel.wait_until(lambda p: "active in this process" in p.header.value)
        assert "#2e7d32" in panel.header.value and standby.clock.active
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
    ticker = panel._ticker
    await standby.aclose()
    async with asyncio.timeout(10):
        await panel.wait_until(lambda p: "clock: closed" in p.header.value)
        await ticker  # it stops once the clock is closed
    panel.close()


async def test_a_timed_out_run_shows_the_notice_it_delivered(llm, make_agent):
    agent = clock_agent(make_agent)
    task = await agent.clock.create(
        cron="@daily", title="slow", content="x", target="nb:t", timeout=0.3
    )
    panel = await ClockPanel(agent).refresh()
    llm.script(delay(5, reply("too late")))
    entry = await agent.clock.run_now(task.id)
    (item,) = panel.feed
    assert entry.status == item.status == "timeout" and item.delivered
    assert item.text.startswith("⏰ clock task “slow” timed out")
    assert "◷ timeout · slow (#1)" in panel.text()
    assert "last ◷ timeout" in panel.text()
    panel.close()


def html_values(widget) -> list[str]:
    """The HTML of every HTML widget in a widget tree."""
    found = [widget.value] if type(widget).__name__ == "HTML" else []
    for child in getattr(widget, "children", ()):
        found += html_values(child)
    return found


async def test_a_task_title_from_a_chat_user_is_shown_as_text_not_markup(llm, make_agent):
    agent = clock_agent(make_agent)
    title = '<img src=x onerror="alert(1)">'
    task = await agent.clock.create(cron="@daily", title=title, content="c", target="nb:t")
    llm.script(reply("ran"))
    await agent.clock.run_now(task.id)  # a feed entry with the title too
    panel = await ClockPanel(agent).refresh()
    shown = "\n".join(html_values(panel.widget))
    assert "<img" not in shown
    row, feed = (v for v in html_values(panel.widget) if "&lt;img" in v)  # the row and the feed
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in row
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in feed
    panel.close()


async def test_close_stops_the_lease_ticker_at_once(make_agent):
    agent = clock_agent(make_agent)
    panel = ClockPanel(agent)
    panel.lease_tick = 3600.0  # its next tick is far away: only a cancel ends it soon
    await panel.refresh()
    [ticker] = [t for t in asyncio.all_tasks() if t.get_name() == "ania-clock-panel-ticker"]
    assert not ticker.done()
    panel.close()
    await wait_until(ticker.done, "the ticker to end")


async def test_target_filter_and_close_stops_listening(make_agent):
    agent = clock_agent(make_agent)
    mine = ClockPanel(agent, target="nb:a")
    every = ClockPanel(agent)
    subscribers = agent.outbox.subscribers
    a = await agent.clock.create(cron="@daily", title="a", content="x", target="nb:a")
    b = await agent.clock.create(cron="@daily", title="b", content="x", target="nb:b")
    assert list(mine.tasks) == [a.id] and list(every.tasks) == [a.id, b.id]
    assert "tasks of nb:a" in mine.text()
    await agent.clock.update(a.id, target="nb:b")  # moved away: gone from nb:a's panel
    assert mine.tasks == {} and list(every.tasks) == [a.id, b.id]
    await agent.clock.update(a.id, target="nb:a")
    assert list(mine.tasks) == [a.id]
    assert ClockPanel.open_panels(agent) == [mine, every]

    every.close()
    assert agent.outbox.subscribers == subscribers - 1
    assert ClockPanel.open_panels(agent) == [mine]
    await agent.clock.delete(a.id)
    await agent.clock.delete(b.id)
    assert mine.tasks == {} and list(every.tasks) == [a.id, b.id]  # closed: frozen
    mine.close()
    mine.close()  # idempotent
    assert agent.outbox.subscribers == subscribers - 2


@tool
async def chart(title: str, ctx: ToolContext) -> str:
    """Send a chart image and a CSV file to the user."""
    await ctx.callbacks.call("send_image", base64.b64encode(PNG).decode("ascii"))
    await ctx.callbacks.call("send_file", "data.csv", base64.b64encode(b"a,b\n1,2\n").decode())
    return "sent" if ctx.callbacks.has("send_image") else "no front end for images"


async def test_media_of_a_clock_run_reach_the_open_panel(llm, make_agent):
    agent = clock_agent(make_agent)
    agent.add_tool(chart)
    agent.outbox.callbacks_for = panel_callbacks(agent)
    task = await agent.clock.create(cron="@daily", title="chart", content="plot", target="nb:t")

    llm.script(reply(tool_calls=[tool_call("chart", {"title": "x"})]), reply("Chart sent."))
    await agent.clock.run_now(task.id)  # no panel open: no media callbacks for the run
    assert llm.requests[-1].messages[-1]["content"] == "no front end for images"

    panel = await ClockPanel(agent).refresh()
    llm.script(reply(tool_calls=[tool_call("chart", {"title": "x"})]), reply("Chart sent."))
    await agent.clock.run_now(task.id)
    assert llm.requests[-1].messages[-1]["content"] == "sent"
    item = panel.feed[0]
    assert item.text == "Chart sent." and [text for text, _ in item.media] == [
        f"[image png, {len(PNG)} B]",
        "[file data.csv, 8 B]",
    ]
    shown = panel._feed_widgets[item.key].value
    assert 'src="data:image/png;base64,' in shown and 'download="data.csv"' in shown
    assert "[file data.csv, 8 B]" in panel.text()
    panel.close()
    assert panel_callbacks(agent)("nb:t").provided() == []


@tool
def launch(target: str) -> str:
    """Launch something (needs a human's approval)."""
    return f"launched {target}"


async def test_a_clock_runs_approval_is_answered_in_the_panel(llm, make_agent):
    agent = clock_agent(make_agent, **{"approval.enable": True, "approval.tools": ["launch"]})
    agent.add_tool(launch)
    agent.outbox.callbacks_for = panel_callbacks(agent)
    task = await agent.clock.create(cron="@daily", title="go", content="launch", target="nb:t")
    panel = await ClockPanel(agent).refresh()
    llm.script(reply(tool_calls=[tool_call("launch", {"target": "moon"})]), reply("Launched."))
    run = asyncio.ensure_future(agent.clock.run_now(task.id))
    async with asyncio.timeout(10):
        await panel.wait_until(lambda p: bool(p._cards))
    (card,) = panel._cards
    assert card.request.tool == "launch" and card.request.admin_only
    assert "? approval for launch" in panel.text()
    card.allow_button.click()  # the local notebook user is the clock's admin
    entry = await asyncio.wait_for(run, 10)
    assert entry.status == "success" and panel.feed[0].text == "Launched."
    assert llm.requests[-1].messages[-1]["content"] == "launched moon"
    assert card.state == "allowed" and "? approval" not in panel.text()
    panel.close()
