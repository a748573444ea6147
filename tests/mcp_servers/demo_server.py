"""A real MCP server for the tests, written with the SDK's `MCPServer`.

Run: ``python demo_server.py stdio|http|sse``.
Over HTTP/SSE it binds 127.0.0.1 on a free port and prints ``PORT <n>`` as its first stdout line.
``--name`` sets the server name (so several instances are told apart); ``--extra N`` adds N
generated tools ``extra_000`` ... (for filters and ordering tests). ``--barrier DIR --parties N``
makes the server wait, before it serves, until N servers have started with the same DIR (each
leaves a file there): servers connected one after another would never get past it.
``--annotated`` adds tools for the gating tests: ``mark`` (no annotations), ``peek``
(``readOnlyHint``) and ``wipe`` (``destructiveHint``), each writing or checking a marker file.
``--media`` adds tools whose results are not text: ``picture`` (a PNG image block), ``sound``
(audio), ``document`` (a PDF blob resource and an image blob resource), ``steps`` (reports
progress while it works) and ``batch_job`` (listed with ``execution.taskSupport: required``).
``--prompts`` adds prompts: ``review`` (``code`` required, ``language`` optional), ``chat-log``
(a user, an assistant and an image message) and ``broken`` (fails).
``--resources`` adds resources (``memo://note`` text, ``memo://logo.png`` an image,
``memo://data.bin`` binary, the template ``memo://notes/{name}``), subscriptions, and the tools
``bump_note`` (changes the note and notifies subscribers) and ``linked`` (a resource link and an
embedded text resource). ``--ask`` adds ``ask_model`` (asks the client's model through MCP
sampling).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

from mcp.server.lowlevel.server import HandlerEntry
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.prompts.base import AssistantMessage, UserMessage
from mcp_types import (
    AudioContent,
    BlobResourceContents,
    EmbeddedResource,
    EmptyResult,
    ImageContent,
    ResourceLink,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
    Tool,
    ToolAnnotations,
    ToolExecution,
    UnsubscribeRequestParams,
)
from pydantic import Field

# A 1x1 red PNG.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de"
        "0000000c49444154789c63f8cfc0000003010100c9fe92ef0000000049454e44ae426082"
    )
).decode("ascii")


class DemoServer(MCPServer):
    """`MCPServer` that can mark tools as requiring task augmentation (the SDK cannot yet)."""

    task_required: frozenset[str] = frozenset()

    async def list_tools(self) -> list[Tool]:
        tools = await super().list_tools()
        return [
            t.model_copy(update={"execution": ToolExecution(task_support="required")})
            if t.name in self.task_required
            else t
            for t in tools
        ]


def build(
    name: str,
    extra: int,
    annotated: bool = False,
    media: bool = False,
    prompts: bool = False,
    resources: bool = False,
    ask: bool = False,
) -> MCPServer:
    server = DemoServer(name, instructions="Test server for ania-nb.")

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
    async def sleep(seconds: float, started: str = "") -> str:
        """Sleep, then say so (``started``: a file touched once the call is running)."""
        if started:
            await asyncio.to_thread(Path(started).touch)
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
    if media:
        _add_media(server)
    if prompts:
        _add_prompts(server)
    if resources:
        _add_resources(server)
    if ask:
        _add_ask(server)
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


def _add_media(server: DemoServer) -> None:
    @server.tool()
    def picture(caption: str = "") -> list[TextContent | ImageContent]:
        """Return a tiny PNG (and the caption as text when given)."""
        image = ImageContent(type="image", data=PNG, mime_type="image/png")
        return [TextContent(type="text", text=caption), image] if caption else [image]

    @server.tool()
    def sound() -> AudioContent:
        """Return a short WAV clip."""
        data = base64.b64encode(b"RIFF" + bytes(40)).decode("ascii")
        return AudioContent(type="audio", data=data, mime_type="audio/wav")

    @server.tool()
    def document() -> list[EmbeddedResource]:
        """Return a PDF and a PNG as blob resources."""
        pdf = BlobResourceContents(
            uri="file:///report.pdf",
            mime_type="application/pdf",
            blob=base64.b64encode(b"%PDF-1.4 " + bytes(2048)).decode(),
        )
        png = BlobResourceContents(uri="file:///chart.png", mime_type="image/png", blob=PNG)
        return [
            EmbeddedResource(type="resource", resource=pdf),
            EmbeddedResource(type="resource", resource=png),
        ]

    @server.tool()
    async def steps(count: int, ctx: Context) -> str:
        """Work in ``count`` steps, reporting progress after each."""
        for i in range(1, count + 1):
            await ctx.report_progress(i, count, f"step {i} of {count}")
            await asyncio.sleep(0.25)  # so every step is its own progress event
        return f"done in {count} steps"

    @server.tool()
    def batch_job(items: int) -> str:
        """A long job that must run as an MCP task."""
        return f"{items} items"

    server.task_required = frozenset({"batch_job"})


def _add_prompts(server: MCPServer) -> None:
    @server.prompt(description="Review a piece of code.")
    def review(
        code: Annotated[str, Field(description="the code to review")], language: str = "python"
    ) -> str:
        return f"Please review this {language} code:\n{code}"

    @server.prompt(name="chat-log", description="A short exchange about a topic, with a picture.")
    def chat_log(topic: str) -> list[UserMessage | AssistantMessage]:
        image = ImageContent(type="image", data=PNG, mime_type="image/png")
        return [
            UserMessage(f"Tell me about {topic}."),
            AssistantMessage(f"{topic} is a big subject; what part?"),
            UserMessage(content=image),
        ]

    @server.prompt(description="Always fails.")
    def broken() -> str:
        raise ValueError("this prompt is broken on purpose")


def _add_ask(server: MCPServer) -> None:
    @server.tool()
    async def ask_model(question: str, ctx: Context) -> str:
        """Ask the client's model (MCP sampling) and return its answer or its refusal."""
        from mcp import MCPError
        from mcp_types import ModelHint, ModelPreferences, SamplingMessage

        try:
            result = await ctx.session.create_message(
                [SamplingMessage(role="user", content=TextContent(type="text", text=question))],
                max_tokens=5000,
                system_prompt="You answer in one word.",
                model_preferences=ModelPreferences(hints=[ModelHint(name="cheap")]),
            )
        except MCPError as exc:
            return f"refused: {exc.message}"
        return f"{result.model} said: {result.content.text}"


def _add_resources(server: MCPServer) -> None:
    version = [0]

    @server.resource("memo://note", name="note", description="A note that changes.")
    def note() -> str:
        return f"note v{version[0]}"

    @server.resource("memo://logo.png", name="logo", mime_type="image/png")
    def logo() -> bytes:
        return base64.b64decode(PNG)

    @server.resource("memo://data.bin", name="data", mime_type="application/octet-stream")
    def data() -> bytes:
        return bytes(range(64))

    @server.resource("memo://notes/{name}", name="named-note", description="A note by name.")
    def named(name: str) -> str:
        return f"note called {name}"

    @server.tool()
    async def bump_note(ctx: Context) -> str:
        """Change the note and tell subscribers."""
        version[0] += 1
        await ctx.session.send_resource_updated("memo://note")
        return f"note is now v{version[0]}"

    @server.tool()
    def linked() -> list[ResourceLink | EmbeddedResource]:
        """Return a link to the note and an embedded text resource."""
        inline = TextResourceContents(uri="memo://inline", mime_type="text/plain", text="inline")
        return [
            ResourceLink(
                type="resource_link", uri="memo://note", name="note", mime_type="text/plain"
            ),
            EmbeddedResource(type="resource", resource=inline),
        ]

    async def subscribed(ctx: object, params: object) -> EmptyResult:
        return EmptyResult()

    handlers = server._lowlevel_server._request_handlers
    handlers["resources/subscribe"] = HandlerEntry(SubscribeRequestParams, subscribed)
    handlers["resources/unsubscribe"] = HandlerEntry(UnsubscribeRequestParams, subscribed)


def _extra(i: int) -> Callable[[str], str]:
    def tool(text: str = "") -> str:
        return f"extra {i}: {text}"

    return tool


async def serve_http(server: MCPServer, kind: str) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    # Listening before the port is announced: a client that connects while uvicorn still starts
    # waits in the backlog instead of being refused (seen on a loaded machine).
    sock.listen(128)
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
    parser.add_argument("--media", action="store_true")
    parser.add_argument("--prompts", action="store_true")
    parser.add_argument("--resources", action="store_true")
    parser.add_argument("--ask", action="store_true")
    args = parser.parse_args()
    if args.barrier is not None:
        wait_at_barrier(args.barrier, args.name, args.parties)
    server = build(
        args.name, args.extra, args.annotated, args.media, args.prompts, args.resources, args.ask
    )
    if args.transport == "stdio":
        server.run("stdio")
    else:
        asyncio.run(serve_http(server, args.transport))


if __name__ == "__main__":
    sys.exit(main())
