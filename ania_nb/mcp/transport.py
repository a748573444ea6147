"""Opening one MCP client session with the `mcp` SDK over stdio, streamable HTTP or SSE.

The SDK (and httpx2/anyio under it) is imported on first use, in a worker thread, so
``import ania_nb.mcp`` stays cheap and a notebook kernel never stalls on the import.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ania_nb._env import child_env
from ania_nb.mcp.config import MCPServerConfig
from ania_nb.text import cut

if TYPE_CHECKING:
    import httpx2
    from mcp import ClientSession
    from mcp.client.session import MessageHandlerFnT, SamplingFnT

    from ania_nb._http import MCPClientFactory
    from ania_nb.config import SecuritySettings

__all__ = [
    "PromptArgument",
    "RemotePrompt",
    "RemoteResource",
    "RemoteTool",
    "ServerFeatures",
    "StderrTail",
    "list_remote_prompts",
    "list_remote_resources",
    "list_remote_tools",
    "load_sdk",
    "open_session",
    "server_features",
]

_log = logging.getLogger(__name__)

_SDK_MODULES = ("mcp", "mcp.client.stdio", "mcp.client.streamable_http", "mcp.client.sse")
_MAX_PAGES = 100  # tools/list pagination guard against a server that never stops paging


@dataclass(frozen=True)
class RemoteTool:
    """A tool as the server lists it (SDK-independent, so the rest never touches mcp types)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool
    destructive: bool = False  # the server set destructiveHint: true (and not readOnlyHint)
    task_support: str | None = None  # execution.taskSupport: forbidden / optional / required


@dataclass(frozen=True)
class PromptArgument:
    """One argument of a server prompt."""

    name: str
    description: str = ""
    required: bool = False


@dataclass(frozen=True)
class RemotePrompt:
    """A prompt as the server lists it (``prompts/list``), SDK-independent."""

    name: str
    description: str
    arguments: tuple[PromptArgument, ...] = ()


_import_lock = threading.Lock()
_sdk_ready = threading.Event()  # set once every SDK module is fully imported


def _import_sdk() -> None:
    # One thread imports at a time: servers connecting concurrently would otherwise import the
    # SDK in parallel threads and see each other's partially initialised modules.
    with _import_lock:
        for module in _SDK_MODULES:
            importlib.import_module(module)
        quiet_sdk_logs()
        _sdk_ready.set()


SDK_LOGGER = "ania_nb.mcp.sdk"


class _SDKLogs(logging.Handler):
    """Re-logs the SDK's records at debug level under `SDK_LOGGER`, tracebacks included."""

    def emit(self, record: logging.LogRecord) -> None:
        target = logging.getLogger(SDK_LOGGER)
        if target.isEnabledFor(logging.DEBUG):
            message = f"[{record.name}] {record.getMessage()}"
            target.debug("%s", message, exc_info=record.exc_info)


def quiet_sdk_logs() -> None:
    """Keep the SDK's own tracebacks off the notebook's stderr: they go to `SDK_LOGGER`.

    With no handler configured anywhere, Python prints warnings and errors to stderr; the SDK
    logs a full traceback for a dropped connection that ania-nb already reports in one line
    (``MCP server 'x' disconnected: …``). A handler the user put on the ``mcp`` logger wins.
    """
    sdk = logging.getLogger("mcp")
    if sdk.handlers:
        return
    sdk.addHandler(_SDKLogs())
    sdk.propagate = False


async def load_sdk() -> None:
    """Import the SDK modules off the event loop (they take a few hundred ms the first time)."""
    if not _sdk_ready.is_set():
        await asyncio.to_thread(_import_sdk)


class StderrTail:
    """A stdio server's stderr: logged at debug level, the last lines kept for error messages.

    A pipe read by a daemon thread, because a notebook's ``sys.stderr`` has no file descriptor
    to hand to a subprocess, and a server's start-up traceback is the best error message there is.
    """

    def __init__(self, server: str, keep: int = 20) -> None:
        read_fd, write_fd = os.pipe()
        self.writer = os.fdopen(write_fd, "w", encoding="utf-8")
        self._lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._server = server
        self.on_eof: Callable[[], object] | None = None  # called (in the thread) at the end
        reader = os.fdopen(read_fd, "r", encoding="utf-8", errors="replace")
        self._thread = threading.Thread(
            target=self._pump, args=(reader,), name=f"mcp-stderr-{server}", daemon=True
        )
        self._thread.start()

    def _pump(self, reader: Any) -> None:
        with reader:  # ends at EOF: when the server and everything it spawned have exited
            for line in reader:
                line = line.rstrip()
                if line:
                    self._lines.append(line)
                    _log.debug("MCP server %r stderr: %s", self._server, line)
        if self.on_eof is not None:
            self.on_eof()

    def close_writer(self) -> None:
        """Drop our copy of the write end (the child holds its own after the spawn)."""
        if not self.writer.closed:
            self.writer.close()

    def join(self, timeout: float) -> None:
        """Wait (blocking) up to ``timeout`` seconds for the server's stderr to reach its end."""
        self._thread.join(timeout)

    def text(self, limit: int = 1500) -> str:
        """The last stderr lines, at most ``limit`` characters."""
        return cut("\n".join(self._lines), limit, keep="end")


def _http_timeout(seconds: float) -> httpx2.Timeout:
    import httpx2

    # Connect, write and pool waits are bounded; reads are not, because an SSE stream (and a
    # long tool call answered over it) may stay silent for a long time. The handshake as a
    # whole is bounded by the caller's connect timeout.
    return httpx2.Timeout(connect=seconds, read=None, write=seconds, pool=seconds)


async def open_session(
    stack: contextlib.AsyncExitStack,
    config: MCPServerConfig,
    connect_timeout: float,
    stderr: StderrTail | None = None,
    client_factory: MCPClientFactory | None = None,
    security: SecuritySettings | None = None,
    message_handler: MessageHandlerFnT | None = None,
    sampling_callback: SamplingFnT | None = None,
) -> ClientSession:
    """Enter the transport and an initialised `ClientSession` on ``stack`` (in this task).

    HTTP transports get their client from ``client_factory`` (default: the SDK's own); a stdio
    server inherits the environment without ``ANIA_*`` and ``security.secret_env`` variables,
    plus its entry's own ``env``. ``message_handler`` receives the server's notifications;
    ``sampling_callback`` answers its sampling requests (and advertises the capability).
    """
    import mcp_types
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    from ania_nb._version import VERSION

    if config.transport == "stdio":
        params = StdioServerParameters(
            command=config.command or "",
            args=config.args,
            env=child_env(security, config.env),
            cwd=config.cwd,
        )
        errlog = stderr.writer if stderr is not None else sys.stderr
        try:
            streams = await stack.enter_async_context(stdio_client(params, errlog=errlog))
        finally:
            if stderr is not None:
                stderr.close_writer()
    elif config.transport == "streamable-http":
        make_client = client_factory or create_mcp_http_client
        client = make_client(headers=config.headers, timeout=_http_timeout(connect_timeout))
        await stack.enter_async_context(client)
        streams = await stack.enter_async_context(
            streamable_http_client(config.endpoint or "", http_client=client)
        )
    else:
        make_client = client_factory or create_mcp_http_client
        http_timeout = _http_timeout(connect_timeout)

        def sse_factory(
            headers: dict[str, str] | None = None,
            timeout: httpx2.Timeout | None = None,
            auth: httpx2.Auth | None = None,
        ) -> httpx2.AsyncClient:
            # sse_client would impose a read timeout on the event stream; ours has none.
            return make_client(headers=headers, timeout=http_timeout, auth=auth)

        streams = await stack.enter_async_context(
            sse_client(
                config.endpoint or "", headers=config.headers, httpx_client_factory=sse_factory
            )
        )
    read_stream, write_stream = streams
    info = mcp_types.Implementation(name="ania-nb", version=VERSION)
    session = await stack.enter_async_context(
        ClientSession(
            read_stream,
            write_stream,
            client_info=info,
            message_handler=message_handler,
            sampling_callback=sampling_callback,
        )
    )
    await session.initialize()
    return session


async def list_remote_tools(session: ClientSession) -> list[RemoteTool]:
    """Every tool the server lists, following pagination."""
    import mcp_types

    tools: list[RemoteTool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        for tool in page.tools:
            hints = tool.annotations
            tools.append(
                RemoteTool(
                    name=tool.name,
                    description=(tool.description or "").strip(),
                    input_schema=dict(tool.input_schema or {}),
                    read_only=bool(hints is not None and hints.read_only_hint),
                    destructive=bool(
                        hints is not None and hints.destructive_hint and not hints.read_only_hint
                    ),
                    task_support=tool.execution.task_support if tool.execution else None,
                )
            )
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


@dataclass(frozen=True)
class ServerFeatures:
    """What the server declared besides tools: resources (and subscribe), prompts."""

    resources: bool = False
    subscribe: bool = False
    prompts: bool = False


def server_features(session: ClientSession) -> ServerFeatures:
    """The capabilities of the server's initialize answer, as `ServerFeatures`."""
    init = session.initialize_result
    if init is None:
        return ServerFeatures()
    caps = init.capabilities
    resources = caps.resources
    return ServerFeatures(
        resources=resources is not None,
        subscribe=bool(resources is not None and resources.subscribe),
        prompts=caps.prompts is not None,
    )


@dataclass(frozen=True)
class RemoteResource:
    """A resource (``uri``) or a resource template (``uri`` is the RFC 6570 template)."""

    uri: str
    name: str
    description: str = ""
    mime_type: str = ""
    size: int | None = None
    template: bool = False


async def list_remote_resources(session: ClientSession) -> list[RemoteResource]:
    """Every resource, then every template, the server lists (pagination followed)."""
    import mcp_types

    found: list[RemoteResource] = []
    for kind in ("resources", "templates"):
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            if kind == "resources":
                page: Any = await session.list_resources(params=params)
                for r in page.resources:
                    found.append(
                        RemoteResource(
                            str(r.uri),
                            r.name,
                            (r.description or "").strip(),
                            r.mime_type or "",
                            r.size,
                        )
                    )
            else:
                page = await session.list_resource_templates(params=params)
                for t in page.resource_templates:
                    found.append(
                        RemoteResource(
                            t.uri_template,
                            t.name,
                            (t.description or "").strip(),
                            t.mime_type or "",
                            template=True,
                        )
                    )
            cursor = page.next_cursor
            if not cursor:
                break
    return found


async def list_remote_prompts(session: ClientSession) -> list[RemotePrompt]:
    """Every prompt the server lists, following pagination, sorted by name."""
    import mcp_types

    prompts: list[RemotePrompt] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_prompts(params=params)
        for prompt in page.prompts:
            arguments = tuple(
                PromptArgument(a.name, (a.description or "").strip(), bool(a.required))
                for a in prompt.arguments or ()
            )
            prompts.append(RemotePrompt(prompt.name, (prompt.description or "").strip(), arguments))
        cursor = page.next_cursor
        if not cursor:
            break
    return sorted(prompts, key=lambda p: p.name)
