"""Runner: simulated QQ chats through the reverse-WebSocket OneBot path vs ``Agent.chat`` alone.

What runs where:

* the model: ``ania_nb.testing``'s scripted server in its **own process**, answering every call
  after ``--latency`` seconds (50 ms) with a plain text reply naming the message it answers
  (no tool round: one model call per message). Its CPU is reported, not counted.
* the runner under test: one **child process** holding one Agent, the real `OneBotAdapter` in
  reverse mode (listening on 127.0.0.1, access token on) and the real `Router`, wired as
  ``ania-nb serve`` wires them (``router.start()``: the router is the durable outbox's deliverer;
  ``adapter.start(router.handle)``). Since issue 29 every message through it is an inbox row
  before it is queued and every reply an outbox row before it is sent (SQLite, WAL).
  The same child also runs the baseline, ``Agent.chat`` called in-process on the same Agent.
  Its CPU (``/proc/<pid>/stat`` utime + stime, all threads) is what "CPU per message" counts.
* the chat platform: this process, a thin OneBot v11 implementation written from the spec
  (``_onebot_peer.py``; ``communication/ws-reverse.md``: it dials the runner with ``X-Self-ID``,
  ``X-Client-Role: Universal`` and ``Authorization: Bearer``; sends ``message`` events in array
  form; answers ``send_private_msg`` / ``send_group_msg`` / ``send_msg`` / ``get_login_info``).

Every simulated chat is a closed loop: it sends a message, waits for the reply, sends the next
(so runs never batch). Half the chats are private chats (session ``f:<user>``), half are groups
where the one speaker @-mentions the bot (session ``g:<group>``; the reply @-mentions them).
The baseline sends the same texts with the router's sender prefix to the same kind of session
keys, with ``sender="qq:<id>"``, from the same number of concurrent chats.

Measured, engine and runner blocks interleaved A-B-B-A in the same run (fresh chat ids per
block, so every block starts from empty histories):

* throughput: messages / wall time of the block;
* p50 / p99 from event to reply: runner, the moment the event frame is sent until the reply
  action arrives at the implementation; engine, ``Agent.chat`` call to return;
* CPU ms per message of the child process, and the ratio runner / engine;
* failures: a reply missing, late (``--reply-timeout``), or not naming its message.

Memory: ``--memory-messages`` (10,000) further messages through the runner path, in chunks of
1,000 from fresh chats (2,000 chats × 5 messages), ``VmRSS`` of the child after ``gc.collect()``
after every chunk, with the sessions the Agent holds (the janitor: ``agent.max_sessions`` LRU and
``agent.session_idle_seconds``). No growth = the second half's RSS slope is ≈ 0.

    python bench/runner.py            # full: 200 chats × 10 messages, 10,000-message memory test
    python bench/runner.py --quick    # 50 chats × 4 messages, 1,000 messages with max_sessions 100
    python bench/runner.py --json     # JSON on stdout, the table on stderr
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from _onebot_peer import TOKEN, OneBotPeer, chat_of  # bench/ is the script's folder
from _raw import ServerProcess

MODEL = "bench-model"
API_KEY = "sk-bench"

# The model: one text reply per call after the latency, naming the message it answers.
SERVER = r"""
import re, signal, sys, threading
from ania_nb.testing import ScriptedLLM, delay, reply, usage

latency = float(sys.argv[1])
TAG = re.compile(r"msg#(\d+-\d+)")

def respond(request):
    users = [m for m in request.messages if m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    if isinstance(content, list):
        content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    tags = TAG.findall(content or "")
    text = "answer to " + (" ".join("msg#" + t for t in tags) if tags else "nothing")
    return delay(latency, reply(text, usage=usage(120, 8)))

llm = ScriptedLLM(responder=respond).start()
print("base_url=" + llm.base_url, flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
llm.close()
"""


def message_text(uid: int, k: int) -> str:
    """The k-th message of user ``uid``; the model's reply names ``msg#<uid>-<k>``."""
    return f"msg#{uid}-{k} what's the weather like today?"


def sender_prefix(uid: int) -> str:
    """What the router puts before a message [orig §13.2], for the engine baseline."""
    return f"[nickname:user{uid} id:{uid}]: "


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int | str = "self") -> int:
    """VmRSS of a process in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


# =========================================================================== the child


def make_agent(
    base_url: str,
    data_dir: Path,
    max_sessions: int | None,
    max_runs: int | None,
    store_url: str = "",
) -> Any:
    """The Agent as ``ania-nb serve`` would open it, isolated from ./skills and MCP config."""
    from ania_nb import Agent

    overrides: dict[str, Any] = {
        "skills.dir": str(data_dir / "no-skills"),
        "mcp.config_file": str(data_dir / "no-mcp.json"),
        "runner.mode": "reverse",
        "runner.host": "127.0.0.1",
        "runner.port": 0,  # any free port; the adapter tells its URL
        "runner.access_token": TOKEN,
    }
    if max_sessions is not None:
        overrides["agent.max_sessions"] = max_sessions
    if max_runs is not None:
        overrides["runner.max_concurrent_runs"] = max_runs
    if store_url:
        overrides["store.url"] = store_url
    return Agent(
        base_url=base_url,
        api_key=API_KEY,
        model=MODEL,
        data_dir=data_dir,
        overrides=overrides,
    )


async def start_runner(agent: Any) -> tuple[Any, Any] | str:
    """The real adapter and router, started; or why they could not be (not merged yet)."""
    try:
        from ania_nb.runner.onebot import OneBotAdapter
        from ania_nb.runner.router import Router
    except ImportError as exc:
        return f"adapter/router not importable: {exc}"
    adapter = OneBotAdapter(agent.config.runner)
    router = Router(agent, adapter)
    await router.start()  # the durable outbox's deliverer, recovery (nothing to recover here)
    await adapter.start(router.handle)
    return adapter, router


async def engine_block(agent: Any, chats: int, messages: int, base: int, wait: float) -> dict:
    """``chats`` closed-loop chats of ``messages`` messages each, through ``Agent.chat``."""
    latencies: list[float] = []
    failures: dict[str, int] = {}

    async def one_chat(uid: int) -> None:
        kind, cid = chat_of(uid)
        session = f"{'g' if kind == 'group' else 'f'}:{cid}"
        for k in range(messages):
            t0 = time.perf_counter()
            try:
                text = sender_prefix(uid) + message_text(uid, k)
                result = await asyncio.wait_for(
                    agent.chat(text, session=session, sender=f"qq:{uid}"), wait
                )
                problem = None
                if result.status != "success":
                    problem = f"{result.status}: {(result.error or '')[:80]}"
                elif f"msg#{uid}-{k}" not in result.text:
                    problem = "reply names another message"
            except Exception as exc:  # counted, not fatal
                problem = f"{type(exc).__name__}: {str(exc)[:80]}"
            latencies.append(time.perf_counter() - t0)
            if problem:
                failures[problem] = failures.get(problem, 0) + 1

    await asyncio.gather(*(one_chat(base + i) for i in range(chats)))
    return {"latencies": latencies, "failures": failures}


_snapshot: list[Any] = []


class Profiler:
    """``--profile DIR``: cProfile of the loop thread and the store thread, and each thread's CPU.

    Switched on for one side's measured blocks at a time (``profile`` commands); what each side
    gathered is dumped as ``<side>-loop.prof`` / ``<side>-store.prof`` and ``<side>-threads.json``
    (CPU seconds per thread name) in DIR at the end.
    """

    def __init__(self, folder: Path, agent: Any) -> None:
        self.folder = folder
        self.agent = agent
        self.side: str | None = None
        self.loop: dict[str, Any] = {}
        self.store: dict[str, Any] = {}
        self.threads: dict[str, dict[str, float]] = {}
        self._cpu0: dict[str, float] = {}

    @staticmethod
    def thread_cpu() -> dict[str, float]:
        """CPU seconds (utime + stime) of each live thread of this process, by thread name."""
        import threading

        tick = os.sysconf("SC_CLK_TCK")
        found: dict[str, float] = {}
        for thread in threading.enumerate():
            try:
                raw = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
            except OSError:
                continue
            fields = raw.rsplit(")", 1)[1].split()
            name = thread.name.split("_")[0]
            found[name] = found.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        return found

    async def switch(self, side: str | None) -> None:
        """Profile ``side`` from now on (None: stop)."""
        import cProfile

        db = (await self.agent.host.open_store()).db
        # SQLite runs on a thread of its own (profiled too); PostgreSQL is natively async.
        executor = getattr(db, "_executor", None)
        if self.side is not None:
            self.loop[self.side].disable()
            if executor is not None:
                await asyncio.get_running_loop().run_in_executor(
                    executor, self.store[self.side].disable
                )
            now = self.thread_cpu()
            spent = self.threads.setdefault(self.side, {})
            for name, cpu in now.items():
                spent[name] = spent.get(name, 0.0) + cpu - self._cpu0.get(name, 0.0)
        self.side = side
        if side is None:
            return
        self._cpu0 = self.thread_cpu()
        self.loop.setdefault(side, cProfile.Profile()).enable()
        if executor is not None:
            store = self.store.setdefault(side, cProfile.Profile())
            await asyncio.get_running_loop().run_in_executor(executor, store.enable)

    def dump(self) -> None:
        """Write what was gathered."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for side, prof in self.loop.items():
            prof.dump_stats(self.folder / f"{side}-loop.prof")
        for side, prof in self.store.items():
            prof.dump_stats(self.folder / f"{side}-store.prof")
        for side, spent in self.threads.items():
            (self.folder / f"{side}-threads.json").write_text(json.dumps(spent, indent=2))


def trace_step() -> dict[str, Any]:
    """tracemalloc: 1st call starts it, 2nd takes a snapshot, 3rd: the 12 largest growths since.

    Started before the snapshot so that objects replaced at a steady rate (evicted sessions and
    their successors) cancel out and only growth remains.
    """
    import tracemalloc

    gc.collect()
    if not tracemalloc.is_tracing():
        tracemalloc.start(6)
        return {"top": []}
    now = tracemalloc.take_snapshot()
    if not _snapshot:
        _snapshot.append(now)
        return {"top": []}
    top = []
    for stat in now.compare_to(_snapshot[0], "traceback")[:12]:
        frames = [f"{f.filename.split('ania_nb/')[-1]}:{f.lineno}" for f in stat.traceback]
        top.append({"size_diff": stat.size_diff, "count_diff": stat.count_diff, "at": frames})
    return {"top": top}


async def child_main(args: argparse.Namespace) -> None:
    """Hold the Agent (+ runner); answer the parent's commands, one JSON line each."""
    agent = make_agent(
        args.base_url, args.data_dir, args.max_sessions, args.max_concurrent_runs, args.store_url
    )
    await agent.start()
    started = await start_runner(agent)
    runner = None if isinstance(started, str) else started
    out = sys.stdout

    def emit(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    emit(
        {
            "ready": True,
            "runner": runner is not None,
            "why_not": started if isinstance(started, str) else None,
            "max_concurrent_runs": agent.config.runner.max_concurrent_runs,
            "max_sessions": agent.config.agent.max_sessions,
            "url": runner[0].url if runner is not None else None,
        }
    )
    loop = asyncio.get_running_loop()
    profiler = Profiler(args.profile, agent) if args.profile else None
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            cmd = json.loads(line)
            if cmd["cmd"] == "engine":
                emit(
                    await engine_block(
                        agent, cmd["chats"], cmd["messages"], cmd["base"], cmd["timeout"]
                    )
                )
            elif cmd["cmd"] == "rss":
                await asyncio.sleep(0.2)  # let replies' tails (history writes) settle
                gc.collect()
                sample = {"rss_kib": rss_kib(), "sessions": len(agent.sessions)}
                if runner is not None:  # private, for the report only: what the runner holds
                    sample["router_chats"] = len(getattr(runner[1], "_links", ()))
                    sample["adapter_sent_ids"] = len(getattr(runner[0], "_sent", ()))
                emit(sample)
            elif cmd["cmd"] == "trace":  # tracemalloc: start, then the top growth since
                emit(trace_step())
            elif cmd["cmd"] == "profile":
                if profiler is not None:
                    await profiler.switch(cmd["side"])
                emit({"profiling": cmd["side"]})
            elif cmd["cmd"] == "quit":
                break
    finally:
        if profiler is not None:
            profiler.dump()
        if runner is not None:
            adapter, router = runner
            await router.close(5.0)
            await adapter.aclose()
        await agent.aclose()


async def runner_block(peer: OneBotPeer, chats: int, messages: int, base: int, wait: float) -> dict:
    """``chats`` closed-loop chats of ``messages`` messages each, over the WebSocket."""
    latencies: list[float] = []
    failures: dict[str, int] = {}

    async def one_chat(uid: int) -> None:
        for k in range(messages):
            t0, future = await peer.message(uid, message_text(uid, k))
            try:
                arrived, text = await asyncio.wait_for(future, wait)
                latencies.append(arrived - t0)
                if f"msg#{uid}-{k}" not in text:
                    failures["reply names another message"] = (
                        failures.get("reply names another message", 0) + 1
                    )
            except TimeoutError:
                latencies.append(wait)
                failures["no reply"] = failures.get("no reply", 0) + 1
                if messages - k - 1:  # the chat is out of step now; stop it
                    failures["not sent (chat stopped)"] = messages - k - 1
                return

    await asyncio.gather(*(one_chat(base + i) for i in range(chats)))
    return {"latencies": latencies, "failures": failures}


# =========================================================================== the parent


class Child:
    """The runner process: one Agent, the adapter and the router; commands on its stdin."""

    def __init__(self, args: argparse.Namespace, base_url: str, data_dir: Path) -> None:
        cmd = [sys.executable, __file__, "--child", "--base-url", base_url]
        cmd += ["--data-dir", str(data_dir)]
        if args.max_sessions is not None:
            cmd += ["--max-sessions", str(args.max_sessions)]
        if args.max_concurrent_runs is not None:
            cmd += ["--max-concurrent-runs", str(args.max_concurrent_runs)]
        if args.store_url:
            cmd += ["--store-url", args.store_url]
        if args.profile is not None:
            cmd += ["--profile", str(args.profile)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"runner child exited ({self.proc.wait()})")
        return json.loads(line)

    async def ask(self, **cmd: Any) -> dict[str, Any]:
        """Send one command and wait for its answer line (off the loop)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return await asyncio.to_thread(self._read)

    def cpu(self) -> float:
        """CPU seconds the child has used so far."""
        return proc_cpu(self.proc.pid)

    def close(self) -> None:
        """Ask it to quit; kill it if it does not."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(OSError):
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Side:
    """What one side measured (summed over its interleaved blocks)."""

    messages: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    server_cpu: float = 0.0
    latencies: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)

    def add(self, result: dict[str, Any], wall: float, cpu: float, server_cpu: float) -> None:
        """Add one block."""
        self.latencies += result["latencies"]
        self.messages += len(result["latencies"])
        self.wall += wall
        self.cpu += cpu
        self.server_cpu += server_cpu
        for key, n in result["failures"].items():
            self.failures[key] = self.failures.get(key, 0) + n

    def row(self) -> dict[str, Any]:
        """Per-message figures."""
        lat = sorted(self.latencies)
        n = max(1, self.messages)
        return {
            "messages": self.messages,
            "failed": sum(self.failures.values()),
            "failures": self.failures,
            "messages_per_s": self.messages / self.wall if self.wall else float("nan"),
            "p50_ms": 1000 * _quantile(lat, 0.50),
            "p99_ms": 1000 * _quantile(lat, 0.99),
            "cpu_ms_per_message": 1000 * self.cpu / n,
            "server_cpu_ms_per_message": 1000 * self.server_cpu / n,
        }


class Bench:
    """The parent: the model server, the runner child, the OneBot peer."""

    def __init__(self, args: argparse.Namespace, server: ServerProcess, child: Child) -> None:
        self.args = args
        self.server = server
        self.child = child
        self.peer: OneBotPeer | None = None
        self.next_uid = 2  # fresh chats for every block

    def _uids(self, chats: int) -> int:
        base = self.next_uid
        self.next_uid += chats + (chats % 2)  # keep parity: even = private, odd = group
        return base

    async def block(self, side: str, chats: int, messages: int, into: Side | None) -> None:
        """One block of closed-loop chats on one side."""
        base = self._uids(chats)
        timeout = self.args.reply_timeout
        c0, s0, w0 = self.child.cpu(), self.server.cpu(), time.perf_counter()
        if side == "engine":
            result = await self.child.ask(
                cmd="engine", chats=chats, messages=messages, base=base, timeout=timeout
            )
        else:
            assert self.peer is not None
            result = await runner_block(self.peer, chats, messages, base, timeout)
        wall = time.perf_counter() - w0
        if into is not None:
            into.add(result, wall, self.child.cpu() - c0, self.server.cpu() - s0)

    async def throughput(self) -> dict[str, Any]:
        """Engine and runner blocks, A-B-B-A; the ratios runner / engine."""
        a = self.args
        sides = ["engine"] + (["runner"] if self.peer is not None else [])
        for side in sides:  # warm-up: imports, connections, caches
            await self.block(side, min(20, a.chats), 2, None)
        results = {side: Side() for side in sides}
        order = ["engine", "runner", "runner", "engine"] if self.peer else ["engine", "engine"]
        for side in order:
            gc.collect()
            if a.profile is not None:
                await self.child.ask(cmd="profile", side=side)
            await self.block(side, a.chats, a.messages, results[side])
            if a.profile is not None:
                await self.child.ask(cmd="profile", side=None)
            print(f"  {side} block done", file=sys.stderr, flush=True)
        rows = {side: results[side].row() for side in sides}
        if "runner" in rows:
            e, r = rows["engine"], rows["runner"]
            rows["ratio"] = {
                key: r[key] / e[key]
                for key in ("messages_per_s", "p50_ms", "p99_ms", "cpu_ms_per_message")
            }
            rows["extra_cpu_ms_per_message"] = r["cpu_ms_per_message"] - e["cpu_ms_per_message"]
        return rows

    async def memory(self) -> dict[str, Any]:
        """``--memory-messages`` through the runner (or the engine without it), RSS per chunk."""
        a = self.args
        side = "runner" if self.peer is not None else "engine"
        per_chat = 5
        chats = max(1, a.memory_chunk // per_chat)
        first = await self.child.ask(cmd="rss")
        samples = [{"messages": 0, **first}]
        traced: list[dict[str, Any]] = []
        if a.tracemalloc:
            traced.append(await self.child.ask(cmd="trace"))  # starts tracing
        failed, done = 0, 0
        while done < a.memory_messages:
            block = Side()
            await self.block(side, chats, per_chat, block)
            done += block.messages
            failed += block.row()["failed"]
            sample = await self.child.ask(cmd="rss")
            samples.append({"messages": done, **sample})
            if a.tracemalloc and done >= a.memory_messages // 2 and len(traced) == 1:
                traced.append(await self.child.ask(cmd="trace"))  # the mid-point snapshot
            print(
                f"  memory: {done} messages, RSS {sample['rss_kib'] / 1024:.1f} MiB, "
                f"sessions held {sample['sessions']}, router chats {sample.get('router_chats')}, "
                f"adapter sent ids {sample.get('adapter_sent_ids')}",
                file=sys.stderr,
                flush=True,
            )
        if traced:
            for row in (await self.child.ask(cmd="trace"))["top"]:
                print(
                    f"  +{row['size_diff'] / 1024:8.1f} KiB {row['count_diff']:+6d}  "
                    + " <- ".join(reversed(row["at"][-5:])),
                    file=sys.stderr,
                )
        half = samples[len(samples) // 2]
        last = samples[-1]
        span = max(1, last["messages"] - half["messages"])
        return {
            "side": side,
            "messages": done,
            "failed": failed,
            "max_sessions": self.child.hello["max_sessions"],
            "samples": samples,
            "second_half_growth_kib": last["rss_kib"] - half["rss_kib"],
            "second_half_bytes_per_message": 1024 * (last["rss_kib"] - half["rss_kib"]) / span,
        }


def machine() -> dict[str, Any]:
    """Where and with what this ran."""
    import importlib.metadata

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
        check=False,
    ).stdout.strip()
    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "websockets": importlib.metadata.version("websockets"),
        "commit": commit,
    }


def _line(name: str, row: dict[str, Any]) -> str:
    return (
        f"{name:<7} {row['messages']:>6} msgs  {row['messages_per_s']:7.1f} msg/s  "
        f"p50 {row['p50_ms']:7.1f}  p99 {row['p99_ms']:7.1f} ms  "
        f"{row['cpu_ms_per_message']:6.2f} CPU ms/msg  failed {row['failed']}  "
        f"(server {row['server_cpu_ms_per_message']:.2f} CPU ms/msg)"
    )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    """Start the server and the child, measure, stop everything."""
    server = await asyncio.to_thread(ServerProcess, "-c", SERVER, str(args.latency))
    try:
        with tempfile.TemporaryDirectory(prefix="ania-runner-bench-") as tmp:
            child = await asyncio.to_thread(Child, args, server.base_url, Path(tmp) / "data")
            bench = Bench(args, server, child)
            try:
                report: dict[str, Any] = {
                    "machine": machine(),
                    "latency_s": args.latency,
                    "chats": args.chats,
                    "messages_per_chat": args.messages,
                    "path": "in-process adapter + router in a child process (reverse WS)",
                    "max_concurrent_runs": child.hello["max_concurrent_runs"],
                    "max_sessions": child.hello["max_sessions"],
                }
                if child.hello["runner"]:
                    bench.peer = OneBotPeer(child.hello["url"], TOKEN)
                    await bench.peer.connect()
                else:
                    report["runner_missing"] = child.hello["why_not"]
                    print(f"runner path skipped: {child.hello['why_not']}", file=sys.stderr)
                rows = await bench.throughput()
                report["throughput"] = rows
                for name in ("engine", "runner"):
                    if name in rows:
                        print(_line(name, rows[name]), file=sys.stderr, flush=True)
                if "ratio" in rows:
                    x = rows["ratio"]
                    print(
                        f"runner / engine: thr {x['messages_per_s']:.2f}  p50 {x['p50_ms']:.2f}  "
                        f"p99 {x['p99_ms']:.2f}  CPU {x['cpu_ms_per_message']:.2f} "
                        f"(+{rows['extra_cpu_ms_per_message']:.2f} ms/msg)",
                        file=sys.stderr,
                        flush=True,
                    )
                if args.memory_messages:
                    report["memory"] = await bench.memory()
                if bench.peer is not None:
                    report["peer"] = {
                        "actions": bench.peer.actions,
                        "unexpected_sends": bench.peer.unexpected,
                    }
                    await bench.peer.close()
            finally:
                await asyncio.to_thread(child.close)
            return report
    finally:
        await asyncio.to_thread(server.close)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="50 chats × 4, 1,000-message memory test")
    p.add_argument("--chats", type=int, default=None, help="concurrent chats (default 200)")
    p.add_argument("--messages", type=int, default=None, help="messages per chat (default 10)")
    p.add_argument("--latency", type=float, default=0.05, help="model latency per call, s")
    p.add_argument("--memory-messages", type=int, default=None, help="default 10,000; 0 = skip")
    p.add_argument("--memory-chunk", type=int, default=1000, help="messages between RSS samples")
    p.add_argument("--max-sessions", type=int, default=None, help="agent.max_sessions override")
    p.add_argument(
        "--max-concurrent-runs", type=int, default=None, help="runner.max_concurrent_runs (8)"
    )
    p.add_argument("--reply-timeout", type=float, default=120.0, help="s before a reply is lost")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument(
        "--store-url", default="", help="store.url of the child (a PostgreSQL URL; default SQLite)"
    )
    p.add_argument(
        "--tracemalloc", action="store_true", help="memory test: top growth of its second half"
    )
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="cProfile the child's loop and store threads per side (measured blocks) into DIR; "
        "the CPU figures then include the profiler's cost",
    )
    # Internal: the runner child process.
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--base-url", help=argparse.SUPPRESS)
    p.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.chats is None:
        args.chats = 50 if args.quick else 200
    if args.messages is None:
        args.messages = 4 if args.quick else 10
    if args.memory_messages is None:
        args.memory_messages = 1000 if args.quick else 10_000
    if args.quick and args.max_sessions is None and not args.child:
        args.max_sessions = 100  # so the janitor evicts within the short memory test
    if args.quick:
        args.memory_chunk = min(args.memory_chunk, 200)
    return args


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    if args.child:
        asyncio.run(child_main(args))
        return 0
    report = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(report, indent=2))
    failed = sum(
        report["throughput"][s]["failed"] for s in ("engine", "runner") if s in report["throughput"]
    )
    failed += report.get("memory", {}).get("failed", 0)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
