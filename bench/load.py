"""Load: ``Agent.chat`` at 1/10/100/500 concurrent sessions against a model with 50 ms latency.

Every run is one conversation with one tool round: the model (after ``--latency`` seconds) asks
for the async ``lookup`` tool, the tool runs, the model (after the same delay again) answers. So
the ideal latency of a run is twice the model latency. The model is ``ania_nb.testing``'s
scripted server running in a **separate process** (a responder answers by the conversation's
state, so concurrent runs never get each other's replies); its CPU is not counted here.

For each concurrency C, C workers each run conversations back to back, every run in a fresh
session, until the level's run count is done. Measured per level, for ania-nb and for the
baseline, interleaved A-B-B-A so that drift on a shared machine hits both alike:

* runs/s (runs / wall time of the level) and p50/p99 of the per-run latency;
* CPU ms per run: ``time.process_time()`` of this process (all threads: the store thread and
  ``to_thread`` workers count) / runs;
* failed runs (status other than ``success``, or an exception).

The baseline is a hand-written ``openai.AsyncOpenAI(max_retries=0)`` loop with the typed
``client.chat.completions.create(...)``, the same system prompt, tool schema and messages, one
fresh message list per run (what a typical user writes; see ``engine_overhead.py``). Ratios are
ania / baseline.

Memory: ``RSS`` (``VmRSS`` of ``/proc/self/status``) of a fresh interpreter after ``--rss-runs``
runs (default 5,000) over as many distinct sessions, at concurrency 100, for ania-nb and for the
baseline loop, each in its own child process; reported with the RSS after the warm-up, so the
growth per session is visible.

    python bench/load.py            # full: about 5 minutes on 2 cores
    python bench/load.py --quick    # a short run to check that it works (about 1 minute)
    python bench/load.py --json     # JSON on stdout, the table on stderr
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from _raw import ServerProcess, assistant_message  # bench/ is the script's folder

MODEL = "bench-model"
API_KEY = "sk-bench"
USER_TEXT = "What is the capital of Norway? Look it up."
FINAL_TEXT = "The capital of Norway is Oslo."
LEVELS = (1, 10, 100, 500)
FULL_RUNS = {1: 200, 10: 1000, 100: 2000, 500: 3000}
QUICK_RUNS = {1: 20, 10: 100, 100: 300, 500: 500}

# The server process: a responder keyed on the conversation, so concurrent runs stay in step.
SERVER = """
import signal, sys, threading
from ania_nb.testing import ScriptedLLM, delay, reply, tool_call, usage

latency, final = float(sys.argv[1]), sys.argv[2]

def respond(request):
    last = request.messages[-1] if request.messages else {}
    if last.get("role") == "tool":
        return delay(latency, reply(final, usage=usage(180, 12)))
    call = tool_call("lookup", {"key": "capital of Norway"})
    return delay(latency, reply(tool_calls=[call], usage=usage(150, 20)))

llm = ScriptedLLM(responder=respond).start()
print("base_url=" + llm.base_url, flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
llm.close()
"""

_CAPITALS = {"norway": "Oslo", "france": "Paris"}


async def lookup(key: str) -> dict[str, Any]:
    """Look up a fact in the knowledge base.

    Args:
        key: what to look up
    """
    await asyncio.sleep(0)
    return {"key": key, "value": _CAPITALS.get(key.split()[-1].lower(), "unknown")}


RAW_SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a fact in the knowledge base.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string", "description": "what to look up"}},
                "required": ["key"],
            },
        },
    }
]


class Server(ServerProcess):
    """The scripted server in a child process."""

    def __init__(self, latency: float) -> None:
        super().__init__("-c", SERVER, str(latency), FINAL_TEXT)


# --------------------------------------------------------------------------- the two sides


class RawLoop:
    """The baseline: a hand-written typed ``create()`` loop, one fresh conversation per run."""

    name = "raw"

    def __init__(self, base_url: str, system_prompt: str, params: dict[str, Any]) -> None:
        import openai

        self.client = openai.AsyncOpenAI(
            base_url=base_url, api_key=API_KEY, max_retries=0, timeout=300.0
        )
        self.system_prompt = system_prompt
        self.params = params

    async def run(self, n: int) -> bool:
        """One conversation; True when it ended with the expected answer."""
        stamp = datetime.now().astimezone().isoformat(timespec="seconds")
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": f"[{stamp}] {USER_TEXT}"},
        ]
        for _ in range(5):
            response = await self.client.chat.completions.create(
                model=MODEL, messages=messages, tools=RAW_SCHEMAS, **self.params
            )
            msg = response.choices[0].message
            if not msg.tool_calls:
                return msg.content == FINAL_TEXT
            messages.append(assistant_message(msg))
            results = await asyncio.gather(
                *(lookup(**json.loads(c.function.arguments)) for c in msg.tool_calls)
            )
            messages += [
                {"role": "tool", "tool_call_id": c.id, "content": json.dumps(r)}
                for c, r in zip(msg.tool_calls, results, strict=True)
            ]
        return False

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.client.close()


class AniaSide:
    """One long-lived Agent (as in a kernel); every run is a fresh session."""

    name = "ania"

    def __init__(self, agent: Any, label: str) -> None:
        self.agent = agent
        self.label = label
        self.errors: dict[str, int] = {}

    async def run(self, n: int) -> bool:
        """One ``Agent.chat`` in a new session; True on success with the expected answer."""
        result = await self.agent.chat(USER_TEXT, session=f"{self.label}-{n}")
        if result.status == "success" and result.text == FINAL_TEXT:
            return True
        key = f"{result.status}: {(result.error or result.text)[:120]}"
        self.errors[key] = self.errors.get(key, 0) + 1
        return False

    async def aclose(self) -> None:
        """Close the agent."""
        await self.agent.aclose()


def make_agent(base_url: str, data_dir: Path) -> Any:
    """The Agent under test: one tool, non-streamed (like the baseline), isolated from ./skills."""
    from ania_nb import Agent, tool

    overrides = {
        "llm.stream": False,
        "agent.max_context_tokens": 0,
        "agent.builtin_tools": False,
        "skills.dir": str(data_dir / "no-skills"),
        "mcp.config_file": str(data_dir / "no-mcp.json"),
    }
    return Agent(
        base_url=base_url,
        api_key=API_KEY,
        model=MODEL,
        data_dir=data_dir,
        tools=[tool(lookup)],
        overrides=overrides,
    )


def make_sides(base_url: str, data_dir: Path) -> tuple[AniaSide, RawLoop]:
    """ania-nb and the baseline, sending the same prompt, parameters and tool."""
    agent = make_agent(base_url, data_dir)
    llm = agent.config.llm
    params = {
        k: getattr(llm, k)
        for k in ("temperature", "top_p", "max_tokens")
        if getattr(llm, k) is not None
    }
    return AniaSide(agent, "load"), RawLoop(base_url, agent.system_prompt, params)


# --------------------------------------------------------------------------- measurement


@dataclass
class Level:
    """What one side measured at one concurrency (summed over its interleaved halves)."""

    runs: int = 0
    failed: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    server_cpu: float = 0.0
    latencies: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """Per-run figures."""
        lat = sorted(self.latencies)
        return {
            "runs": self.runs,
            "failed": self.failed,
            "runs_per_s": self.runs / self.wall,
            "p50_ms": 1000 * _quantile(lat, 0.50),
            "p99_ms": 1000 * _quantile(lat, 0.99),
            "cpu_ms_per_run": 1000 * self.cpu / self.runs,
            "server_cpu_ms_per_run": 1000 * self.server_cpu / self.runs,
        }


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values) + 0.5) - 1))
    return sorted_values[index]


Runner = Callable[[int], Awaitable[bool]]


def _no_server_cpu() -> float:
    return 0.0


async def drive(
    run: Runner,
    concurrency: int,
    runs: int,
    start: int,
    into: Level,
    server_cpu: Callable[[], float] = _no_server_cpu,
) -> int:
    """``runs`` runs by ``concurrency`` workers; adds to ``into``; returns the next run number."""
    numbers = iter(range(start, start + runs))

    async def worker() -> None:
        for n in numbers:
            t0 = time.perf_counter()
            try:
                ok = await run(n)
            except Exception as exc:  # a failed run is counted, not fatal
                print(f"run {n}: {type(exc).__name__}: {exc}", file=sys.stderr)
                ok = False
            into.latencies.append(time.perf_counter() - t0)
            into.failed += not ok

    gc.collect()
    c0, w0, s0 = time.process_time(), time.perf_counter(), server_cpu()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    into.cpu += time.process_time() - c0
    into.wall += time.perf_counter() - w0
    into.server_cpu += server_cpu() - s0
    into.runs += runs
    return start + runs


async def measure_levels(args: argparse.Namespace, server: Server, root: Path) -> list[dict]:
    """Every level, ania and raw interleaved A-B-B-A."""
    ania, raw = make_sides(server.base_url, root / "levels")
    await ania.agent.start()
    counters = {"ania": 0, "raw": 0}
    rows = []
    try:
        for side in (ania, raw):  # warm-up: imports, connections, caches
            counters[side.name] = await drive(side.run, 10, args.warmup, 0, Level())
        for c in args.levels:
            runs = args.runs[c]
            results = {"ania": Level(), "raw": Level()}
            halves = [
                (raw, runs // 2),
                (ania, runs // 2),
                (ania, runs - runs // 2),
                (raw, runs - runs // 2),
            ]
            for side, n in halves:
                counters[side.name] = await drive(
                    side.run, c, n, counters[side.name], results[side.name], server.cpu
                )
            a, r = results["ania"].row(), results["raw"].row()
            row = {
                "concurrency": c,
                "ideal_runs_per_s": c / (2 * args.latency),
                "ania": a,
                "raw": r,
                "ratio": {
                    key: a[key] / r[key]
                    for key in ("runs_per_s", "p50_ms", "p99_ms", "cpu_ms_per_run")
                },
            }
            rows.append(row)
            print(_level_line(row), file=sys.stderr, flush=True)
    finally:
        if ania.errors:
            print(f"ania failures: {ania.errors}", file=sys.stderr)
        await ania.aclose()
        await raw.aclose()
    return rows


def _level_line(row: dict[str, Any]) -> str:
    a, r, x = row["ania"], row["raw"], row["ratio"]
    return (
        f"C={row['concurrency']:>3}  ania {a['runs_per_s']:7.1f} runs/s  p50 {a['p50_ms']:7.1f}  "
        f"p99 {a['p99_ms']:7.1f} ms  {a['cpu_ms_per_run']:5.2f} CPU ms/run  failed {a['failed']}"
        f"  |  raw {r['runs_per_s']:7.1f}  p50 {r['p50_ms']:7.1f}  p99 {r['p99_ms']:7.1f}  "
        f"{r['cpu_ms_per_run']:5.2f}  failed {r['failed']}  |  x: thr {x['runs_per_s']:.2f} "
        f"p50 {x['p50_ms']:.2f} p99 {x['p99_ms']:.2f} cpu {x['cpu_ms_per_run']:.2f}  |  server "
        f"CPU ms/run {a['server_cpu_ms_per_run']:.2f} / {r['server_cpu_ms_per_run']:.2f}"
    )


# --------------------------------------------------------------------------- memory (child)


def rss_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


async def rss_child(side_name: str, base_url: str, runs: int, concurrency: int, root: Path) -> dict:
    """In a fresh interpreter: RSS after warm-up, and after ``runs`` runs in distinct sessions."""
    ania, raw = make_sides(base_url, root)
    side: AniaSide | RawLoop = ania if side_name == "ania" else raw
    other = raw if side is ania else ania
    await other.aclose()  # only one side lives in this process
    if side is ania:
        await ania.agent.start()
    level = Level()
    try:
        start = await drive(side.run, 10, 50, 0, level)
        gc.collect()
        before = rss_kib()[0]
        level = Level()
        await drive(side.run, concurrency, runs, start, level)
        gc.collect()
        after, peak = rss_kib()
        held = None
        if side is ania:
            # Sessions kept in memory (``agent.sessions``, bounded by ``agent.max_sessions``).
            sessions = getattr(ania.agent, "sessions", None)
            held = len(sessions) if hasattr(sessions, "__len__") else None
    finally:
        await side.aclose()
    return {
        "side": side_name,
        "runs": runs,
        "failed": level.failed,
        "rss_after_warmup_kib": before,
        "rss_after_kib": after,
        "peak_kib": peak,
        "growth_bytes_per_session": 1024 * (after - before) / runs,
        "sessions_held_in_memory": held,
    }


def measure_rss(args: argparse.Namespace, base_url: str, root: Path) -> dict[str, Any]:
    """Run the memory test for each side in its own child process."""
    out = {}
    for side in ("ania", "raw"):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--rss-child",
                side,
                "--base-url",
                base_url,
                "--rss-runs",
                str(args.rss_runs),
                "--data-dir",
                str(root / f"rss-{side}"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"memory child ({side}) failed:\n{proc.stderr[-3000:]}")
        out[side] = json.loads(proc.stdout.strip().splitlines()[-1])
        o = out[side]
        print(
            f"RSS {side}: {o['rss_after_warmup_kib'] / 1024:.1f} MiB after warm-up -> "
            f"{o['rss_after_kib'] / 1024:.1f} MiB after {o['runs']} runs in distinct sessions "
            f"({o['growth_bytes_per_session'] / 1024:.1f} KiB/session; failed {o['failed']}; "
            f"sessions held: {o['sessions_held_in_memory']})",
            file=sys.stderr,
            flush=True,
        )
    return out


# --------------------------------------------------------------------------- main


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
        "openai": importlib.metadata.version("openai"),
        "commit": commit,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="few runs per level, 500-run memory test")
    p.add_argument("--latency", type=float, default=0.05, help="model latency per call, s")
    p.add_argument("--levels", type=int, nargs="+", default=list(LEVELS), help="concurrencies")
    p.add_argument("--rss-runs", type=int, default=None, help="memory test runs (default 5000)")
    p.add_argument("--no-rss", action="store_true", help="skip the memory test")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    # Internal: the memory test's child process.
    p.add_argument("--rss-child", choices=("ania", "raw"), help=argparse.SUPPRESS)
    p.add_argument("--base-url", help=argparse.SUPPRESS)
    p.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    table = QUICK_RUNS if args.quick else FULL_RUNS
    args.runs = {c: table.get(c, 4 * c if args.quick else 10 * c) for c in args.levels}
    args.warmup = 10 if args.quick else 40
    if args.rss_runs is None:
        args.rss_runs = 500 if args.quick else 5000
    return args


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    """Start the server, measure the levels and memory, stop the server."""
    server = Server(args.latency)
    try:
        with tempfile.TemporaryDirectory(prefix="ania-load-") as tmp:
            root = Path(tmp)
            report: dict[str, Any] = {"machine": machine(), "latency_s": args.latency}
            report["levels"] = await measure_levels(args, server, root)
            if not args.no_rss:
                report["memory"] = await asyncio.to_thread(measure_rss, args, server.base_url, root)
            return report
    finally:
        await asyncio.to_thread(server.close)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    if args.rss_child:
        result = asyncio.run(
            rss_child(args.rss_child, args.base_url, args.rss_runs, 100, args.data_dir)
        )
        print(json.dumps(result))
        return 0
    report = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(report, indent=2))
    failed = sum(row[side]["failed"] for row in report["levels"] for side in ("ania", "raw"))
    failed += sum(m["failed"] for m in report.get("memory", {}).values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
