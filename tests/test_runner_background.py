"""A background subagent across real restarts of ``ania-nb serve`` (SIGTERM and kill -9).

The runner is the real subprocess against the OneBot test implementation
(``ania_nb.testing.onebot``) and the scripted model; the child's model answers are held, so the
child is still running when the signal comes. After each restart the chat is asked once more
and answered (the point from which nothing more can arrive), and the notice "background task N
was stopped by a restart" must have been sent exactly once.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import signal
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from test_runner_serve import TOKEN, Serve, connect, to_user, uid, write_config

from ania_nb.agents.background import STOPPED_BY_RESTART
from ania_nb.testing import RecordedRequest, ScriptedLLM, reply, tool_call
from ania_nb.testing.onebot import OneBotImpl

pytestmark = pytest.mark.asyncio(loop_scope="function")

CHILD = "You are a subagent"  # in the subagent prompt: routes the children's requests
FIRST_IDS = itertools.count(60_000, 10_000)  # message ids of each new OneBot side: never reused
NOTICE = re.compile(STOPPED_BY_RESTART.replace("{id}", r"(\d+)").replace("~", "~?"))


def PARENT(request: RecordedRequest) -> bool:
    """The parent's requests: everything without the subagent prompt."""
    return CHILD not in request.system


class HeldChild:
    """The children's model: holds every answer until the test ends (on the server's thread)."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.released = threading.Event()

    def __call__(self, request: RecordedRequest) -> Any:
        self.asked.set()
        self.released.wait(30)
        return reply("too late")


@pytest.fixture
def llm() -> Any:
    with ScriptedLLM(strict=True) as server:
        yield server


@pytest_asyncio.fixture
async def launch(tmp_path: Path, llm: ScriptedLLM) -> AsyncIterator[Callable[..., Any]]:
    """Start ``ania-nb serve`` on this test's model and data dir: ``await launch(runner={…})``."""
    started: list[Serve] = []

    async def start(**sections: dict[str, Any]) -> Serve:
        path = write_config(
            tmp_path / f"ania-{len(started)}.toml",
            llm,
            tmp_path / "data",
            subagent={"enable": True},
            **sections,
        )
        proc = Serve(path)
        started.append(proc)
        return await proc.start()

    yield start
    for proc in started:
        await proc.kill()


def notices(impl: OneBotImpl, user: int) -> list[str]:
    """The stop notices sent to ``user``."""
    return [a.text for a in impl.actions if to_user(user)(a) and NOTICE.search(a.text)]


def children(data: Path) -> list[tuple[int, str, str | None]]:
    """(id, state, outcome) of the stored children (read like any other client)."""
    with sqlite3.connect(data / "ania.db") as db:
        return db.execute("SELECT id, state, outcome FROM children ORDER BY id").fetchall()


async def start_a_child(
    launch: Any, impl: OneBotImpl, llm: ScriptedLLM, held: HeldChild, user: int, **sections: Any
) -> Serve:
    """Serve; the user asks, the parent starts a background child that is still running."""
    llm.route(
        PARENT,
        reply(tool_calls=[tool_call("subagent_run", {"task": "watch it", "background": True})]),
        reply("started a watcher"),
    )
    llm.responder = held
    proc = await connect(launch, impl, "reverse", **sections)
    await impl.private_message(user, "watch it for me")
    await impl.wait_for_action("send_private_msg", to_user(user, "started a watcher"))
    await _wait_event(held.asked)
    return proc


async def _wait_event(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 20), "the child never asked the model"


async def back_again(
    launch: Any, impl: OneBotImpl, llm: ScriptedLLM, user: int, text: str
) -> tuple[Serve, OneBotImpl]:
    """A new OneBot side and serve on the same data; asked once and answered (``text``)."""
    await impl.aclose()
    again = OneBotImpl(self_id="10000", access_token=TOKEN, first_message_id=next(FIRST_IDS))
    llm.route(PARENT, reply(text))
    proc = await connect(launch, again, "reverse")
    await again.private_message(user, "are you there?")
    await again.wait_for_action("send_private_msg", to_user(user, text))
    return proc, again


async def test_sigterm_stops_a_running_child_with_one_notice_and_a_restart_sends_no_more(
    launch: Any, llm: ScriptedLLM, tmp_path: Path
) -> None:
    user, held = uid(), HeldChild()
    impl = OneBotImpl(self_id="10000", access_token=TOKEN)
    again: OneBotImpl | None = None
    try:
        proc = await start_a_child(
            launch, impl, llm, held, user, runner={"access_token": TOKEN, "grace_seconds": 0.5}
        )
        assert await proc.stop() == 0
        assert "stopped 1 background subagent(s) still running" in proc.log
        [notice] = notices(impl, user)  # sent before the exit
        [(child_id, state, outcome)] = children(tmp_path / "data")
        assert (state, outcome) == ("stopped", "restart")
        assert notice == STOPPED_BY_RESTART.format(id=child_id)
        _, again = await back_again(launch, impl, llm, user, "yes, here")
        assert notices(again, user) == []  # nothing more after the restart
    finally:
        held.released.set()
        if again is not None:
            await again.aclose()
        await impl.aclose()


async def test_kill_9_during_a_child_then_exactly_one_notice_after_the_restart(
    launch: Any, llm: ScriptedLLM, tmp_path: Path
) -> None:
    user, held = uid(), HeldChild()
    impl = OneBotImpl(self_id="10000", access_token=TOKEN)
    again = third = None
    try:
        proc = await start_a_child(launch, impl, llm, held, user)
        assert await proc.stop(signal.SIGKILL) == -signal.SIGKILL
        [(child_id, state, _)] = children(tmp_path / "data")
        assert state == "running"  # as the killed process left it
        second, again = await back_again(launch, impl, llm, user, "back after the kill")
        assert notices(again, user) == [STOPPED_BY_RESTART.format(id=child_id)]
        assert children(tmp_path / "data") == [(child_id, "interrupted", "restart")]
        assert await second.stop() == 0
        _, third = await back_again(launch, again, llm, user, "and again")
        assert notices(third, user) == []  # told once, not at every start
    finally:
        held.released.set()
        for side in (third, again, impl):
            if side is not None:
                await side.aclose()
