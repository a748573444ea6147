"""``ania-nb serve`` end to end: the real subprocess, the scripted LLM and the OneBot test impl.

The test process runs `ScriptedLLM` (threaded HTTP server) and `OneBotImpl` (a OneBot v11
implementation written from the spec, ``tests/onebot_impl.py``) on 127.0.0.1; the runner is the
installed ``ania-nb serve`` console script with an ``ania.toml`` pointing at both.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

ANIA_NB = str(Path(sys.executable).parent / "ania-nb")
TOKEN = "s3cret-token"
ADMIN = "999"
LISTEN_RE = re.compile(r"ws://127\.0\.0\.1:([1-9]\d*)/onebot/v11/ws")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def write_config(path: Path, sections: dict[str, dict[str, Any]]) -> Path:
    """Write ``sections`` as an ``ania.toml``."""
    lines: list[str] = []
    for section, keys in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in keys.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


class Serve:
    """One ``ania-nb serve`` subprocess: its stderr lines, collected as they come."""

    def __init__(self, config: Path, cwd: Path) -> None:
        self.config, self.cwd = config, cwd
        self.lines: list[str] = []
        self._changed = asyncio.Condition()
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self, *extra: str) -> Serve:
        """Start the process (it is stopped by the fixture if the test does not)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANIA_")}
        self.proc = await asyncio.create_subprocess_exec(
            ANIA_NB,
            "serve",
            "--config",
            str(self.config),
            *extra,
            cwd=self.cwd,
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
        """The reverse-mode listener's URL, from the log."""
        m = await self.wait_log(LISTEN_RE.pattern)
        return m.group(0)

    def signal(self, signum: int = signal.SIGTERM) -> None:
        """Send a signal to the process."""
        assert self.proc is not None
        self.proc.send_signal(signum)

    async def wait(self, within: float = 30) -> int:
        """Wait for the exit; returns the exit code (and the log is complete)."""
        assert self.proc is not None and self._reader is not None
        code = await asyncio.wait_for(self.proc.wait(), within)
        await asyncio.wait_for(self._reader, within)
        return code

    async def kill(self) -> None:
        """Kill it if it still runs (test cleanup)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()


@pytest.fixture
async def serve(tmp_path: Path, llm: Any) -> AsyncIterator[Callable[..., Any]]:
    """Start ``ania-nb serve`` with a config on the scripted LLM: ``await serve(runner={...})``."""
    started: list[Serve] = []

    async def start(*extra: str, **sections: dict[str, Any]) -> Serve:
        config: dict[str, dict[str, Any]] = {
            "llm": {
                "base_url": llm.base_url,
                "api_key": llm.api_key,
                "model": "scripted",
                "stream": False,
            },
            "retry": {"base_delay": 0.01, "max_delay": 0.05},
            "store": {"data_dir": str(tmp_path / "data")},
            "skills": {"dir": str(tmp_path / "no-skills")},
            "mcp": {"config_file": str(tmp_path / "no-mcp.json")},
            "admin": {"ids": [f"qq:{ADMIN}"]},
        }
        for name, keys in sections.items():
            config.setdefault(name, {}).update(keys)
        path = write_config(tmp_path / f"ania-{len(started)}.toml", config)
        proc = Serve(path, tmp_path)
        started.append(proc)
        return await proc.start(*extra)

    yield start
    for proc in started:
        await proc.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _runs(data_dir: Path) -> list[tuple[str, str, str]]:
    """(session, status, input) of every run record, oldest first (read after the exit)."""
    with sqlite3.connect(data_dir / "ania.db") as db:
        return list(db.execute("SELECT session, status, input FROM runs ORDER BY id"))


# ------------------------------------------------------------------ start-up refusals


async def test_help_documents_options_and_exit_codes() -> None:
    proc = await asyncio.create_subprocess_exec(
        ANIA_NB, "serve", "--help", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    text = out.decode()
    assert proc.returncode == 0
    for expected in ("--config PATH", "--log-level", "exit codes", "access_token", "SIGTERM"):
        assert expected in text


async def test_bad_config_exits_2_naming_the_key(serve: Any, tmp_path: Path) -> None:
    proc = await serve(runner={"mode": "sideways"})
    assert await proc.wait() == 2
    assert re.search(r"ERROR ania_nb\.runner: cannot start: .*\n\s+runner\.mode", proc.log)
    assert not (tmp_path / "data").exists()  # refused before the store was opened


async def test_non_loopback_listener_without_token_is_refused(serve: Any, tmp_path: Path) -> None:
    proc = await serve(runner={"mode": "reverse", "host": "0.0.0.0", "port": _free_port()})
    assert await proc.wait() == 2
    assert "runner.access_token" in proc.log and "'0.0.0.0'" in proc.log
    assert not (tmp_path / "data").exists()
    # One line per record: date, time, level, logger, message.
    first = proc.lines[0]
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ERROR ania_nb\.runner: cannot start: ", first)
