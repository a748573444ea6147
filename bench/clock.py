"""Clock: how late 1,000 tasks fire on a busy loop, and start-up with 10,000 stored tasks.

(a) **Lateness.** ``--tasks`` enabled ``@every`` tasks (default 1,000) are created through
``agent.clock.create(...)``; their periods are spread evenly over [P/2, 3P/2] (``--period`` P,
default 60 s), so they fire at scattered times, about N/P per second. The loop is, in
alternating blocks, *idle* (only the clock's own runs) or *busy* (``--concurrency`` workers
running ``Agent.chat`` back to back, a fresh session per run). Every task run and every chat is
a real run against ``ania_nb.testing.ScriptedLLM`` (``loop=True`` script: one reply after
``--latency`` seconds) in a **separate process**, so its CPU is not counted here.

Lateness of a fire = the task-log entry's ``started_at`` − ``scheduled_at`` (the planned fire
time APScheduler fired for), taken from the ``run_started`` events of ``agent.clock.subscribe``
(``run_started → event`` is when the event reached the subscriber). Baseline, in the same
blocks and on the same loop: bare ``loop.call_at`` timers at random times, at the same rate,
whose lateness is the loop's own lag; ratios are clock / timer. Goal (issue 13): clock p99 in
the busy blocks ≤ 50 ms. Diagnostics per block: the scheduler's dispatch lateness (a stamp on
its internal fire callback), loop-thread / process / server CPU, the loop thread's run-queue
wait (``/proc/thread-self/schedstat``: CPU taken by other processes) and GC pauses.

(b) **Start-up.** ``--stored`` tasks (default 10,000; a mix of crontab lines, descriptors and
long ``@every`` periods) are stored, then a fresh ``Clock(agent.host).start()`` loads and schedules
them (lease, orphan check, read, one APScheduler job each, next fire times written back). Ratio
to reading the same rows from SQLite alone (a fresh ``sqlite3`` connection, ``SELECT * FROM
clock_tasks ORDER BY seq``, ``fetchall``), and to ``clock.list()`` (the rows read into
``ClockTask`` objects on the store thread); interleaved, ``--repeat`` times each, medians.

    python bench/clock.py            # full: about 5 minutes on 2 cores
    python bench/clock.py --quick    # a short run to check that it works (about 1 minute)
    python bench/clock.py --json     # JSON on stdout, the table on stderr
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import pstats
import random
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _raw import ServerProcess  # bench/ is the script's folder
from load import _quantile, machine

MODEL = "bench-model"
API_KEY = "sk-bench"
FINAL_TEXT = "Nothing to report."
GOAL_P99_MS = 50.0

# The server process: every request (chat or clock run) gets one reply after `latency` seconds.
SERVER = """
import signal, sys, threading
from ania_nb.testing import ScriptedLLM, delay, reply, usage

latency, final = float(sys.argv[1]), sys.argv[2]
llm = ScriptedLLM(loop=True).script(delay(latency, reply(final, usage=usage(150, 8)))).start()
print("base_url=" + llm.base_url, flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
llm.close()
"""


class Server(ServerProcess):
    """The scripted server in a child process."""

    def __init__(self, latency: float) -> None:
        super().__init__("-c", SERVER, str(latency), FINAL_TEXT)


def make_agent(base_url: str, data_dir: Path, *, clock: bool = True) -> Any:
    """An Agent on the scripted server: non-streamed, no built-in tools, isolated from ./skills."""
    from ania_nb import Agent

    overrides = {
        "llm.stream": False,
        "agent.max_context_tokens": 0,
        "agent.builtin_tools": False,
        "skills.dir": str(data_dir / "no-skills"),
        "mcp.config_file": str(data_dir / "no-mcp.json"),
        "clock.enable": clock,
    }
    return Agent(
        base_url=base_url, api_key=API_KEY, model=MODEL, data_dir=data_dir, overrides=overrides
    )


async def open_clock(agent: Any) -> Any:
    """Open the Agent and its clock (``agent.clock``; a `Clock` of our own until it is wired)."""
    from ania_nb.clock import Clock

    await agent.start()
    clock = getattr(agent, "clock", None)
    if clock is None:
        clock = Clock(agent.host)
    await clock.start()
    return clock


def _ms(values: list[float]) -> dict[str, float]:
    """p50/p99/max of seconds, in ms."""
    s = sorted(values)
    return {
        "n": len(s),
        "p50_ms": 1000 * _quantile(s, 0.50),
        "p99_ms": 1000 * _quantile(s, 0.99),
        "max_ms": 1000 * s[-1] if s else float("nan"),
    }


# --------------------------------------------------------------------------- (a) lateness


@dataclass
class Samples:
    """Everything measured in the blocks of one kind (idle or busy)."""

    started: list[float] = field(default_factory=list)  # started_at - scheduled_at
    event: list[float] = field(default_factory=list)  # event received - scheduled_at
    timer: list[float] = field(default_factory=list)  # loop.call_at lateness
    dispatch: list[float] = field(default_factory=list)  # fire callback - scheduled
    skipped: int = 0
    wall: float = 0.0
    loop_cpu: float = 0.0
    cpu: float = 0.0
    server_cpu: float = 0.0
    runq_wait: float = 0.0  # the loop thread runnable but not on a CPU (other processes)
    chats: int = 0
    chat_failed: int = 0
    gc_pauses: list[tuple[int, float]] = field(default_factory=list)  # (generation, seconds)

    def merge(self, other: Samples) -> None:
        """Add another block's figures to these."""
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


class GcWatch:
    """Records every garbage collection's generation and pause (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._t0 = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._t0))

    def close(self) -> None:
        """Stop recording."""
        gc.callbacks.remove(self._on_gc)


def runq_wait() -> float:
    """Seconds this thread has waited runnable for a CPU (Linux schedstat; 0 elsewhere)."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Recorder:
    """Collects the clock's ``run_started``/``run_finished`` events, stamped on arrival."""

    def __init__(self) -> None:
        self.starts: list[tuple[float, float, float]] = []  # (scheduled, started_at, received)
        self.skips: list[float] = []  # scheduled times of skipped fires
        self.finished: dict[str, int] = {}  # final status → count
        self.dispatched: list[tuple[float, float]] = []  # (planned, fire callback called)

    def trace_dispatch(self, clock: Any) -> bool:
        """Diagnostic: stamp the scheduler's fire callback (internal; False if not found)."""
        scheduler = getattr(clock, "_scheduler", None)
        inner = getattr(scheduler, "_fire", None)
        if inner is None:
            return False

        def traced(task_id: str, planned: float) -> None:
            self.dispatched.append((planned, time.time()))
            inner(task_id, planned)

        scheduler._fire = traced  # type: ignore[union-attr]
        return True

    def __call__(self, event: Any) -> None:
        now = time.time()
        entry = event.entry
        if entry is None or entry.scheduled_at is None:
            return  # a manual run
        if event.kind == "run_started":
            self.starts.append((entry.scheduled_at, entry.started_at, now))
        elif event.kind == "run_finished":
            self.finished[entry.status] = self.finished.get(entry.status, 0) + 1
            if entry.status == "skipped":
                self.skips.append(entry.scheduled_at)


def plan_timers(t0: float, t1: float, rate: float, out: list[float], rng: random.Random) -> None:
    """Bare loop timers at Poisson times in [t0, t1) (loop clock); each records its lateness."""
    loop = asyncio.get_running_loop()

    def fired(when: float) -> None:
        out.append(loop.time() - when)

    when = t0
    while True:
        when += rng.expovariate(rate)
        if when >= t1:
            return
        loop.call_at(when, fired, when)


async def chat_workers(agent: Any, n: int, stop: asyncio.Event, into: Samples, tag: str) -> None:
    """``n`` workers running ``Agent.chat`` back to back (fresh sessions) until ``stop``."""

    async def worker(w: int) -> None:
        k = 0
        while not stop.is_set():
            k += 1
            try:
                result = await agent.chat("ping", session=f"bg-{tag}-{w}-{k}")
                ok = result.status == "success"
            except Exception as exc:  # a failed run is counted, not fatal
                print(f"chat: {type(exc).__name__}: {exc}", file=sys.stderr)
                ok = False
            into.chats += 1
            into.chat_failed += not ok

    await asyncio.gather(*(worker(w) for w in range(n)))


async def measure_lateness(args: argparse.Namespace, server: Server, root: Path) -> dict[str, Any]:
    """Create the tasks, wait for the first fires, then alternate idle and busy blocks."""
    agent = make_agent(server.base_url, root / "lateness")
    clock = await open_clock(agent)
    recorder = Recorder()
    unsubscribe = clock.subscribe(recorder)
    traced = recorder.trace_dispatch(clock)
    rng = random.Random(13)
    loop = asyncio.get_running_loop()
    kinds = {"idle": Samples(), "busy": Samples()}
    gc_watch = GcWatch()
    try:
        t_create = time.perf_counter()
        n, p = args.tasks, args.period
        for i in range(n):
            period = p * (0.5 + (i + 0.5) / n)  # evenly over [P/2, 3P/2]
            await clock.create(
                cron=f"@every {period:.3f}s",
                title=f"bench {i}",
                content="Check the queue and report.",
                target=f"nb:clock-bench-{i % 10}",
            )
        created = time.perf_counter() - t_create
        rate = n / p  # nominal fires per second (the timer probe's rate)
        print(
            f"created {n} tasks in {created:.1f} s; waiting {p / 2:.0f} s for the first fires",
            file=sys.stderr,
            flush=True,
        )
        if args.gc_freeze:  # what exists now (imports, agent, tasks) is never collected again
            gc.collect()
            gc.freeze()
        await asyncio.sleep(p / 2 + 1.0)  # no task fires before P/2 after its creation
        for r in range(args.rounds):
            for kind in ("idle", "busy") if r % 2 == 0 else ("busy", "idle"):
                s = Samples()
                stop = asyncio.Event()
                workers = None
                if kind == "busy":
                    workers = asyncio.create_task(
                        chat_workers(agent, args.concurrency, stop, s, f"{r}")
                    )
                    await asyncio.sleep(0.5)  # let the workers get going
                gc.collect()
                gc_watch.pauses.clear()
                w0, lt0, c0 = time.time(), time.thread_time(), time.process_time()
                q0, sc0 = runq_wait(), server.cpu()
                plan_timers(loop.time(), loop.time() + args.block, rate, s.timer, rng)
                await asyncio.sleep(args.block)
                w1 = time.time()
                s.wall += w1 - w0
                s.loop_cpu += time.thread_time() - lt0
                s.cpu += time.process_time() - c0
                s.runq_wait += runq_wait() - q0
                s.server_cpu += server.cpu() - sc0
                s.gc_pauses += gc_watch.pauses
                stop.set()
                if workers is not None:
                    await workers
                await asyncio.sleep(0.3)  # the last fires' run_started events arrive
                for scheduled, started, received in recorder.starts:
                    if w0 <= scheduled < w1:
                        s.started.append(started - scheduled)
                        s.event.append(received - scheduled)
                s.skipped += sum(w0 <= t < w1 for t in recorder.skips)
                s.dispatch += [at - t for t, at in recorder.dispatched if w0 <= t < w1]
                print(_block_line(kind, s), file=sys.stderr, flush=True)
                kinds[kind].merge(s)
    finally:
        gc_watch.close()
        if args.gc_freeze:
            gc.unfreeze()
        unsubscribe()
        if getattr(agent, "clock", None) is not clock:
            await clock.aclose()  # our own clock: before the store closes under its runs
        await agent.aclose()
    out: dict[str, Any] = {"tasks": args.tasks, "period_s": args.period, "created_s": created}
    for kind, s in kinds.items():
        started, timer = _ms(s.started), _ms(s.timer)
        out[kind] = {
            "fires": len(s.started),
            "fires_per_s": len(s.started) / s.wall,
            "skipped": s.skipped,
            "started": started,
            "event": _ms(s.event),
            "dispatch": _ms(s.dispatch) if traced else None,
            "timer": timer,
            "ratio_p50": started["p50_ms"] / max(timer["p50_ms"], 1e-3),
            "ratio_p99": started["p99_ms"] / max(timer["p99_ms"], 1e-3),
            "loop_busy": s.loop_cpu / s.wall,
            "process_cpu": s.cpu / s.wall,
            "runq_wait": s.runq_wait / s.wall,
            "server_cpu": s.server_cpu / s.wall,
            "gc": _gc_summary(s.gc_pauses, s.wall),
            "chats_per_s": s.chats / s.wall,
            "chat_failed": s.chat_failed,
        }
    out["run_statuses"] = recorder.finished
    out["goal_met"] = out["busy"]["started"]["p99_ms"] <= GOAL_P99_MS
    return out


def _gc_summary(pauses: list[tuple[int, float]], wall: float) -> dict[str, Any]:
    """Collections per generation, the longest pause, the share of the wall time spent in GC."""
    return {
        "count": [sum(g == gen for g, _ in pauses) for gen in (0, 1, 2)],
        "max_ms": 1000 * max((d for _, d in pauses), default=0.0),
        "gen2_max_ms": 1000 * max((d for g, d in pauses if g == 2), default=0.0),
        "share": sum(d for _, d in pauses) / wall,
    }


def _block_line(kind: str, s: Samples) -> str:
    st, tm, dp = _ms(s.started), _ms(s.timer), _ms(s.dispatch)
    return (
        f"  {kind:4}: {st['n']:5} fires  clock p50 {st['p50_ms']:6.1f}  p99 {st['p99_ms']:6.1f} ms"
        f"  (dispatch p50 {dp['p50_ms']:5.1f}  p99 {dp['p99_ms']:5.1f})"
        f"  |  timer p50 {tm['p50_ms']:5.1f}  p99 {tm['p99_ms']:5.1f} ms  |  loop busy "
        f"{s.loop_cpu / max(s.wall, 1e-9):.0%}  process {s.cpu / max(s.wall, 1e-9):.0%}  server "
        f"{s.server_cpu / max(s.wall, 1e-9):.0%}  run-queue wait "
        f"{s.runq_wait / max(s.wall, 1e-9):.0%}"
        f"  gc max {_gc_summary(s.gc_pauses, s.wall)['max_ms']:.0f} ms"
        f"  chats {s.chats} (failed {s.chat_failed})"
    )


# --------------------------------------------------------------------------- (b) start-up


def stored_cron(i: int, rng: random.Random) -> str:
    """A mix: a third crontab lines, a third descriptors, a third long ``@every`` periods."""
    kind = i % 3
    if kind == 0:
        return f"{rng.randrange(60)} {rng.randrange(24)} * * {rng.choice(['*', '1-5', '0,6'])}"
    if kind == 1:
        return rng.choice(["@hourly", "@daily", "@weekly", "@monthly", "@yearly"])
    return f"@every {rng.randrange(2, 48)}h{rng.randrange(60)}m"


async def store_tasks(base_url: str, data_dir: Path, count: int) -> float:
    """Store ``count`` tasks through the public API (the clock not running); returns seconds."""
    from ania_nb.clock import Clock

    agent = make_agent(base_url, data_dir, clock=False)
    await agent.start()
    clock = getattr(agent, "clock", None) or Clock(agent.host)
    rng = random.Random(10)
    t0 = time.perf_counter()
    try:
        for start in range(0, count, 100):  # 100 creates in flight: the store thread stays busy
            await asyncio.gather(
                *(
                    clock.create(
                        cron=stored_cron(i, rng),
                        title=f"stored {i}",
                        content=f"Task number {i}: look at the dashboard and summarise it.",
                        target=f"nb:stored-{i % 50}",
                    )
                    for i in range(start, min(count, start + 100))
                )
            )
    finally:
        await agent.aclose()
    return time.perf_counter() - t0


def read_sqlite(path: str) -> int:
    """The baseline: a fresh connection reads every task row."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT * FROM clock_tasks ORDER BY seq").fetchall()
    finally:
        conn.close()
    return len(rows)


async def measure_startup(args: argparse.Namespace, base_url: str, root: Path) -> dict[str, Any]:
    """Time ``Clock.start()`` with the stored tasks against reading the rows alone."""
    from ania_nb.clock import Clock

    data_dir = root / "startup"
    stored_s = await store_tasks(base_url, data_dir, args.stored)
    print(f"stored {args.stored} tasks in {stored_s:.1f} s", file=sys.stderr, flush=True)
    agent = make_agent(base_url, data_dir)
    t0 = time.perf_counter()
    await agent.start()
    agent_start = time.perf_counter() - t0
    own = getattr(agent, "clock", None)
    if own is not None:
        await own.aclose()  # free the lease: the fresh clocks below each take it
    path = (await agent.host.open_store()).db.path
    times: dict[str, list[float]] = {"sqlite": [], "list": [], "start": []}
    cpu: list[float] = []
    stalls: list[float] = []
    first_start = None
    try:
        for r in range(args.repeat + 1):  # round 0: warm-up (and the first start, reported)
            gc.collect()
            t0 = time.perf_counter()
            rows = read_sqlite(path)
            t_sql = time.perf_counter() - t0
            assert rows == args.stored, f"read {rows} rows, expected {args.stored}"

            probe = Clock(agent.host)  # not started: list() only reads
            t0 = time.perf_counter()
            listed = await probe.list()
            t_list = time.perf_counter() - t0
            assert len(listed) == args.stored

            gc.collect()
            t_start, c_start, stall = await start_clock(agent, args.stored)
            if r == 0:
                first_start = t_start
                continue
            times["sqlite"].append(t_sql)
            times["list"].append(t_list)
            times["start"].append(t_start)
            cpu.append(c_start)
            stalls.append(stall)
        if args.profile:  # one more start, profiled (not in the figures: cProfile slows it)
            profile = cProfile.Profile()
            await start_clock(agent, args.stored, profile)
            profile.dump_stats(f"{args.profile}.startup.pstats")
            print(f"profile of one Clock.start(): {args.profile}.startup.pstats", file=sys.stderr)
            stats = pstats.Stats(profile, stream=sys.stderr)
            stats.sort_stats("cumulative").print_stats(25)
    finally:
        await agent.aclose()
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "stored": args.stored,
        "store_s": stored_s,
        "agent_start_s": agent_start,
        "first_clock_start_s": first_start,
        "median_s": med,
        "clock_start_cpu_s": statistics.median(cpu),
        "longest_loop_stall_ms": 1000 * max(stalls),
        "ratio_start_to_sqlite": med["start"] / med["sqlite"],
        "ratio_start_to_list": med["start"] / med["list"],
        "ratio_list_to_sqlite": med["list"] / med["sqlite"],
    }
    return out


async def start_clock(
    agent: Any, expected: int, profile: cProfile.Profile | None = None
) -> tuple[float, float, float]:
    """Start and close a fresh ``Clock(agent.host)``: wall, CPU and longest loop stall of start().

    The stall is the longest gap seen by a 1 ms ticker running on the loop meanwhile.
    """
    from ania_nb.clock import Clock

    clock = Clock(agent.host)
    loop = asyncio.get_running_loop()
    done = False
    stall = 0.0

    async def ticker() -> None:
        nonlocal stall
        while not done:
            t = loop.time()
            await asyncio.sleep(0.001)
            stall = max(stall, loop.time() - t - 0.001)

    probe = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    if profile is not None:
        profile.enable()
    t0, c0 = time.perf_counter(), time.process_time()
    await clock.start()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if profile is not None:
        profile.disable()
    done = True
    await probe
    status = clock.status_text()
    await clock.aclose()
    found = re.search(r"(\d+) task\(s\) scheduled", status)
    if found is None or int(found.group(1)) != expected:
        raise RuntimeError(f"the clock did not schedule all {expected} tasks: {status}")
    return wall, cpu, stall


# --------------------------------------------------------------------------- main


def print_table(report: dict[str, Any]) -> None:
    """The results as a table on stderr."""
    p = print
    m = report["machine"]
    p(
        f"\nclock bench, {m['date']}, {m['cores']} cores (load {m['load_average'][0]:.1f}), "
        f"Python {m['python']}, commit {m['commit']}",
        file=sys.stderr,
    )
    lat = report.get("lateness")
    if lat:
        p(
            f"\n(a) lateness: {lat['tasks']} enabled tasks, periods {lat['period_s'] / 2:g}–"
            f"{1.5 * lat['period_s']:g} s, busy = {report['args']['concurrency']} chat workers",
            file=sys.stderr,
        )
        p(
            "| loop | fires/s | clock p50 / p99 / max ms | dispatch p99 | event p99 | "
            "timer p50 / p99 ms | × timer p50, p99 | CPU: loop, process, server | run-queue wait | "
            "GC max (gen2 n) | chats/s |",
            file=sys.stderr,
        )
        p("|---|---|---|---|---|---|---|---|---|---|---|", file=sys.stderr)
        for kind in ("idle", "busy"):
            r = lat[kind]
            st, tm, gcs = r["started"], r["timer"], r["gc"]
            dispatch = f"{r['dispatch']['p99_ms']:.1f}" if r["dispatch"] else "—"
            p(
                f"| {kind} | {r['fires_per_s']:.1f} | {st['p50_ms']:.1f} / {st['p99_ms']:.1f} / "
                f"{st['max_ms']:.1f} | {dispatch} | {r['event']['p99_ms']:.1f} | "
                f"{tm['p50_ms']:.2f} / {tm['p99_ms']:.1f} | {r['ratio_p50']:.1f}×, "
                f"{r['ratio_p99']:.1f}× | {r['loop_busy']:.0%}, {r['process_cpu']:.0%}, "
                f"{r['server_cpu']:.0%} | {r['runq_wait']:.0%} | "
                f"{gcs['max_ms']:.0f} ms ({gcs['count'][2]}) | {r['chats_per_s']:.0f} |",
                file=sys.stderr,
            )
        verdict = "met" if lat["goal_met"] else "NOT met"
        skipped = lat["idle"]["skipped"] + lat["busy"]["skipped"]
        p(
            f"goal: busy p99 ≤ {GOAL_P99_MS:g} ms: {verdict}; run statuses "
            f"{lat['run_statuses']}; skipped fires {skipped}",
            file=sys.stderr,
        )
    up = report.get("startup")
    if up:
        med = up["median_s"]
        p(
            f"\n(b) start-up with {up['stored']} stored tasks "
            f"(median of {report['args']['repeat']})",
            file=sys.stderr,
        )
        p("| step | ms | × SQLite read |", file=sys.stderr)
        p("|---|---|---|", file=sys.stderr)
        p(
            f"| SQLite read (fresh connection, fetchall) | {1000 * med['sqlite']:.1f} | 1.0× |",
            file=sys.stderr,
        )
        p(
            f"| clock.list() (ClockTask objects) | {1000 * med['list']:.1f} | "
            f"{up['ratio_list_to_sqlite']:.1f}× |",
            file=sys.stderr,
        )
        p(
            f"| Clock.start() (load + schedule) | {1000 * med['start']:.1f} | "
            f"{up['ratio_start_to_sqlite']:.1f}× |",
            file=sys.stderr,
        )
        p(
            f"first Clock.start() after storing: {1000 * up['first_clock_start_s']:.0f} ms; "
            f"Agent.start() with the stored tasks: {1000 * up['agent_start_s']:.0f} ms; "
            f"Clock.start() CPU {1000 * up['clock_start_cpu_s']:.0f} ms; longest loop stall "
            f"during a start {up['longest_loop_stall_ms']:.0f} ms",
            file=sys.stderr,
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="200 tasks, short blocks, 2,000 stored")
    p.add_argument("--tasks", type=int, default=None, help="enabled tasks (default 1000)")
    p.add_argument("--period", type=float, default=None, help="mean task period P, s (60)")
    p.add_argument("--concurrency", type=int, default=10, help="chat workers when busy (10)")
    p.add_argument("--latency", type=float, default=0.05, help="model latency per call, s")
    p.add_argument("--block", type=float, default=None, help="seconds per block (15)")
    p.add_argument("--rounds", type=int, default=None, help="idle+busy block pairs (4)")
    p.add_argument("--stored", type=int, default=None, help="stored tasks (default 10000)")
    p.add_argument("--repeat", type=int, default=None, help="start-up repetitions (5)")
    p.add_argument("--gc-freeze", action="store_true", help="(a): gc.freeze() once the tasks exist")
    p.add_argument("--no-lateness", action="store_true", help="skip (a)")
    p.add_argument("--no-startup", action="store_true", help="skip (b)")
    p.add_argument("--profile", metavar="PREFIX", help="cProfile one more Clock.start()")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    args = p.parse_args(argv)
    quick = {"tasks": 200, "period": 10.0, "block": 5.0, "rounds": 1, "stored": 2000, "repeat": 3}
    full = {"tasks": 1000, "period": 60.0, "block": 15.0, "rounds": 4, "stored": 10000, "repeat": 5}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    """Start the server, run (a) and (b), stop the server."""
    server = Server(args.latency)
    report: dict[str, Any] = {"machine": machine(), "args": vars(args)}
    try:
        with tempfile.TemporaryDirectory(prefix="ania-clock-") as tmp:
            root = Path(tmp)
            if not args.no_lateness:
                report["lateness"] = await measure_lateness(args, server, root)
            if not args.no_startup:
                report["startup"] = await measure_startup(args, server.base_url, root)
    finally:
        await asyncio.to_thread(server.close)
    return report


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    report = asyncio.run(main_async(args))
    print_table(report)
    if args.json:
        print(json.dumps(report, indent=2))
    lat = report.get("lateness", {})
    failed = sum(lat.get(k, {}).get("chat_failed", 0) for k in ("idle", "busy"))
    statuses = lat.get("run_statuses", {})
    failed += sum(v for k, v in statuses.items() if k not in ("success", "skipped", "interrupted"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
