"""`MCPToolManager`: the connection to one MCP server, its tool list and its tool calls.

The SDK's transports and `ClientSession` are async context managers built on anyio task groups
and cancel scopes, which must be exited by the task that entered them. So each connection lives
in one dedicated task (the *runner*): it enters everything on an `AsyncExitStack`, reports
readiness, waits for the stop signal and unwinds the stack itself. Calls are made from any task.

Every successful (re)connect increments ``generation``; tool objects remember the generation
they were made for: after a reconnect a tool whose schema did not change is re-bound to the new
session, any other fails with a clear message instead of silently talking to a new session.

A lost server is noticed without waiting for a call: a stdio server's stderr reaching its end
means its process exited, and HTTP/SSE servers are pinged every ``mcp.ping_interval`` seconds.
With ``mcp.auto_reconnect`` the next use of a lost server reconnects it (attempts at most every
1, 2, 4 … 60 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from ania_nb.errors import ConfigError, MCPServerError, ToolError
from ania_nb.mcp.config import MCPServerConfig, expand_env
from ania_nb.mcp.results import ToolOutput, convert_result, read_tool_name
from ania_nb.mcp.transport import (
    RemotePrompt,
    RemoteResource,
    RemoteTool,
    ServerFeatures,
    StderrTail,
    list_remote_prompts,
    list_remote_resources,
    list_remote_tools,
    load_sdk,
    open_session,
    server_features,
)

if TYPE_CHECKING:
    from mcp import ClientSession

    from ania_nb._http import MCPClientFactory
    from ania_nb.config import MCPSettings, SecuritySettings
    from ania_nb.mcp.sampling import Sampler
    from ania_nb.tools.base import ToolContext

__all__ = ["MCPServerError", "MCPToolManager", "ProgressHandler", "ServerState"]


class ProgressHandler(Protocol):
    """Receives a call's progress notifications (the SDK's progress callback shape)."""

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        """One notification: ``progress`` of ``total`` (None: unknown), with an optional text."""


_log = logging.getLogger(__name__)

_T = TypeVar("_T")
# what a connect finds: tools, prompts, features, resources (and templates)
_Listing = tuple[list[RemoteTool], list[RemotePrompt], ServerFeatures, list[RemoteResource]]
ResourceWatcher = Callable[[str], Awaitable[None]]  # called with the URI of an updated resource
ServerState = Literal["idle", "connecting", "connected", "disconnected", "failed", "closed"]
_STOP_GRACE = 10.0  # seconds a runner gets to unwind (stdio shutdown is itself bounded by ~6 s)
_MAX_BACKOFF = 60.0  # longest pause between automatic reconnect attempts
PROCESS_EXITED = "the server process exited"


def _notify(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    """Set ``event`` from another thread (nothing to tell once the loop is closed)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(event.set)


def describe(exc: BaseException) -> str:
    """A one-line account of an exception, unwrapping anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip() or type(exc).__name__
    return text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"


class MCPToolManager:
    """One MCP server: connect, list and filter its tools, call them, reconnect, close."""

    def __init__(
        self,
        config: MCPServerConfig,
        settings: MCPSettings,
        *,
        client_factory: MCPClientFactory | None = None,
        security: SecuritySettings | None = None,
    ) -> None:
        self.config = config
        self.settings = settings
        self.security = security  # inherited variables a stdio server must not see
        self.client_factory = client_factory  # HTTP transports' clients; None = the SDK's
        self.generation = 0
        self._state: ServerState = "idle"
        self._error: str | None = None
        self._tools: list[RemoteTool] = []
        self._prompts: list[RemotePrompt] = []
        self._features = ServerFeatures()
        self._resources: list[RemoteResource] = []
        self._watchers: dict[str, list[ResourceWatcher]] = {}  # uri -> who shows it
        self._notified: set[asyncio.Task[None]] = set()  # watcher calls in flight
        self.sampler: Sampler | None = None  # answers sampling requests (the Agent sets it)
        self._calls: list[ToolContext] = []  # contexts of the tool calls in flight, in order
        self._session: ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self.starting: asyncio.Task[None] | None = None  # the registry's first connect, if any
        self._backoff = 1.0  # seconds before the next automatic reconnect may be tried
        self._next_attempt = 0.0  # time.monotonic() of that

    def __repr__(self) -> str:
        return f"<MCPToolManager {self.name!r} {self._state}>"

    @property
    def name(self) -> str:
        """The server's name."""
        return self.config.name

    @property
    def state(self) -> ServerState:
        """idle, connecting, connected, disconnected (lost), failed (could not connect), closed."""
        return self._state

    @property
    def error(self) -> str | None:
        """Why the server is disconnected or failed, if it is."""
        return self._error

    @property
    def timeout(self) -> float:
        """Seconds allowed to connect and list tools."""
        return self.config.timeout or self.settings.connect_timeout

    @property
    def tools(self) -> list[RemoteTool]:
        """The server's tools after the entry's filter, sorted by name."""
        return self._tools

    @property
    def features(self) -> ServerFeatures:
        """What the server declared at the last connect (resources, subscribe, prompts)."""
        return self._features

    @property
    def has_resources(self) -> bool:
        """Whether the server listed any resource or template at the last connect.

        (Servers built on the SDK declare the capability even with nothing to offer; the
        resource tools are only offered when there is something to read.)
        """
        return bool(self._resources)

    @property
    def prompts(self) -> list[RemotePrompt]:
        """The server's prompts as listed at the last connect, sorted by name."""
        return self._prompts

    # ------------------------------------------------------------------ lifecycle

    async def connect(self) -> None:
        """Connect, initialise and list tools within the timeout; raises `MCPServerError`."""
        async with self._lock:
            await self._connect()

    async def reconnect(self) -> None:
        """Drop the current connection (if any) and connect again."""
        async with self._lock:
            self._check_open()
            self._state = "connecting"  # what in-flight calls cut off by the stop are told
            await self._stop_runner()
            await self._connect()

    async def aclose(self) -> None:
        """Close the connection for good (the stdio server process is stopped)."""
        async with self._lock:
            self._state, self._error = "closed", None
            await self._stop_runner()

    def _check_open(self) -> None:
        if self._state == "closed":
            raise MCPServerError(f"MCP server {self.name!r} has been closed", server=self.name)

    async def _connect(self) -> None:
        self._check_open()
        try:
            await load_sdk()
        except ImportError as exc:
            self._state, self._error = "failed", str(exc)
            raise MCPServerError(
                f"MCP server {self.name!r} cannot be connected: the 'mcp' package is missing or "
                f'broken ({exc}); reinstall with: pip install "ania-nb"',
                server=self.name,
            ) from exc
        if self._task is not None:  # connect() on a live connection: replace it, never leak it
            await self._stop_runner()
        try:
            live = expand_env(self.config)  # ${VAR} from the environment, at each connect
        except ConfigError as exc:
            self._state, self._error = "failed", str(exc)
            raise MCPServerError(str(exc), server=self.name) from None
        self._state, self._error = "connecting", None
        ready: asyncio.Future[_Listing] = asyncio.get_running_loop().create_future()
        stderr = StderrTail(self.name) if self.config.transport == "stdio" else None
        self._stop = asyncio.Event()
        lost = asyncio.Event()
        if stderr is not None:  # stderr's end = the process exited: seen at once, not at a call
            loop = asyncio.get_running_loop()
            stderr.on_eof = lambda: _notify(loop, lost)
        self._task = asyncio.create_task(
            self._run(live, ready, self._stop, stderr, lost), name=f"mcp:{self.name}"
        )
        try:
            listing = await asyncio.wait_for(asyncio.shield(ready), self.timeout)
        except asyncio.CancelledError:
            await self._stop_runner(cancel=True)
            self._state, self._error = "failed", "the connection attempt was cancelled"
            raise
        except Exception as exc:
            await self._stop_runner(cancel=True)
            reason = (
                f"no answer within {self.timeout:g} s (connect, initialize and list tools)"
                if isinstance(exc, TimeoutError)
                else describe(exc)
            )
            if stderr is not None:
                await asyncio.to_thread(stderr.join, 1.0)  # let the last lines arrive
                if stderr.text():
                    reason += f"\nserver stderr (last lines):\n{stderr.text()}"
            self._state, self._error = "failed", reason
            where = f"{self.config.transport} {self.config.target}"
            raise MCPServerError(
                f"MCP server {self.name!r} ({where}) could not be connected: {reason}",
                server=self.name,
            ) from None
        tools, self._prompts, self._features, self._resources = listing
        self._tools = self._select(tools)
        self.generation += 1
        self._state = "connected"
        _log.info("MCP server %r connected: %d tools", self.name, len(self._tools))

    async def _run(
        self,
        live: MCPServerConfig,
        ready: asyncio.Future[_Listing],
        stop: asyncio.Event,
        stderr: StderrTail | None,
        lost: asyncio.Event,
    ) -> None:
        """The runner task: owns the exit stack, so the SDK's cancel scopes stay in one task."""
        session: ClientSession | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                session = await open_session(
                    stack,
                    live,
                    self.timeout,
                    stderr,
                    self.client_factory,
                    self.security,
                    message_handler=self._on_message,
                    sampling_callback=self._on_sampling,
                )
                tools = await list_remote_tools(session)
                features = server_features(session)
                prompts = await self._optional(session, features.prompts, list_remote_prompts)
                resources = await self._optional(session, features.resources, list_remote_resources)
                self._session = session
                ready.set_result((tools, prompts, features, resources))
                why = await self._watch(session, stop, lost)
                if why is not None and self._session is session:
                    tail = stderr.text() if stderr is not None else ""
                    self._mark_lost(
                        why + (f"\nserver stderr (last lines):\n{tail}" if tail else "")
                    )
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            elif not stop.is_set():
                self._mark_lost(describe(exc))  # the transport died under a live connection
        finally:
            if self._session is session:
                self._session = None
            if stderr is not None:
                stderr.close_writer()

    async def _optional(
        self,
        session: ClientSession,
        declared: bool,
        lister: Callable[[ClientSession], Awaitable[list[_T]]],
    ) -> list[_T]:
        """A listing besides tools (prompts, resources): a server failing it keeps its tools."""
        if not declared:
            return []
        try:
            return await lister(session)
        except Exception as exc:
            _log.warning("MCP server %r: %s failed: %s", self.name, lister.__name__, describe(exc))
            return []

    async def _on_sampling(self, context: Any, params: Any) -> Any:
        """``sampling/createMessage``: answered for the latest tool call in flight, if any."""
        from ania_nb.mcp.sampling import answer_sampling

        return await answer_sampling(
            self.name,
            params,
            allowed=self.config.sampling,
            ctx=self._calls[-1] if self._calls else None,
            sampler=self.sampler,
            cap=self.settings.sampling_max_tokens,
        )

    async def _on_message(self, message: Any) -> None:
        """A server notification (or a transport exception the SDK surfaces)."""
        import mcp_types

        if isinstance(message, mcp_types.ResourceUpdatedNotification):
            uri = str(message.params.uri)
            for watcher in list(self._watchers.get(uri, ())):
                task = asyncio.ensure_future(watcher(uri))  # never block the session's reader
                self._notified.add(task)
                task.add_done_callback(self._watcher_done)

    def _watcher_done(self, task: asyncio.Task[None]) -> None:
        self._notified.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.warning(
                "MCP server %r: showing an updated resource failed: %s",
                self.name,
                describe(task.exception() or Exception()),
            )

    async def _watch(
        self, session: ClientSession, stop: asyncio.Event, lost: asyncio.Event
    ) -> str | None:
        """Wait for the stop signal; return why the connection died first, if it did."""
        waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(lost.wait())}
        interval = self.settings.ping_interval if self.config.transport != "stdio" else 0
        try:
            while True:
                done, _ = await asyncio.wait(
                    waiters, timeout=interval or None, return_when=asyncio.FIRST_COMPLETED
                )
                if stop.is_set():
                    return None
                if lost.is_set():
                    return PROCESS_EXITED
                if not done:  # a ping is due
                    try:
                        await asyncio.wait_for(session.send_ping(), self.timeout)
                    except Exception as exc:
                        return f"the server stopped answering pings ({describe(exc)})"
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def ready(self) -> None:
        """Make the server usable if it can be, else raise `ToolError` saying why.

        Waits for a connection in progress (up to the connect timeout) and, with
        ``mcp.auto_reconnect``, reconnects a lost server (attempts spaced 1 → 60 s).
        """
        starting = self.starting
        if starting is not None and not starting.done():  # the first connection, in progress
            await asyncio.wait({starting}, timeout=self.timeout + _STOP_GRACE)
        elif self._state == "connecting":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lock.acquire(), self.timeout)
                self._lock.release()
        elif (
            self._state == "disconnected"
            and self.settings.auto_reconnect
            and time.monotonic() >= self._next_attempt
        ):
            try:
                await self.reconnect()
            except MCPServerError as exc:
                self._next_attempt = time.monotonic() + self._backoff
                self._backoff = min(self._backoff * 2, _MAX_BACKOFF)
                _log.warning("automatic reconnect failed: %s", exc)
                self._state = "disconnected"  # keep trying on later uses
            else:
                self._backoff, self._next_attempt = 1.0, 0.0
                _log.info("MCP server %r reconnected on use", self.name)
        self.check_available()

    def current(self, tool: str) -> RemoteTool | None:
        """The server's tool ``tool`` on the current connection, if it lists it."""
        return next((t for t in self._tools if t.name == tool), None)

    async def _stop_runner(self, *, cancel: bool = False) -> None:
        task, stop = self._task, self._stop
        self._task = self._stop = None
        self._session = None
        if task is None:
            return
        if stop is not None:
            stop.set()
        if cancel:
            task.cancel()
        done, _ = await asyncio.wait({task}, timeout=_STOP_GRACE)
        if not done:
            _log.warning("MCP server %r did not shut down in time; cancelling", self.name)
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            _log.debug("MCP server %r runner ended with %r", self.name, task.exception())

    def _select(self, tools: list[RemoteTool]) -> list[RemoteTool]:
        rule = self.config.filter
        kept = [t for t in tools if rule is None or rule.matches(t.name, t.description)]
        return sorted(kept, key=lambda t: t.name)

    def _mark_lost(self, reason: str) -> None:
        if self._state == "connected":
            self._state, self._error = "disconnected", reason
            _log.warning("MCP server %r disconnected: %s", self.name, reason)

    # ------------------------------------------------------------------ calls

    def unavailable_message(self) -> str:
        """What the model is told when this server cannot take calls right now."""
        name = self.name
        if self._state == "closed":
            return (
                f"MCP server '{name}' has been removed or shut down; this tool is gone (if "
                f"mcp_load_{name} is still offered, load the tool again)"
            )
        if self._state in ("connecting", "idle"):
            return (
                f"MCP server '{name}' is still connecting; try again in a moment (or do without it)"
            )
        why = f" ({self._error.splitlines()[0]})" if self._error else ""
        what = "is disconnected" if self._state == "disconnected" else "is not connected"
        return (
            f"MCP server '{name}' {what}{why}. Reconnect it with mcp_reconnect(name='{name}') "
            "if that tool is available, otherwise ask the user to reconnect it"
        )

    def check_available(self) -> None:
        """Raise `ToolError` with `unavailable_message` unless the server is connected."""
        if self._state != "connected" or self._session is None:
            raise ToolError(self.unavailable_message())

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        generation: int,
        on_progress: ProgressHandler | None = None,
        ctx: ToolContext | None = None,
    ) -> ToolOutput:
        """Call a tool; returns its output (text truncated) or raises `ToolError` for the model.

        ``on_progress(progress, total, message)`` receives the server's progress notifications.
        ``ctx`` (the calling run's) is who the server's sampling requests during the call ask.
        """
        if generation != self.generation:
            raise ToolError(
                f"tool '{tool}' belongs to an earlier connection to MCP server '{self.name}', "
                f"which has been reconnected since; load it again with "
                f"mcp_load_{self.name}(tool_names=['{tool}'])"
            )
        self.check_available()
        session = self._session
        assert session is not None
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        if ctx is not None:
            self._calls.append(ctx)
        try:
            result = await session.call_tool(tool, arguments, progress_callback=on_progress)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise ToolError(
                    f"MCP server '{self.name}' rejected the call to '{tool}': {exc.message}"
                ) from None
            lost = "the connection was closed (the server may have crashed)"
        except _connection_errors() as exc:
            lost = describe(exc)
        except Exception as exc:
            raise ToolError(
                f"MCP call to '{tool}' on server '{self.name}' failed: {describe(exc)}"
            ) from None
        else:
            reader = read_tool_name(self.name) if self.has_resources else None
            output = convert_result(result, self.settings.max_result_chars, reader)
            if result.is_error:
                message = output.text or f"MCP tool '{tool}' reported an error without a message"
                raise ToolError(message)
            return output
        finally:
            if ctx is not None:
                self._calls.remove(ctx)
        if self._session is session:
            self._mark_lost(lost)
        raise ToolError(self.unavailable_message())

    async def request(self, what: str, send: Callable[[ClientSession], Awaitable[_T]]) -> _T:
        """Send one request (``what``: e.g. "prompts/get 'x'") on the live session.

        Waits for / revives the connection like a tool call; raises `ToolError` saying what
        went wrong (the server refused, or the connection was lost, which marks it lost).
        """
        await self.ready()
        session = self._session
        assert session is not None
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        try:
            return await send(session)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise ToolError(f"MCP server '{self.name}' refused {what}: {exc.message}") from None
            lost = "the connection was closed (the server may have crashed)"
        except _connection_errors() as exc:
            lost = describe(exc)
        except Exception as exc:
            raise ToolError(f"{what} on MCP server '{self.name}' failed: {describe(exc)}") from None
        if self._session is session:
            self._mark_lost(lost)
        raise ToolError(self.unavailable_message())

    # ------------------------------------------------------------------ resources

    async def list_resources(self) -> list[RemoteResource]:
        """The server's resources, then its templates; raises `ToolError` when it cannot."""
        return await self.request("resources/list", list_remote_resources)

    async def read_resource(self, uri: str) -> Any:
        """``resources/read``: the SDK's ``ReadResourceResult``; raises `ToolError`."""
        return await self.request(f"resources/read {uri!r}", lambda s: s.read_resource(uri))

    async def watch(self, uri: str, watcher: ResourceWatcher) -> Callable[[], Awaitable[None]]:
        """Subscribe to ``uri`` (``resources/subscribe``); ``watcher(uri)`` runs on each update.

        Returns the coroutine function that stops watching. Raises `ToolError` when the server
        does not support subscriptions or refuses this one.
        """
        await self.ready()
        if not self._features.subscribe:
            raise ToolError(f"MCP server '{self.name}' does not support resource subscriptions")
        first = uri not in self._watchers
        self._watchers.setdefault(uri, []).append(watcher)
        if first:
            try:
                await self.request(f"resources/subscribe {uri!r}", _subscriber(uri, True))
            except ToolError:
                self._watchers.pop(uri, None)
                raise

        async def stop() -> None:
            watchers = self._watchers.get(uri, [])
            if watcher in watchers:
                watchers.remove(watcher)
            if not watchers and self._watchers.pop(uri, None) is not None:
                with contextlib.suppress(ToolError):
                    await self.request(f"resources/unsubscribe {uri!r}", _subscriber(uri, False))

        return stop


def _subscriber(uri: str, on: bool) -> Callable[[ClientSession], Awaitable[Any]]:
    """``resources/(un)subscribe``, the notification form servers of every version answer.

    The SDK flags it deprecated for 2026-07-28 servers (``subscriptions/listen`` replaces it);
    the reference servers and the SDK's own server still serve it, so the warning is muted.
    """

    async def send(session: ClientSession) -> Any:
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="resources/(un)?subscribe is removed")
            call = session.subscribe_resource if on else session.unsubscribe_resource
            return await call(uri)

    return send


def _connection_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean the transport under a session died (SDK imported by then)."""
    import anyio
    import httpx2

    return (
        OSError,
        anyio.BrokenResourceError,
        anyio.ClosedResourceError,
        anyio.EndOfStream,
        httpx2.TransportError,
        httpx2.HTTPStatusError,
    )
