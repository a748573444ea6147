"""The durable runner under kill -9 and reconnect storms: ``ania-nb serve`` as a real process.

Many chats send steadily to a real ``ania-nb serve`` (the OneBot test implementation,
``ania_nb.testing.onebot``; the scripted model answering after a small latency with the message
keys it read, sometimes after a tool round). The process is killed with SIGKILL at random
points and started again on the same data directory, or its connection is dropped every 200 ms.
At the end every event ever pushed is pushed again with the same message id (a platform
re-sending after reconnects), and then, for every message:

- answered exactly once, or exactly one restart notice names it — never both, never twice;
- or (rarely) its reply is an ``uncertain`` outbox row: the process died between committing
  "sending" and writing the frame, so nobody can know; it is never sent twice;

and the stored history is consistent (every tool call has its result).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from test_runner_serve import TOKEN, Serve, write_config

from ania_nb.testing import ScriptedLLM, reply, tool_call
from ania_nb.testing.onebot import OneBotImpl

pytestmark = pytest.mark.asyncio(loop_scope="function")

KEY = re.compile(r"msg-\d+-\d+")
LATENCY = 0.02  # the model's answer time
USERS = range(300_001, 300_041)  # 40 private chats


def answering_model(request: Any) -> Any:
    """Reply naming every message key of the turn; a third of the turns use a tool first."""
    time.sleep(LATENCY)  # on the server's thread: each request its own
    messages = request.messages
    last = messages[-1]
    turn = next(m for m in reversed(messages) if m.get("role") == "user")
    keys = KEY.findall(str(turn.get("content")))
    if last.get("role") == "user" and keys and int(keys[0].rsplit("-", 1)[1]) % 3 == 0:
        return reply(tool_calls=[tool_call("clock_list", {})])
    return reply("re: " + " ".join(keys))


def config(folder: Path, llm: ScriptedLLM, runner: dict[str, Any]) -> Path:
    return write_config(
        folder / "ania.toml",
        llm,
        folder / "data",
        runner={"access_token": TOKEN, "queued_notice": "", **runner},
        agent={"queue_size": 1000},
    )


class Traffic:
    """Chats sending messages ``msg-<user>-<n>`` steadily while the bot is up."""

    def __init__(self, impl: OneBotImpl, users: range, every: float) -> None:
        self.impl, self.users, self.every = impl, users, every
        self.count: Counter[int] = Counter()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        users = list(self.users)
        n = 0
        while True:
            user = users[n % len(users)]
            n += 1
            if self.impl.connected:
                self.count[user] += 1
                # the bot may die under it: every event is pushed again at the end
                with contextlib.suppress(Exception):
                    await self.impl.private_message(
                        user, f"msg-{user}-{self.count[user]}", wait=0.05
                    )
            await asyncio.sleep(self.every)


def message_events(impl: OneBotImpl) -> dict[int, dict[str, Any]]:
    """Every message event ever pushed, by message id (re-pushes share their id)."""
    return {e["message_id"]: e for e in impl.events if e.get("post_type") == "message"}


def event_key(event: dict[str, Any]) -> str:
    return KEY.findall(json.dumps(event["message"]))[0]


def sent_counts(impl: OneBotImpl) -> tuple[Counter[str], Counter[str]]:
    """How often each key was answered, and how often a restart notice named it."""
    answers: Counter[str] = Counter()
    notices: Counter[str] = Counter()
    for message in impl.sent("private"):
        text = message.text
        target = notices if "重启" in text else answers
        target.update(KEY.findall(text))
    return answers, notices


def uncertain_keys(data: Path) -> set[str]:
    """Keys of messages whose reply (or notice) is an ``uncertain`` outbox row."""
    with sqlite3.connect(data / "ania.db") as db:
        rows = db.execute("SELECT payload FROM outbox WHERE state = 'uncertain'").fetchall()
        inbox = dict(db.execute("SELECT id, payload FROM inbox").fetchall())
    keys: set[str] = set()
    for (raw,) in rows:
        payload = json.loads(raw)
        keys.update(KEY.findall(payload.get("text") or ""))
        for inbox_id in payload.get("meta", {}).get("inbox") or ():
            keys.update(KEY.findall(inbox.get(inbox_id, "")))
    return keys


def unanswered_tool_calls(data: Path) -> list[str]:
    """Tool calls in the stored histories without a result after them."""
    with sqlite3.connect(data / "ania.db") as db:
        rows = db.execute("SELECT session, message FROM chat_history ORDER BY id").fetchall()
    by_session: dict[str, list[dict[str, Any]]] = {}
    for session, raw in rows:
        by_session.setdefault(session, []).append(json.loads(raw))
    missing = []
    for session, messages in by_session.items():
        answered = {m.get("tool_call_id") for m in messages if m.get("role") == "tool"}
        for m in messages:
            for call in m.get("tool_calls") or ():
                if call["id"] not in answered:
                    missing.append(f"{session}:{call['id']}")
    return missing


def inbox_states(data: Path) -> Counter[str]:
    with sqlite3.connect(data / "ania.db") as db:
        return Counter(s for (s,) in db.execute("SELECT state FROM inbox").fetchall())


async def settle_all(impl: OneBotImpl, data: Path, within: float = 60) -> None:
    """Re-push every event with its id, then wait until every message has its answer or trace."""
    events = message_events(impl)
    for event in events.values():
        await impl.push(dict(event))
    keys = {event_key(e) for e in events.values()}
    loop = asyncio.get_running_loop()
    give_up = loop.time() + within
    while True:
        answers, notices = sent_counts(impl)
        open_keys = {k for k in keys if not answers[k] and not notices[k]}
        if open_keys:
            open_keys -= await asyncio.to_thread(uncertain_keys, data)
        if not open_keys:
            return
        if loop.time() > give_up:
            raise AssertionError(f"{len(open_keys)} of {len(keys)} messages never answered")
        await asyncio.sleep(0.2)


def check_exactly_once(impl: OneBotImpl, data: Path) -> dict[str, int]:
    """Every message answered once or announced once (or uncertain, never twice)."""
    keys = {event_key(e) for e in message_events(impl).values()}
    answers, notices = sent_counts(impl)
    uncertain = uncertain_keys(data)
    twice = sorted(k for k in keys if answers[k] + notices[k] > 1)
    lost = sorted(k for k in keys if answers[k] + notices[k] == 0 and k not in uncertain)
    assert twice == [], f"answered more than once: {twice[:20]}"
    assert lost == [], f"without a trace: {lost[:20]}"
    assert unanswered_tool_calls(data) == []
    states = inbox_states(data)
    assert set(states) <= {"answered", "notified"}, states
    return {
        "messages": len(keys),
        "answered": sum(1 for k in keys if answers[k]),
        "notified": sum(1 for k in keys if notices[k]),
        "uncertain": sum(1 for k in keys if not answers[k] + notices[k]),
    }


async def test_kill_9_under_40_chats_answers_every_message_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(29)
    impl = OneBotImpl(self_id="10000", access_token=TOKEN)
    with ScriptedLLM(strict=True, responder=answering_model) as llm:
        url = await impl.serve()
        path = config(tmp_path, llm, {"mode": "forward", "url": url, "reconnect_max": 1})
        traffic = Traffic(impl, USERS, every=0.02)
        traffic.start()
        procs: list[Serve] = []
        try:
            for _ in range(10):
                proc = await Serve(path).start()
                procs.append(proc)
                await proc.ready()
                await impl.wait_connected(20, connections=len(procs))
                # a platform re-sends a few events it already delivered
                old = list(message_events(impl).values())
                for event in rng.sample(old, min(5, len(old))):
                    await impl.push(dict(event))
                await asyncio.sleep(rng.uniform(0.3, 1.5))
                assert await proc.stop(signal.SIGKILL) == -signal.SIGKILL
            await traffic.stop()
            final = await Serve(path).start()
            procs.append(final)
            await final.ready()
            await impl.wait_connected(20, connections=len(procs))
            await settle_all(impl, tmp_path / "data")
            assert await final.stop() == 0
        finally:
            await traffic.stop()
            for proc in procs:
                await proc.kill()
            await impl.aclose()
    counts = check_exactly_once(impl, tmp_path / "data")
    print("kill -9 x10:", counts)  # shown with -s
    assert counts["messages"] >= 200 and counts["notified"] + counts["answered"] >= 190
    assert "Future exception was never retrieved" not in "\n".join(p.log for p in procs)


async def test_a_reconnect_storm_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    impl = OneBotImpl(self_id="10000", access_token=TOKEN)
    with ScriptedLLM(strict=True, responder=answering_model) as llm:
        path = config(tmp_path, llm, {"mode": "reverse", "port": 0})
        proc = await Serve(path).start()
        traffic = Traffic(impl, range(310_001, 310_021), every=0.04)
        try:
            await impl.connect(await proc.listen_url(), deadline=20, retry_interval=0.05)
            await proc.ready()
            traffic.start()
            loop = asyncio.get_running_loop()
            end = loop.time() + 12
            while loop.time() < end:
                await asyncio.sleep(0.2)
                await impl.drop()  # the implementation dials again at once
            await traffic.stop()
            await impl.wait_connected(20)
            await settle_all(impl, tmp_path / "data")
            assert await proc.stop() == 0
        finally:
            await traffic.stop()
            await proc.kill()
            await impl.aclose()
    counts = check_exactly_once(impl, tmp_path / "data")
    print("reconnect storm:", counts, impl.connections, "connections")  # shown with -s
    assert counts["notified"] == 0  # no restart: nothing was cut off
    assert counts["messages"] >= 100
    assert "Future exception was never retrieved" not in proc.log
