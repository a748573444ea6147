"""Several ``ania-nb serve`` replicas on one PostgreSQL store (issue 31, check 1).

The OneBot test implementation plays NapCat's forward-WS server with several clients
(``ania_nb.testing.onebot``, buffered: every event goes to every connected replica, each at its own
pace, and every action records which replica sent it). Three ``ania-nb serve`` processes, each
with its own data directory, share one fresh PostgreSQL database of the suite's cluster and the
scripted model, which answers at once naming the message keys it read (``re: msg-<chat>-<n> …``).
1,000 events over 100 chats (50 private, 50 groups @-ing the bot) are sent fast while one
replica is killed with SIGKILL and started again, or frozen with SIGSTOP for 5 s. Once every
message has its answer (bounded), every replica is stopped and the contract is checked:

- every message is answered exactly once, or named by exactly one restart notice. A message
  answered more than once must have its reply (or notice) among the outbox rows that were
  ``sending`` right after the kill, and there are no more such duplicates than those rows (OneBot
  has no idempotency key: a send cut off between the frame and the "sent" mark may go again);
- no two runs of a session overlap in time (``runs.started_at``/``finished_at``; a run of the
  killed process ended at the kill at the latest);
- every run that finished with a reply had that reply sent at least once — except a reply the
  killed process had claimed (``sending``, owned by its pid) and was cut off from: that row is
  ``uncertain`` (issue 29's rule: it may have been written, so it is never written again) and
  its messages count as cut off, never as lost. Any other ``uncertain`` row is a failure.

The failure message names the message ids answered more than once (and by which replicas), the
ones never answered, and the sessions whose runs overlapped.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import signal
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _waits import until
from test_runner_serve import ANIA_NB, TOKEN, Serve, write_config

from ania_nb.testing import ScriptedLLM, reply
from ania_nb.testing.onebot import OneBotImpl

pytestmark = pytest.mark.asyncio(loop_scope="function")

KEY = re.compile(r"msg-\d+-\d+")
PRIVATE_USERS = range(410_001, 410_051)  # 50 private chats
GROUPS = range(420_001, 420_051)  # 50 groups, one speaker each (group id + 100,000)
EVENTS = 1000
EVERY = 0.008  # seconds between two events: the stream lasts about 10 s
REPLICAS = ("r1", "r2", "r3")
VICTIM = "r2"
RESTART_WORDS = "重启"  # in the restart notice (and the shutdown notice, which names no key)


def answering_model(request: Any) -> Any:
    """Answer at once, naming every message key of the turn's user text."""
    turn = next((m for m in reversed(request.messages) if m.get("role") == "user"), {})
    keys = KEY.findall(json.dumps(turn.get("content"), ensure_ascii=False))
    return reply("re: " + (" ".join(keys) if keys else "nothing"))


@functools.cache
def replica_id_flag() -> bool:
    """Whether ``ania-nb serve`` takes ``--replica-id`` (else the replicas keep default ids)."""
    help_text = subprocess.run(
        [ANIA_NB, "serve", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    return "--replica-id" in help_text


def query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Rows of ``sql`` on the shared database, as dicts (blocking: call it in a thread)."""
    import psycopg
    from psycopg.rows import dict_row

    with psycopg.connect(url, row_factory=dict_row) as conn:
        return list(conn.execute(sql, params).fetchall())


def owner_pid(owner: str | None) -> int | None:
    """The pid in an outbox row's owner column (host, pid, start token; tab-separated)."""
    parts = (owner or "").split("\t")
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def outbox_keys(url: str, rows: list[dict[str, Any]]) -> set[str]:
    """The message keys outbox ``rows`` answer: named in their text, or their inbox rows'."""
    inbox_ids: set[int] = set()
    keys: set[str] = set()
    for row in rows:
        payload = json.loads(row["payload"])
        keys.update(KEY.findall(payload.get("text") or ""))
        inbox_ids.update(int(i) for i in (payload.get("meta") or {}).get("inbox") or ())
    if inbox_ids:
        found = query(url, "SELECT payload FROM inbox WHERE id = ANY(%s)", (sorted(inbox_ids),))
        for row in found:
            keys.update(KEY.findall(row["payload"]))
    return keys


@dataclass
class Cluster:
    """The implementation, the replicas (each with its own data dir) and what happened to them."""

    impl: OneBotImpl
    url: str
    configs: dict[str, Path]
    options: dict[str, tuple[str, ...]]
    procs: dict[str, list[Serve]] = field(default_factory=dict)
    killed: dict[int, float] = field(default_factory=dict)  # pid -> time.time() of the kill -9
    in_flight: list[dict[str, Any]] = field(default_factory=list)  # outbox 'sending' at the kill
    frozen: list[str] = field(default_factory=list)
    tasks: list[asyncio.Future[None]] = field(default_factory=list)  # disruptions still going

    def current(self, name: str) -> Serve:
        """The replica's latest process."""
        return self.procs[name][-1]

    async def start(self, name: str) -> Serve:
        """Start (or start again) one replica; it dials the implementation as client ``name``."""
        proc = await Serve(self.configs[name], *self.options[name]).start()
        self.procs.setdefault(name, []).append(proc)
        return proc

    async def kill(self, name: str) -> None:
        """kill -9 one replica; note the outbox rows it may have been writing.

        Those are the rows ``sending`` just before or just after the kill (read both: a takeover
        may resend and mark one before the second read). Other replicas' rows in flight then
        count too, which only loosens the bound.
        """
        proc = self.current(name)
        assert proc.proc is not None
        sending = "SELECT id, payload FROM outbox WHERE state = 'sending'"
        before = await asyncio.to_thread(query, self.url, sending)
        self.killed[proc.proc.pid] = time.time()
        assert await proc.stop(signal.SIGKILL) == -signal.SIGKILL
        after = await asyncio.to_thread(query, self.url, sending)
        self.in_flight = list({row["id"]: row for row in [*before, *after]}.values())

    async def freeze(self, name: str, seconds: float) -> None:
        """SIGSTOP one replica for ``seconds`` (the scenario's length, not a wait), then SIGCONT."""
        proc = self.current(name)
        proc.send(signal.SIGSTOP)
        self.frozen.append(name)
        try:
            await asyncio.sleep(seconds)
        finally:
            proc.send(signal.SIGCONT)
            self.frozen.remove(name)

    async def stop_all(self) -> dict[str, int | None]:
        """SIGTERM every live replica at once; their exit codes (None: still running after 40 s)."""

        async def stop(proc: Serve) -> int | None:
            try:
                return await proc.stop()
            except TimeoutError:
                return None

        live = {name: self.current(name) for name in self.procs}
        codes = await asyncio.gather(*(stop(proc) for proc in live.values()))
        return dict(zip(live, codes, strict=True))

    async def cleanup(self) -> None:
        """Kill whatever still runs (a frozen one is woken first)."""
        for task in self.tasks:
            task.cancel()
        for name in list(self.frozen):
            self.current(name).send(signal.SIGCONT)
        for procs in self.procs.values():
            for proc in procs:
                await proc.kill()

    @property
    def logs(self) -> str:
        """Every process's log."""
        return "\n".join(p.log for procs in self.procs.values() for p in procs)


class Chats:
    """100 chats sending ``msg-<chat>-<n>`` in turn; the message id of every key."""

    def __init__(self, impl: OneBotImpl) -> None:
        self.impl = impl
        self.ids: dict[str, int] = {}
        self.chats = [("private", u) for u in PRIVATE_USERS] + [("group", g) for g in GROUPS]

    async def send(self, events: int, at: dict[int, Callable[[], Awaitable[None]]]) -> None:
        """Send ``events`` messages, ``EVERY`` s apart; ``at[i]`` is awaited before event i."""
        for i in range(events):
            if i in at:
                await at[i]()
            kind, chat = self.chats[i % len(self.chats)]
            key = f"msg-{chat}-{i // len(self.chats) + 1}"
            if kind == "private":
                self.ids[key] = await self.impl.private_message(chat, key)
            else:
                self.ids[key] = await self.impl.group_message(
                    chat, chat + 100_000, key, at_bot=True
                )
            await asyncio.sleep(EVERY)  # a steady stream, not a wait for something


def sends(impl: OneBotImpl) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Who answered each key, and who sent a restart notice naming it (one entry per send)."""
    answers: dict[str, list[str]] = defaultdict(list)
    notices: dict[str, list[str]] = defaultdict(list)
    for action in impl.actions:
        if not action.name.startswith("send_") or (action.response or {}).get("status") != "ok":
            continue
        target = notices if RESTART_WORDS in action.text else answers
        for key in KEY.findall(action.text):
            target[key].append(action.client)
    return answers, notices


def overlapping_runs(runs: list[dict[str, Any]], killed: dict[int, float]) -> list[str]:
    """Pairs of runs of one session whose [started_at, finished_at] intervals overlap.

    A run still open ends never; one of a killed process ended at the kill at the latest.
    """
    by_session: dict[str, list[tuple[float, float, dict[str, Any]]]] = defaultdict(list)
    for run in runs:
        end = run["finished_at"] if run["finished_at"] is not None else math.inf
        if run.get("owner_pid") in killed:
            end = min(end, killed[run["owner_pid"]])
        by_session[run["session"]].append((run["started_at"], end, run))
    found = []
    for session, spans in sorted(by_session.items()):
        spans.sort(key=lambda span: span[0])
        latest_end, latest = -math.inf, None
        for start, end, run in spans:
            if latest is not None and start < latest_end:
                found.append(
                    f"{session}: run {run['id']} (pid {run.get('owner_pid')}, {run['status']}) "
                    f"started {latest_end - start:.3f} s before run {latest['id']} "
                    f"(pid {latest.get('owner_pid')}, {latest['status']}) ended"
                )
            if end > latest_end:
                latest_end, latest = end, run
    return found


def shown(
    keys: list[str], ids: dict[str, int], detail: Callable[[str], str], limit: int = 15
) -> str:
    """``key (message_id N): detail`` for the first ``limit`` keys."""
    rows = [f"{k} (message_id {ids.get(k)}): {detail(k)}" for k in keys[:limit]]
    more = f"\n    … and {len(keys) - limit} more" if len(keys) > limit else ""
    return "\n    " + "\n    ".join(rows) + more


async def check_contract(
    cluster: Cluster,
    chats: Chats,
    settled: bool,
    codes: dict[str, int | None],
    seconds: dict[str, float],
) -> dict[str, Any]:
    """Every check of the issue's contract; one AssertionError listing every violation."""
    answers, notices = sends(cluster.impl)
    keys = sorted(chats.ids)
    runs = await asyncio.to_thread(query, cluster.url, "SELECT * FROM runs ORDER BY id")
    uncertain = await asyncio.to_thread(
        query, cluster.url, "SELECT id, owner, payload FROM outbox WHERE state = 'uncertain'"
    )
    cut_off = [row for row in uncertain if owner_pid(row["owner"]) in cluster.killed]
    stray = [row for row in uncertain if owner_pid(row["owner"]) not in cluster.killed]
    cut_off_keys = await asyncio.to_thread(outbox_keys, cluster.url, cut_off)
    cut_off_texts = [json.loads(row["payload"]).get("text") or "" for row in cut_off]
    in_flight_keys = await asyncio.to_thread(outbox_keys, cluster.url, cluster.in_flight)
    states = {
        table: Counter(r["state"] for r in await asyncio.to_thread(query, cluster.url, sql))
        for table, sql in (
            ("inbox", "SELECT state FROM inbox"),
            ("outbox", "SELECT state FROM outbox"),
        )
    }

    def times(k: str) -> int:
        return len(answers.get(k, ())) + len(notices.get(k, ()))

    def who(k: str) -> str:
        return f"answered by {answers.get(k, [])}, notices by {notices.get(k, [])}"

    twice = [k for k in keys if times(k) > 1]
    lost = [k for k in keys if times(k) == 0 and k not in cut_off_keys]
    extra_sends = sum(times(k) - 1 for k in twice)
    unexplained = [k for k in twice if k not in in_flight_keys]
    sent_texts = [a.text for a in cluster.impl.actions if a.name.startswith("send_")]
    replies = [r for r in runs if r["status"] == "success" and (r["reply"] or "").strip()]
    unsent = [
        r
        for r in replies
        if not any(r["reply"].strip() in t for t in [*sent_texts, *cut_off_texts])
    ]
    overlaps = overlapping_runs(runs, cluster.killed)

    problems = []
    if not settled:
        problems.append("not every message had an answer or notice within the time limit")
    if twice and (unexplained or extra_sends > len(cluster.in_flight)):
        problems.append(
            f"{len(twice)} messages answered more than once ({extra_sends} extra sends; allowed: "
            f"only messages of the {len(cluster.in_flight)} outbox rows 'sending' at the kill, "
            f"{len(unexplained)} are not):" + shown(unexplained or twice, chats.ids, who)
        )
    if lost:
        problems.append(
            f"{len(lost)} messages never answered nor announced, and not cut off at the kill:"
            + shown(lost, chats.ids, lambda k: "no trace")
        )
    if stray:
        problems.append(
            f"{len(stray)} 'uncertain' outbox rows of a process that was not killed: "
            + ", ".join(f"row {r['id']} (owner {r['owner']!r})" for r in stray[:10])
        )
    if overlaps:
        problems.append(
            f"{len(overlaps)} overlapping runs of one session:\n    " + "\n    ".join(overlaps[:15])
        )
    if unsent:
        problems.append(
            f"{len(unsent)} finished runs whose reply was never sent: "
            + ", ".join(f"run {r['id']} ({r['session']}): {r['reply'][:60]!r}" for r in unsent[:10])
        )
    expected = {name: 0 for name in cluster.procs}
    if codes != expected:
        problems.append(f"exit codes after SIGTERM {codes}, expected {expected}")
    if "Future exception was never retrieved" in cluster.logs:
        problems.append("a replica logged 'Future exception was never retrieved'")
    summary = {
        "messages": len(keys),
        "answered_once": sum(1 for k in keys if len(answers.get(k, ())) == 1 and times(k) == 1),
        "notified_once": sum(1 for k in keys if len(notices.get(k, ())) == 1 and times(k) == 1),
        "answered_more_than_once": len(twice),
        "extra_sends": extra_sends,
        "never_answered": len(lost),
        "cut_off_at_kill": len(cut_off_keys - set(answers) - set(notices)),
        "sending_at_kill": len(cluster.in_flight),
        "overlapping_runs": len(overlaps),
        "runs": dict(Counter(r["status"] for r in runs)),
        "sends_by_replica": dict(
            Counter(a.client for a in cluster.impl.actions if a.name.startswith("send_"))
        ),
        **{f"{table}_states": dict(c) for table, c in states.items()},
        "seconds": seconds,
    }
    print("replicas:", summary)  # shown with -s
    assert not problems, "\n".join([f"summary: {summary}", *problems])
    return summary


async def run_scenario(
    tmp_path: Path,
    pg_url: str,
    disruption: Callable[[Cluster], dict[int, Callable[[], Awaitable[None]]]],
) -> dict[str, Any]:
    """Three replicas, the stream with ``disruption``'s steps in it, then the contract."""
    flag = await asyncio.to_thread(replica_id_flag)
    impl = OneBotImpl(self_id="10000", access_token=TOKEN, buffered=True)
    with ScriptedLLM(strict=True, responder=answering_model) as llm:
        url = await impl.serve()
        for name in REPLICAS:
            (tmp_path / name).mkdir()
        configs = {
            name: write_config(
                tmp_path / name / "ania.toml",
                llm,
                tmp_path / name / "data",
                runner={
                    "mode": "forward",
                    "url": f"{url}/?client={name}",  # who sent each action
                    "access_token": TOKEN,
                    "reconnect_max": 1,
                    "queued_notice": "",
                    "grace_seconds": 5,
                },
                store={"url": pg_url},
                agent={"queue_size": 1000},
            )
            for name in REPLICAS
        }
        options = {name: ("--replica-id", name) if flag else () for name in REPLICAS}
        cluster = Cluster(impl, pg_url, configs, options)
        chats = Chats(impl)
        seconds: dict[str, float] = {}  # how long each phase took, for the summary
        mark = time.monotonic()

        def phase(name: str) -> None:
            nonlocal mark
            seconds[name], mark = round(time.monotonic() - mark, 1), time.monotonic()

        try:
            for name in REPLICAS:
                await cluster.start(name)
            for name in REPLICAS:
                await cluster.current(name).ready()
            await until(
                lambda: impl.connected_clients == set(REPLICAS), "every replica connected", 30
            )
            phase("start")
            await chats.send(EVENTS, disruption(cluster))
            await asyncio.gather(*cluster.tasks)
            for name in REPLICAS:
                await cluster.current(name).ready()  # a restarted one too
            phase("stream")

            async def every_message_answered() -> bool:
                answers, notices = sends(impl)
                waiting = {k for k in chats.ids if k not in answers and k not in notices}
                if waiting:
                    uncertain = await asyncio.to_thread(
                        query, pg_url, "SELECT owner, payload FROM outbox WHERE state = 'uncertain'"
                    )
                    cut = [r for r in uncertain if owner_pid(r["owner"]) in cluster.killed]
                    waiting -= await asyncio.to_thread(outbox_keys, pg_url, cut)
                if waiting:
                    return False
                open_rows = await asyncio.to_thread(
                    query, pg_url, "SELECT id FROM outbox WHERE state IN ('pending', 'sending')"
                )
                return not open_rows

            try:
                await until(every_message_answered, "every message answered", 60, 0.1)
                settled = True
            except AssertionError:
                settled = False  # reported with everything else below
            phase("settle")
            codes = await cluster.stop_all()
            phase("stop")
        finally:
            await cluster.cleanup()
            await impl.aclose()
    return await check_contract(cluster, chats, settled, codes, seconds)


async def test_three_replicas_one_killed_and_restarted_answer_every_message_once(
    tmp_path: Path, pg_url: str
) -> None:
    def kill_then_restart(cluster: Cluster) -> dict[int, Callable[[], Awaitable[None]]]:
        async def restart() -> None:
            await cluster.start(VICTIM)  # its readiness is awaited after the stream

        return {400: functools.partial(cluster.kill, VICTIM), 700: restart}

    summary = await run_scenario(tmp_path, pg_url, kill_then_restart)
    assert summary["messages"] >= 1000


async def test_a_frozen_replica_causes_no_double_answers(tmp_path: Path, pg_url: str) -> None:
    def freeze(cluster: Cluster) -> dict[int, Callable[[], Awaitable[None]]]:
        async def start_freeze() -> None:
            cluster.tasks.append(asyncio.ensure_future(cluster.freeze(VICTIM, 5.0)))  # goes on

        return {200: start_freeze}

    summary = await run_scenario(tmp_path, pg_url, freeze)
    assert summary["messages"] >= 1000


async def test_the_overlap_check_cuts_a_killed_process_runs_at_the_kill() -> None:
    def run(ident: int, pid: int, start: float, end: float | None) -> dict[str, Any]:
        return {
            "id": ident,
            "session": "f:1",
            "status": "x",
            "owner_pid": pid,
            "started_at": start,
            "finished_at": end,
        }

    # the killed process's run never ended (or was swept late): the takeover's run is fine
    cut = [run(1, 7, 10.0, None), run(2, 8, 12.0, 13.0), run(3, 7, 20.0, 30.0)]
    assert overlapping_runs(cut[:2], {7: 11.5}) == []
    assert len(overlapping_runs(cut[:2], {})) == 1  # not killed: still running, so overlapping
    assert overlapping_runs([run(4, 8, 1.0, 2.0), run(5, 9, 2.0, 3.0)], {}) == []
    found = overlapping_runs([run(4, 8, 1.0, 5.0), run(5, 9, 2.0, 3.0), run(6, 8, 4.0, 6.0)], {})
    assert [line.split(" (")[0] for line in found] == ["f:1: run 5", "f:1: run 6"]
