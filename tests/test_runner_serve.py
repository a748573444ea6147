"""``ania-nb serve`` end to end: the real subprocess, the scripted LLM and the OneBot test impl.

The test process runs `ScriptedLLM` (threaded HTTP server) and `OneBotImpl` (a OneBot v11
implementation written from the spec, ``ania_nb.testing.onebot``) on 127.0.0.1; the runner is the
installed ``ania-nb serve`` console script with an ``ania.toml`` pointing at both.

Chat behaviour is checked against one shared reverse-mode process (the ``bot`` fixture; every
test uses chats of its own, so sessions never mix); connection styles, signals, exit codes and
restarts get processes of their own.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import socket
import sqlite3
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from ania_nb.catalogue import say
from ania_nb.testing import ScriptedLLM, reply, tool_call
from ania_nb.testing.onebot import HandshakeRejected, OneBotImpl

# One event loop for the module: the shared bot's connections live across tests.
pytestmark = pytest.mark.asyncio(loop_scope="module")

ANIA_NB = str(Path(sys.executable).parent / "ania-nb")
TOKEN = "s3cret-token"
RESENT = say("approval.resent", "zh")  # how a card posted again after a restart says so
ADMIN = 999
LISTEN_RE = re.compile(r"ws://127\.0\.0\.1:[1-9]\d*/onebot/v11/ws")
_ids = itertools.count(100_001)


def uid() -> int:
    """A QQ id (user or group) no other test of this module uses."""
    return next(_ids)


# ------------------------------------------------------------------ the process


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def write_config(path: Path, llm: ScriptedLLM, data: Path, /, **sections: dict[str, Any]) -> Path:
    """An ``ania.toml`` on the scripted model with ``data`` as the store; ``sections`` on top
    (``llm={…}`` too: the parameters before them are positional)."""
    config: dict[str, dict[str, Any]] = {
        "llm": {"base_url": llm.base_url, "api_key": llm.api_key, "model": "scripted"},
        "retry": {"base_delay": 0.01, "max_delay": 0.05},
        "store": {"data_dir": str(data)},
        "skills": {"dir": str(data.parent / "no-skills")},
        "mcp": {"config_file": str(data.parent / "no-mcp.json")},
        "admin": {"ids": [f"qq:{ADMIN}"]},
    }
    for name, keys in sections.items():
        config.setdefault(name, {}).update(keys)
    lines: list[str] = []
    for name, keys in config.items():
        lines += [f"[{name}]", *(f"{k} = {_toml_value(v)}" for k, v in keys.items()), ""]
    path.write_text("\n".join(lines))
    return path


class Serve:
    """One ``ania-nb serve`` subprocess: its stderr lines, collected as they come."""

    def __init__(self, config: Path, *options: str) -> None:
        self.config = config
        self.options = options  # more command-line options after --config
        self.lines: list[str] = []
        self._changed = asyncio.Condition()
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> Serve:
        """Start the process, with a clean environment (no ANIA_* of the developer)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANIA_")}
        self.proc = await asyncio.create_subprocess_exec(
            ANIA_NB,
            "serve",
            "--config",
            str(self.config),
            *self.options,
            cwd=self.config.parent,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.ensure_future(self._read())
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        async for raw in self.proc.stderr:
            async with self._changed:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()
        async with self._changed:
            self._changed.notify_all()

    @property
    def log(self) -> str:
        """Everything logged so far."""
        return "\n".join(self.lines)

    async def wait_log(self, pattern: str, within: float = 20) -> re.Match[str]:
        """The first log line matching ``pattern`` (a regex), waiting for it."""
        regex = re.compile(pattern)

        async def find() -> re.Match[str]:
            async with self._changed:
                while True:
                    for line in self.lines:
                        if m := regex.search(line):
                            return m
                    if self._reader is not None and self._reader.done():
                        raise AssertionError(f"serve exited, no {pattern!r} logged:\n{self.log}")
                    await self._changed.wait()

        try:
            return await asyncio.wait_for(find(), within)
        except TimeoutError:
            raise AssertionError(f"no log line matching {pattern!r}:\n{self.log}") from None

    async def ready(self) -> None:
        """Wait until serve says it is ready."""
        await self.wait_log(r"ania_nb\.runner: ready")

    async def listen_url(self) -> str:
        """The reverse-mode listener's URL (with the bound port), from the log."""
        return (await self.wait_log(LISTEN_RE.pattern)).group(0)

    def send(self, signum: int = signal.SIGTERM) -> None:
        """Send a signal to the process."""
        assert self.proc is not None
        self.proc.send_signal(signum)

    async def wait(self, within: float = 40) -> int:
        """Wait for the exit; returns the exit code (and the log is complete)."""
        assert self.proc is not None and self._reader is not None
        code = await asyncio.wait_for(self.proc.wait(), within)
        await asyncio.wait_for(self._reader, within)
        return code

    async def stop(self, signum: int = signal.SIGTERM) -> int:
        """Signal the process and return its exit code."""
        self.send(signum)
        return await self.wait()

    async def kill(self) -> None:
        """Kill it if it still runs (cleanup)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()


class Gate:
    """A model that holds its answers until the test opens the gate (`ScriptedLLM.responder`)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.opened = threading.Event()

    def __call__(self, request: Any) -> Any:
        self.opened.wait(30)  # on the server's thread; cleanup opens it at the latest
        return reply(self.text)

    def open(self) -> None:
        """Let the held request (and later ones) answer."""
        self.opened.set()


def runs(data_dir: Path, session: str | None = None) -> list[tuple[str, str]]:
    """(session, status) of the run records, oldest first (read like any other client)."""
    with sqlite3.connect(data_dir / "ania.db") as db:
        rows = db.execute("SELECT session, status FROM runs ORDER BY id").fetchall()
    return [r for r in rows if session is None or r[0] == session]


async def wait_run(data_dir: Path, session: str, status: str) -> None:
    """Wait until ``session`` has a run record with ``status`` (re-read every 50 ms)."""

    async def poll() -> None:
        # Another process's database: there is no event to wait on, only the file to re-read.
        while (session, status) not in await asyncio.to_thread(runs, data_dir, session):  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), 20)


async def requests(llm: ScriptedLLM, n: int) -> list[Any]:
    """The first ``n`` model requests, waiting for them off the loop."""
    return await asyncio.to_thread(llm.wait_for_requests, n, 20)


def to_user(user: int, has: str = "") -> Callable[[Any], bool]:
    """Predicate: a private send to ``user`` whose text contains ``has``."""
    return lambda a: str(a.params.get("user_id")) == str(user) and has in a.text


def to_group(group: int, has: str = "") -> Callable[[Any], bool]:
    """Predicate: a group send to ``group`` whose text contains ``has``."""
    return lambda a: str(a.params.get("group_id")) == str(group) and has in a.text


def ats(action: Any) -> list[str]:
    """The QQ ids an action's message @-mentions."""
    return [str(s["data"]["qq"]) for s in action.segments if s["type"] == "at"]


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    """A strict scripted model: a history the runner left inconsistent is refused."""
    with ScriptedLLM(strict=True) as server:
        yield server


@pytest_asyncio.fixture(loop_scope="module")
async def launch(tmp_path: Path, llm: ScriptedLLM) -> AsyncIterator[Callable[..., Any]]:
    """Start ``ania-nb serve`` on this test's model and data dir: ``await launch(runner={…})``."""
    started: list[Serve] = []

    async def start(**sections: dict[str, Any]) -> Serve:
        path = write_config(
            tmp_path / f"ania-{len(started)}.toml", llm, tmp_path / "data", **sections
        )
        proc = Serve(path)
        started.append(proc)
        return await proc.start()

    yield start
    for proc in started:
        await proc.kill()


@pytest_asyncio.fixture(loop_scope="module")
async def impl() -> AsyncIterator[OneBotImpl]:
    """A OneBot implementation of this test (token required)."""
    onebot = OneBotImpl(self_id="10000", access_token=TOKEN)
    yield onebot
    await onebot.aclose()


async def connect(launch: Any, impl: OneBotImpl, mode: str, **sections: Any) -> Serve:
    """``ania-nb serve`` connected to ``impl`` in ``mode`` (reverse or forward)."""
    runner = {"access_token": TOKEN, **sections.pop("runner", {})}
    if mode == "reverse":
        proc = await launch(runner={"mode": "reverse", "port": 0, **runner}, **sections)
        await impl.connect(await proc.listen_url(), deadline=20)
    else:
        url = await impl.serve()
        proc = await launch(runner={"mode": "forward", "url": url, **runner}, **sections)
    await impl.wait_connected(20)
    await proc.ready()
    return proc


@dataclass
class Bot:
    """The shared reverse-mode process and what it talks to."""

    llm: ScriptedLLM
    impl: OneBotImpl
    proc: Serve
    url: str
    data: Path
    gates: list[Gate]

    def gate(self, text: str) -> Gate:
        """Hold the model's answers (this test only) until the gate opens."""
        gate = Gate(text)
        self.gates.append(gate)
        self.llm.responder = gate
        return gate


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared_bot(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Bot]:
    """One ``ania-nb serve`` (reverse mode) for the chat-behaviour tests of this module."""
    folder = tmp_path_factory.mktemp("shared-serve")
    with ScriptedLLM(strict=True) as llm:
        config = write_config(
            folder / "ania.toml",
            llm,
            folder / "data",
            runner={
                "mode": "reverse",
                "port": 0,
                "access_token": TOKEN,
                "queued_notice": "QUEUED",
                "overflow_notice": "TOO MANY",
            },
            agent={"queue_size": 1},
            approval={"enable": True, "tools": ["time"]},
        )
        proc = await Serve(config).start()
        onebot = OneBotImpl(self_id="10000", access_token=TOKEN)
        try:
            url = await proc.listen_url()
            await onebot.connect(url, deadline=20)
            await proc.ready()
            yield Bot(llm, onebot, proc, url, folder / "data", [])
            proc.send(signal.SIGTERM)
            await proc.wait()
        finally:
            await onebot.aclose()
            await proc.kill()


@pytest_asyncio.fixture(loop_scope="module")
async def bot(shared_bot: Bot) -> AsyncIterator[Bot]:
    """The shared bot with a fresh model script; held answers are released afterwards."""
    shared_bot.llm.reset()
    yield shared_bot
    shared_bot.llm.responder = None
    for gate in shared_bot.gates:
        gate.open()
    shared_bot.gates.clear()


# ------------------------------------------------------------------ start-up and exit codes


async def test_the_log_formatter_blanks_every_spelling_of_every_secret() -> None:
    """What the subprocess test cannot provoke: a record (message or traceback) that carries a
    secret raw, URL-quoted, base64 or JSON-escaped, from any logger, is printed blanked."""
    import base64
    import io
    import logging
    from urllib.parse import quote, quote_plus

    from ania_nb.config import Config
    from ania_nb.mcp.config import MCPServerConfig
    from ania_nb.runner.redact import SecretRedactor, config_secrets, server_secrets

    token, key, url_key = "ob-Tok/en+42=&x%y", 'sk-llm-5ecret-"quote"', "emb-url-5ecret"
    bearer, mcp_key = "mcp-bearer-5ecret", "mcp-url-5ecret"
    config = Config().with_overrides(
        {
            "runner.access_token": token,
            "llm.api_key": key,
            "embedding.base_url": f"http://127.0.0.1:9/v1?api_key={url_key}",
        }
    )
    redactor = SecretRedactor("%(levelname)s %(name)s: %(message)s")
    redactor.add_secrets(config_secrets(config))
    servers: list[MCPServerConfig] = []
    redactor.add_source(  # asked per record: a server added at run time counts at once
        lambda: [value for server in servers for value in server_secrets(server)]
    )
    servers.append(
        MCPServerConfig(
            name="demo",
            endpoint=f"http://127.0.0.1:9/mcp?api_key={mcp_key}",
            headers={"Authorization": f"Bearer {bearer}"},  # the credential alone is secret too
        )
    )
    secrets = (token, key, url_key, bearer, mcp_key)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(redactor)
    logger = logging.getLogger("some.library")
    logger.addHandler(handler)
    try:
        for secret in secrets:
            raw = secret.encode()
            for form in (
                secret,
                quote(secret, safe=""),
                quote(secret),
                quote_plus(secret),
                json.dumps(secret)[1:-1],
                base64.b64encode(raw).decode(),
                base64.urlsafe_b64encode(raw).decode().rstrip("="),
            ):
                logger.warning("dialing ws://h/?access_token=%s now", form)
            try:
                raise RuntimeError(f"refused {quote(secret, safe='')}")
            except RuntimeError:
                logger.exception("in a traceback")
    finally:
        logger.removeHandler(handler)
    printed = stream.getvalue()
    for secret in secrets:
        assert secret not in printed and quote(secret, safe="") not in printed
        assert quote_plus(secret) not in printed
    lines = [line for line in printed.splitlines() if line.startswith("WARNING")]
    assert len(lines) == 5 * 7 and all(line.endswith("=*** now") for line in lines), lines
    assert printed.count("RuntimeError: refused ***") == 5


async def test_help_documents_options_and_exit_codes() -> None:
    proc = await asyncio.create_subprocess_exec(
        ANIA_NB, "serve", "--help", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    for expected in ("--config PATH", "--log-level", "exit codes", "access_token", "SIGTERM"):
        assert expected in out.decode()


async def test_start_up_refusals_exit_2_with_the_reason(launch: Any, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        bad, exposed, busy = [
            await launch(runner={"mode": "sideways"}),
            await launch(runner={"mode": "reverse", "host": "0.0.0.0", "port": 1}),
            await launch(runner={"mode": "reverse", "port": port}),
        ]
        codes = await asyncio.gather(bad.wait(), exposed.wait(), busy.wait())
    assert codes == [2, 2, 2]
    assert re.search(r"ERROR ania_nb\.runner: cannot start: .*\n\s+runner\.mode", bad.log)
    # One line per record: date, time, level, logger, message.
    assert re.match(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ERROR ania_nb\.runner: cannot start: runner\.host is "
        r"'0\.0\.0\.0' \(not loopback\) and runner\.access_token is not set",
        exposed.lines[0],
    )
    assert re.search(rf"cannot start: .*cannot listen on 127\.0\.0\.1:{port}", busy.log)


async def test_a_reverse_path_without_a_leading_slash_is_refused() -> None:
    from ania_nb.config import RunnerSettings
    from ania_nb.runner.serve import StartError, check_settings

    with pytest.raises(StartError, match=r"runner\.path must start with '/', got 'onebot/v11/ws'"):
        check_settings(RunnerSettings(mode="reverse", path="onebot/v11/ws"))
    check_settings(RunnerSettings(mode="reverse", path="/bot"))
    check_settings(RunnerSettings(mode="forward", path="unused in forward mode"))


async def test_refusals_happen_before_the_store_is_opened(launch: Any, tmp_path: Path) -> None:
    proc = await launch(runner={"mode": "reverse", "host": "0.0.0.0"})
    assert await proc.wait() == 2
    assert not (tmp_path / "data").exists()


async def test_no_model_configured_exits_2_naming_every_missing_key_before_connecting(
    launch: Any, impl: OneBotImpl, tmp_path: Path
) -> None:
    url = await impl.serve()  # forward mode: a runner that started would dial this at once
    runner = f'[runner]\nmode = "forward"\nurl = "{url}"\naccess_token = "{TOKEN}"\n'
    bare = tmp_path / "bare.toml"  # no [llm] at all: ania-nb has no default vendor
    bare.write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\n{runner}')
    hosted = {"base_url": "https://api.example.com/v1", "model": "m", "api_key": ""}
    nothing, no_key = Serve(bare), await launch(llm=hosted, runner={"mode": "forward", "url": url})
    await nothing.start()
    try:
        assert await asyncio.gather(nothing.wait(), no_key.wait()) == [2, 2]
    finally:
        await nothing.kill()
    assert re.match(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ERROR ania_nb\.runner: cannot start: the model is not "
        r"configured: llm\.base_url, llm\.model and llm\.api_key are not set \(ania-nb has no "
        r"default model; llm\.api_key may stay empty only for a server on this machine or a "
        r"private network\)\. Set them under \[llm\] in ania\.toml \(or the --config file\), or "
        r"as ANIA_LLM__BASE_URL, ANIA_LLM__MODEL and ANIA_LLM__API_KEY\.$",
        nothing.lines[0],
    )
    assert len(nothing.lines) == 1
    assert "cannot start: the model is not configured: llm.api_key is not set (the endpoint " in (
        no_key.log
    )
    assert "llm.base_url" not in no_key.log and "llm.model" not in no_key.log
    assert impl.connections == 0 and impl.request_headers == [] and impl.rejections == []
    assert not (tmp_path / "data").exists()  # refused before the store is opened


async def test_a_local_endpoint_needs_no_key(
    launch: Any, impl: OneBotImpl, llm: ScriptedLLM
) -> None:
    user = uid()
    llm.script(reply("no key needed"))
    proc = await connect(launch, impl, "reverse", llm={"api_key": ""})  # 127.0.0.1: loopback
    await impl.private_message(user, "hi")
    await impl.wait_for_action("send_private_msg", to_user(user, "no key needed"))
    assert await proc.stop() == 0


async def test_a_saved_value_that_leaves_the_model_without_a_key_is_refused_too(
    launch: Any, impl: OneBotImpl, tmp_path: Path
) -> None:
    from ania_nb.store import Store

    store = await Store.open(tmp_path / "data")  # config_set moved the bot to a hosted endpoint
    try:
        await store.kv("config").set("llm.base_url", "https://api.example.com/v1")
    finally:
        await store.close()
    url = await impl.serve()
    proc = await launch(llm={"api_key": ""}, runner={"mode": "forward", "url": url})
    assert await proc.wait() == 2
    assert "cannot start: the model is not configured: llm.api_key is not set" in proc.log
    assert impl.connections == 0 and impl.request_headers == []


async def test_a_crash_exits_1_with_the_traceback(
    launch: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A bug nothing foresees, planted in the serve process: Agent.start raises.
    hook = tmp_path / "crash-hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "import ania_nb.agent\n"
        "async def start(self, *args, **kwargs):\n"
        "    raise RuntimeError('a bug nothing foresees')\n"
        "ania_nb.agent.Agent.start = start\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]))
    proc = await launch()
    assert await proc.wait() == 1
    assert "ERROR ania_nb.runner: crashed" in proc.log and "Traceback" in proc.log


async def test_a_store_that_cannot_be_opened_is_one_line_and_exit_2(
    launch: Any, tmp_path: Path
) -> None:
    (tmp_path / "data").write_text("a file where the data directory should be")
    proc = await launch()
    assert await proc.wait() == 2
    assert "cannot start: cannot create the directory for the store" in proc.log
    assert "Traceback" not in proc.log


# ------------------------------------------------------------------ chats (the shared bot)


async def test_private_message_is_answered_with_the_sender_prefix(bot: Bot) -> None:
    user = uid()
    bot.llm.script(reply("hello back"))
    await bot.impl.private_message(user, "hi there", nickname="Alice")
    sent = await bot.impl.wait_for_action("send_private_msg", to_user(user))
    assert sent.text == "hello back"
    (request,) = await requests(bot.llm, 1)
    assert f"[nickname:Alice id:{user}]: hi there" in request.messages[-1]["content"]


async def test_group_answers_mentions_only_and_ats_the_sender(bot: Bot) -> None:
    group, member = uid(), uid()
    bot.llm.script(reply("pong"))
    await bot.impl.group_message(group, member, "just chatting", nickname="Bob")
    await bot.impl.group_message(group, member, "ping", at_bot=True, nickname="Bob")
    sent = await bot.impl.wait_for_action("send_group_msg", to_group(group))
    assert ats(sent) == [str(member)] and sent.segments[0]["type"] == "at"
    assert sent.text.strip() == "pong"
    # The unaddressed message (handled first: a chat's events are handled in order) never
    # reached the model.
    assert len(bot.llm.requests) == 1
    content = bot.llm.requests[0].messages[-1]["content"]
    assert f"id:{member}]: ping" in content and "just chatting" not in content


async def test_a_tool_round_runs_in_the_chats_session(bot: Bot) -> None:
    user = uid()
    bot.llm.script(reply(tool_calls=[tool_call("clock_list", {})]), reply("no tasks yet"))
    await bot.impl.private_message(user, "any tasks?")
    await bot.impl.wait_for_action("send_private_msg", to_user(user, "no tasks yet"))
    tool_result = (await requests(bot.llm, 2))[1].messages[-1]
    assert tool_result["role"] == "tool" and f"f:{user}" in tool_result["content"]


async def test_approval_by_reply_stranger_refused_then_admin_allows(bot: Bot) -> None:
    group, member, stranger = uid(), uid(), uid()
    bot.llm.script(reply(tool_calls=[tool_call("time", {})]), reply("approved and done"))
    await bot.impl.group_message(group, member, "what time is it?", at_bot=True)
    asked = await bot.impl.wait_for_action("send_group_msg", to_group(group, "time"))
    assert "approved and done" not in asked.text
    seen = len(bot.impl.actions)
    await bot.impl.group_message(group, stranger, "允许", at_bot=True, nickname="Eve")
    refused = await bot.impl.wait_for_action("send_group_msg", to_group(group), after=seen)
    assert "无法审批" in refused.text
    assert len(bot.llm.requests) == 1  # the tool still waits
    await bot.impl.group_message(group, ADMIN, "allow", at_bot=True, nickname="Admin")
    done = await bot.impl.wait_for_action("send_group_msg", to_group(group, "approved and done"))
    assert "current time is" in bot.llm.requests[1].messages[-1]["content"]
    assert ats(done) == [str(member)]  # the verdicts were not messages of the batch


async def test_approval_by_the_requester_in_a_private_chat(bot: Bot) -> None:
    user = uid()
    bot.llm.script(reply(tool_calls=[tool_call("time", {})]), reply("there you go"))
    await bot.impl.private_message(user, "what time is it?")
    await bot.impl.wait_for_action("send_private_msg", to_user(user, "time"))
    await bot.impl.private_message(user, "同意")
    await bot.impl.wait_for_action("send_private_msg", to_user(user, "there you go"))
    assert "current time is" in bot.llm.requests[1].messages[-1]["content"]


async def test_stop_mid_run(bot: Bot) -> None:
    user = uid()
    bot.gate("too late")
    await bot.impl.private_message(user, "write me a long poem")
    await requests(bot.llm, 1)
    await bot.impl.private_message(user, "/stop")
    await bot.impl.wait_for_action("send_private_msg", to_user(user, "AI 响应已被停止"))
    await wait_run(bot.data, f"f:{user}", "stopped")
    assert not any("too late" in a.text for a in bot.impl.actions)


async def test_queued_notice_once_then_overflow_notice(bot: Bot) -> None:
    user = uid()
    gate = bot.gate("answer")
    await bot.impl.private_message(user, "first")
    await requests(bot.llm, 1)
    await bot.impl.private_message(user, "second")
    await bot.impl.wait_for_action("send_private_msg", to_user(user, "QUEUED"))
    await bot.impl.private_message(user, "third")  # queue_size 1: no room
    await bot.impl.wait_for_action("send_private_msg", to_user(user, "TOO MANY"))
    gate.open()
    batch = (await requests(bot.llm, 2))[1].messages[-1]["content"]
    assert "second" in batch and "third" not in batch
    first = await bot.impl.wait_for_action("send_private_msg", to_user(user, "answer"))
    after = bot.impl.actions.index(first) + 1
    await bot.impl.wait_for_action("send_private_msg", to_user(user, "answer"), after=after)
    assert sum(a.text == "QUEUED" for a in bot.impl.actions if to_user(user)(a)) == 1


async def test_clock_task_result_is_delivered_to_the_group_at_its_creator(bot: Bot) -> None:
    group, member = uid(), uid()
    bot.llm.route(lambda req: "【定时任务】" in str(req.messages[-1]["content"]), reply("tick"))
    # /clock works in a group without @.
    await bot.impl.group_message(group, member, "/clock add --once @every 1s | ping | say tick")
    await bot.impl.wait_for_action("send_group_msg", to_group(group, "created task"))
    sent = await bot.impl.wait_for_action("send_group_msg", to_group(group, "tick"), 20)
    sends = [a.params for a in bot.impl.actions if to_group(group)(a)]
    assert ats(sent) == [str(member)], (sends, bot.proc.log)


async def test_wrong_or_missing_token_is_refused_in_reverse_mode(bot: Bot) -> None:
    intruder = OneBotImpl(self_id="10000", access_token=TOKEN)
    try:
        with pytest.raises(HandshakeRejected) as wrong:
            await intruder.connect(bot.url, token="not-the-token", deadline=5)
        with pytest.raises(HandshakeRejected) as missing:
            await intruder.connect(bot.url, token=None, deadline=5)
    finally:
        await intruder.aclose()
    assert (wrong.value.status, missing.value.status) == (403, 401)
    await bot.proc.wait_log("missing or wrong access token")
    assert bot.impl.connected  # the rightful connection was not replaced


async def test_reply_in_flight_during_a_drop_arrives_after_the_reconnect(bot: Bot) -> None:
    user = uid()
    gate = bot.gate("worth the wait")
    await bot.impl.private_message(user, "slow one")
    await requests(bot.llm, 1)
    connections = bot.impl.connections
    await bot.impl.drop(reconnect=False)
    gate.open()
    await wait_run(bot.data, f"f:{user}", "success")  # the reply is ready; no socket to send on
    await bot.impl.connect(bot.url, deadline=20)
    await bot.impl.wait_connected(20, connections=connections + 1)
    await bot.impl.wait_for_action("send_private_msg", to_user(user, "worth the wait"))
    bot.llm.responder = None
    bot.llm.script(reply("and this one too"))
    await bot.impl.private_message(user, "after the reconnect")
    await bot.impl.wait_for_action("send_private_msg", to_user(user, "and this one too"))


# ------------------------------------------------------------------ connection styles, signals


async def test_forward_mode_reply_reconnect_and_sigterm_exit_0(
    launch: Any, impl: OneBotImpl, llm: ScriptedLLM, tmp_path: Path
) -> None:
    user = uid()
    llm.script(reply("before"), reply("after"))
    proc = await connect(launch, impl, "forward")
    assert "Bearer " + TOKEN in impl.request_headers[0].get("Authorization", "")
    await impl.private_message(user, "one", nickname="Alice")
    await impl.wait_for_action("send_private_msg", to_user(user, "before"))
    assert f"[nickname:Alice id:{user}]: one" in llm.requests[0].messages[-1]["content"]
    await impl.drop()  # the runner dials again (backoff from 1 s)
    await impl.wait_connected(20, connections=2)
    await impl.private_message(user, "two")
    await impl.wait_for_action("send_private_msg", to_user(user, "after"))
    assert await proc.stop() == 0
    assert "SIGTERM received" in proc.log and proc.lines[-1].endswith("ania_nb.runner: stopped")
    assert runs(tmp_path / "data") == [(f"f:{user}", "success")] * 2


async def test_forward_mode_with_a_wrong_token_is_refused_and_says_so(
    launch: Any, impl: OneBotImpl
) -> None:
    url = await impl.serve()
    proc = await launch(
        runner={"mode": "forward", "url": f"{url}/?access_token=wrong", "access_token": "wrong"}
    )
    await proc.wait_log(r"WARNING .*(403|401|refused|rejected)")
    assert impl.rejections and set(impl.rejections) <= {401, 403}
    assert not impl.connected
    assert await proc.stop(signal.SIGINT) == 0
    assert "SIGINT received" in proc.log
    assert f"dialling {url}/ (with access token)" in proc.log  # no token in the log


async def test_sigterm_lets_a_running_reply_finish_within_the_grace_period(
    launch: Any, impl: OneBotImpl, llm: ScriptedLLM, tmp_path: Path
) -> None:
    user = uid()
    llm.responder = gate = Gate("finished in time")
    try:
        proc = await connect(launch, impl, "reverse")
        await impl.private_message(user, "slow question")
        await requests(llm, 1)
        proc.send(signal.SIGTERM)
        await proc.wait_log(r"stopping: no new messages")
        await impl.private_message(user, "too late to ask")  # not taken any more
        gate.open()
        await impl.wait_for_action("send_private_msg", to_user(user, "finished in time"))
        assert await proc.wait() == 0
    finally:
        gate.open()
    assert runs(tmp_path / "data") == [(f"f:{user}", "success")]
    assert len(llm.requests) == 1


async def test_second_sigterm_stops_the_run_and_history_stays_consistent(
    launch: Any, impl: OneBotImpl, llm: ScriptedLLM, tmp_path: Path
) -> None:
    user = uid()
    llm.script(reply(tool_calls=[tool_call("clock_list", {})]))  # then the gate holds round two
    llm.responder = gate = Gate("never sent")
    try:  # a grace far longer than the test waits: only the second signal ends it in time
        proc = await connect(launch, impl, "reverse", runner={"grace_seconds": 600})
        await impl.private_message(user, "list my tasks, slowly")
        await requests(llm, 2)  # the tool ran; the model's second round is held
        proc.send(signal.SIGTERM)
        await proc.wait_log(r"stopping: no new messages")
        proc.send(signal.SIGTERM)
        assert await proc.wait() == 0
    finally:
        gate.open()
    assert "second signal" in proc.log
    assert runs(tmp_path / "data") == [(f"f:{user}", "stopped")]
    assert not any("never sent" in a.text for a in impl.actions)
    # A new process on the same data dir continues the conversation; the strict model server
    # refuses a history with a tool call left unanswered.
    await impl.aclose()
    again = OneBotImpl(self_id="10000", access_token=TOKEN, first_message_id=50_000)
    try:
        llm.responder = None
        llm.script(reply("back again"))
        await connect(launch, again, "forward")
        await again.private_message(user, "are you there?")
        await again.wait_for_action("send_private_msg", to_user(user, "back again"))
    finally:
        await again.aclose()
    assert any(m.get("tool_calls") for m in llm.requests[-1].messages)  # the turn is remembered


async def test_a_killed_runner_leaves_an_interrupted_run_and_a_usable_history(
    launch: Any, impl: OneBotImpl, llm: ScriptedLLM, tmp_path: Path
) -> None:
    user = uid()
    llm.script(reply(tool_calls=[tool_call("clock_list", {})]))  # then the gate holds round two
    llm.responder = gate = Gate("never sent")
    try:
        proc = await connect(launch, impl, "reverse")
        await impl.private_message(user, "list my tasks")
        await requests(llm, 2)
        assert await proc.stop(signal.SIGKILL) == -signal.SIGKILL
    finally:
        gate.open()
    assert runs(tmp_path / "data") == [(f"f:{user}", "running")]
    await impl.aclose()
    again = OneBotImpl(self_id="10000", access_token=TOKEN, first_message_id=50_000)
    try:
        llm.responder = None
        llm.script(reply("recovered"))
        await connect(launch, again, "forward")
        await again.private_message(user, "still there?")
        await again.wait_for_action("send_private_msg", to_user(user, "recovered"))
    finally:
        await again.aclose()
    assert runs(tmp_path / "data") == [(f"f:{user}", "interrupted"), (f"f:{user}", "success")]


# ------------------------------------------------------------------ approvals across restarts

APPROVE_TIME = {"enable": True, "tools": ["time"]}
REQUEST_ID = re.compile(r"请求 ([0-9a-f]+)）")


async def restarted(launch: Any, impl: OneBotImpl) -> OneBotImpl:
    """A new OneBot side and a new ``ania-nb serve`` on the same data dir.

    Reverse mode: the implementation connects only after serve has started, so a card posted
    before the connection would fail.
    """
    await impl.aclose()
    again = OneBotImpl(self_id="10000", access_token=TOKEN)
    await connect(launch, again, "reverse", approval=APPROVE_TIME)
    return again


async def test_kill_9_while_the_card_waits_then_the_card_comes_back_and_allow_continues(
    launch: Any, impl: OneBotImpl, llm: ScriptedLLM, tmp_path: Path
) -> None:
    user = uid()
    llm.script(reply(tool_calls=[tool_call("time", {})]))
    proc = await connect(launch, impl, "reverse", approval=APPROVE_TIME)
    await impl.private_message(user, "what time is it?")
    card = await impl.wait_for_action("send_private_msg", to_user(user, "工具审批"))
    match = REQUEST_ID.search(card.text)
    assert match is not None and RESENT not in card.text
    assert await proc.stop(signal.SIGKILL) == -signal.SIGKILL
    llm.script(reply("it is late"))
    again = await restarted(launch, impl)
    try:
        resent = await again.wait_for_action("send_private_msg", to_user(user, RESENT))
        assert match.group(0) in resent.text  # the same request, asked again
        await again.private_message(user, "允许")
        await again.wait_for_action("send_private_msg", to_user(user, "it is late"))
    finally:
        await again.aclose()
    resumed = llm.requests[-1].messages
    assert "what time is it?" in resumed[1]["content"]  # the same conversation, not a new turn
    assert resumed[-1]["role"] == "tool" and "current time is" in resumed[-1]["content"]
    assert runs(tmp_path / "data") == [(f"f:{user}", "interrupted"), (f"f:{user}", "success")]


async def test_sigterm_with_an_approval_pending_exits_at_once_and_the_card_comes_back(
    launch: Any, impl: OneBotImpl, llm: ScriptedLLM, tmp_path: Path
) -> None:
    user = uid()
    llm.script(reply(tool_calls=[tool_call("time", {})]))
    # A grace far longer than the test waits: only suspending the run lets it exit in time.
    proc = await connect(
        launch, impl, "reverse", approval=APPROVE_TIME, runner={"grace_seconds": 600}
    )
    await impl.private_message(user, "what time is it?")
    await impl.wait_for_action("send_private_msg", to_user(user, "工具审批"))
    assert await proc.stop() == 0
    assert "suspended 1 run(s) waiting for an approval" in proc.log
    await impl.wait_for_action("send_private_msg", to_user(user, "重启后会重新发送审批请求"))
    with sqlite3.connect(tmp_path / "data" / "ania.db") as db:
        [(status, error)] = db.execute("SELECT status, error FROM runs").fetchall()
        [(state,)] = db.execute("SELECT state FROM approvals").fetchall()
    assert (status, error, state) == (
        "interrupted",
        "suspended waiting for an approval",
        "suspended",
    )
    llm.script(reply("no time then"))
    again = await restarted(launch, impl)
    try:
        await again.wait_for_action("send_private_msg", to_user(user, RESENT))
        await again.private_message(user, "拒绝")
        await again.wait_for_action("send_private_msg", to_user(user, "no time then"))
    finally:
        await again.aclose()
    refusal = llm.requests[-1].messages[-1]
    assert refusal["role"] == "tool" and refusal["content"].startswith("Tool call not approved")


async def test_allow_during_the_sigterm_grace_is_kept_and_the_run_goes_on_without_a_second_card(
    launch: Any, impl: OneBotImpl, llm: ScriptedLLM, tmp_path: Path
) -> None:
    user, busy, late = uid(), uid(), uid()
    llm.script(reply(tool_calls=[tool_call("time", {})]))
    proc = await connect(
        launch, impl, "reverse", approval=APPROVE_TIME, runner={"grace_seconds": 600}
    )
    await impl.private_message(user, "what time is it?")
    await impl.wait_for_action("send_private_msg", to_user(user, "工具审批"))
    llm.responder = gate = Gate("the slow one")  # holds the grace open: a reply still running
    try:
        await impl.private_message(busy, "a slow question")
        await requests(llm, 2)
        proc.send(signal.SIGTERM)
        await impl.wait_for_action("send_private_msg", to_user(user, "重启后会重新发送审批请求"))
        await impl.private_message(user, "允许")
        await impl.wait_for_action("send_private_msg", to_user(user, "重启后继续"))
        for n in range(2):  # messages of the grace: stored, one notice, answered after
            await impl.private_message(late, f"are you there {n}?")
        await impl.wait_for_action("send_private_msg", to_user(late, "你的消息已保存"))
        gate.open()
        await impl.wait_for_action("send_private_msg", to_user(busy, "the slow one"))
        assert await proc.wait() == 0
    finally:
        gate.open()
    assert sum(1 for a in impl.actions if to_user(late)(a)) == 1  # the shutdown notice, once
    with sqlite3.connect(tmp_path / "data" / "ania.db") as db:
        [(state, verdict)] = db.execute("SELECT state, verdict FROM approvals").fetchall()
    assert (state, verdict) == ("suspended", "allowed")

    def answer(request: Any) -> Any:
        resumed = request.messages[-1]["role"] == "tool"
        return reply("it is late" if resumed else "back for the late one")

    llm.responder = answer
    await impl.aclose()
    again = OneBotImpl(self_id="10000", access_token=TOKEN)
    try:
        proc = await connect(launch, again, "reverse", approval=APPROVE_TIME)
        await again.wait_for_action("send_private_msg", to_user(user, "it is late"))
        await again.wait_for_action("send_private_msg", to_user(late, "back for the late one"))
        assert await proc.stop() == 0  # everything sent is in ``actions`` now
    finally:
        await again.aclose()
    assert "continuing 1 run(s) with the verdict given during the shutdown" in proc.log
    assert [a.text for a in again.actions if to_user(user)(a)] == ["it is late"]  # no 2nd card
    assert [a.text for a in again.actions if to_user(late)(a)] == ["back for the late one"]
    resumed = next(r for r in llm.requests if r.messages[-1]["role"] == "tool").messages
    assert [m["role"] for m in resumed].count("tool") == 1  # the tool ran once
    assert "current time is" in resumed[-1]["content"]
    assert not any("允许" in str(r.messages) for r in llm.requests)
    assert runs(tmp_path / "data", f"f:{user}") == [
        (f"f:{user}", "interrupted"),
        (f"f:{user}", "success"),
    ]
