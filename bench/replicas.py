"""Replicas: throughput and event→reply latency of 1, 2 and 3 ``ania-nb serve`` on one PostgreSQL.

What runs where (issue 31, check 4):

* the model: ``bench/runner.py``'s scripted server in its **own process**, answering every call
  after ``--latency`` seconds (50 ms) naming the message it answers (one model call a message);
* the store: one PostgreSQL cluster, a throwaway one started here from the machine's binaries
  (``tests/pg_cluster.py``; fsync off unless ``--durable``), or ``--pg-url`` (a URL that may
  create databases); every block gets a fresh database;
* the replicas: N real ``ania-nb serve`` processes (forward mode, each its own data directory,
  all with ``store.url`` on the block's database; ``--replica-id rN`` when serve has the flag);
* the chat platform: this process, ``ania_nb.testing.onebot`` as NapCat's forward-WS server with
  several clients: every event goes to every replica (buffered per connection), every send is
  recorded with the replica that sent it.

Each block: start N replicas, warm up (20 chats × 2), pause, then ``--chats`` closed-loop chats
of ``--messages`` messages each (half private, half groups @-ing the bot; a chat sends its next
message once its reply arrived), pause, stop the replicas. Blocks run 1, 2, 3, 3, 2, 1 replicas
(``--order``) in the same run; per replica count the blocks are summed.

Printed per replica count: throughput (messages / wall time), p50/p99 from the event frame to
the reply's send action, duplicate answers (a message answered by more than one send), replica
CPU ms per message, and PostgreSQL commits per message: the ``pg_stat_database.xact_commit``
delta of the block's database over the measured part (statistics are flushed by idle backends
within a second: the pauses before both readings are 1.5 s, their background commits counted
too) and the write transactions (``pg_current_xact_id()`` delta, exact, cluster-wide). Then the
scaling ratio 3 vs 1 replicas (target ≥ 2.2×) and the on-paper plan past one host: commits per
message fitted as ``a + b·N`` over N, the cluster's measured commit capacity (8 connections
doing one-row insert transactions for 3 s), and what that allows at 10 replicas.

    python bench/replicas.py                   # 200 chats × 5 per block, about 5 min
    python bench/replicas.py --quick           # 60 chats × 3, 1 and 3 replicas, about 2 min
    python bench/replicas.py --pg-url postgresql://USER@127.0.0.1:5432/postgres --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the OneBot implementation, the PG cluster

from _raw import ServerProcess  # noqa: E402  (bench/ is the script's folder)
from runner import SERVER, _quantile, machine, proc_cpu  # noqa: E402

MODEL = "bench-model"
API_KEY = "sk-bench"
TOKEN = "bench-token"
SELF_ID = "10000"
GROUP_BASE = 7_000_000
WARMUP = (20, 2)
PAUSE = 1.5  # idle backends flush their statistics within a second


def chat_of(uid: int) -> tuple[str, int]:
    """Even user ids chat privately, odd ones in their own group (one speaker per group)."""
    return ("group", GROUP_BASE + uid) if uid % 2 else ("private", uid)


def toml(sections: dict[str, dict[str, Any]]) -> str:
    """A small TOML file of string, number and boolean keys."""
    lines: list[str] = []
    for name, keys in sections.items():
        lines.append(f"[{name}]")
        for key, value in keys.items():
            shown = (
                ("true" if value else "false")
                if isinstance(value, bool)
                else repr(value)
                if isinstance(value, int | float)
                else json.dumps(str(value))
            )
            lines.append(f"{key} = {shown}")
        lines.append("")
    return "\n".join(lines)


# =========================================================================== the store


class Postgres:
    """Where the blocks' databases live: a throwaway cluster, or ``--pg-url``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.admin_url = args.pg_url
        self.server: Any = None
        if not self.admin_url:
            from pg_cluster import PgServer, find_bindir, unavailable_reason

            why = unavailable_reason()
            if why:
                raise SystemExit(f"no PostgreSQL to start: {why}; or give --pg-url")
            bindir = find_bindir()
            assert bindir is not None
            self.server = PgServer(bindir, durable=args.durable)
            cluster = self.server.start()
            self.cluster = cluster
            self.admin_url = cluster.url()

    def fresh(self) -> tuple[str, str]:
        """A new empty database: its name and URL."""
        if self.server is not None:
            name = f"bench_{secrets.token_hex(4)}"
            self.server.create_database(name)
            return name, self.cluster.url(name)
        from store_backends import fresh_database

        return fresh_database(self.admin_url)

    def drop(self, name: str) -> None:
        """Drop a database made by `fresh`."""
        if self.server is not None:
            self.server.drop_database(name)
            return
        from store_backends import drop_database

        drop_database(self.admin_url, name)

    def close(self) -> None:
        """Stop the throwaway cluster (if this started one)."""
        if self.server is not None:
            self.server.stop()


def counters(url: str) -> dict[str, int]:
    """The database's committed transactions so far, and the cluster's next transaction id."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        xid = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert commits is not None and xid is not None
    return {"xact_commit": int(commits[0]), "xid": int(xid[0])}


def commit_capacity(url: str, seconds: float = 3.0, connections: int = 8) -> float:
    """One-row insert transactions per second the cluster takes from ``connections`` at once."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_commits (id BIGSERIAL, at DOUBLE PRECISION)")
    done = [0] * connections
    stop = threading.Event()

    def worker(slot: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute("INSERT INTO bench_commits (at) VALUES (%s)", (time.time(),))
                done[slot] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)  # the measured interval
    stop.set()
    for thread in threads:
        thread.join()
    return sum(done) / seconds


# =========================================================================== the replicas


class Replica:
    """One ``ania-nb serve`` process, its stderr read as it comes."""

    def __init__(self, name: str, config: Path, replica_flag: bool) -> None:
        self.name = name
        self.config = config
        self.flag = replica_flag
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []
        self.ready = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start it (environment without the developer's ANIA_* settings)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANIA_")}
        options = ["--replica-id", self.name] if self.flag else []
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ania_nb",
            "serve",
            "--config",
            str(self.config),
            *options,
            cwd=self.config.parent,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        async for raw in self.proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append(line)
            if "ania_nb.runner: ready" in line:
                self.ready.set()

    async def wait_ready(self, within: float = 120) -> None:
        """Until serve logs that it is ready (its log when it exits first)."""
        assert self._reader is not None
        waiting = asyncio.ensure_future(self.ready.wait())
        await asyncio.wait({waiting, self._reader}, timeout=within, return_when="FIRST_COMPLETED")
        if not self.ready.is_set():
            waiting.cancel()
            raise RuntimeError(f"replica {self.name} did not start:\n" + "\n".join(self.lines))

    def cpu(self) -> float:
        """CPU seconds it used so far."""
        assert self.proc is not None
        return proc_cpu(self.proc.pid)

    async def stop(self) -> int:
        """SIGTERM and wait (SIGKILL after 60 s)."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 60)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        return self.proc.returncode if self.proc.returncode is not None else -1


# =========================================================================== the chats


@dataclass
class Tally:
    """What one replica count measured, summed over its blocks."""

    messages: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    commits: int = 0
    writes: int = 0
    duplicates: int = 0
    unexpected: int = 0
    lost: int = 0
    latencies: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """Per-message figures."""
        lat = sorted(self.latencies)
        n = max(1, self.messages)
        return {
            "messages": self.messages,
            "messages_per_s": self.messages / self.wall if self.wall else float("nan"),
            "p50_ms": 1000 * _quantile(lat, 0.50),
            "p99_ms": 1000 * _quantile(lat, 0.99),
            "cpu_ms_per_message": 1000 * self.cpu / n,
            "commits_per_message": self.commits / n,
            "write_transactions_per_message": self.writes / n,
            "duplicate_answers": self.duplicates,
            "unexpected_sends": self.unexpected,
            "lost": self.lost,
        }


class Platform:
    """The OneBot side: the implementation, the chats' waiting replies, who answered what."""

    def __init__(self) -> None:
        from ania_nb.testing.onebot import OneBotImpl

        self.impl = OneBotImpl(SELF_ID, TOKEN, buffered=True)
        self.impl.on_action = self._on_action
        self.waiting: dict[str, asyncio.Future[float]] = {}  # message tag -> time of its reply
        self.answers: dict[str, int] = {}
        self.unexpected = 0
        self.url = ""
        self.next_uid = 2

    async def start(self) -> None:
        """Listen on a free port."""
        self.url = await self.impl.serve()

    def _on_action(self, action: Any) -> None:
        if not action.name.startswith("send_"):
            return
        arrived = time.perf_counter()
        tags = [word for word in action.text.split() if word.startswith("msg#")]
        for tag in tags:
            self.answers[tag] = self.answers.get(tag, 0) + 1
            waiter = self.waiting.pop(tag, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(arrived)
        if not tags:
            self.unexpected += 1

    def uids(self, chats: int) -> int:
        """The first of ``chats`` fresh user ids (parity kept: even private, odd group)."""
        base = self.next_uid
        self.next_uid += chats + (chats % 2)
        return base

    async def block(self, chats: int, messages: int, wait: float) -> tuple[list[float], int]:
        """Closed-loop chats; the event→reply latencies and how many replies never came."""
        latencies: list[float] = []
        lost = 0
        base = self.uids(chats)

        async def one_chat(uid: int) -> None:
            nonlocal lost
            kind, cid = chat_of(uid)
            for k in range(messages):
                tag = f"msg#{uid}-{k}"
                reply = asyncio.get_running_loop().create_future()
                self.waiting[tag] = reply
                text = f"{tag} what's the weather like today?"
                t0 = time.perf_counter()
                if kind == "private":
                    await self.impl.private_message(uid, text, nickname=f"user{uid}")
                else:
                    await self.impl.group_message(cid, uid, text, at_bot=True)
                try:
                    latencies.append(await asyncio.wait_for(reply, wait) - t0)
                except TimeoutError:
                    lost += messages - k
                    return

        await asyncio.gather(*(one_chat(base + i) for i in range(chats)))
        return latencies, lost

    def duplicates(self) -> int:
        """Extra answers so far (a message answered by more than one send)."""
        return sum(n - 1 for n in self.answers.values() if n > 1)


# =========================================================================== the blocks


class Bench:
    """The model server, the store, the platform; one block per replica count."""

    def __init__(self, args: argparse.Namespace, base_url: str, store: Postgres) -> None:
        self.args = args
        self.base_url = base_url
        self.store = store
        self.platform = Platform()
        self.replica_flag = False
        self.tallies: dict[int, Tally] = {}

    def config(self, folder: Path, name: str, store_url: str) -> Path:
        """The replica's ania.toml (forward mode to the platform, store on the block's DB)."""
        folder.mkdir(parents=True)
        path = folder / "ania.toml"
        path.write_text(
            toml(
                {
                    "llm": {"base_url": self.base_url, "api_key": API_KEY, "model": MODEL},
                    "store": {"data_dir": str(folder / "data"), "url": store_url},
                    "skills": {"dir": str(folder / "no-skills")},
                    "mcp": {"config_file": str(folder / "no-mcp.json")},
                    "agent": {"queue_size": 1000},
                    "runner": {
                        "mode": "forward",
                        "url": f"{self.platform.url}/?client={name}",
                        "access_token": TOKEN,
                        "reconnect_max": 1,
                        "queued_notice": "",
                        "grace_seconds": 5,
                    },
                }
            )
        )
        return path

    async def block(self, replicas: int, tmp: Path) -> None:
        """One block with ``replicas`` replicas on a fresh database."""
        a = self.args
        name, url = await asyncio.to_thread(self.store.fresh)
        folder = tmp / name
        running = [
            Replica(f"r{i}", self.config(folder / f"r{i}", f"r{i}", url), self.replica_flag)
            for i in range(1, replicas + 1)
        ]
        try:
            for replica in running:
                await replica.start()
            for replica in running:
                await replica.wait_ready()
            names = {r.name for r in running}
            await self.platform.impl.wait_until(
                lambda: names <= self.platform.impl.connected_clients, 60, "every replica"
            )
            await self.platform.block(*WARMUP, a.reply_timeout)
            await asyncio.sleep(PAUSE)  # statistics flushed (see the module docstring)
            before = await asyncio.to_thread(counters, url)
            cpu0 = sum(r.cpu() for r in running)
            dup0, unexpected0 = self.platform.duplicates(), self.platform.unexpected
            t0 = time.perf_counter()
            latencies, lost = await self.platform.block(a.chats, a.messages, a.reply_timeout)
            wall = time.perf_counter() - t0
            cpu = sum(r.cpu() for r in running) - cpu0
            await asyncio.sleep(PAUSE)
            after = await asyncio.to_thread(counters, url)
            tally = self.tallies.setdefault(replicas, Tally())
            tally.messages += len(latencies) + lost
            tally.wall += wall
            tally.cpu += cpu
            tally.commits += after["xact_commit"] - before["xact_commit"]
            tally.writes += after["xid"] - before["xid"]
            tally.duplicates += self.platform.duplicates() - dup0
            tally.unexpected += self.platform.unexpected - unexpected0
            tally.lost += lost
            tally.latencies += latencies
            row = Tally(len(latencies) + lost, wall, cpu, latencies=latencies).row()
            print(
                f"  {replicas} replica(s): {row['messages_per_s']:.1f} msg/s, "
                f"p50 {row['p50_ms']:.0f} ms, p99 {row['p99_ms']:.0f} ms, lost {lost}",
                file=sys.stderr,
                flush=True,
            )
        finally:
            codes = await asyncio.gather(*(r.stop() for r in running if r.proc is not None))
            if any(code != 0 for code in codes):
                print(f"  replica exit codes {codes}", file=sys.stderr)
            await asyncio.to_thread(self.store.drop, name)

    async def run(self) -> dict[str, Any]:
        """Every block in ``--order``; the table, the ratio, the plan."""
        help_text = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ania_nb", "serve", "--help", stdout=asyncio.subprocess.PIPE
        )
        out, _ = await help_text.communicate()
        self.replica_flag = b"--replica-id" in out
        await self.platform.start()
        with tempfile.TemporaryDirectory(prefix="ania-replicas-bench-") as tmp:
            for replicas in self.args.order:
                await self.block(replicas, Path(tmp))
        await self.platform.impl.aclose()
        rows = {n: self.tallies[n].row() for n in sorted(self.tallies)}
        report: dict[str, Any] = {"rows": rows, "replica_id_flag": self.replica_flag}
        if 1 in rows and 3 in rows:
            report["scaling_3_vs_1"] = rows[3]["messages_per_s"] / rows[1]["messages_per_s"]
        report["plan"] = await asyncio.to_thread(self.plan, rows)
        return report

    def plan(self, rows: dict[int, dict[str, Any]]) -> dict[str, Any]:
        """Commits per message as a + b·N, the cluster's commit capacity, 10 replicas on paper."""
        counts = sorted(rows)
        plan: dict[str, Any] = {}
        if len(counts) >= 2:
            xs = [float(n) for n in counts]
            ys = [rows[n]["commits_per_message"] for n in counts]
            slope, intercept = statistics.linear_regression(xs, ys)
            plan.update(
                commits_per_message_fixed=intercept,
                commits_per_message_per_replica=slope,
                commits_per_message_at_10=intercept + 10 * slope,
            )
        if not self.args.no_capacity:
            name, url = self.store.fresh()
            try:
                plan["commit_capacity_per_s"] = commit_capacity(url)
            finally:
                self.store.drop(name)
            if "commits_per_message_at_10" in plan:
                plan["messages_per_s_at_10_bound_by_commits"] = (
                    plan["commit_capacity_per_s"] / plan["commits_per_message_at_10"]
                )
        return plan


def show(report: dict[str, Any]) -> None:
    """The table on stderr."""
    print(
        "replicas  msgs   msg/s   p50 ms   p99 ms  CPU ms/msg  commits/msg  writes/msg  dup  lost",
        file=sys.stderr,
    )
    for n, r in report["rows"].items():
        print(
            f"{n:>8} {r['messages']:>5} {r['messages_per_s']:7.1f} {r['p50_ms']:8.1f} "
            f"{r['p99_ms']:8.1f} {r['cpu_ms_per_message']:11.2f} {r['commits_per_message']:12.2f} "
            f"{r['write_transactions_per_message']:11.2f} {r['duplicate_answers']:4} {r['lost']:5}",
            file=sys.stderr,
        )
    if "scaling_3_vs_1" in report:
        print(
            f"scaling 3 vs 1 replicas: {report['scaling_3_vs_1']:.2f}× (target ≥ 2.2×)",
            file=sys.stderr,
        )
    plan = report["plan"]
    if "commits_per_message_at_10" in plan:
        print(
            f"commits per message ≈ {plan['commits_per_message_fixed']:.2f} + "
            f"{plan['commits_per_message_per_replica']:.2f}·N → "
            f"{plan['commits_per_message_at_10']:.1f} at 10 replicas",
            file=sys.stderr,
        )
    if "commit_capacity_per_s" in plan:
        line = f"cluster commit capacity {plan['commit_capacity_per_s']:.0f}/s"
        if "messages_per_s_at_10_bound_by_commits" in plan:
            line += (
                f" → ≤ {plan['messages_per_s_at_10_bound_by_commits']:.0f} msg/s "
                "for 10 replicas on this server"
            )
        print(line, file=sys.stderr)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="60 chats × 3; order 1, 3")
    p.add_argument("--chats", type=int, default=None, help="closed-loop chats per block (200)")
    p.add_argument("--messages", type=int, default=None, help="messages per chat (5)")
    p.add_argument("--latency", type=float, default=0.05, help="model latency per call, s")
    p.add_argument(
        "--order", default=None, help="replica counts of the blocks, e.g. 1,2,3,3,2,1 (default)"
    )
    p.add_argument("--pg-url", default=os.environ.get("ANIA_BENCH_PG_URL", ""))
    p.add_argument("--durable", action="store_true", help="throwaway cluster with fsync on")
    p.add_argument("--no-capacity", action="store_true", help="skip the commit-capacity probe")
    p.add_argument("--reply-timeout", type=float, default=60.0, help="s before a reply is lost")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    args = p.parse_args(argv)
    if args.chats is None:
        args.chats = 60 if args.quick else 200
    if args.messages is None:
        args.messages = 3 if args.quick else 5
    order = args.order or ("1,3" if args.quick else "1,2,3,3,2,1")
    args.order = [int(n) for n in order.split(",")]
    return args


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    """Start the model server and the store, run the blocks, stop everything."""
    server = await asyncio.to_thread(ServerProcess, "-c", SERVER, str(args.latency))
    store = await asyncio.to_thread(Postgres, args)
    try:
        report = await Bench(args, server.base_url, store).run()
        report.update(
            machine=machine(),
            latency_s=args.latency,
            chats=args.chats,
            messages_per_chat=args.messages,
            order=args.order,
            durable=args.durable or bool(args.pg_url),
        )
        return report
    finally:
        await asyncio.to_thread(store.close)
        await asyncio.to_thread(server.close)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    report = asyncio.run(main_async(args))
    show(report)
    if args.json:
        print(json.dumps(report, indent=2))
    failed = sum(r["lost"] + r["duplicate_answers"] for r in report["rows"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
