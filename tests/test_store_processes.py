"""Many processes, one data directory: real subprocesses opening and running on one store."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path
from typing import Any

import ania_nb
from ania_nb import Agent
from ania_nb.store import Store
from ania_nb.store.db import Conn
from ania_nb.store.schema import MIGRATIONS
from ania_nb.testing import RecordedRequest, ScriptedLLM, reply, tool_call

# Only the store is imported: the package's __init__ (agent, openai, ...) is skipped so that
# twenty interpreters start in a fraction of the time; Store.open is the real one.
OPENER = """
import asyncio, sys, types
package = types.ModuleType("ania_nb")
package.__path__ = [sys.argv[2]]
sys.modules["ania_nb"] = package
from ania_nb.store import Store

async def main():
    print("ready", flush=True)
    sys.stdin.readline()
    store = await Store.open(sys.argv[1])
    await store.kv("test").incr("opens")
    await store.close()
    print("ok", flush=True)

asyncio.run(main())
"""

WORKER = """
import asyncio, json, sys
from ania_nb import Agent, tool

@tool
def echo(text: str) -> str:
    \"\"\"Echo the text.\"\"\"
    return text

async def main():
    base_url, data_dir, name, count, scratch = sys.argv[1:6]
    overrides = {
        "llm.stream": False,
        "agent.builtin_tools": False,
        "skills.dir": scratch + "/no-skills",
        "mcp.config_file": scratch + "/no-mcp.json",
    }
    agent = Agent(base_url=base_url, api_key="k", model="m", data_dir=data_dir, tools=[echo],
                  overrides=overrides)
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await agent.start()  # opening marks orphaned runs: never another live process's
    print("opened", flush=True)
    results = await asyncio.gather(
        *(agent.chat(f"{name} message {i}", session=f"{name}-{i}") for i in range(int(count)))
    )
    print(json.dumps([[r.status, r.text, r.error] for r in results]), flush=True)
    await agent.aclose()

asyncio.run(main())
"""


async def _spawn(script: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def _line(proc: asyncio.subprocess.Process) -> str:
    assert proc.stdout is not None
    raw = await asyncio.wait_for(proc.stdout.readline(), 120)
    assert raw, f"process {proc.pid} ended early (exit code {await proc.wait()})"
    return raw.decode().strip()


def _send(proc: asyncio.subprocess.Process, text: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(text.encode() + b"\n")


async def test_twenty_processes_open_a_fresh_directory_at_once(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh"
    package = str(Path(ania_nb.__file__).parent)
    procs = [await _spawn(OPENER, str(data_dir), package) for _ in range(20)]
    try:
        for proc in procs:  # every process has imported everything and waits
            assert await _line(proc) == "ready"
        for proc in procs:
            _send(proc, "go")
        for proc in procs:
            await proc.stdin.drain()  # type: ignore[union-attr]
        outcomes = [await _line(proc) for proc in procs]
        codes = [await proc.wait() for proc in procs]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert outcomes == ["ok"] * 20
    assert codes == [0] * 20
    store = await Store.open(data_dir)
    try:
        assert await store.kv("test").get("opens") == 20

        async def version(conn: Conn) -> int:
            return int(await conn.fetchval("PRAGMA user_version"))

        assert await store.db.run(version) == len(MIGRATIONS)
    finally:
        await store.close()


def _hold_first_calls(release: threading.Event) -> Any:
    """Responder: each run's first call waits for ``release`` and asks for a tool round."""

    def respond(request: RecordedRequest) -> Any:
        last = request.messages[-1]
        if last["role"] == "tool":
            return reply(f"done: {last['content']}")
        release.wait(120)
        return reply(tool_calls=[tool_call("echo", {"text": "round"})])

    return respond


async def test_four_processes_run_on_one_directory_and_only_a_killed_ones_run_is_interrupted(
    llm: ScriptedLLM, tmp_path: Path
) -> None:
    data_dir, count = tmp_path / "shared", 8
    release = threading.Event()
    llm.responder = _hold_first_calls(release)
    procs: list[asyncio.subprocess.Process] = []
    agent: Agent | None = None
    try:

        async def worker(name: str, n: int) -> asyncio.subprocess.Process:
            proc = await _spawn(WORKER, llm.base_url, str(data_dir), name, str(n), str(tmp_path))
            procs.append(proc)
            assert await _line(proc) == "ready"
            return proc

        workers = [await worker(f"p{w}", count) for w in range(4)]
        for w, proc in enumerate(workers):
            # Each process opens while every earlier one has `count` runs in flight.
            _send(proc, "go")
            assert await _line(proc) == "opened"
            await asyncio.to_thread(llm.wait_for_requests, (w + 1) * count, 120)

        victim = await worker("victim", 1)
        _send(victim, "go")
        assert await _line(victim) == "opened"
        await asyncio.to_thread(llm.wait_for_requests, 4 * count + 1, 120)
        victim.kill()  # SIGKILL mid-run
        await victim.wait()

        # Opening here (a fifth process) marks the killed process's run, and nothing else.
        agent = Agent(
            base_url=llm.base_url,
            api_key="k",
            model="m",
            data_dir=data_dir,
            overrides={
                "agent.builtin_tools": False,
                "skills.dir": str(tmp_path / "no-skills"),
                "mcp.config_file": str(tmp_path / "no-mcp.json"),
            },
        )
        await agent.start()
        records = await agent.runs(limit=1000)
        assert len(records) == 4 * count + 1
        by_status = {r.session: r.status for r in records}
        assert by_status.pop("victim-0") == "interrupted"
        assert set(by_status.values()) == {"running"}

        release.set()
        for proc in workers:
            results = json.loads(await _line(proc))
            assert [status for status, _, _ in results] == ["success"] * count, results
            assert all(text == "done: round" for _, text, _ in results)
            assert await proc.wait() == 0
        records = await agent.runs(limit=1000)
        finished = {r.session: (r.status, r.tool_calls_total) for r in records}
        assert finished.pop("victim-0") == ("interrupted", 0)
        assert set(finished.values()) == {("success", 1)}
        assert len(finished) == 4 * count
        for w in range(4):
            history = await agent.history(f"p{w}-0")
            assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
    finally:
        release.set()
        if agent is not None:
            await agent.aclose()
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
