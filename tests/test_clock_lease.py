"""One scheduler per data directory, across real processes (ania_nb.clock.lease), and crashes.

A child process opens an Agent with its clock on the test's data directory and talks to the
test's scripted server; the test opens another Agent on the same directory and watches who
fires what. Children are SIGKILLed to simulate crashes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from ania_nb.clock import Clock
from ania_nb.clock.lease import Lease
from ania_nb.clock.store import INTERRUPTED_ERROR
from ania_nb.testing import reply, tool_call

WAIT = 20.0
ROOT = str(Path(__file__).resolve().parent.parent)

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from ania_nb import Agent, tool
    from ania_nb.clock import Clock

    async def main():
        data_dir, base_url, mode = sys.argv[1:4]

        @tool(name="hold")
        async def hold() -> str:
            '''Block until the process is killed.'''
            print("HOLDING", flush=True)
            await asyncio.Event().wait()
            return "never"

        agent = Agent(
            base_url=base_url, api_key="test", model="scripted", data_dir=data_dir,
            tools=[hold],
            overrides={
                "llm.stream": False, "agent.builtin_tools": False,
                "skills.dir": data_dir + "/no-skills", "mcp.config_file": data_dir + "/no.json",
            },
        )
        await agent.start()
        clock = getattr(agent, "clock", None) or Clock(agent.host)
        clock.poll_interval = 0.2
        await clock.start()
        agent.outbox.subscribe(
            lambda d: print("DELIVERY", json.dumps(d.text), flush=True)
        )
        print("STATUS", json.dumps({"active": clock.active, "text": clock.status_text()}),
              flush=True)
        if mode == "run":
            task = await clock.create(
                cron="@yearly", title="crash me", content="hold", target="nb:crash"
            )
            print("TASK", task.id, flush=True)
            await clock.run_now(task.id)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


class Child:
    """A child process running an Agent with its clock; its stdout lines are awaitable."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []

    @property
    def pid(self) -> int:
        return self.process.pid

    async def line(self, prefix: str) -> str:
        """The rest of the first (new) stdout line starting with ``prefix``."""
        assert self.process.stdout is not None

        async def read() -> str:
            assert self.process.stdout is not None
            while True:
                raw = await self.process.stdout.readline()
                if not raw:
                    err = b""
                    if self.process.stderr is not None:
                        err = await self.process.stderr.read()
                    raise AssertionError(f"the child ended: {err.decode(errors='replace')}")
                text = raw.decode().rstrip("\n")
                self.lines.append(text)
                if text.startswith(prefix):
                    return text[len(prefix) :].strip()

        return await asyncio.wait_for(read(), WAIT)

    async def kill(self) -> None:
        """SIGKILL: no clean-up runs, like a crash."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()


@pytest.fixture
async def spawn(tmp_path: Path, llm: Any) -> AsyncIterator[Callable[..., Any]]:
    """Start children on the test's data directory: ``child = await spawn(mode)``."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    children: list[Child] = []

    async def start(mode: str = "hold") -> Child:
        env = {**os.environ, "PYTHONPATH": ROOT}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            str(tmp_path / "data"),
            llm.base_url,
            mode,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        child = Child(process)
        children.append(child)
        return child

    yield start
    for child in children:
        await child.kill()


async def _started(make_agent: Callable[..., Any]) -> tuple[Any, Clock, list[Clock]]:
    agent = make_agent()
    await agent.start()
    clock = getattr(agent, "clock", None)
    own: list[Clock] = []
    if clock is None:  # until the Agent constructs and starts its own
        clock = Clock(agent.host)
        own.append(clock)
    clock.poll_interval = 0.2
    await clock.start()
    return agent, clock, own


async def _until(condition: Callable[[], Any], what: str) -> None:
    """Poll ``condition`` (sync or async) until it is true; fail after WAIT seconds."""

    async def wait() -> None:
        while True:
            result = condition()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(wait(), WAIT)
    except TimeoutError:
        raise AssertionError(f"timed out waiting until {what}") from None


async def test_one_process_holds_the_clock_and_another_takes_over_when_it_dies(
    llm, make_agent, spawn
):
    llm.script(reply("fired by the child"), reply("fired by the test process"))
    child = await spawn()
    status = json.loads(await child.line("STATUS"))
    assert status["active"] is True

    agent, clock, own = await _started(make_agent)
    try:
        assert not clock.active
        text = clock.status_text()
        assert text.startswith("clock: standby") and f"pid {child.pid}" in text
        events: list[str] = []
        clock.subscribe(lambda e: events.append(f"{e.kind}:{e.task_id}"))
        mine: list[str] = []
        agent.outbox.subscribe(lambda d: mine.append(d.text))

        # A task created here is picked up and fired by the holder, not by this process.
        task = await clock.create(
            cron="@every 1s", title="t", content="c", target="nb:x", run_once=True
        )
        assert json.loads(await child.line("DELIVERY")) == "fired by the child"
        await _until(lambda: f"task_deleted:{task.id}" in events, "the deletion is seen here")
        # The holder's run is announced here too (for a panel in this standing-by process).
        await _until(lambda: f"run_finished:{task.id}" in events, "the run is seen here")
        assert mine == []
        [entry] = await clock.logs(task_id=task.id)
        assert entry.status == "success" and entry.reply == "fired by the child"

        await child.kill()
        await _until(lambda: clock.active, "this process takes the clock over")
        assert clock.status_text().startswith("clock: active in this process")
        second = await clock.create(
            cron="@every 1s", title="t2", content="c2", target="nb:x", run_once=True
        )
        await _until(lambda: mine == ["fired by the test process"], "this process fires")

        async def second_deleted() -> bool:
            return await clock.get(second.id) is None

        # The delivery is published before the run-once task is deleted: wait for both.
        await _until(second_deleted, "the run-once task is deleted after its run")
    finally:
        for c in own:
            await c.aclose()


async def test_a_run_of_a_live_process_is_left_alone_and_never_started_twice(
    llm, make_agent, spawn
):
    llm.script(reply(tool_calls=[tool_call("hold")]))
    child = await spawn("run")
    task_id = await child.line("TASK")
    await child.line("HOLDING")

    _agent, clock, own = await _started(make_agent)
    try:
        [entry] = await clock.logs()
        assert entry.status == "running"  # its process lives: not marked interrupted
        skipped = await clock.run_now(task_id)
        assert skipped.status == "skipped"  # running in another process counts
        assert len(llm.requests) == 1

        await child.kill()
        await _until(lambda: clock.active, "this process takes the clock over")
        [_, crashed] = await clock.logs()
        assert crashed.id == entry.id and crashed.status == "interrupted"
        assert crashed.error == INTERRUPTED_ERROR
    finally:
        for c in own:
            await c.aclose()


async def test_a_run_killed_mid_way_is_interrupted_at_the_next_start(llm, make_agent, spawn):
    llm.script(reply(tool_calls=[tool_call("hold")]))
    child = await spawn("run")
    task_id = await child.line("TASK")
    await child.line("HOLDING")
    await child.kill()

    _agent, clock, own = await _started(make_agent)
    try:
        assert clock.active
        [entry] = await clock.logs()
        assert (entry.task_id, entry.status, entry.error) == (
            task_id,
            "interrupted",
            INTERRUPTED_ERROR,
        )
        task = await clock.get(task_id)
        assert task is not None and task.last_status == "interrupted"
    finally:
        for c in own:
            await c.aclose()


async def test_the_lease_excludes_a_second_holder_until_released(tmp_path):
    first, second = Lease(tmp_path), Lease(tmp_path)
    assert await first.acquire()
    assert not await second.acquire()  # flock: even within one process
    holder = await second.holder()
    assert holder is not None and holder["pid"] == os.getpid()
    await first.release()
    assert await second.acquire()
    await second.release()
    await second.release()  # idempotent


async def test_the_holder_marks_the_run_of_a_standby_process_that_died(llm, make_agent, spawn):
    llm.script(reply(tool_calls=[tool_call("hold")]))
    agent, clock, own = await _started(make_agent)
    try:
        assert clock.active
        child = await spawn("run")
        status = json.loads(await child.line("STATUS"))
        assert status["active"] is False and status["text"].startswith("clock: standby")
        await child.line("HOLDING")  # a manual run in the standby process
        [entry] = await clock.logs()
        assert entry.status == "running"
        await child.kill()

        async def interrupted() -> bool:
            [now] = await clock.logs()
            return now.status == "interrupted"

        await _until(interrupted, "the holder marks the dead process's run")
        # Its run record too (the holder's periodic sweep, not only the next start's).
        [record] = await agent.runs(session="nb:crash")
        assert record.sender == f"clock:{entry.task_id}" and record.status == "interrupted"
    finally:
        for c in own:
            await c.aclose()
