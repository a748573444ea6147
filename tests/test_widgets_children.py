"""Nested transcripts in `RunView`: ``child`` events of subagent and team calls build one row per
child under the parent's tool row (status, elapsed, tokens, tool rows, final Markdown), live;
background children keep a pending chip that completes after the run has ended."""

from __future__ import annotations

import asyncio
from typing import Any

from _waits import until

from ania_nb import Callbacks, RunEvent, tool
from ania_nb.engine.usage import Usage
from ania_nb.notebook.widgets import RunView
from ania_nb.result import RunResult
from ania_nb.testing import reply, tool_call, usage

SESSION = "nb:kids"
TEAM_CALL = "call_team"


def event(kind: str, **data: Any) -> RunEvent:
    return RunEvent(kind, SESSION, data)


def child(
    call_id: str, child_id: str, label: str, kind: str, background: bool = False, **data: Any
) -> RunEvent:
    """A ``child`` event exactly as the contract shapes it."""
    shaped = {"call_id": call_id, "child_id": child_id, "label": label, "kind": kind}
    return RunEvent("child", SESSION, {**shaped, "data": data, "background": background})


def member_usage(total: int, calls: int) -> dict[str, int]:
    return Usage(total // 2, total - total // 2, total, 0, total // 2, calls).to_dict()


def result(text: str, status: str = "success", error: str | None = None) -> RunResult:
    return RunResult(text=text, status=status, session=SESSION, error=error)  # type: ignore[arg-type]


class SavedOutput:
    """Stands in for the notebook's display handle: keeps what would be saved in the notebook."""

    def __init__(self) -> None:
        self.text = ""

    def update(self, bundle: dict[str, Any], raw: bool = False) -> None:
        self.text = bundle["text/plain"]


async def test_a_team_call_nests_one_live_row_per_member_under_its_tool_row(make_agent):
    view = RunView(make_agent(), session=SESSION, prompt="research it")
    on = view.on_event
    on(event("run_start", run_id=1, text="research it"))
    on(event("tool_start", id=TEAM_CALL, name="team_run", arguments='{"task": "t"}'))
    on(event("tool_start", id="call_other", name="time", arguments="{}"))  # a parallel call
    members = [("alpha", "researcher"), ("beta", "a critic"), ("gamma", "")]
    for i, (name, role) in enumerate(members):
        on(
            child(
                TEAM_CALL, f"{TEAM_CALL}:{i}", name, "child_start", role=role, task=f"t for {name}"
            )
        )
    for i, (name, _) in enumerate(members):
        on(child(TEAM_CALL, f"{TEAM_CALL}:{i}", name, "run_start", run_id=10 + i, text="t"))
    a, b = f"{TEAM_CALL}:0", f"{TEAM_CALL}:1"
    on(child(TEAM_CALL, a, "alpha", "assistant_text", text="Searching first."))
    args = '{"query": "cats"}'
    on(child(TEAM_CALL, a, "alpha", "tool_start", id="c1", name="webSearch", arguments=args))
    on(child(TEAM_CALL, a, "alpha", "usage", **member_usage(120, 1)))
    on(event("tool_end", id="call_other", name="time", arguments="{}", result="noon"))

    nested = view.children[TEAM_CALL]
    team_row = view.tool_rows[TEAM_CALL]
    at = view.items.index(team_row)
    assert view.items[at + 1] is nested  # right under its tool row, not at the end
    assert view.body.children[at + 1] is nested.widget
    assert view.items.index(view.tool_rows["call_other"]) == at + 2
    rows = list(nested.rows.values())
    assert [r.label for r in rows] == ["alpha", "beta", "gamma"]
    assert [r.status for r in rows] == ["running"] * 3
    assert nested.widget.selected_index == 0 and rows[0].accordion.selected_index == 0
    assert nested.widget.titles[0] == "team_run: 3 children — running 3"
    alpha = rows[0]
    assert alpha.accordion.titles[0].startswith("◐ alpha (researcher) · running · ")
    assert alpha.accordion.titles[0].endswith(" · 120 tokens · 1 LLM call")
    assert rows[2].accordion.titles[0].startswith("◐ gamma · running")  # no role: just the name
    assert "t for alpha" in alpha.info.value and "researcher" in alpha.info.value
    [note, search] = alpha.items
    assert "Searching first." in note.widget.value
    assert search is alpha.tool_rows["c1"] and search.state == "running"
    assert list(alpha.body.children) == [note.widget, search.widget]
    assert nested._ticker is not None and not nested._ticker.done()  # elapsed time ticks

    on(
        child(
            TEAM_CALL,
            a,
            "alpha",
            "tool_end",
            id="c1",
            name="webSearch",
            arguments=args,
            result="3 hits",
            error=None,
            duration_ms=40,
            outcome="ok",
        )
    )
    assert search.state == "ok" and search.title().startswith("✓ webSearch(query=cats)")
    on(
        child(
            TEAM_CALL,
            a,
            "alpha",
            "child_end",
            status="success",
            text="Cats **purr**.",
            error="",
            elapsed=2.5,
            usage=member_usage(300, 2),
        )
    )
    on(child(TEAM_CALL, b, "beta", "run_end", status="error", error="LLM error 500"))
    on(
        child(
            TEAM_CALL,
            b,
            "beta",
            "child_end",
            status="error",
            text="",
            error="LLM error 500",
            elapsed=1.25,
            usage=member_usage(0, 1),
        )
    )
    assert alpha.status == "success" and alpha.ended
    assert alpha.reply.value == "<p>Cats <strong>purr</strong>.</p>\n"
    assert (
        alpha.accordion.titles[0]
        == "✓ alpha (researcher) · success · 2.5 s · 300 tokens · 2 LLM calls"
    )
    beta = rows[1]
    assert beta.accordion.titles[0] == "✗ beta (a critic) · error · 1.2 s · 0 tokens · 1 LLM call"
    assert "LLM error 500" in beta.error_html.value and beta.reply.value == ""
    assert alpha.error_html.value == ""
    assert nested.widget.titles[0] == "team_run: 3 children — error 1 · running 1 · success 1"
    ticker = nested._ticker
    on(
        child(
            TEAM_CALL,
            f"{TEAM_CALL}:2",
            "gamma",
            "child_end",
            status="success",
            text="ok",
            error="",
            elapsed=0.5,
            usage=member_usage(10, 1),
        )
    )
    assert nested._ticker is None  # nothing runs any more
    await until(lambda: ticker is not None and ticker.done(), "the ticker to end")

    on(event("tool_end", id=TEAM_CALL, name="team_run", arguments="{}", result="[Agent team]"))
    on(event("run_end", status="success", error=None))
    view.finish(result("The team found: cats purr."))
    text = view.text()
    lines = text.splitlines()
    team_line = next(i for i, line in enumerate(lines) if "team_run(task=t)" in line)
    assert lines[team_line + 1] == "    ↳ team_run: 3 children — error 1 · success 2"
    assert lines[team_line + 2] == (
        "      ↳ ✓ alpha (researcher) · success · 2.5 s · 300 tokens · 2 LLM calls"
    )
    nested_text = "\n".join(lines[team_line + 2 :])
    for expected in (
        "          task: t for alpha",
        "          … Searching first.",
        "          ✓ webSearch(query=cats) → 3 hits · 40 ms",
        "          Cats **purr**.",
        "      ↳ ✗ beta (a critic) · error · 1.2 s · 0 tokens · 1 LLM call",
        "          error: LLM error 500",
        "      ↳ ✓ gamma · success · 0.5 s · 10 tokens · 1 LLM call",
    ):
        assert expected in nested_text.splitlines(), expected
    assert text.endswith("The team found: cats purr.")


async def test_an_expanded_childs_task_is_cut_to_its_limit_the_marker_included(make_agent):
    from ania_nb.notebook.widgets.children import TASK_CHARS

    view = RunView(make_agent(), session=SESSION, prompt="p")
    on = view.on_event
    on(event("run_start", run_id=1, text="p"))
    on(event("tool_start", id=TEAM_CALL, name="team_run", arguments='{"task": "t"}'))
    exact, longer = "e" * TASK_CHARS, "l" * (TASK_CHARS + 1)
    on(child(TEAM_CALL, f"{TEAM_CALL}:0", "a", "child_start", task=exact))
    on(child(TEAM_CALL, f"{TEAM_CALL}:1", "b", "child_start", task=longer))
    whole, cut = view.children[TEAM_CALL].rows.values()
    assert f">{exact}</pre>" in whole.info.value  # exactly the limit: shown whole
    assert f">{'l' * (TASK_CHARS - 1)}…</pre>" in cut.info.value  # one more: cut to the limit


async def test_a_running_childs_elapsed_time_and_streamed_text_update_without_events(make_agent):
    view = RunView(make_agent(), session=SESSION)
    view.on_event(event("tool_start", id="call_s", name="subagent_run", arguments="{}"))
    view.on_event(child("call_s", "sub-1", "subagent", "run_start", run_id=3, text="dig"))
    row = view.children["call_s"].rows["sub-1"]
    first = row.accordion.titles[0]
    assert first.startswith("◐ subagent · running · ") and row.task == "dig"
    for piece in ("Digging ", "*deep*"):
        view.on_event(child("call_s", "sub-1", "subagent", "text_delta", text=piece))
    assert row.reply.value == ""  # not per delta: the ticker renders the stream
    await until(lambda: row.accordion.titles[0] != first, "the elapsed time to tick")
    await until(lambda: "<em>deep</em>" in row.reply.value, "the streamed text")
    view.on_event(
        child(
            "call_s",
            "sub-1",
            "subagent",
            "child_end",
            status="success",
            text="Found it.",
            error="",
            elapsed=0.75,
            usage={},
        )
    )
    assert row.reply.value == "<p>Found it.</p>\n"
    assert row.accordion.titles[0] == "✓ subagent · success · 0.8 s"
    assert view.children["call_s"]._ticker is None
    view.finish(result("done"))
    view.close()


async def test_a_background_child_completes_its_chip_after_the_run_has_ended(make_agent):
    view = RunView(make_agent(), session=SESSION, prompt="look it up later")
    saved = SavedOutput()
    view._display_handle = saved  # as if displayed in a notebook
    on = view.on_event
    args = '{"task": "look it up", "background": true}'
    on(event("tool_start", id="call_bg", name="subagent_run", arguments=args))
    on(child("call_bg", "sub_7", "subagent", "child_start", background=True, task="look it up"))
    on(event("tool_end", id="call_bg", name="subagent_run", arguments=args, result="started sub_7"))
    on(event("run_end", status="success"))
    view.finish(result("I started a subagent."))

    nested = view.children["call_bg"]
    row = nested.rows["sub_7"]
    assert row.status == "pending" and not row.ended
    assert row.accordion.selected_index is None  # the chip says enough until opened
    assert "○ subagent in background: pending · " in row.chip.value
    assert list(row.widget.children) == [row.chip, row.accordion, row.followup_html]
    assert nested._ticker is not None  # still ticking: the chip's time goes on after the run
    assert "↳ ○ subagent · background · pending · " in saved.text

    # the background runner delivers later, on the same callbacks
    on(
        child(
            "call_bg",
            "sub_7",
            "subagent",
            "child_end",
            background=True,
            status="success",
            text="The **answer** is 42.",
            error="",
            elapsed=12.0,
            usage=member_usage(80, 2),
        )
    )
    assert row.status == "success" and row.ended
    assert "✓ subagent in background: success after 12.0 s · 80 tokens · 2 LLM calls" in (
        row.chip.value
    )
    assert row.reply.value == "<p>The <strong>answer</strong> is 42.</p>\n"
    assert nested._ticker is None
    # the notebook's saved text follows the late completion
    assert "↳ ✓ subagent · background · success · 12.0 s · 80 tokens · 2 LLM calls" in saved.text
    assert "    The **answer** is 42." in saved.text
    assert view.status == "success"  # the run itself is unchanged


async def test_children_still_running_when_the_run_stops_end_with_it_background_ones_go_on(
    make_agent,
):
    view = RunView(make_agent(), session=SESSION)
    on = view.on_event
    on(event("tool_start", id="call_t", name="team_run", arguments="{}"))
    on(child("call_t", "call_t:0", "alpha", "child_start", role="", task="x"))
    on(child("call_t", "call_t:0", "alpha", "tool_start", id="c9", name="bash", arguments="{}"))
    on(event("tool_start", id="call_b", name="subagent_run", arguments="{}"))
    on(child("call_b", "sub_1", "subagent", "child_start", background=True, task="y"))
    view.finish(result("", status="stopped", error="stopped by the user"))

    alpha = view.children["call_t"].rows["call_t:0"]
    assert alpha.status == "stopped" and alpha.ended
    assert alpha.tool_rows["c9"].state == "stopped"
    assert "the run ended (stopped)" in alpha.error_html.value
    assert view.children["call_t"]._ticker is None
    background = view.children["call_b"].rows["sub_1"]
    assert background.status == "pending" and not background.ended
    view.close()  # stops the background child's ticker too
    assert view.children["call_b"]._ticker is None


async def test_child_events_of_an_unknown_call_still_show(make_agent):
    view = RunView(make_agent(), session=SESSION)
    view.on_event(
        child(
            "call_x",
            "call_x:0",
            "solo",
            "tool_end",
            id="t",
            name="add",
            arguments='{"a": 1}',
            result="2",
            duration_ms=3,
            outcome="ok",
        )
    )
    [nested] = view.items
    assert nested is view.children["call_x"]
    assert nested.widget.titles[0] == "children: 1 child — running 1"
    assert nested.rows["call_x:0"].tool_rows["t"].state == "ok"
    view.finish(result("ok"))


# ------------------------------------------------------------ through a real Agent


async def test_a_real_team_run_shows_three_members_running_at_once(llm, make_agent):
    arrived: list[str] = []
    gate = asyncio.Event()

    @tool
    async def meet(who: str) -> str:
        """Wait at the meeting point."""
        arrived.append(who)
        await gate.wait()
        return f"{who} met the others"

    agent = make_agent(tools=[meet], overrides={"team.enable": True, "agent.builtin_tools": True})
    names = ["alpha", "beta", "gamma"]
    for name in names:
        llm.route(
            f"You are {name}.",
            reply(tool_calls=[tool_call("meet", {"who": name})], usage=usage(10, 5)),
            reply(f"{name} says **yes**", usage=usage(20, 5)),
        )
    members = [{"name": n, "role": f"the {n} expert", "task": f"part {n}"} for n in names]
    llm.script(
        reply(tool_calls=[tool_call("team_run", {"task": "decide", "members": members})]),
        reply("All agree."),
    )
    view = RunView(agent, session=SESSION, prompt="decide")
    task = asyncio.create_task(agent.chat("decide", session=SESSION, callbacks=view.callbacks))

    def meeting() -> bool:
        nested = next(iter(view.children.values()), None)
        return (
            nested is not None
            and all(
                any(r.name == "meet" and r.state == "running" for r in row.tool_rows.values())
                for row in nested.rows.values()
            )
            and len(nested.rows) == 3
            and len(arrived) == 3  # a row shows "running" a hop before the tool's body starts
        )

    await until(meeting, "all three members inside their meet call")
    [nested] = view.children.values()
    assert sorted(arrived) == names  # all three in flight at once: they run in parallel
    team_row = view.tool_rows[nested.call_id]
    assert team_row.name == "team_run" and team_row.state == "running"
    assert view.items[view.items.index(team_row) + 1] is nested
    assert [r.label for r in nested.rows.values()] == names  # input order
    assert all(r.status == "running" for r in nested.rows.values())
    assert nested.rows[f"{nested.call_id}:0"].role == "the alpha expert"
    gate.set()
    view.finish(await asyncio.wait_for(task, 10))

    assert view.status == "success" and view.reply_text == "All agree."
    assert team_row.state == "ok" and "3 members (3 succeeded · 0 failed)" in team_row.result
    for i, name in enumerate(names):
        row = nested.rows[f"{nested.call_id}:{i}"]
        assert row.status == "success"
        assert row.reply.value == f"<p>{name} says <strong>yes</strong></p>\n"
        assert row.tool_rows and all(r.state == "ok" for r in row.tool_rows.values())
        assert row.accordion.titles[0].endswith(" · 40 tokens · 2 LLM calls")
    text = view.text()
    assert "    ↳ team_run: 3 children — success 3" in text
    assert "          ✓ meet(who=beta) → beta met the others · " in text
    assert "          gamma says **yes**" in text


async def test_real_subagents_a_waited_one_nests_live_a_background_one_completes_later(
    llm, make_agent
):
    gate = asyncio.Event()

    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @tool
    async def wait_for_data() -> str:
        """Wait until the data is there."""
        await gate.wait()
        return "the data is there"

    agent = make_agent(
        tools=[add, wait_for_data], overrides={"subagent.enable": True, "agent.builtin_tools": True}
    )
    injected: list[RunEvent] = []
    answered = asyncio.Event()

    def background_events(event: RunEvent) -> None:  # the front end of injected turns
        injected.append(event)
        if event.kind == "run_end":
            answered.set()

    agent.outbox.callbacks_for = lambda session: Callbacks(on_event=background_events)

    def asks(task: str) -> Any:
        return lambda request: any(task in str(m.get("content")) for m in request.messages[1:2])

    llm.route(
        asks("sum job"),
        reply("Adding.", tool_calls=[tool_call("add", {"a": 2, "b": 3})], usage=usage(10, 5)),
        reply("The sum is **5**.", usage=usage(20, 5)),
    )
    llm.route(
        asks("slow job"),
        reply(tool_calls=[tool_call("wait_for_data")], usage=usage(10, 2)),
        reply("The data **arrived**.", usage=usage(10, 3)),
    )
    llm.script(
        reply(
            tool_calls=[
                tool_call("subagent_run", {"task": "sum job"}),
                tool_call("subagent_run", {"task": "slow job", "background": True}),
            ]
        ),
        reply("One is done, one runs on."),
        reply("The background result is in."),  # the injected completion's turn
    )
    view = RunView(agent, session=SESSION, prompt="work")
    saved = SavedOutput()
    view._display_handle = saved
    view.finish(await agent.chat("work", session=SESSION, callbacks=view.callbacks))

    assert view.status == "success" and view.reply_text == "One is done, one runs on."
    calls = [row for row in view.items if getattr(row, "name", "") == "subagent_run"]
    assert len(calls) == 2 and all(row.state == "ok" for row in calls)
    waited = view.children[calls[0].id]
    [sync] = waited.rows.values()
    assert (sync.label, sync.background, sync.status) == ("subagent", False, "success")
    assert sync.task == "sum job"
    assert [r.name for r in sync.tool_rows.values()] == ["add"]
    assert sync.tool_rows[next(iter(sync.tool_rows))].result == "5"
    assert "Adding." in sync.items[0].widget.value
    assert sync.reply.value == "<p>The sum is <strong>5</strong>.</p>\n"
    assert sync.accordion.titles[0].endswith(" · 40 tokens · 2 LLM calls")
    assert view.items.index(waited) == view.items.index(calls[0]) + 1
    [pending] = view.children[calls[1].id].rows.values()
    assert pending.background and pending.status == "pending" and not pending.ended
    assert "○ subagent in background: pending" in pending.chip.value
    assert "↳ ○ subagent · background · pending" in saved.text

    gate.set()  # the background child goes on after its launching run has ended
    await until(lambda: pending.ended, "the background child's child_end")
    assert pending.status == "success"
    assert pending.reply.value == "<p>The data <strong>arrived</strong>.</p>\n"
    assert "✓ subagent in background: success after " in pending.chip.value
    assert " · 25 tokens · 2 LLM calls" in pending.chip.value
    assert "↳ ✓ subagent · background · success · " in saved.text
    assert "    The data **arrived**." in saved.text
    await asyncio.wait_for(answered.wait(), 10)  # its result came back as a message
    assert "[Subagent finished]" in llm.requests[-1].messages[-1]["content"]
    # the agent's reply to it (published on the outbox) shows under the chip
    await until(lambda: pending.followup, "the reply to the injected result")
    assert pending.followup == "The background result is in."
    assert "↪ reply to a subagent message" in pending.followup_html.value
    assert list(pending.widget.children)[-1] is pending.followup_html
    assert "↪ reply to a subagent message:\n            The background result is in." in (
        saved.text
    )
    assert view._unfollow is None  # answered: no longer listening


async def test_a_subagents_approval_card_is_answered_in_the_parent_view(llm, make_agent):
    ran: list[str] = []

    @tool(side_effects=True)
    def danger(target: str) -> str:
        """Do something risky to a target."""
        ran.append(target)
        return f"destroyed {target}"

    gated = {
        "approval.enable": True,
        "approval.tools": ["danger"],
        "subagent.enable": True,
        "agent.builtin_tools": True,
    }
    agent = make_agent(tools=[danger], overrides=gated)
    llm.route(
        "You are a subagent",
        reply(tool_calls=[tool_call("danger", {"target": "tmp"})]),
        reply("Cleaned up."),
    )
    llm.script(reply(tool_calls=[tool_call("subagent_run", {"task": "clean up"})]), reply("Done."))
    view = RunView(agent, session=SESSION)
    task = asyncio.create_task(agent.chat("go", session=SESSION, callbacks=view.callbacks))
    await until(lambda: view.cards, "the child's approval card")
    [card] = view.cards.values()
    [nested] = view.children.values()
    [row] = nested.rows.values()
    assert card.state == "pending" and row.tool_rows and ran == []
    card.allow_button.click()
    view.finish(await asyncio.wait_for(task, 10))
    assert ran == ["tmp"] and row.status == "success"
    assert card.state == "allowed" and card.disabled  # resolved by the child's event
    assert next(iter(row.tool_rows.values())).state == "ok"


async def test_a_childs_approval_answered_elsewhere_resolves_its_card(llm, make_agent):
    gated = {
        "approval.enable": True,
        "approval.tools": ["danger"],
        "subagent.enable": True,
        "agent.builtin_tools": True,
    }

    @tool(side_effects=True)
    def danger(target: str) -> str:
        """Do something risky to a target."""
        return f"destroyed {target}"

    agent = make_agent(tools=[danger], overrides=gated)
    llm.route(
        "You are a subagent",
        reply(tool_calls=[tool_call("danger", {"target": "tmp"})]),
        reply("Left it alone."),
    )
    llm.script(reply(tool_calls=[tool_call("subagent_run", {"task": "clean up"})]), reply("Done."))
    view = RunView(agent, session=SESSION)
    task = asyncio.create_task(agent.chat("go", session=SESSION, callbacks=view.callbacks))
    await until(lambda: view.cards, "the child's approval card")
    [card] = view.cards.values()
    agent.answer_approval(card.request.id, allow=False, reason="not today")  # e.g. by chat
    await until(lambda: card.state != "pending", "the card to hear of the verdict")
    assert card.state == "denied" and card.reason == "not today"
    view.finish(await asyncio.wait_for(task, 10))
    [row] = next(iter(view.children.values())).rows.values()
    assert row.status == "success" and next(iter(row.tool_rows.values())).state == "denied"
