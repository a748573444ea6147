"""The clock's engine (ania_nb.clock): tasks fire on the running loop against the scripted server.

Schedules are short ``@every 1s`` ones; tests wait on clock events and outbox deliveries, never
on the wall clock. A shared tool ``hold`` keeps a run busy until the test releases it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from ania_nb import Callbacks, tool
from ania_nb.clock import Clock, ClockError, ClockEvent
from ania_nb.clock.lease import Lease
from ania_nb.clock.schedule import parse_schedule
from ania_nb.clock.store import SKIPPED_ERROR, ClockStore
from ania_nb.orchestration import Delivery
from ania_nb.store import Store
from ania_nb.testing import error, reply, tool_call, usage
from ania_nb.tools import ToolContext

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends

WAIT = 15.0


class Watch:
    """Everything a clock announces and everything its host's outbox delivers, waitable."""

    def __init__(self, agent: Any, clock: Clock) -> None:
        self.events: list[ClockEvent] = []
        self.deliveries: list[Delivery] = []
        self._changed = asyncio.Condition()
        clock.subscribe(self._on_event)
        agent.outbox.subscribe(self._on_delivery)

    async def _on_event(self, event: ClockEvent) -> None:
        async with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    async def _on_delivery(self, delivery: Delivery) -> None:
        async with self._changed:
            self.deliveries.append(delivery)
            self._changed.notify_all()

    async def event(self, kind: str, status: str | None = None, n: int = 1) -> ClockEvent:
        """The n-th event of ``kind`` (whose entry has ``status``, if given), once it happened."""

        def found() -> list[ClockEvent]:
            return [
                e
                for e in self.events
                if e.kind == kind and (status is None or (e.entry and e.entry.status == status))
            ]

        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(found()) >= n), WAIT)
        return found()[n - 1]

    async def delivery(self, n: int = 1) -> Delivery:
        """The n-th delivery, once it arrived."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.deliveries) >= n), WAIT)
        return self.deliveries[n - 1]


class Hold:
    """A tool that blocks until released, so a test controls how long a run lasts."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = 0

        @tool(name="hold")
        async def hold() -> str:
            """Wait until the test releases the run."""
            self.entered.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            return "released"

        self.tool = hold


def disable_on(clock: Clock, kind: str, status: str | None = None, n: int = 1) -> None:
    """Disable the task from inside its n-th ``kind`` event (no later fire can race the test)."""
    seen: list[ClockEvent] = []

    async def handler(event: ClockEvent) -> None:
        if event.kind == kind and (
            status is None or (event.entry and event.entry.status == status)
        ):
            seen.append(event)
            if len(seen) == n:
                await clock.update(event.task_id, enabled=False)

    clock.subscribe(handler)


@pytest.fixture
async def open_clock(make_agent: Callable[..., Any]):
    """Open an Agent and its started clock: ``agent, clock, watch = await open_clock()``."""
    made: list[Clock] = []

    async def factory(**kwargs: Any) -> tuple[Any, Clock, Watch]:
        agent = make_agent(**kwargs)
        await agent.start()
        clock = getattr(agent, "clock", None)
        if clock is None:  # until the Agent constructs and starts its own
            clock = Clock(agent.host)
            made.append(clock)
        await clock.start()
        return agent, clock, Watch(agent, clock)

    yield factory
    for clock in made:
        await clock.aclose()


async def test_a_task_fires_on_the_loop_with_its_targets_tools_and_delivers_only_the_reply(
    llm, open_clock
):
    bound: list[str] = []

    def lookup_for(session: str) -> list[Any]:
        bound.append(session)

        @tool(name="lookup")
        def lookup() -> str:
            """Look something up for the session."""
            return f"data of {session}"

        return [lookup]

    agent, clock, watch = await open_clock(overrides={"todo.enable": True})
    agent.add_session_tools(lookup_for)
    texts: list[str] = []
    agent.outbox.callbacks_for = lambda session: Callbacks(send_text=texts.append)
    llm.script(
        reply("let me look", tool_calls=[tool_call("lookup")]),
        reply("It is done."),
    )
    disable_on(clock, "run_started")
    task = await clock.create(
        cron="@every 1s",
        title="Report",
        content="summarise the data",
        target="nb:reports",
        note="be brief",
        created_by="qq:42",
    )
    delivery = await watch.delivery()

    assert delivery == Delivery(
        session="nb:reports",
        text="It is done.",
        source="clock",
        title="Report",
        status="success",
        meta={"task_id": task.id, "entry_id": delivery.meta["entry_id"], "created_by": "qq:42"},
    )
    assert texts == []  # the intermediate "let me look" never reached the front end
    first = llm.requests[0]
    trigger = "【定时任务】Report\nsummarise the data\n（备注：be brief）"
    assert first.messages[-1]["content"].endswith(trigger)
    system = first.messages[0]["content"]
    assert system.startswith(agent.host.system_prompt_for("nb:reports"))
    assert "scheduled task" in system and "nb:reports" in system
    names = {t["function"]["name"] for t in first.tools}
    assert "lookup" in names and "todo_write" not in names
    assert "nb:reports" in bound
    assert llm.requests[1].messages[-1]["content"] == "data of nb:reports"

    [entry] = await clock.logs(task_id=task.id)
    assert entry.status == "success" and entry.reply == "It is done." and not entry.manual
    assert entry.trigger == trigger
    assert [c.name for c in entry.tool_calls] == ["lookup"] and entry.tool_calls_total == 1
    assert entry.total_tokens > 0 and entry.iterations == 2
    assert entry.scheduled_at is not None and entry.started_at >= entry.scheduled_at
    assert entry.duration_ms is not None and entry.finished_at is not None
    after = await clock.get(task.id)
    assert after is not None and after.last_status == "success"
    assert after.last_run_at == entry.started_at
    assert after.next_run_at is None  # disabled now
    kinds = [e.kind for e in watch.events if e.kind != "task_updated"]
    assert kinds == ["task_created", "run_started", "run_finished"]
    # The run is in the target's run records too, once, with its tool calls and tokens.
    [record] = await agent.runs(session="nb:reports")
    assert (record.status, record.sender, record.reply) == (
        "success",
        f"clock:{task.id}",
        "It is done.",
    )
    assert record.input == trigger and [c.name for c in record.tool_calls] == ["lookup"]
    assert record.total_tokens == entry.total_tokens


async def test_next_run_at_stays_true_after_fires_and_every_change(llm, open_clock):
    _agent, clock, watch = await open_clock()
    llm.script(reply("one"), reply("two"))
    disable_on(clock, "run_started", n=2)
    task = await clock.create(cron="@every 1s", title="tick", content="tick", target="nb:t")
    assert task.next_run_at is not None
    first = (await watch.event("run_finished", "success")).entry
    assert first is not None and first.scheduled_at == task.next_run_at
    started = await watch.event("run_started", n=2)
    second = started.entry
    assert second is not None and second.scheduled_at == pytest.approx(first.scheduled_at + 1)
    # As the second run began, the row already said when the third would come.
    assert started.task is not None
    assert started.task.next_run_at == pytest.approx(second.scheduled_at + 1)
    await watch.event("run_finished", "success", n=2)

    stopped = await clock.get(task.id)
    assert stopped is not None and stopped.next_run_at is None  # disabled after the second
    daily = await clock.update(task.id, cron="0 9 * * *", enabled=True)
    assert daily.next_run_at == parse_schedule("0 9 * * *").next_fire()
    off = await clock.update(task.id, enabled=False)
    assert off.next_run_at is None
    on = await clock.update(task.id, enabled=True)
    assert on.next_run_at == daily.next_run_at
    assert (await clock.get(task.id)) == on


async def test_tasks_and_their_ids_persist_across_an_agent_restart(llm, open_clock, make_agent):
    agent, clock, _ = await open_clock()
    a = await clock.create(cron="0 9 * * 1-5", title="A", content="a", target="nb:one")
    b = await clock.create(
        cron="@daily", title="B", content="b", target="nb:two", run_once=True, timeout=30
    )
    c = await clock.create(cron="@hourly", title="C", content="c", target="nb:one")
    await clock.update(b.id, updater="someone", title="B2", enabled=False)
    await clock.delete(c.id)
    before = await clock.list()
    await clock.aclose()
    await agent.aclose()

    llm.script(reply("after the restart"))
    _agent2, clock2, watch2 = await open_clock()
    assert await clock2.list() == before
    assert [t.id for t in before] == [a.id, b.id] == ["1", "2"]
    assert [t.title for t in await clock2.list(target="nb:one")] == ["A"]
    d = await clock2.create(
        cron="@every 1s", title="D", content="d", target="nb:one", run_once=True
    )
    assert d.id == "4"  # the counter survived; a deleted id is never reused
    assert [t.id for t in await clock2.list()] == ["1", "2", "4"]
    assert (await watch2.delivery()).text == "after the restart"  # it fires after a restart


async def test_an_overlapping_trigger_is_skipped_and_logged(llm, open_clock):
    hold = Hold()
    _agent, clock, watch = await open_clock(tools=[hold.tool])
    llm.script(reply(tool_calls=[tool_call("hold")]), reply("held, then done"))
    disable_on(clock, "run_finished", "skipped")
    task = await clock.create(cron="@every 1s", title="slow", content="hold", target="nb:x")
    await asyncio.wait_for(hold.entered.wait(), WAIT)
    skipped = (await watch.event("run_finished", "skipped")).entry
    manual = await clock.run_now(task.id)  # a manual run is refused the same way
    hold.release.set()
    done = (await watch.event("run_finished", "success")).entry

    assert skipped is not None and skipped.error == SKIPPED_ERROR and skipped.reply is None
    assert manual.status == "skipped" and manual.manual
    assert done is not None and done.reply == "held, then done"
    assert len(llm.requests) == 2  # one run only
    assert [d.text for d in watch.deliveries] == ["held, then done"]
    started = [e for e in watch.events if e.kind == "run_started"]
    assert len(started) == 1


async def test_skips_during_one_long_run_share_one_log_entry(llm, open_clock):
    hold = Hold()
    _, clock, watch = await open_clock(tools=[hold.tool])
    llm.script(reply(tool_calls=[tool_call("hold")]), reply("finally"))
    disable_on(clock, "run_finished", "skipped", n=3)
    task = await clock.create(cron="@every 1s", title="slow", content="hold", target="nb:x")
    third = (await watch.event("run_finished", "skipped", n=3)).entry
    hold.release.set()
    await watch.event("run_finished", "success")

    first = (await watch.event("run_finished", "skipped")).entry
    assert first is not None and third is not None and third.id == first.id
    assert third.error == SKIPPED_ERROR + " (3 triggers skipped)"
    assert third.scheduled_at == pytest.approx(first.scheduled_at + 2)
    assert [e.status for e in await clock.logs(task_id=task.id)] == ["skipped", "success"]


async def test_a_run_once_task_is_deleted_only_after_its_run_finished(llm, open_clock):
    hold = Hold()
    _agent, clock, watch = await open_clock(tools=[hold.tool])
    llm.script(reply(tool_calls=[tool_call("hold")]), reply("once is enough"))
    task = await clock.create(
        cron="@every 1s", title="once", content="do it once", target="nb:x", run_once=True
    )
    await asyncio.wait_for(hold.entered.wait(), WAIT)
    running = await clock.get(task.id)
    assert running is not None and running.last_status == "running"
    assert running.next_run_at is None  # no further fire is planned while it runs
    hold.release.set()
    deleted = await watch.event("task_deleted")

    assert deleted.task_id == task.id and await clock.get(task.id) is None
    kinds = [e.kind for e in watch.events]
    assert kinds.index("run_finished") < kinds.index("task_deleted")
    assert (await watch.delivery()).text == "once is enough"
    [entry] = await clock.logs(task_id=task.id)  # the log outlives the task
    assert entry.status == "success"


async def test_a_run_once_task_made_repeating_during_its_run_is_scheduled_again(llm, open_clock):
    hold = Hold()
    _, clock, watch = await open_clock(tools=[hold.tool])
    llm.script(reply(tool_calls=[tool_call("hold")]), reply("done"))
    disable_on(clock, "task_updated", n=2)
    task = await clock.create(
        cron="@every 1s", title="once?", content="c", target="nb:x", run_once=True
    )
    await asyncio.wait_for(hold.entered.wait(), WAIT)
    await clock.update(task.id, run_once=False)
    hold.release.set()
    again = (await watch.event("task_updated", n=2)).task

    assert again is not None and again.enabled and not again.run_once
    assert again.next_run_at is not None  # scheduled again, not deleted
    assert [e.kind for e in watch.events].count("task_deleted") == 0


async def test_a_failed_run_once_task_stays_disabled_with_its_log(llm, open_clock):
    _agent, clock, watch = await open_clock()
    llm.script(error(400, "the model refused the request"))
    task = await clock.create(
        cron="@every 1s", title="doomed", content="fail", target="nb:x", run_once=True
    )
    updated = await watch.event("task_updated")

    assert updated.task is not None and not updated.task.enabled
    kept = await clock.get(task.id)
    assert kept is not None and not kept.enabled and kept.next_run_at is None
    assert kept.last_status == "error" and kept.updater == "clock"
    [entry] = await clock.logs(task_id=task.id)
    assert entry.status == "error" and "refused" in (entry.error or "")
    assert watch.deliveries == []  # a failure is logged, not delivered


async def test_a_timeout_cancels_the_run_and_delivers_a_notice(llm, open_clock):
    hold = Hold()
    _agent, clock, watch = await open_clock(tools=[hold.tool])
    llm.script(reply(tool_calls=[tool_call("hold")]))
    task = await clock.create(  # run-once: a timed-out run leaves it disabled, no second fire
        cron="@every 1s",
        title="slow",
        content="hold forever",
        target="nb:x",
        timeout=1,
        run_once=True,
    )
    delivery = await watch.delivery()

    assert delivery.text == "⏰ clock task “slow” timed out (1s), aborted"
    assert (delivery.status, delivery.session, delivery.source) == ("timeout", "nb:x", "clock")
    assert hold.cancelled == 1  # the run was really cancelled
    [entry] = await clock.logs(task_id=task.id)
    assert entry.status == "timeout" and entry.tool_calls_total == 0
    assert len(llm.requests) == 1
    kept = await clock.get(task.id)
    assert kept is not None and not kept.enabled and kept.last_status == "timeout"


async def test_run_now_runs_even_a_disabled_task_and_never_deletes_a_run_once_one(llm, open_clock):
    _agent, clock, watch = await open_clock()
    llm.script(reply("by hand"))
    task = await clock.create(
        cron="@yearly", title="manual", content="go", target="nb:m", run_once=True
    )
    await clock.update(task.id, enabled=False)
    entry = await clock.run_now(task.id)

    assert entry.status == "success" and entry.manual and entry.scheduled_at is None
    assert entry.reply == "by hand"
    assert (await watch.delivery()).text == "by hand"
    assert await clock.get(task.id) is not None
    assert await clock.logs(target="nb:m") == [entry]
    assert await clock.logs(target="nb:other") == []


async def test_the_log_keeps_the_newest_entries(llm, open_clock):
    _agent, clock, _ = await open_clock(overrides={"clock.max_log_entries": 3})
    llm.script(*(reply(f"run {i}") for i in range(5)))
    task = await clock.create(cron="@yearly", title="t", content="c", target="nb:x")
    for _ in range(5):
        await clock.run_now(task.id)
    entries = await clock.logs(limit=10)
    assert [e.reply for e in entries] == ["run 4", "run 3", "run 2"]


async def test_bad_input_is_refused_and_nothing_is_saved(open_clock):
    _agent, clock, _ = await open_clock()
    ok = {"cron": "@daily", "title": "t", "content": "c", "target": "nb:x"}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"cron": "61 * * * *"}, "minute '61'"),
        ({"cron": "every day"}, "has 2 field(s)"),
        ({"content": "   "}, "content must not be blank"),
        ({"target": ""}, "target must be a session key"),
        ({"timeout": -1}, "timeout must be a number of seconds ≥ 0"),
        ({"timeout": float("nan")}, "timeout must be a number"),
        ({"run_once": "yes"}, "run_once must be true or false"),
        ({"title": None}, "title must be a string"),
    ]
    for change, says in cases:
        with pytest.raises(ClockError, match=re.escape(says)):
            await clock.create(**{**ok, **change})
    assert await clock.list() == []

    task = await clock.create(**ok)
    with pytest.raises(ClockError, match="cannot change colour of a clock task"):
        await clock.update(task.id, colour="red")
    with pytest.raises(ClockError, match="examples:"):
        await clock.update(task.id, title="renamed", cron="@sometimes")
    assert await clock.get(task.id) == task  # nothing of the bad update was saved
    for call in (clock.update("zz", title="x"), clock.delete("zz"), clock.run_now("zz")):
        with pytest.raises(ClockError, match="no clock task with id 'zz'"):
            await call
    with pytest.raises(ClockError, match="limit must be a positive whole number"):
        await clock.logs(limit=0)
    long = await clock.update(task.id, timeout=99999)
    assert long.timeout == 1800  # clamped to the longest run allowed


async def test_closing_the_agent_cancels_a_running_task_and_leaves_nothing_pending(
    llm, open_clock, tmp_path
):
    hold = Hold()
    agent, clock, watch = await open_clock(tools=[hold.tool])
    llm.script(reply(tool_calls=[tool_call("hold")]))
    await clock.create(cron="@every 1s", title="long", content="hold", target="nb:x")
    await asyncio.wait_for(hold.entered.wait(), WAIT)
    if getattr(agent, "clock", None) is clock:
        await agent.aclose()  # the Agent closes its clock first
    else:  # pragma: no cover - before the Agent wired its clock
        await clock.aclose()

    assert hold.cancelled == 1
    left = [t for t in asyncio.all_tasks() if t.get_name().startswith("ania-clock")]
    assert left == []
    assert not clock.active and clock.status_text() == "clock: closed"
    lease = Lease(tmp_path / "data")
    assert await lease.acquire()  # released: the next Agent on this directory takes it at once
    await lease.release()
    store = await Store.open(tmp_path / "data")
    try:
        [entry] = await ClockStore(store.db).logs()
    finally:
        await store.close()
    assert (
        entry.status == "interrupted" and entry.error == "the clock was closed while the task ran"
    )
    assert watch.deliveries == []
    with pytest.raises(ClockError, match="closed"):
        await clock.list()


async def test_stopping_the_target_session_stops_its_clock_run(llm, open_clock):
    hold = Hold()
    agent, clock, watch = await open_clock(tools=[hold.tool])
    llm.script(reply(tool_calls=[tool_call("hold")]))
    disable_on(clock, "run_started")
    task = await clock.create(cron="@every 1s", title="t", content="c", target="nb:busy")
    await asyncio.wait_for(hold.entered.wait(), WAIT)
    assert agent.stop("nb:other") is False  # another session's stop leaves it alone
    assert agent.stop("nb:busy") is True
    finished = (await watch.event("run_finished")).entry

    assert hold.cancelled == 1
    assert finished is not None and finished.status == "interrupted"
    assert finished.error == "stopped: its target session was stopped while the task ran"
    assert watch.deliveries == []
    left = [t for t in asyncio.all_tasks() if t.get_name() == f"ania-clock-{task.id}"]
    assert left == [] or all(t.done() for t in left)


async def test_a_disabled_clock_schedules_nothing(open_clock):
    _agent, clock, _ = await open_clock(overrides={"clock.enable": False})
    assert not clock.active
    assert clock.status_text() == "clock: disabled (clock.enable is false)"
    assert clock.session_tools("nb:x") == []


async def test_subagents_of_a_clock_run_are_drained_into_its_final_reply(llm, open_clock):
    _, clock, watch = await open_clock()
    llm.route(  # the clock run's requests (its scene prompt); the subagent takes the queue
        "## Scheduled task",
        reply(
            tool_calls=[tool_call("subagent_run", {"task": "find the number"})],
            usage=usage(10, 1),
        ),
        reply("I started a helper.", usage=usage(10, 1)),
        reply("The number is 42.", usage=usage(10, 1)),
    )
    llm.script(reply("42", usage=usage(100, 5)))
    task = await clock.create(cron="@yearly", title="ask", content="find it", target="nb:x")
    entry = await clock.run_now(task.id)

    assert entry.status == "success" and entry.reply == "The number is 42."
    assert [d.text for d in watch.deliveries] == ["The number is 42."]  # only the last reply
    clock_requests = [r for r in llm.requests if "## Scheduled task" in r.system]
    assert len(clock_requests) == 3
    report = clock_requests[2].messages[-1]["content"]
    assert "【子代理执行结果汇总】" in report and "42" in report
    assert [c.name for c in entry.tool_calls] == ["subagent_run"]
    assert entry.total_tokens == 3 * 11 + 105  # the subagent's tokens count for the task


async def test_each_drain_round_gets_what_is_left_of_the_tasks_budget(llm, open_clock):
    seen: list[tuple[float, float]] = []  # (the round's deadline, when the tool ran)

    @tool
    def probe(ctx: ToolContext) -> str:
        """Note this round's deadline."""
        seen.append((ctx.run_state["deadline"], time.monotonic()))
        return "noted"

    _, clock, _ = await open_clock(tools=[probe])
    llm.route(
        "## Scheduled task",
        reply(tool_calls=[tool_call("subagent_run", {"task": "find"}), tool_call("probe")]),
        reply("I started a helper."),
        reply(tool_calls=[tool_call("probe")]),  # the round that reads the helper's result
        reply("The number is 42."),
    )
    llm.script(reply("42"))
    task = await clock.create(cron="@yearly", title="t", content="c", target="nb:x", timeout=600)
    entry = await clock.run_now(task.id)

    assert entry.status == "success" and entry.reply == "The number is 42."
    (first_deadline, first_at), (drain_deadline, drain_at) = seen
    # One deadline for the whole task: a drain round that got the full 600 s again would end
    # as much later as it started later (drain_at - first_at: model calls and the helper's run).
    assert abs(drain_deadline - first_deadline) < (drain_at - first_at) / 2


async def test_a_clock_run_over_its_targets_quota_is_denied_before_any_model_call(llm, open_clock):
    agent, clock, watch = await open_clock(overrides={"quota.daily_tokens": 10})
    llm.script(reply("spent", usage=usage(20, 0)))
    assert (await agent.chat("use it up", session="nb:x")).ok
    task = await clock.create(cron="@yearly", title="t", content="c", target="nb:x")
    entry = await clock.run_now(task.id)

    assert entry.status == "denied" and "quota of this session is used up" in (entry.error or "")
    assert watch.deliveries == [] and len(llm.requests) == 1
    other = await clock.create(cron="@yearly", title="t", content="c", target="nb:y")
    llm.script(reply("still fine"))
    assert (await clock.run_now(other.id)).status == "success"  # another target: its own quota


async def test_subagents_still_running_when_a_clock_run_ends_are_cancelled(llm, open_clock):
    hold = Hold()
    _, clock, _ = await open_clock(tools=[hold.tool])
    llm.route(
        "## Scheduled task",
        reply(tool_calls=[tool_call("subagent_run", {"task": "hold on"})]),
        error(400, "the clock run fails"),  # the run ends while its helper still works
    )
    llm.script(reply(tool_calls=[tool_call("hold")]))  # the helper holds
    task = await clock.create(cron="@yearly", title="t", content="c", target="nb:x")
    entry = await clock.run_now(task.id)

    assert entry.status == "error"
    assert hold.entered.is_set() and hold.cancelled == 1  # the helper was cancelled, not left
