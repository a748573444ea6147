"""OneBot v11 over WebSocket: one Universal connection carrying events in and actions out.

`ForwardTransport` dials the implementation's WebSocket server (``communication/ws.md``) and
redials with jittered exponential backoff; `ReverseTransport` listens for the implementation
(``communication/ws-reverse.md``), one connection at a time (a newer one replaces the older).
Both authenticate per ``communication/authorization.md``: the secret as ``Authorization:
Bearer <token>`` (``Token <token>``, what go-cqhttp sends, is accepted too) or as the
``access_token`` query parameter, compared in constant time. Actions are ``{action, params,
echo}`` frames answered by a frame with the same ``echo``; a call waits for a connection and for
its answer within ``action_timeout`` and fails with `AdapterError` when the socket drops first.

No frame ends a connection: whatever goes wrong while decoding or handling one (not JSON,
nested too deeply, the wrong shape, a handler that raises) is logged and that frame ignored.
Frames over ``_MAX_FRAME`` bytes and text frames that are not UTF-8 break the WebSocket protocol
itself; websockets closes that connection and it is redialed (forward) or awaited (reverse).
Only cancellation ends a connection loop; a loop that stops anyway (a bug) is reported through
`Transport.wait_broken`, and ``ania-nb serve`` exits non-zero so a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import random
from collections.abc import Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import (
    ConnectionClosed,
    InvalidStatus,
    InvalidURI,
    WebSocketException,
)
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.uri import parse_uri

from ...addresses import ip_of, is_loopback
from ...errors import ConfigError
from ..model import AdapterError
from ..redact import shown_url, url_secrets
from .models import ActionRequest, ActionResponse, validation_summary

log = logging.getLogger("ania_nb.runner.onebot")


class ActionFailed(AdapterError):
    """The implementation answered an action with a failure status [action, status, retcode]."""

    refused = True

    def __init__(self, message: str, *, action: str, status: str, retcode: int) -> None:
        super().__init__(message)
        self.action, self.status, self.retcode = action, status, retcode


EventHandler = Callable[[dict[str, Any]], None]
ConnectHandler = Callable[[], None]
_MAX_FRAME = 64 * 1024 * 1024  # history answers and image-bearing events can be large
_PREVIEW_CHARS = 200  # of a frame quoted in a log line


def _preview(frame: str | bytes) -> str:
    """The start of a frame for a log line (never the whole of a huge one)."""
    head = frame[:_PREVIEW_CHARS]
    more = f"… ({len(frame)} {'bytes' if isinstance(frame, bytes) else 'characters'})"
    return repr(head) + (more if len(frame) > _PREVIEW_CHARS else "")


class _Link:
    """One live WebSocket: reads frames, resolves action answers, hands events on."""

    def __init__(self, ws: ClientConnection | ServerConnection, on_event: EventHandler) -> None:
        self.ws = ws
        self.on_event = on_event
        self.pending: dict[str, tuple[asyncio.Future[ActionResponse], str]] = {}

    async def run(self) -> None:
        """Read until the socket closes; then fail the calls still waiting on it."""
        try:
            async for frame in self.ws:
                self.dispatch(frame)
        except ConnectionClosed as exc:  # not a plain goodbye (the iterator ends on those)
            log.warning("the OneBot connection broke: %s", exc)
        finally:
            self.fail_pending("the OneBot connection closed before it answered")

    def dispatch(self, frame: str | bytes) -> None:
        """Handle one frame; whatever goes wrong is logged and the frame ignored."""
        try:
            self._dispatch(frame)
        except Exception:  # one frame must never end the connection
            log.exception("ignored a OneBot frame whose handling failed: %s", _preview(frame))

    def _dispatch(self, frame: str | bytes) -> None:
        try:
            payload = json.loads(frame)
        except RecursionError:
            log.warning("ignored a OneBot frame nested too deeply: %s", _preview(frame))
            return
        except ValueError as exc:  # UnicodeDecodeError included (a binary frame)
            log.warning("ignored a OneBot frame that is not JSON (%s): %s", exc, _preview(frame))
            return
        if not isinstance(payload, dict):
            kind = type(payload).__name__
            log.warning("ignored a OneBot frame that is a JSON %s: %s", kind, _preview(frame))
            return
        if "post_type" in payload:
            self.on_event(payload)
            return
        echo = payload.get("echo")
        waiter = self.pending.pop(echo, None) if isinstance(echo, str) else None
        if waiter is None:
            log.debug("ignored a OneBot answer nobody waits for: %s", _preview(frame))
            return
        future, action = waiter
        if future.done():  # the call timed out meanwhile
            return
        try:
            response = ActionResponse.model_validate(payload)
        except ValidationError as exc:
            why = validation_summary(exc)
            future.set_exception(AdapterError(f"OneBot answered {action} with a bad frame: {why}"))
            return
        future.set_result(response)

    def fail_pending(self, reason: str) -> None:
        """Fail every waiting call with `AdapterError` (the socket is gone)."""
        pending, self.pending = self.pending, {}
        for future, action in pending.values():
            if not future.done():
                future.set_exception(AdapterError(f"OneBot action {action} failed: {reason}"))


def _settle(future: asyncio.Future[Any]) -> None:
    """A call's answer future is done with: cancel it, or retrieve the failure it holds.

    A dropped link fails its waiting futures; one whose call already gave up (the send raised
    first) would otherwise log "Future exception was never retrieved".
    """
    if not future.done():
        future.cancel()
    elif not future.cancelled():
        future.exception()


class Transport:
    """What both connection styles share: the current link, action calls, lifecycle."""

    def __init__(self, *, token: str | None, action_timeout: float) -> None:
        self.token = token or None
        self.action_timeout = action_timeout
        self.self_id_hint: str | None = None  # reverse mode: the X-Self-ID header
        self.last_error: str | None = None  # why the last connection attempt or link failed
        self._link: _Link | None = None
        self._linked = asyncio.Event()
        self._closed = False
        self._echoes = itertools.count(1)
        self._on_event: EventHandler = lambda payload: None
        self._on_connect: ConnectHandler = lambda: None
        self._broken = asyncio.Event()
        self.broken_reason: str | None = None  # why a connection loop stopped by itself

    @property
    def connected(self) -> bool:
        """Whether a connection is open right now."""
        return self._link is not None

    @property
    def url(self) -> str:
        """The WebSocket URL: dialed (forward) or listened at (reverse)."""
        raise NotImplementedError

    async def start(self, on_event: EventHandler, on_connect: ConnectHandler) -> None:
        """Start connecting or listening; ``on_event`` gets every event frame as a dict."""
        self._on_event, self._on_connect = on_event, on_connect

    async def wait_connected(self) -> None:
        """Return once a connection is open or the transport closed (use ``asyncio.wait_for``)."""
        await self._linked.wait()

    async def wait_broken(self) -> str:
        """Return (why) only when a connection loop stopped by itself: it will not reconnect."""
        await self._broken.wait()
        return self.broken_reason or "the OneBot connection loop stopped"

    def _break(self, reason: str) -> None:
        """A connection loop died (a bug): say so, and wake `wait_broken`."""
        if self._closed or self._broken.is_set():
            return
        self.broken_reason = reason
        log.error("%s; no more connections will be made", reason)
        self._broken.set()

    async def call(self, action: str, params: dict[str, Any] | None = None) -> Any:
        """Run an action and return its ``data``; `AdapterError` when it fails or times out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.action_timeout
        frame = ActionRequest(action=action, params=params or {}, echo="")
        while True:
            link = await self._wait_link(action, deadline)
            if link.ws.protocol.state is not State.OPEN:
                # Closing already: websockets would refuse the frame without writing it, so the
                # next connection cannot get a duplicate.
                self._drop_link(link, "the OneBot connection closed")
                continue
            echo = f"ania:{next(self._echoes)}"
            future: asyncio.Future[ActionResponse] = loop.create_future()
            link.pending[echo] = (future, action)
            try:
                # The state was OPEN just now and nothing ran since: this call hands the frame
                # to the socket before it can fail, so from here on the frame was *written*.
                await link.ws.send(frame.model_copy(update={"echo": echo}).model_dump_json())
                response = await asyncio.wait_for(future, max(deadline - loop.time(), 0.001))
            except ConnectionClosed:
                raise AdapterError(
                    f"OneBot action {action} failed: the connection closed while it was sent",
                    written=True,
                ) from None
            except TimeoutError:
                raise AdapterError(
                    f"OneBot action {action} timed out after {self.action_timeout:g} s "
                    "(runner.action_timeout)"
                ) from None
            finally:
                link.pending.pop(echo, None)
                _settle(future)
            break
        if not response.ok:
            why = response.wording or response.message
            raise ActionFailed(
                f"OneBot action {action} failed: status {response.status}, "
                f"retcode {response.retcode}" + (f": {why}" if why else ""),
                action=action,
                status=response.status,
                retcode=response.retcode,
            )
        return response.data

    async def _wait_link(self, action: str, deadline: float) -> _Link:
        """The current link; during a reconnect wait for the next one until ``deadline``."""
        if not self._closed and self._link is None:
            remaining = deadline - asyncio.get_running_loop().time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._linked.wait(), max(remaining, 0))
        if self._closed:
            raise AdapterError(
                f"OneBot action {action} failed: the adapter is closed", written=False
            )
        if self._link is None:
            reason = f" ({self.last_error})" if self.last_error else ""
            raise AdapterError(
                f"OneBot action {action} failed: not connected{reason}", written=False
            )
        return self._link

    def _drop_link(self, link: _Link, reason: str) -> None:
        """Forget ``link`` (its socket is gone) and fail the calls waiting on it."""
        if self._link is link:
            self._link = None
            self._linked.clear()
        link.fail_pending(reason)

    async def _serve_link(self, ws: ClientConnection | ServerConnection) -> None:
        """Make ``ws`` the current link (replacing any older one) and read it until it closes."""
        if self._closed:  # arrived while closing: do not adopt it
            await ws.close(1001, "the runner is stopping")
            return
        old = self._link
        link = _Link(ws, self._on_event)
        self._link = link
        self._linked.set()
        self.last_error = None
        try:
            if old is not None:
                old.fail_pending("a newer OneBot connection replaced this one")
                await old.ws.close(1000, "replaced by a newer connection")
            try:
                self._on_connect()
            except Exception:
                log.exception("the OneBot connect handler failed")
            await link.run()
        finally:
            self._drop_link(link, "the OneBot connection closed before it answered")

    async def aclose(self) -> None:
        """Close the connection; waiting calls fail with `AdapterError`."""
        self._closed = True
        self._linked.set()  # wake calls waiting for a link: they fail as closed now
        link = self._link
        if link is not None:
            self._drop_link(link, "the adapter is closing")
            await link.ws.close(1001, "the runner is stopping")


class ForwardTransport(Transport):
    """Dial the implementation's WebSocket server; redial with backoff 1 s → ``reconnect_max``."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        action_timeout: float,
        reconnect_max: float,
        compression: bool = False,
    ) -> None:
        super().__init__(token=token, action_timeout=action_timeout)
        self.compression = compression  # offer permessage-deflate (runner.ws_compression)
        try:
            parse_uri(url)
        except (InvalidURI, ValueError) as exc:
            raise ConfigError(
                f"runner.url must be the implementation's WebSocket server as a ws:// or wss:// "
                f"URL (e.g. ws://127.0.0.1:3001), got {url!r}: {exc}",
                key="runner.url",
            ) from None
        self._url = url
        self._shown = shown_url(url)  # runner.url may carry the token: never in logs or errors
        self.reconnect_max = reconnect_max
        self._task: asyncio.Task[None] | None = None
        self._first_attempt = asyncio.Event()

    @property
    def url(self) -> str:
        """The implementation's WebSocket URL."""
        return self._url

    def _dial_url(self) -> str:
        if not self.token:
            return self.url
        # Token in the query too: some implementations read only one of header and query.
        sep = "&" if urlsplit(self.url).query else "?"
        return f"{self.url}{sep}access_token={quote(self.token, safe='')}"

    async def start(self, on_event: EventHandler, on_connect: ConnectHandler) -> None:
        """Start dialing; returns after the first attempt, connected or not (it keeps trying)."""
        await super().start(on_event, on_connect)
        self._task = asyncio.create_task(self._run(), name="onebot-forward")
        self._task.add_done_callback(self._loop_ended)
        first = asyncio.ensure_future(self._first_attempt.wait())
        try:
            await asyncio.wait({self._task, first}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            first.cancel()
        if self._task.done() and not self._task.cancelled():  # a bug, not a network state
            exc = self._task.exception()
            raise AdapterError(f"the OneBot forward connection loop stopped: {exc!r}") from exc

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():  # only cancellation may end the loop
            return
        exc = task.exception()
        self._break(f"the OneBot forward connection loop stopped: {exc!r}")

    async def _run(self) -> None:
        backoff = 1.0
        while not self._closed:
            try:
                if await self._dial_once():
                    backoff = 1.0
            except Exception as exc:  # a bug, not a network state: report it, keep dialing
                log.exception("a OneBot connection attempt failed unexpectedly")
                self.last_error = f"the connection to {self._shown} failed: {self._redact(exc)}"
            if self._closed:
                return
            self._first_attempt.set()
            delay = random.uniform(backoff / 2, backoff)  # jitter: many bots, one restart
            log.warning("%s; retrying in %.1f s", self.last_error, delay)
            await asyncio.sleep(delay)
            backoff = min(backoff * 2, self.reconnect_max)

    async def _dial_once(self) -> bool:
        """Connect and serve the link until it drops; whether a connection was made."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            ws = await connect(
                self._dial_url(),
                additional_headers=headers,
                proxy=None,
                max_size=_MAX_FRAME,
                open_timeout=self.action_timeout,
                compression="deflate" if self.compression else None,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            hint = " (check runner.access_token)" if status in (401, 403) else ""
            self.last_error = f"{self._shown} refused the connection: HTTP {status}{hint}"
            return False
        except (OSError, TimeoutError, WebSocketException) as exc:
            self.last_error = f"cannot connect to {self._shown}: {self._redact(exc)}"
            return False
        log.info("connected to OneBot at %s", self._shown)
        self._first_attempt.set()
        try:
            await self._serve_link(ws)
        finally:
            await ws.close()
        self.last_error = f"the connection to {self._shown} dropped"
        return True

    def _redact(self, exc: BaseException) -> str:
        """An error's text without the token (some name the URL, query and all)."""
        text = str(exc) or type(exc).__name__
        for secret in [*url_secrets(self._url), *([self.token] if self.token else [])]:
            text = text.replace(quote(secret, safe=""), "***").replace(secret, "***")
        return text

    async def aclose(self) -> None:
        """Stop redialing and close the connection."""
        await super().aclose()
        if self._task is not None:
            self._task.cancel()
            # A loop that died was reported by `_loop_ended`; closing must not raise it again.
            await asyncio.gather(self._task, return_exceptions=True)


class ReverseTransport(Transport):
    """Listen at ``ws://host:port/path`` for the implementation's Universal client."""

    def __init__(
        self,
        host: str,
        port: int,
        path: str,
        *,
        token: str | None,
        action_timeout: float,
        compression: bool = False,
    ) -> None:
        super().__init__(token=token, action_timeout=action_timeout)
        self.compression = compression  # accept permessage-deflate (runner.ws_compression)
        if not self.token and not is_loopback(host):
            raise ConfigError(
                f"refusing to listen on {host!r} without runner.access_token: anyone who can "
                "reach the port could drive the bot; set a token or listen on 127.0.0.1",
                key="runner.access_token",
            )
        address = ip_of(host)  # "[::1]" and "::ffff:127.0.0.1" bind as the address they name
        self.host = str(address) if address is not None else host
        self.port, self.path = port, "/" + path.strip("/")
        self._server: Server | None = None

    @property
    def url(self) -> str:
        """The URL to give the implementation (with the bound port)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ws://{host}:{self.port}{self.path}"

    async def start(self, on_event: EventHandler, on_connect: ConnectHandler) -> None:
        """Start listening; `AdapterError` when the address cannot be bound."""
        await super().start(on_event, on_connect)
        try:
            self._server = await serve(
                self._handle,
                self.host,
                self.port,
                process_request=self._check_request,
                max_size=_MAX_FRAME,
                open_timeout=self.action_timeout,
                compression="deflate" if self.compression else None,
            )
        except OSError as exc:
            raise AdapterError(f"cannot listen on {self.host}:{self.port}: {exc}") from exc
        self.port = next(iter(self._server.sockets)).getsockname()[1]
        log.info("listening for OneBot on %s", self.url)

    async def _handle(self, ws: ServerConnection) -> None:
        """One implementation connection; its failure ends it, never the listener."""
        try:
            await self._serve_link(ws)
        except Exception:  # this connection ends (the implementation reconnects); others go on
            log.exception("a OneBot connection failed unexpectedly")
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self._break(f"the OneBot reverse connection handler stopped: {exc!r}")
            raise

    def _check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        split = urlsplit(request.path)
        if split.path.rstrip("/") != self.path.rstrip("/"):
            return self._refuse(
                connection, HTTPStatus.NOT_FOUND, f"no OneBot endpoint here; use {self.path}"
            )
        if self.token and not self._token_ok(request.headers, split.query):
            missing = "Authorization" not in request.headers and "access_token" not in split.query
            status = HTTPStatus.UNAUTHORIZED if missing else HTTPStatus.FORBIDDEN
            return self._refuse(connection, status, "missing or wrong access token")
        role = request.headers.get("X-Client-Role", "Universal")
        if role.lower() != "universal":
            return self._refuse(
                connection,
                HTTPStatus.BAD_REQUEST,
                f"X-Client-Role {role} is not supported: configure a Universal client",
            )
        self.self_id_hint = request.headers.get("X-Self-ID") or self.self_id_hint
        return None

    def _token_ok(self, headers: Headers, query: str) -> bool:
        assert self.token is not None
        offered = headers.get("Authorization", "")
        scheme, _, value = offered.partition(" ")
        # "Token" is what older implementations (CQHTTP, go-cqhttp) send; the secret is what counts.
        if scheme.lower() in ("bearer", "token") and hmac.compare_digest(
            value.strip().encode(), self.token.encode()
        ):
            return True
        return any(
            hmac.compare_digest(value.encode(), self.token.encode())
            for value in parse_qs(query).get("access_token", [])
        )

    def _refuse(self, connection: ServerConnection, status: HTTPStatus, why: str) -> Response:
        remote = connection.remote_address
        self.last_error = f"refused a OneBot connection from {remote[0] if remote else '?'}: {why}"
        log.warning("%s (HTTP %d)", self.last_error, status)
        return connection.respond(status, why + "\n")

    async def aclose(self) -> None:
        """Stop listening and close the connection."""
        await super().aclose()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
