"""Helpers shared by the MCP tests: real demo servers (stdio, HTTP, SSE) and config files."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ania_nb.config import MCPSettings
from ania_nb.tools import SessionToolExecutor, ToolContext, ToolExecutor

DEMO = Path(__file__).with_name("demo_server.py")
DEMO_TOOLS = [
    "add",
    "client",
    "fail",
    "get_env",
    "greet",
    "header",
    "huge",
    "pid",
    "sleep",
    "whoami",
]


def stdio_entry(
    name: str = "demo", *, extra: int = 0, barrier: tuple[Path, int] | None = None, **fields: Any
) -> dict[str, Any]:
    """A ``servers``-form entry starting the demo server over stdio (``media=True``: --media,
    ``prompts=True``: --prompts, ``resources=True``: --resources, ``ask=True``: --ask).

    ``barrier=(folder, n)``: the server waits until n servers started with that folder.
    """
    args = [str(DEMO), "stdio", "--name", name]
    if fields.pop("media", False):
        args.append("--media")
    for flag in ("prompts", "resources", "ask"):
        if fields.pop(flag, False):
            args.append(f"--{flag}")
    if extra:
        args += ["--extra", str(extra)]
    if barrier is not None:
        args += ["--barrier", str(barrier[0]), "--parties", str(barrier[1])]
    return {"name": name, "transport": "stdio", "command": sys.executable, "args": args, **fields}


def time_entry(name: str = "time") -> dict[str, Any]:
    """The PyPI ``mcp-server-time`` over stdio."""
    return {"name": name, "command": sys.executable, "args": ["-m", "mcp_server_time"]}


@contextmanager
def http_server(kind: str, name: str = "demo") -> Iterator[str]:
    """Run the demo server over ``http`` or ``sse`` in a subprocess; yields its URL."""
    proc = subprocess.Popen(
        [sys.executable, str(DEMO), kind, "--name", name],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PORT "), f"demo server did not start: {line!r}"
        path = "/sse" if kind == "sse" else "/mcp"
        yield f"http://127.0.0.1:{int(line.split()[1])}{path}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


EVERYTHING_ENV = "ANIA_TEST_SERVER_EVERYTHING"


def everything_script() -> Path:
    """The reference server's ``dist/index.js`` (npm ``@modelcontextprotocol/server-everything``).

    Found through ``$ANIA_TEST_SERVER_EVERYTHING`` (the path of ``index.js`` or of the package
    folder) or an installed ``mcp-server-everything``; the test is skipped, saying how to
    install it, when neither is there (the tests never download it themselves).
    """
    import pytest

    given = os.environ.get(EVERYTHING_ENV)
    if given:
        path = Path(given)
        path = path / "dist" / "index.js" if path.is_dir() else path
        if path.is_file():
            return path
        pytest.fail(f"${EVERYTHING_ENV} = {given!r} names no server-everything index.js")
    installed = shutil.which("mcp-server-everything")
    if installed is not None:
        return Path(installed).resolve()
    pytest.skip(
        "server-everything is not installed: npm install @modelcontextprotocol/server-everything "
        f"in a folder and set {EVERYTHING_ENV} to its node_modules/@modelcontextprotocol/"
        "server-everything"
    )


@contextmanager
def everything_entry(
    transport: str = "stdio", name: str = "everything"
) -> Iterator[dict[str, Any]]:
    """A servers-form entry for server-everything over stdio or streamable HTTP (a subprocess)."""
    script = everything_script()
    node = shutil.which("node") or "node"
    if transport == "stdio":
        yield {"name": name, "command": node, "args": [str(script), "stdio"]}
        return
    with socket.socket() as probe:  # a free port: the server takes it from $PORT
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PORT": str(port)}
    proc = subprocess.Popen(
        [node, str(script), "streamableHttp"], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # "MCP Streamable HTTP Server listening on port N"
            if "listening on port" in line:
                break
            if proc.poll() is not None:
                raise AssertionError(f"server-everything did not start: {line!r}")
        else:
            raise AssertionError("server-everything exited before it listened")
        yield {
            "name": name,
            "transport": "streamable-http",
            "endpoint": f"http://127.0.0.1:{port}/mcp",
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def write_config(path: Path, servers: list[dict[str, Any]], form: str = "servers") -> Path:
    """Write a servers file in any form (map forms key entries by name; VS Code says "type")."""
    if form == "servers":
        data: dict[str, Any] = {"servers": servers}
    elif form == "vscode":
        data = {
            "servers": {
                s["name"]: {
                    ("type" if k == "transport" else k): v for k, v in s.items() if k != "name"
                }
                for s in servers
            }
        }
    else:
        data = {
            "mcpServers": {s["name"]: {k: v for k, v in s.items() if k != "name"} for s in servers}
        }
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def settings(path: Path, **overrides: Any) -> MCPSettings:
    """MCPSettings for a config file, with a short connect timeout for tests."""
    overrides.setdefault("connect_timeout", 20.0)
    return MCPSettings(config_file=path, **overrides)


def session_of(shared: ToolExecutor) -> tuple[SessionToolExecutor, ToolContext]:
    """A session executor over ``shared`` and a context bound to it."""
    session = SessionToolExecutor(shared)
    return session, ToolContext(session="s", executor=session)
