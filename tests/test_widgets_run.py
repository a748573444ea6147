"""`RunView` over real Agent runs: streaming, tool rows, usage, statuses, approval cards
(Allow / Deny / allow-for-session, timeout, stop) by button clicks, media and plain text."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from datetime import datetime

import pytest
from _waits import until

from ania_nb import RunEvent, ToolContext, tool
from ania_nb.notebook.widgets import RunView
from ania_nb.testing import delay, error, reply, tool_call, usage

ran: list[str] = []
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
GATED = {"approval.enable": True, "approval.tools": ["danger"]}


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool(side_effects=True)
def danger(target: str) -> str:
    """Do something risky to a target."""
    ran.append(target)
    return f"destroyed {target}"


@tool
async def show_chart(ctx: ToolContext) -> str:
    """Send a chart, its data, and a broken image."""
    await ctx.callbacks.call("send_image", base64.b64encode(PNG).decode())
    await ctx.callbacks.call("send_file", "data.csv", base64.b64encode(b"a,b\n1,2\n").decode())
    await ctx.callbacks.call("send_image", "this is not base64!")
    return "sent"


@pytest.fixture(autouse=True)
def _fresh():
    ran.clear()


def start(agent, view: RunView, prompt: str = "go") -> asyncio.Task:
    return asyncio.create_task(agent.chat(prompt, session=view.session, callbacks=view.callbacks))


async def card_of(view: RunView):
    await until(lambda: view.cards, "the approval card")
    [card] = view.cards.values()
    return card


def tool_messages(request) -> list[str]:
    return [m["content"] for m in request.messages if m.get("role") == "tool"]


# ------------------------------------------------------------------ run states


async def test_streamed_run_shows_deltas_tool_rows_usage_and_the_reply(llm, make_agent):
    agent = make_agent(tools=[add], overrides={"llm.stream": True})
    llm.script(
        reply(
            "Let me add those.",
            tool_calls=[tool_call("add", {"a": 2, "b": 3})],
            usage=usage(100, 20, cached=64),
        ),
        reply("The **sum** of the numbers is 5, as computed.", usage=usage(150, 12, cached=96)),
    )
    view = RunView(agent, session="nb:x", prompt="add 2 and 3")
    assert (view.status, view.spinner.value) == ("running", "⠋")
    ticker = view._ticker  # the elapsed-time task, on this loop
    assert ticker is not None and not ticker.done()
    shown: list[str] = []
    view.reply.observe(lambda change: shown.append(change["new"]), names="value")

    result = await agent.chat("add 2 and 3", session="nb:x", callbacks=view.callbacks)
    view.finish(result)

    final = "<p>The <strong>sum</strong> of the numbers is 5, as computed.</p>\n"
    assert view.reply.value == final
    partial = [v for v in shown if v and v != final]
    assert partial, "the reply was not streamed"
    assert any("The <strong>sum</strong>" not in v and "The" in v for v in partial)
    [intermediate, row] = view.items
    assert intermediate.kind == "text" and "Let me add those." in intermediate.widget.value
    assert row is view.tool_rows[row.id] and row.state == "ok" and row.result == "5"
    assert row.title().startswith("✓ add(a=2, b=3) → 5 · ")
    assert "<b>result</b>" in row.widget.value and "<b>a</b>: <code" in row.widget.value
    assert 'aria-label="success"' in view.status_label.value
    assert view.status == "success" and ">success</b>" in view.status_label.value
    assert view.usage["cached_tokens"] == 160 and view.usage["total_tokens"] == 282
    assert view.usage_label.value == "282 tokens (in 250 · cached 160 · out 32) · 2 LLM calls"
    assert view.spinner.value == "" and view._ticker is None
    await until(ticker.done, "the ticker to end")
    assert ticker.cancelled()
    assert view.error_html.value == ""


async def test_raw_html_in_the_models_reply_is_shown_as_text_not_markup(llm, make_agent):
    agent = make_agent()
    llm.script(reply('See <img src=x onerror="alert(1)"> and <script>steal()</script> **now**'))
    view = RunView(agent, session="nb:x", prompt="hi")
    result = await agent.chat("hi", session="nb:x", callbacks=view.callbacks)
    view.finish(result)
    shown = view.reply.value
    assert "<img" not in shown and "<script" not in shown
    assert "&lt;img src=x onerror=" in shown and "&lt;script&gt;steal()&lt;/script&gt;" in shown
    assert "<strong>now</strong>" in shown  # the Markdown itself still renders


async def test_usage_header_follows_usage_events_while_running(llm, make_agent):
    agent = make_agent(tools=[add])
    llm.script(
        reply(tool_calls=[tool_call("add", {"a": 1, "b": 1})], usage=usage(40, 5, cached=32)),
        delay(30, reply("late")),
    )
    view = RunView(agent, session="nb:u")
    task = start(agent, view)
    await until(lambda: len(llm.requests) == 2, "the second LLM call")
    assert view.status == "running"
    assert view.usage_label.value == "45 tokens (in 40 · cached 32 · out 5) · 1 LLM call"
    view.on_event(RunEvent("usage", "sub:nb:u", {"total_tokens": 999}))  # not this run's
    assert view.usage["total_tokens"] == 45
    assert agent.stop("nb:u")
    view.finish(await task)
    assert view.status == "stopped" and ">stopped</b>" in view.status_label.value


async def test_an_llm_failure_shows_the_error_status(llm, make_agent):
    agent = make_agent()
    llm.script(error(400, "model 'scripted' does not exist"))
    view = RunView(agent, session="nb:e", prompt="hi")
    result = await agent.chat("hi", session="nb:e", callbacks=view.callbacks)
    assert view.status == "error"  # already from the run_end event, before finish
    view.finish(result)
    assert result.status == "error" and view.status == "error"
    assert 'aria-label="error"' in view.status_label.value
    assert ">error</b>" in view.status_label.value
    assert "does not exist" in view.error_html.value and view.reply.value == ""
    assert view.text().splitlines()[0].startswith("✗ error · nb:e · ")
    assert "error: " in view.text() and "does not exist" in view.text()


async def test_a_call_written_as_text_and_not_run_is_shown_not_silent(llm, make_agent, tmp_path):
    """The run record had the warning, the cell showed a plain success (#36)."""
    example = 'Like this:\n```json\n{"name": "add", "arguments": {"a": 1}}\n```\nSee?'
    llm.script(reply(example))
    agent = make_agent(tools=[add])
    view = RunView(agent, session="nb:w", prompt="how do I call add?")
    result = await agent.chat("how do I call add?", session="nb:w", callbacks=view.callbacks)
    view.finish(result)
    assert result.ok and len(result.warnings) == 1
    assert "warning: the answer contains a tool call written as text (add)" in view.text()
    assert "#ef6c00" in view.error_html.value and "written as text" in view.error_html.value

    llm.script(reply('{"name": "add", "arguments": {"a": 1, "b": 2}}'))
    off = make_agent(
        tools=[add], overrides={"llm.text_tool_calls": False}, data_dir=tmp_path / "off"
    )
    view = RunView(off, session="nb:w", prompt="1+2")
    view.finish(await off.chat("1+2", session="nb:w", callbacks=view.callbacks))
    assert view.status == "error" and "#c62828" in view.error_html.value
    assert "error: the answer is only a tool call written as text (add)" in view.text()


async def test_agent_stop_shows_stopped_and_ends_the_running_tool_row(llm, make_agent):
    gate = asyncio.Event()

    @tool
    async def slow() -> str:
        """Wait for a long time."""
        await gate.wait()
        return "never"

    agent = make_agent(tools=[slow])
    llm.script(reply(tool_calls=[tool_call("slow")]))
    view = RunView(agent, session="nb:s")
    task = start(agent, view)
    await until(lambda: view.tool_rows, "the tool row")
    [row] = view.tool_rows.values()
    assert row.state == "running" and row.title() == "⚙ slow() · running…"
    assert agent.stop("nb:s")
    result = await task
    view.finish(result)
    assert result.status == "stopped" and view.status == "stopped"
    assert row.state == "stopped" and "the run ended (stopped)" in row.result


# ------------------------------------------------------------------- approvals


async def test_allow_click_runs_the_tool(llm, make_agent):
    agent = make_agent(tools=[danger], overrides=GATED)
    llm.script(reply(tool_calls=[tool_call("danger", {"target": "db"})]), reply("Done."))
    view = RunView(agent, session="nb:a")
    task = start(agent, view)
    card = await card_of(view)
    assert card.state == "pending" and not card.disabled and ran == []
    assert "<code>danger</code>" in card.heading.value
    # No summary of its own: the arguments are shown field by field, not as a JSON line.
    assert card.summary.value == "" and "<b>target</b>: <code" in card.details.value
    assert ">db</code>" in card.details.value
    assert card.session_button.description == "Allow danger for the rest of this session"
    assert view.tool_rows and next(iter(view.tool_rows.values())).state == "running"
    card.allow_button.click()
    result = await task
    view.finish(result)
    assert result.ok and ran == ["db"]
    assert card.state == "allowed" and card.disabled
    assert card.verdict_text() == "✓ allowed — approved by the user"
    assert "<b>Allowed</b>: <code>danger</code>" in card.heading.value  # not "Approval needed"
    assert "Approval needed" not in card.html()
    [row] = view.tool_rows.values()
    assert row.state == "ok" and row.result == "destroyed db"
    assert tool_messages(llm.requests[-1]) == ["destroyed db"]
    assert agent.approvals.allowed_tools("nb:a") == []  # a plain Allow is for this call only


async def test_deny_click_sends_the_denial_to_the_model(llm, make_agent):
    agent = make_agent(tools=[danger], overrides=GATED)
    llm.script(reply(tool_calls=[tool_call("danger", {"target": "db"})]), reply("OK, I won't."))
    view = RunView(agent, session="nb:d")
    task = start(agent, view)
    card = await card_of(view)
    assert "<b>Approval needed</b>: <code>danger</code>" in card.heading.value
    deadline = datetime.fromtimestamp(card.deadline).strftime("%H:%M:%S")
    assert card.verdict_text() == (
        f"⚠ waiting for your answer — denied on its own at {deadline} if nobody answers"
    )
    assert abs(card.deadline - time.time() - agent.approvals.timeout) < 5
    card.deny_button.click()
    card.allow_button.click()  # a second click is ignored: the question is closed
    view.finish(await task)
    assert "<b>Denied</b>: <code>danger</code>" in card.heading.value
    assert ran == []
    assert tool_messages(llm.requests[-1]) == ["Tool call not approved: denied by the user"]
    assert card.state == "denied" and card.disabled
    [row] = view.tool_rows.values()
    assert row.state == "denied" and row.title().startswith("⊘ danger(")
    assert "? approval for danger" in view.text() and "✗ denied" in view.text()


async def test_allow_for_session_stops_asking_in_that_session_only(llm, make_agent):
    agent = make_agent(tools=[danger], overrides=GATED)
    llm.script(
        reply(tool_calls=[tool_call("danger", {"target": "a"})]),
        reply("first"),
        reply(tool_calls=[tool_call("danger", {"target": "b"})]),
        reply("second"),
        reply(tool_calls=[tool_call("danger", {"target": "c"})]),
        reply("third"),
    )
    first = RunView(agent, session="nb:s1")
    task = start(agent, first)
    card = await card_of(first)
    card.session_button.click()
    first.finish(await task)
    assert card.state == "allowed" and "rest of this session" in card.verdict_text()
    assert agent.approvals.allowed_tools("nb:s1") == ["danger"]

    second = RunView(agent, session="nb:s1")
    second.finish(await agent.chat("again", session="nb:s1", callbacks=second.callbacks))
    assert second.cards == {} and ran == ["a", "b"]  # not asked again
    assert tool_messages(llm.requests[3])[-1] == "destroyed b"

    other = RunView(agent, session="nb:s2")  # another session still asks
    task = start(agent, other)
    (await card_of(other)).deny_button.click()
    other.finish(await task)
    assert ran == ["a", "b"] and other.status == "success"


async def test_an_unanswered_card_times_out(llm, make_agent):
    agent = make_agent(tools=[danger], overrides=GATED)
    agent.approvals.timeout = 0.2
    llm.script(reply(tool_calls=[tool_call("danger", {"target": "db"})]), reply("Timed out."))
    view = RunView(agent, session="nb:t")
    task = start(agent, view)
    card = await card_of(view)
    view.finish(await task)
    assert card.state == "timeout" and card.disabled
    assert card.verdict_text() == "◷ timed out — no answer within 0.2 s, denied automatically"
    assert "<b>Not answered in time: denied</b>" in card.heading.value
    card.allow_button.click()  # too late: nothing happens
    assert card.state == "timeout" and ran == []
    expected = "Tool call not approved: no answer within 0.2 s, denied automatically"
    assert tool_messages(llm.requests[-1]) == [expected]
    assert next(iter(view.tool_rows.values())).state == "timeout"


async def test_stop_while_a_card_waits_shows_stopped_on_the_card(llm, make_agent):
    agent = make_agent(tools=[danger], overrides=GATED)
    llm.script(reply(tool_calls=[tool_call("danger", {"target": "db"})]))
    view = RunView(agent, session="nb:p")
    task = start(agent, view)
    card = await card_of(view)
    assert agent.stop("nb:p")
    result = await task
    view.finish(result)
    assert result.status == "stopped" and view.status == "stopped" and ran == []
    assert card.state == "stopped" and card.disabled
    assert card.verdict_text() == "■ stopped — stopped by the user"
    assert agent.approvals.pending() == []


# ----------------------------------------------------------- media, plain text


async def test_images_and_files_are_shown_inline(llm, make_agent):
    agent = make_agent(tools=[show_chart])
    llm.script(reply(tool_calls=[tool_call("show_chart")]), reply("Here is your chart."))
    view = RunView(agent, session="nb:m")
    view.finish(await agent.chat("chart", session="nb:m", callbacks=view.callbacks))
    kinds = [getattr(item, "kind", "tool") for item in view.items]
    assert kinds == ["tool", "image", "file", "text"]
    image, link, broken = view.items[1:]
    assert (image.widget.value, image.widget.format) == (PNG, "png")
    assert image.widget in view.body.children
    data = base64.b64encode(b"a,b\n1,2\n").decode()
    assert link.widget.value.startswith(
        f'<a download="data.csv" href="data:text/csv;base64,{data}"><svg '
    )
    assert link.widget.value.endswith("</svg> data.csv (8 B)</a>")
    assert "an image could not be shown" in broken.widget.value
    text = view.text()
    assert "[image png, 24 B]" in text and "[file data.csv, 8 B]" in text


async def test_plain_text_rendering_and_mime_bundle(llm, make_agent):
    agent = make_agent(tools=[add])
    llm.script(
        reply("Adding.", tool_calls=[tool_call("add", {"a": 20, "b": 22})], usage=usage(10, 2)),
        reply("It is **42**.", usage=usage(12, 3, cached=8)),
    )
    view = RunView(agent, session="nb:txt", prompt="what is 20 + 22?")
    assert view.text().startswith("◐ running · nb:txt · ")
    view.finish(await agent.chat("what is 20 + 22?", session="nb:txt", callbacks=view.callbacks))
    lines = view.text().splitlines()
    assert lines[0].startswith("✓ success · nb:txt · ")
    assert lines[0].endswith("· 27 tokens (in 22 · cached 8 · out 5) · 2 LLM calls")
    assert lines[1:] == [
        "› what is 20 + 22?",
        "  … Adding.",
        lines[3],
        "It is **42**.",
    ]
    assert lines[3].startswith("  ✓ add(a=20, b=22) → 42 · ")
    # Finished: the static HTML replaces the widget view (no "model not found" once saved).
    bundle = view._repr_mimebundle_()
    assert bundle == {"text/html": view.html(), "text/plain": view.text()}
    assert "It is <strong>42</strong>." in bundle["text/html"]
    view.close()
    assert view._repr_mimebundle_() == {"text/html": view.html(), "text/plain": view.text()}


async def test_an_attached_todo_view_follows_the_runs_todo_events(llm, make_agent):
    from ania_nb.notebook.widgets import TodoView

    agent = make_agent(overrides={"agent.builtin_tools": True})
    todos = [{"content": "load data", "status": "in_progress", "activeForm": "Loading data"}]
    llm.script(reply(tool_calls=[tool_call("todo_write", {"todos": todos})]), reply("Planned."))
    todo_view = TodoView(agent, "nb:todo")
    view = RunView(agent, session="nb:todo", todo_view=todo_view)
    view.finish(await agent.chat("plan", session="nb:todo", callbacks=view.callbacks))
    assert todo_view.todos == [json.loads(json.dumps(todos[0]))]
    assert "◐ load data — Loading data…" in todo_view.list.children[0].value


async def test_display_shows_the_widget_and_finish_updates_the_saved_text(llm, make_agent):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.display import display
    from IPython.utils.capture import capture_output

    InteractiveShell.instance()  # display() needs a shell; nbconvert keeps what it publishes
    agent = make_agent()
    llm.script(reply("All **done**."))
    view = RunView(agent, session="nb:disp", prompt="finish")
    with capture_output() as captured:
        display(view)
        view.finish(await agent.chat("finish", session="nb:disp", callbacks=view.callbacks))
    shown, updated = captured.outputs
    assert shown.data["text/plain"].startswith("◐ running · nb:disp")
    # Running: the widget view and, in the same display data, the static HTML of the moment.
    assert shown.data["application/vnd.jupyter.widget-view+json"]["model_id"] == (
        view.widget.model_id
    )
    assert ">running</b>" in shown.data["text/html"]
    assert updated.update is True
    assert updated.transient["display_id"] == shown.transient["display_id"]
    assert updated.data["text/plain"] == view.text()
    assert view.text().splitlines()[-1] == "All **done**."
    # Finished: the saved output is the static HTML alone (a reopened notebook shows it).
    assert set(updated.data) == {"text/html", "text/plain"}
    assert "All <strong>done</strong>." in updated.data["text/html"]
    assert ">success</b>" in updated.data["text/html"]


async def test_approval_resolved_events_and_revoking_a_session_allowance():
    from ania_nb import Callbacks
    from ania_nb.governance.approval import ApprovalManager

    events: list[tuple[str, dict]] = []

    def broken(request) -> None:
        raise ConnectionError("front end gone")

    callbacks = Callbacks(
        request_approval=broken, on_event=lambda e: events.append((e.kind, e.data))
    )
    manager = ApprovalManager(timeout=30)
    verdict = await manager.request(session="s", tool="bash", summary="ls", callbacks=callbacks)
    assert verdict.allowed is False
    [(kind, data)] = events
    assert kind == "approval_resolved" and data["outcome"] == "error"
    assert set(data) == {"id", "tool", "allowed", "reason", "outcome"}
    assert data["reason"] == "the approval request could not be shown: front end gone"

    manager.allow_for_session("s", "bash")
    manager.allow_for_session("s", "file")
    allowed = await manager.request(session="s", tool="bash", summary="ls", callbacks=callbacks)
    assert (allowed.allowed, allowed.reason) == (True, "allowed for the rest of this session")
    assert len(events) == 1  # nothing was asked, so nothing resolved
    assert manager.allowed_tools("s") == ["bash", "file"] and manager.allowed_tools("t") == []
    assert manager.revoke_for_session("s", "bash") == 1
    assert manager.allowed_tools("s") == ["file"]
    denied = await manager.request(session="s", tool="bash", summary="ls", callbacks=callbacks)
    assert denied.allowed is False and len(events) == 2  # asked again
    assert manager.revoke_for_session("s") == 1 and manager.allowed_tools("s") == []


async def test_a_stream_retried_after_shown_text_takes_that_text_back(llm, make_agent):
    from ania_nb.testing import cut_stream

    agent = make_agent(overrides={"llm.stream": True})
    llm.script(cut_stream(reply("FIRST ATTEMPT " * 20), after_chunks=3), reply("Second, whole."))
    view = RunView(agent, session="nb:r", prompt="hi")
    notices: list[str] = []
    view.error_html.observe(lambda change: notices.append(change["new"]), names="value")
    result = await agent.chat("hi", session="nb:r", callbacks=view.callbacks)
    assert "FIRST" not in view.reply_text  # taken back before the second attempt streamed
    view.finish(result)
    assert result.text == "Second, whole."
    assert "FIRST" not in view.reply.value and "Second, whole." in view.reply.value
    assert any("retrying" in n for n in notices)  # the retry was shown while it happened
    assert view.error_html.value == ""  # and the note is gone once the run succeeded


async def test_a_priced_run_shows_its_cost_and_a_denied_one_its_reason(llm, make_agent):
    prices = {"scripted": {"input": 3.0, "output": 15.0}}
    agent = make_agent(overrides={"pricing.models": prices, "quota.daily_tokens": 1000})
    llm.script(reply("hi", usage=usage(1000, 200)))
    view = RunView(agent, session="nb:cost")
    view.finish(await start(agent, view))
    assert view.usage_label.value.endswith(" · 1 LLM call · cost $0.0060")  # 0.003 + 0.003
    assert "cost $0.0060" in view.text().splitlines()[0]
    denied = RunView(agent, session="nb:cost")
    denied.finish(await start(agent, denied))
    assert denied.status == "denied" and "⊘ denied" in denied.text()
    assert "quota of this session is used up (1,200 of 1,000" in denied.text()


# ------------------------------------------------------------------ MCP tool rows


async def test_an_mcp_tools_progress_bar_and_images_show_on_its_row(llm, make_agent, tmp_path):
    from mcp_servers.demo_server import PNG as MCP_PNG
    from mcp_servers.support import stdio_entry

    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"servers": [stdio_entry("media", media=True)]}))
    agent = make_agent(overrides={"mcp.config_file": str(config), "mcp.lazy_load": False})
    await agent.start()
    llm.script(
        reply(tool_calls=[tool_call("steps", {"count": 3})]),
        reply(tool_calls=[tool_call("picture")]),
        reply("done"),
    )
    view = RunView(agent, session="nb:mcp")
    task = start(agent, view)
    await until(lambda: view.tool_rows, "the steps row")
    [row] = view.tool_rows.values()
    await until(lambda: row.progress is not None, "a progress event")
    assert row.state == "running"
    assert '<progress value="1" max="3"></progress>' in row.widget.value  # live in the widget
    assert "running 1/3 step 1 of 3…" in row.title()
    view.finish(await task)
    assert "<progress" not in row.html()  # a finished row shows its result instead
    picture = list(view.tool_rows.values())[1]
    uri = f"data:image/png;base64,{MCP_PNG}"
    assert picture.images == [uri]
    assert f'<img src="{uri}"' in picture.widget.value
    assert "[1 image(s)]" in picture.title()
    assert f'<img src="{uri}"' in view.html()  # the saved notebook's static HTML keeps it
