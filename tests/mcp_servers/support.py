"""Helpers shared by the MCP tests: real demo servers (stdio, HTTP, SSE) and config files."""

from __future__ import annotations

import json
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
    """A ``servers``-form entry starting the demo server over stdio (``media=True``: --media).

    ``barrier=(folder, n)``: the server waits until n servers started with that folder.
    """
    args = [str(DEMO), "stdio", "--name", name]
    if fields.pop("media", False):
        args.append("--media")
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
