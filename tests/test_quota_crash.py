"""Kill -9 while model calls are in flight: every answered call's tokens are counted after it.

A child process runs an Agent with many chats, each asking the scripted model for tool rounds
and answers, forever. The scripted server (in this process) is the provider's bill: it counts
the tokens of every call it answered. The child is killed with SIGKILL at points where runs are
in the middle of their tool rounds; after each kill the store (opened again, as the restarted
process does) has counted exactly what the server answered — so a crash-looping bot cannot
spend past its quota — and at a random kill point at most the call each chat had in flight.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ania_nb
from ania_nb.store import Store
from ania_nb.testing import RecordedRequest, ScriptedLLM, disconnect, reply, tool_call, usage

CHATS = 12
ROUNDS = 2  # tool rounds per run before its answer: a kill lands inside runs

WORKER = """
import asyncio, sys
from ania_nb import Agent, tool

@tool
def step(n: int) -> str:
    \"\"\"Take a step.\"\"\"
    return f"step {n}"

async def main():
    base_url, data_dir, scratch, chats = sys.argv[1:5]
    overrides = {
        "llm.stream": False,
        "agent.builtin_tools": False,
        "skills.dir": scratch + "/no-skills",
        "mcp.config_file": scratch + "/no-mcp.json",
        "runner.max_concurrent_runs": 0,
        "quota.timezone": "UTC",
        "kb.auto_inject": False,
    }
    agent = Agent(base_url=base_url, api_key="k", model="m", data_dir=data_dir, tools=[step],
                  overrides=overrides)
    await agent.start()
    print("ready", flush=True)

    async def chat_forever(k):
        i = 0
        while True:
            await agent.chat(f"[c{k}] message {i}", session=f"nb:c{k}")
            i += 1

    await asyncio.gather(*(chat_forever(k) for k in range(int(chats))))

asyncio.run(main())
"""


@dataclass
class Bill:
    """The provider's side: what it answered, per chat; past ``budget`` calls it holds them."""

    budget: int = 0
    answered_calls: int = 0
    answered_tokens: int = 0
    last_call: dict[str, int] = field(default_factory=dict)  # chat -> tokens of its last answer
    held: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def __call__(self, request: RecordedRequest) -> Any:
        messages = request.messages
        turn = max(i for i, m in enumerate(messages) if m["role"] == "user")
        found = re.search(r"\[(c\d+)\] message", str(messages[turn]["content"]))
        chat = found.group(1) if found else "?"
        rounds = sum(1 for m in messages[turn:] if m["role"] == "tool")
        with self.cond:
            if self.answered_calls >= self.budget:
                self.held += 1
                self.cond.notify_all()
                release = self.release
            else:
                release = None
                self.answered_calls += 1
                n = self.answered_calls
                tokens = usage(100 + n % 13, 10 + n % 5)
                self.answered_tokens += tokens["total_tokens"]
                self.last_call[chat] = tokens["total_tokens"]
                self.cond.notify_all()
        if release is not None:  # in flight until the child is gone; never answered
            release.wait(120)
            return disconnect()
        if rounds < ROUNDS:
            return reply(tool_calls=[tool_call("step", {"n": rounds})], usage=tokens)
        return reply(f"answer {n}", usage=tokens)

    def wait(self, predicate: Any, timeout: float = 120) -> None:
        """Block until ``predicate()`` holds (called with the lock held)."""
        with self.cond:
            if not self.cond.wait_for(predicate, timeout):
                raise AssertionError(f"timed out: {self}")

    def reopen(self, budget: int) -> None:
        """Release the held calls of the killed child; hold again past ``budget``."""
        with self.cond:
            self.release.set()
            self.release = threading.Event()
            self.held = 0
            self.budget = budget


async def _start_child(llm: ScriptedLLM, data_dir: Path, scratch: Path) -> Any:
    env = {**os.environ, "PYTHONPATH": str(Path(ania_nb.__file__).parent.parent)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        WORKER,
        llm.base_url,
        str(data_dir),
        str(scratch),
        str(CHATS),
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    assert line.strip() == b"ready", f"the child did not start (exit {proc.returncode})"
    return proc


async def _kill(proc: Any) -> None:
    proc.send_signal(signal.SIGKILL)
    assert await proc.wait() == -signal.SIGKILL


async def _counted(data_dir: Path) -> int:
    """What the store counted on every day it keeps (ledger == counters checked)."""
    store = await Store.open(data_dir)
    try:
        counters = await store.usage.sessions("2000-01-01")
        assert await store.usage.ledger("2000-01-01") == counters
        return sum(c.total for c in counters)
    finally:
        await store.close()


async def test_kill_9_with_calls_in_flight_loses_no_answered_calls_tokens(tmp_path: Path) -> None:
    rng = random.Random(29)
    bill = Bill()
    data_dir, scratch = tmp_path / "data", tmp_path
    with ScriptedLLM(responder=bill) as llm:
        # Kills with every chat's next call held by the server: all it answered reached the
        # child, most runs are between tool rounds.
        for _ in range(4):
            bill.reopen(bill.answered_calls + rng.randint(CHATS, 4 * CHATS))
            proc = await _start_child(llm, data_dir, scratch)
            try:
                await asyncio.to_thread(bill.wait, lambda: bill.held >= CHATS)
            finally:
                await _kill(proc)
            assert await _counted(data_dir) == bill.answered_tokens
        # A kill at a random point: at most each chat's last answered call is not counted yet.
        bill.reopen(10**9)
        proc = await _start_child(llm, data_dir, scratch)
        try:
            target = bill.answered_calls + rng.randint(CHATS, 4 * CHATS)
            await asyncio.to_thread(bill.wait, lambda: bill.answered_calls >= target)
        finally:
            await _kill(proc)
        with bill.cond:
            answered, in_flight = bill.answered_tokens, sum(bill.last_call.values())
        counted = await _counted(data_dir)
        assert "?" not in bill.last_call and len(bill.last_call) == CHATS
        assert answered - in_flight <= counted <= answered
        bill.reopen(0)

    store = await Store.open(data_dir)
    try:
        records = await store.runs.list(limit=10_000)
        interrupted = [r for r in records if r.status in ("running", "interrupted")]
        # Runs cut by a kill still counted the rounds they stored.
        assert sum(r.counted_tokens for r in interrupted) > 0
        assert {r.session for r in records} == {f"nb:c{k}" for k in range(CHATS)}
    finally:
        await store.close()
