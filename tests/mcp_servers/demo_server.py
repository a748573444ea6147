"""A real MCP server for the tests, written with the SDK's `MCPServer`.

Run: ``python demo_server.py stdio|http|sse``.
Over HTTP/SSE it binds 127.0.0.1 on a free port and prints ``PORT <n>`` as its first stdout line.
``--name`` sets the server name (so several instances are told apart); ``--extra N`` adds N
generated tools ``extra_000`` ... (for filters and ordering tests). ``--barrier DIR --parties N``
makes the server wait, before it serves, until N servers have started with the same DIR (each
leaves a file there): servers connected one after another would never get past it.
``--annotated`` adds tools for the gating tests: ``mark`` (no annotations), ``peek``
(``readOnlyHint``) and ``wipe`` (``destructiveHint``), each writing or checking a marker file.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field


def build(name: str, extra: int, annotated: bool = False) -> MCPServer:
    server = MCPServer(name, instructions="Test server for ania-nb.")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def add(
        a: Annotated[int, Field(description="first addend")],
        b: Annotated[int, Field(description="second addend")],
    ) -> int:
        """Add two integers.

        Returns their sum.
        """
        return a + b

    @server.tool()
    def greet(name: str, mode: Literal["plain", "loud"] = "plain") -> str:
        """Greet someone by name."""
        text = f"Hello, {name}!"
        return text.upper() if mode == "loud" else text

    @server.tool()
    def huge(size: int = 20000) -> str:
        """Return a very long text (size characters)."""
        return "".join(chr(ord("a") + i % 26) for i in range(size))

    @server.tool()
    def fail(message: str) -> str:
        """Always fail with the given message."""
        raise ToolError(f"failed on purpose: {message}")

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Sleep, then say so."""
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool()
    def pid() -> int:
        """Return the server's process id."""
        return os.getpid()

    @server.tool()
    def get_env(key: str) -> str:
        """Return an environment variable of the server process (or <unset>)."""
        return os.environ.get(key, "<unset>")

    @server.tool()
    def whoami() -> str:
        """Return the server's name."""
        return name

    @server.tool()
    def client(ctx: Context) -> str:
        """Return the connected client's name/version."""
        params = ctx.session.client_params
        info = params.client_info if params is not None else None
        return f"{info.name}/{info.version}" if info is not None else "unknown"

    @server.tool()
    def header(key: str, ctx: Context) -> str:
        """Return one HTTP request header (or <none>)."""
        headers = ctx.headers or {}
        return headers.get(key.lower(), "<none>")

    if annotated:
        _add_annotated(server)
    for i in range(extra):
        server.add_tool(
            _extra(i),
            name=f"extra_{i:03d}",
            description=f"Generated tool number {i}; keyword{'even' if i % 2 == 0 else 'odd'}.",
        )
    return server


def _add_annotated(server: MCPServer) -> None:
    @server.tool()
    def mark(path: str) -> str:
        """Create a marker file (no annotations: may change anything)."""
        Path(path).write_text("mark")
        return f"marked {path}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def peek(path: str) -> str:
        """Say whether a file exists (read-only)."""
        return f"{path} exists: {Path(path).exists()}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    def wipe(path: str) -> str:
        """Create a marker file standing for a destructive change."""
        Path(path).write_text("wiped")
        return f"wiped {path}"


def _extra(i: int) -> Callable[[str], str]:
    def tool(text: str = "") -> str:
        return f"extra {i}: {text}"

    return tool


async def serve_http(server: MCPServer, kind: str) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    app = server.sse_app() if kind == "sse" else server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


def wait_at_barrier(folder: Path, name: str, parties: int, limit: float = 60.0) -> None:
    """Leave a mark in ``folder``, then wait until ``parties`` servers have left theirs."""
    (folder / name).touch()
    deadline = time.monotonic() + limit
    while len(list(folder.iterdir())) < parties:
        if time.monotonic() > deadline:
            sys.exit(f"barrier: only {len(list(folder.iterdir()))} of {parties} servers started")
        time.sleep(0.02)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http", "sse"])
    parser.add_argument("--name", default="demo")
    parser.add_argument("--extra", type=int, default=0)
    parser.add_argument("--barrier", type=Path)
    parser.add_argument("--parties", type=int, default=1)
    parser.add_argument("--annotated", action="store_true")
    args = parser.parse_args()
    if args.barrier is not None:
        wait_at_barrier(args.barrier, args.name, args.parties)
    server = build(args.name, args.extra, args.annotated)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        asyncio.run(serve_http(server, args.transport))


if __name__ == "__main__":
    sys.exit(main())
