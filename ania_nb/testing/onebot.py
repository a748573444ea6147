"""A small OneBot v11 implementation, written from the spec: the QQ side, for tests and trials.

It plays the part NapCat/Lagrange play in production, over real WebSockets (`websockets`):

- forward mode: ``url = await impl.serve()`` starts a WS server on 127.0.0.1 (random port) with
  the spec's paths ``/`` (universal), ``/api`` (actions only) and ``/event`` (events only);
- reverse mode: ``await impl.connect(url)`` dials the bot as a Universal client (``X-Self-ID``,
  ``X-Client-Role``, ``Authorization: Bearer``) and reconnects after ``await impl.drop()``.

Several bots at once, as NapCat, Lagrange.OneBot and go-cqhttp serve several replicas of one bot:
every event goes to every connected client (each forward-mode client, or one reverse-mode
``connect`` per replica's URL), and each action records which client sent it
(``Action.client``: the ``client`` query parameter a forward-mode client dials with, or
``connect(url, client=…)``). With ``buffered=True`` each connection has its own send queue, as
Node's ``ws`` buffers per socket: a frozen client (SIGSTOP) never delays the others' events.

Tests inject messages (``private_message``, ``group_message``), watch the bot's actions
(``impl.actions``, ``wait_for_action``), and make the next actions fail or stall. Everything
the impl sends or receives is kept, so ``get_msg`` and the history actions answer from it.
Run it standalone with ``python -m ania_nb.testing.onebot --help`` (JSON lines on stdin and
stdout); ``ania-nb chat`` puts a person at its keyboard (`ania_nb.testing.chat`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import json
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal
from urllib.parse import parse_qs, quote, urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.http11 import Request, Response

Segment = dict[str, Any]
MessageLike = str | Segment | list[Segment]
_UNSET: Any = object()
# base64 images and files travel inside one frame; websockets' default 1 MiB is too small
_MAX_FRAME = 64 * 2**20

# ---------------------------------------------------------------- CQ strings (message/string.md)


def cq_escape(text: str, *, comma: bool = False) -> str:
    """Escape plain text (or, with ``comma``, a CQ parameter value) per the spec's table."""
    out = text.replace("&", "&amp;").replace("[", "&#91;").replace("]", "&#93;")
    return out.replace(",", "&#44;") if comma else out


def cq_unescape(text: str) -> str:
    """Undo `cq_escape` (``&amp;`` last, so ``&amp;#91;`` stays the literal ``&#91;``)."""
    out = text.replace("&#44;", ",").replace("&#91;", "[").replace("&#93;", "]")
    return out.replace("&amp;", "&")


def to_cq(segments: Iterable[Segment]) -> str:
    """The CQ-string form of a segment array (text segments become escaped plain text)."""
    parts: list[str] = []
    for seg in segments:
        data = seg.get("data") or {}
        if seg["type"] == "text":
            parts.append(cq_escape(str(data.get("text", ""))))
            continue
        params = "".join(f",{k}={cq_escape(str(v), comma=True)}" for k, v in data.items())
        parts.append(f"[CQ:{seg['type']}{params}]")
    return "".join(parts)


def from_cq(message: str) -> list[Segment]:
    """Parse a CQ string into segments: name up to the first ``,``; params split on ``,``/``=``."""
    segments: list[Segment] = []
    pos = 0
    while pos < len(message):
        start = message.find("[CQ:", pos)
        end = message.find("]", start) if start >= 0 else -1
        if start < 0 or end < 0:
            start = end = len(message)
        if start > pos:
            segments.append(text(cq_unescape(message[pos:start])))
        if end >= len(message):
            break
        name, _, rest = message[start + 4 : end].partition(",")
        data: dict[str, str] = {}
        for item in rest.split(",") if rest else []:
            key, _, value = item.partition("=")
            data[key] = cq_unescape(value)
        segments.append({"type": name, "data": data})
        pos = end + 1
    return segments


# ---------------------------------------------------------------- segment builders (segment.md)


def text(value: str) -> Segment:
    """A ``text`` segment."""
    return {"type": "text", "data": {"text": value}}


def at(qq: str | int) -> Segment:
    """An ``at`` segment (``qq`` may be ``all``)."""
    return {"type": "at", "data": {"qq": str(qq)}}


def reply(message_id: str | int) -> Segment:
    """A ``reply`` segment quoting ``message_id``."""
    return {"type": "reply", "data": {"id": str(message_id)}}


def face(face_id: str | int) -> Segment:
    """A QQ ``face`` (emoji) segment."""
    return {"type": "face", "data": {"id": str(face_id)}}


def image(url: str, file: str | None = None) -> Segment:
    """A received ``image`` segment: file name plus its ``url``."""
    return {"type": "image", "data": {"file": file or url.rsplit("/", 1)[-1], "url": url}}


def file(name: str, file_id: str, url: str | None = None, size: int = 0) -> Segment:
    """A NapCat-style ``file`` segment (not in v11 proper); ``url`` feeds get_private_file_url."""
    data: dict[str, Any] = {"file": name, "file_id": file_id, "file_size": str(size)}
    if url is not None:
        data["url"] = url
    return {"type": "file", "data": data}


def mentions(segments: Iterable[Segment]) -> list[str]:
    """The ``qq`` of every ``at`` segment, in order."""
    return [str((s.get("data") or {}).get("qq")) for s in segments if s.get("type") == "at"]


def plain_text(segments: Iterable[Segment]) -> str:
    """The concatenated ``text`` of the text segments (what a human reads, minus media)."""
    return "".join(
        str((s.get("data") or {}).get("text", "")) for s in segments if s.get("type") == "text"
    )


# ---------------------------------------------------------------- records


@dataclass
class Action:
    """One action the bot called: as received, and the response once it was sent."""

    name: str
    params: dict[str, Any]
    echo: Any
    response: dict[str, Any] | None = None
    connection: int = 0
    client: str = ""  # who sent it: see `OneBotImpl.clients`

    @property
    def segments(self) -> list[Segment]:
        """The ``message`` parameter as segments ([] when absent or malformed)."""
        try:
            return _as_segments(self.params.get("message"), bool(self.params.get("auto_escape")))
        except ValueError:
            return []

    @property
    def text(self) -> str:
        """The plain text of the ``message`` parameter."""
        return plain_text(self.segments)

    @property
    def mentions(self) -> list[str]:
        """Who the ``message`` parameter @-mentions."""
        return mentions(self.segments)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the standalone script prints these)."""
        return {
            "action": self.name,
            "params": self.params,
            "echo": self.echo,
            "response": self.response,
            "client": self.client,
        }


@dataclass
class StoredMessage:
    """A message the impl knows: received from a user or sent by the bot."""

    message_id: int
    message_type: Literal["private", "group"]
    user_id: int
    peer: int  # the group id, or the other user of a private chat: what history is keyed by
    segments: list[Segment]
    sender: dict[str, Any]
    time: int = field(default_factory=lambda: int(time.time()))

    @property
    def group_id(self) -> int | None:
        """The group of a group message."""
        return self.peer if self.message_type == "group" else None

    @property
    def text(self) -> str:
        """The plain text of the message."""
        return plain_text(self.segments)

    @property
    def mentions(self) -> list[str]:
        """Who the message @-mentions."""
        return mentions(self.segments)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the standalone script prints these)."""
        return {
            "message_id": self.message_id,
            "message_type": self.message_type,
            "user_id": self.user_id,
            "peer": self.peer,
            "segments": self.segments,
            "text": self.text,
        }


@dataclass
class _Rule:
    remaining: int
    names: frozenset[str] | None
    fail: tuple[int, str] | None = None
    delay: float = 0.0
    hold: bool = False


class ActionError(Exception):
    """An action the impl refuses: becomes ``status: failed`` with this retcode."""

    def __init__(self, retcode: int, message: str) -> None:
        super().__init__(message)
        self.retcode = retcode


class HandshakeRejected(ConnectionError):
    """The bot's reverse-WS server answered the upgrade with an HTTP error status."""

    def __init__(self, status: int) -> None:
        super().__init__(f"the bot refused the WebSocket handshake with HTTP {status}")
        self.status = status


def _as_segments(message: Any, auto_escape: bool = False) -> list[Segment]:
    """A ``message`` parameter (string, one segment or an array) as a validated array."""
    if isinstance(message, str):
        message = [text(message)] if auto_escape and message else from_cq(message)
    elif isinstance(message, dict):
        message = [message]
    if not isinstance(message, list) or not message:
        raise ValueError("message must be a non-empty string, segment or segment array")
    for seg in message:
        if not isinstance(seg, dict) or not isinstance(seg.get("type"), str):
            raise ValueError(f"not a message segment: {seg!r}")
        if not isinstance(seg.get("data"), dict | None):
            raise ValueError(f"segment data must be an object: {seg!r}")
        if seg["type"] == "image":
            _check_image((seg.get("data") or {}).get("file"))
    return [{"type": s["type"], "data": dict(s.get("data") or {})} for s in message]


def _check_image(file_param: Any) -> None:
    if not isinstance(file_param, str) or not file_param:
        raise ValueError("image segment needs a file")
    if file_param.startswith("base64://"):
        try:
            base64.b64decode(file_param[9:], validate=True)
        except binascii.Error as exc:
            raise ValueError(f"image base64 is not valid: {exc}") from None


def _names(actions: Iterable[str] | None) -> frozenset[str] | None:
    """Action names a rule applies to (a lone string is one name, not its letters)."""
    if actions is None:
        return None
    return frozenset([actions] if isinstance(actions, str) else actions)


def _int_param(params: dict[str, Any], key: str) -> int:
    value = params.get(key)
    try:
        return int(value)  # type: ignore[arg-type]  # numbers and numeric strings, as NapCat
    except (TypeError, ValueError):
        raise ActionError(1400, f"{key} must be a number, got {value!r}") from None


# ---------------------------------------------------------------- the implementation


class OneBotImpl:
    """A OneBot v11 implementation (forward server or reverse client) holding fake QQ state."""

    def __init__(
        self,
        self_id: str = "10000",
        access_token: str | None = None,
        message_format: Literal["array", "string"] = "array",
        *,
        nickname: str = "onebot-test",
        heartbeat_interval: float | None = None,
        report_sent: bool = False,
        first_message_id: int = 1000,
        buffered: bool = False,
    ) -> None:
        if message_format not in ("array", "string"):
            raise ValueError(f"message_format must be 'array' or 'string', not {message_format!r}")
        self.self_id = str(self_id)
        self.access_token = access_token
        self.message_format = message_format
        self.nickname = nickname
        self.heartbeat_interval = heartbeat_interval
        self.report_sent = report_sent  # push message_sent events for the bot's own messages
        self.buffered = buffered  # a send queue per connection: a stalled client delays no other
        self.on_action: Callable[[Action], None] | None = None  # called once each is answered
        self.actions: list[Action] = []
        self.events: list[dict[str, Any]] = []  # every event pushed, in order
        self.messages: dict[int, StoredMessage] = {}
        self.files: dict[str, str] = {}  # file_id -> url, for get_private_file_url
        self.rejections: list[int] = []  # HTTP statuses of refused handshakes (both directions)
        self.connections = 0  # successful connections so far
        self.dial_failures = 0  # reverse mode: attempts that found nothing listening
        self.request_headers: list[dict[str, str]] = []  # forward mode: each accepted upgrade
        self.clients: dict[int, str] = {}  # connection number -> client name ("" when unnamed)
        # A platform never reuses a message id; a second impl in one test starts elsewhere.
        self._next_id = first_message_id
        self._live: dict[int, tuple[ClientConnection | ServerConnection, str]] = {}
        self._queues: dict[int, asyncio.Queue[dict[str, Any]]] = {}  # buffered: per connection
        self._rules: list[_Rule] = []
        self._release = asyncio.Event()
        self._changed = asyncio.Event()
        self._server: Server | None = None
        self._reverse: dict[str, asyncio.Task[None]] = {}  # reverse mode: one dialler per URL
        self._reconnect = True
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------ connection lifecycle

    @property
    def connected(self) -> bool:
        """Whether a bot connection that receives events is open."""
        return any(role != "api" for _, role in self._live.values())

    @property
    def connected_clients(self) -> set[str]:
        """Names of the clients with an open event-receiving connection."""
        return {self.clients[n] for n, (_, role) in self._live.items() if role != "api"}

    @property
    def redialing(self) -> bool:
        """Reverse mode: whether the impl is connected or still dials (False after a final drop)."""
        return any(not task.done() for task in self._reverse.values())

    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Forward mode: listen for the bot; returns ``ws://host:port`` (paths /, /api, /event)."""
        self._server = await serve(
            self._serve_connection,
            host,
            port,
            process_request=self._check_request,
            ping_interval=None,
            max_size=_MAX_FRAME,
        )
        bound = next(iter(self._server.sockets)).getsockname()
        return f"ws://{bound[0]}:{bound[1]}"

    def _check_request(self, connection: ServerConnection, request: Request) -> Response | None:
        parts = urlsplit(request.path)
        if parts.path.rstrip("/") not in ("", "/api", "/event"):
            return connection.respond(HTTPStatus.NOT_FOUND, "no such OneBot endpoint\n")
        if self.access_token is not None:
            given = request.headers.get("Authorization", "")
            token = given[7:] if given.startswith("Bearer ") else None
            if token is None:
                token = next(iter(parse_qs(parts.query).get("access_token", [])), None)
            if token is None:  # authorization.md: missing token 401, wrong token 403
                self.rejections.append(401)
                self._notify()
                return connection.respond(HTTPStatus.UNAUTHORIZED, "access token required\n")
            if token != self.access_token:
                self.rejections.append(403)
                self._notify()
                return connection.respond(HTTPStatus.FORBIDDEN, "access token does not match\n")
        self.request_headers.append(dict(request.headers.raw_items()))
        return None

    async def _serve_connection(self, ws: ServerConnection) -> None:
        parts = urlsplit(ws.request.path if ws.request else "/")
        client = next(iter(parse_qs(parts.query).get("client", [])), "")
        role = {"/api": "api", "/event": "event"}.get(parts.path.rstrip("/"), "universal")
        await self._run(ws, role, client)

    async def connect(
        self,
        url: str,
        *,
        token: str | None = _UNSET,
        role: Literal["Universal", "API", "Event"] = "Universal",
        deadline: float = 10.0,
        retry_interval: float = 0.1,
        auth: Literal["Bearer", "Token", "query"] = "Bearer",
        client: str = "",
    ) -> None:
        """Reverse mode: dial the bot until connected (or ``deadline`` s pass); keep reconnecting.

        Call it once per URL to serve several bots (one reverse-WS entry per replica); ``client``
        names the connections to this URL in `clients` and `Action.client`.

        A refused handshake (HTTP 401/403/…) raises `HandshakeRejected` at once; after the first
        success every drop is retried every ``retry_interval`` s until `aclose`. The token goes
        as ``Authorization: <auth> <token>``, or with ``auth="query"`` as the URL-quoted
        ``access_token`` query parameter (authorization.md allows both; go-cqhttp says Token).
        """
        running = self._reverse.get(url)
        if running is not None and not running.done():
            raise RuntimeError(f"already connected or connecting to {url}; drop(reconnect=False)")
        headers = {"X-Self-ID": self.self_id, "X-Client-Role": role}
        token = self.access_token if token is _UNSET else token
        if token is not None and auth == "query":
            url += ("&" if urlsplit(url).query else "?") + "access_token=" + quote(token, safe="")
        elif token is not None:
            headers["Authorization"] = f"{auth} {token}"
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reconnect = True
        dialler = asyncio.create_task(
            self._reverse_loop(url, headers, role.lower(), first, retry_interval, deadline, client)
        )
        self._reverse[url] = dialler
        dialler.add_done_callback(lambda _: self._notify())  # wakes waiters on `redialing`
        try:
            await asyncio.wait_for(asyncio.shield(first), deadline + 1)
        except BaseException:
            dialler.cancel()
            with contextlib.suppress(BaseException):
                await dialler
            self._reverse.pop(url, None)
            raise

    async def _reverse_loop(
        self,
        url: str,
        headers: dict[str, str],
        role: str,
        first: asyncio.Future[None],
        retry_interval: float,
        deadline: float,
        client: str,
    ) -> None:
        give_up = asyncio.get_running_loop().time() + deadline
        while not first.done() or self._reconnect:  # drop(reconnect=False) ends the redialing
            try:
                ws = await connect(
                    url,
                    additional_headers=headers,
                    proxy=None,
                    ping_interval=None,
                    max_size=_MAX_FRAME,
                )
            except InvalidStatus as exc:
                self.rejections.append(exc.response.status_code)
                self._notify()
                if not first.done():
                    first.set_exception(HandshakeRejected(exc.response.status_code))
                    return
            except (OSError, WebSocketException) as exc:  # not listening yet, or gone: retry
                self.dial_failures += 1
                self._notify()
                if not first.done() and asyncio.get_running_loop().time() > give_up:
                    first.set_exception(
                        ConnectionError(f"could not reach {url} within {deadline} s: {exc}")
                    )
                    return
            else:
                if not first.done():
                    first.set_result(None)
                await self._run(
                    ws,
                    "api" if role == "api" else "event" if role == "event" else "universal",
                    client,
                )
                if not self._reconnect:
                    return
            await asyncio.sleep(retry_interval)  # the spec's reconnect_interval

    async def _run(
        self, ws: ClientConnection | ServerConnection, role: str, client: str = ""
    ) -> None:
        self.connections += 1
        conn_id = self.connections
        self.clients[conn_id] = client
        self._live[conn_id] = (ws, role)
        self._notify()
        beat: asyncio.Task[None] | None = None
        writer: asyncio.Task[None] | None = None
        try:
            if role != "api":
                await self._send(ws, self._meta("lifecycle", sub_type="connect"))
                if self.buffered:
                    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
                    self._queues[conn_id] = queue
                    writer = asyncio.create_task(self._write_queued(ws, queue))
                if self.heartbeat_interval:
                    beat = asyncio.create_task(self._heartbeats(ws))
            async for raw in ws:
                if role == "event":
                    continue  # ws.md: the /event endpoint does not process anything sent to it
                task = asyncio.create_task(
                    self._answer(ws, conn_id, raw)
                )  # a slow action must not block others
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except ConnectionClosed:
            pass
        finally:
            for helper in (beat, writer):
                if helper is not None:
                    helper.cancel()
            self._queues.pop(conn_id, None)
            del self._live[conn_id]
            self._notify()

    async def _write_queued(
        self, ws: ClientConnection | ServerConnection, queue: asyncio.Queue[dict[str, Any]]
    ) -> None:
        """Buffered mode: send one connection's events in order, at its own pace."""
        while await self._send(ws, await queue.get()):
            pass

    async def drop(self, *, reconnect: bool = True, abrupt: bool = False) -> None:
        """Close every open connection (``abrupt``: without a closing handshake).

        In reverse mode the impl dials again unless ``reconnect`` is False.
        """
        self._reconnect = reconnect
        open_now = dict(self._live)
        for ws, _ in open_now.values():
            if abrupt:
                ws.transport.abort()
            else:
                await ws.close(1001, "dropped by the test")
        # only these: in reverse mode a new connection may already be up
        await self.wait_until(
            lambda: not open_now.keys() & self._live.keys(), 10, "the connections to close"
        )

    async def wait_connected(self, timeout: float = 10, *, connections: int = 1) -> None:  # noqa: ASYNC109
        """Wait for an open event connection, and for ``connections`` made so far."""
        await self.wait_until(
            lambda: self.connected and self.connections >= connections,
            timeout,
            f"connection #{connections}",
        )

    async def aclose(self) -> None:
        """Stop reconnecting, close connections and the server, cancel pending work."""
        self._reconnect = False
        for ws, _ in list(self._live.values()):  # first, so the bot sees a proper close
            await ws.close()
        for dialler in self._reverse.values():
            dialler.cancel()
        for dialler in self._reverse.values():
            with contextlib.suppress(BaseException):
                await dialler
        self._reverse.clear()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> OneBotImpl:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------ events

    def _meta(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {
            "time": int(time.time()),
            "self_id": int(self.self_id),
            "post_type": "meta_event",
            "meta_event_type": kind,
            **fields,
        }

    async def _heartbeats(self, ws: ClientConnection | ServerConnection) -> None:
        assert self.heartbeat_interval
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            await self._send(ws, self._heartbeat_event())

    def _heartbeat_event(self) -> dict[str, Any]:
        status = {"online": True, "good": True}
        return self._meta(
            "heartbeat", status=status, interval=int((self.heartbeat_interval or 15) * 1000)
        )

    async def heartbeat(self) -> None:
        """Push one heartbeat meta event now."""
        await self.push(self._heartbeat_event())

    async def push(self, event: dict[str, Any], *, wait: float = 10) -> None:
        """Send an event to every event-receiving connection (waiting up to ``wait`` s for one).

        Buffered: queued for each connection (sent in order at its own pace), not awaited.
        """
        await self.wait_until(lambda: self.connected, wait, "a bot connection to push an event to")
        self.events.append(event)
        delivered = 0
        for conn_id, (ws, role) in list(self._live.items()):
            if role == "api":
                continue
            queue = self._queues.get(conn_id)
            if queue is not None:
                queue.put_nowait(event)
                delivered += 1
            elif await self._send(ws, event):
                delivered += 1
        if not delivered:
            raise ConnectionError("the bot connection closed before the event was sent")

    async def send_raw(
        self, frame: str | bytes, *, text: bool | None = None, wait: float = 10
    ) -> int:
        """Send ``frame`` exactly as given to every event-receiving connection (hostile input).

        ``str`` goes as a text frame, ``bytes`` as a binary one; ``text=True`` sends bytes as a
        text frame without checking that they are UTF-8. Returns how many connections got it
        (0 when they closed while it was sent).
        """
        await self.wait_until(lambda: self.connected, wait, "a bot connection to send a frame to")
        delivered = 0
        for ws, role in list(self._live.values()):
            if role == "api":
                continue
            with contextlib.suppress(ConnectionClosed):
                await ws.send(frame, text=text)
                delivered += 1
        return delivered

    async def _send(self, ws: ClientConnection | ServerConnection, payload: dict[str, Any]) -> bool:
        try:
            await ws.send(json.dumps(payload, ensure_ascii=False))
        except ConnectionClosed:
            return False
        return True

    def _store(
        self,
        kind: Literal["private", "group"],
        user_id: int,
        peer: int,
        segs: list[Segment],
        sender: dict[str, Any],
    ) -> StoredMessage:
        self._next_id += 1
        msg = StoredMessage(self._next_id, kind, user_id, peer, segs, sender)
        self.messages[msg.message_id] = msg
        for seg in segs:
            data = seg.get("data") or {}
            if seg["type"] == "file" and data.get("url") and data.get("file_id"):
                self.files[str(data["file_id"])] = str(data["url"])
        return msg

    def _event_of(self, msg: StoredMessage, sub_type: str | None = None) -> dict[str, Any]:
        own = msg.user_id == int(self.self_id)
        event: dict[str, Any] = {
            "time": msg.time,
            "self_id": int(self.self_id),
            "post_type": "message_sent" if own else "message",  # NapCat's name for own messages
            "message_type": msg.message_type,
            "sub_type": sub_type or ("normal" if msg.message_type == "group" else "friend"),
            "message_id": msg.message_id,
            "user_id": msg.user_id,
            "message": to_cq(msg.segments) if self.message_format == "string" else msg.segments,
            "raw_message": to_cq(msg.segments),
            "font": 0,
            "sender": msg.sender,
        }
        if msg.message_type == "group":
            event["group_id"] = msg.peer
            event["anonymous"] = None
        return event

    async def private_message(
        self,
        user_id: int | str,
        message: MessageLike,
        *,
        nickname: str = "user",
        sub_type: Literal["friend", "group", "other"] = "friend",
        wait: float = 10,
    ) -> int:
        """A friend sends the bot ``message`` (text, a segment or segments); its message_id."""
        segs = [text(message)] if isinstance(message, str) else _as_segments(message)
        sender = {"user_id": int(user_id), "nickname": nickname, "sex": "unknown", "age": 0}
        msg = self._store("private", int(user_id), int(user_id), segs, sender)
        await self.push(self._event_of(msg, sub_type), wait=wait)
        return msg.message_id

    async def group_message(
        self,
        group_id: int | str,
        user_id: int | str,
        message: MessageLike,
        *,
        at_bot: bool = False,
        reply_to: int | str | None = None,
        nickname: str = "member",
        card: str = "",
        role: str = "member",
        wait: float = 10,
    ) -> int:
        """A member posts ``message`` in a group (maybe @-ing the bot, replying); its message_id."""
        segs = [text(message)] if isinstance(message, str) else _as_segments(message)
        if at_bot:
            if segs and segs[0]["type"] == "text":  # how QQ renders it: "@bot hello"
                segs[0] = text(" " + segs[0]["data"]["text"])
            segs = [at(self.self_id), *segs]
        if reply_to is not None:
            segs = [reply(reply_to), *segs]
        sender = {
            "user_id": int(user_id),
            "nickname": nickname,
            "card": card,
            "sex": "unknown",
            "age": 0,
            "role": role,
        }
        msg = self._store("group", int(user_id), int(group_id), segs, sender)
        await self.push(self._event_of(msg), wait=wait)
        return msg.message_id

    # ------------------------------------------------------------ actions

    def fail_next(
        self,
        n: int = 1,
        *,
        actions: Iterable[str] | None = None,
        retcode: int = 100,
        message: str = "injected failure",
    ) -> None:
        """The next ``n`` actions (of these names) answer ``status: failed`` with ``retcode``."""
        self._rules.append(_Rule(n, _names(actions), fail=(retcode, message)))

    def delay_next(
        self, n: int = 1, seconds: float = 1.0, *, actions: Iterable[str] | None = None
    ) -> None:
        """The next ``n`` actions (of these names) are answered ``seconds`` late."""
        self._rules.append(_Rule(n, _names(actions), delay=seconds))

    def hold_next(self, n: int = 1, *, actions: Iterable[str] | None = None) -> None:
        """The next ``n`` actions (of these names) get no answer until `release` (maybe never)."""
        self._release.clear()
        self._rules.append(_Rule(n, _names(actions), hold=True))

    def release(self) -> None:
        """Answer the held actions now."""
        self._release.set()

    def _rule_for(self, name: str) -> _Rule | None:
        for rule in self._rules:
            if rule.remaining > 0 and (rule.names is None or name in rule.names):
                rule.remaining -= 1
                return rule
        return None

    async def _answer(
        self, ws: ClientConnection | ServerConnection, conn_id: int, raw: str | bytes
    ) -> None:
        try:
            request = json.loads(raw)
            if not isinstance(request, dict) or not isinstance(request.get("action"), str):
                raise ValueError("an action is a JSON object with a string 'action'")
        except ValueError as exc:
            await self._send(ws, self._failed(1400, str(exc)) | {"echo": None})
            return
        params = request.get("params")
        params = params if isinstance(params, dict) else {}
        action = Action(
            request["action"],
            params,
            request.get("echo"),
            connection=conn_id,
            client=self.clients.get(conn_id, ""),
        )
        self.actions.append(action)
        self._notify()
        rule = self._rule_for(action.name)
        if rule is not None and rule.hold:
            await self._release.wait()
        if rule is not None and rule.delay:
            await asyncio.sleep(rule.delay)
        fail = rule.fail if rule is not None else None
        response = self._failed(*fail) if fail else self._respond(action)
        if "echo" in request:
            response["echo"] = request["echo"]  # ws.md: returned as-is
        action.response = response
        self._notify()
        await self._send(ws, response)
        if self.on_action is not None:
            self.on_action(action)
        if self.report_sent and action.name.startswith("send_") and response["status"] == "ok":
            sent = self.messages[response["data"]["message_id"]]
            with contextlib.suppress(ConnectionError, TimeoutError):  # the bot left: nobody to tell
                await self.push(self._event_of(sent), wait=0)

    def _respond(self, action: Action) -> dict[str, Any]:
        base = action.name.removesuffix("_async").removesuffix("_rate_limited")
        try:
            data = self._perform(base, action.params)
        except ActionError as exc:
            return self._failed(exc.retcode, str(exc))
        except (TypeError, ValueError) as exc:  # odd params: answer, never leave the bot waiting
            return self._failed(1400, f"bad params for {action.name}: {exc}")
        if base != action.name:  # api/README.md: done in the background, no data
            return {"status": "async", "retcode": 1, "data": None}
        return {"status": "ok", "retcode": 0, "data": data}

    @staticmethod
    def _failed(retcode: int, message: str) -> dict[str, Any]:
        return {
            "status": "failed",
            "retcode": retcode,
            "data": None,
            "message": message,
            "wording": message,
        }

    def _perform(self, name: str, params: dict[str, Any]) -> Any:
        if name in ("send_private_msg", "send_group_msg", "send_msg"):
            return self._send_msg(name, params)
        if name == "get_msg":
            msg = self.messages.get(_int_param(params, "message_id"))
            if msg is None:
                raise ActionError(1400, f"no message with id {params.get('message_id')!r}")
            return self._get_msg_data(msg)
        if name in ("get_group_msg_history", "get_friend_msg_history"):
            return self._history(name, params)
        if name == "get_private_file_url":
            url = self.files.get(str(params.get("file_id")))
            if url is None:
                raise ActionError(1400, f"no file with file_id {params.get('file_id')!r}")
            return {"url": url}
        if name == "get_login_info":
            return {"user_id": int(self.self_id), "nickname": self.nickname}
        if name == "get_status":
            return {"online": True, "good": True}
        raise ActionError(1404, f"unknown action {name!r}")

    def _send_msg(self, name: str, params: dict[str, Any]) -> dict[str, int]:
        kind: Any = {"send_private_msg": "private", "send_group_msg": "group"}.get(name)
        kind = kind or params.get("message_type")
        if kind is None:  # public.md: decided by which *_id is given
            kind = "group" if "group_id" in params else "private"
        if kind not in ("private", "group"):
            raise ActionError(1400, f"message_type must be private or group, not {kind!r}")
        peer = _int_param(params, "group_id" if kind == "group" else "user_id")
        try:
            segs = _as_segments(params.get("message"), bool(params.get("auto_escape")))
        except ValueError as exc:
            raise ActionError(1400, str(exc)) from None
        sender = {"user_id": int(self.self_id), "nickname": self.nickname}
        msg = self._store(kind, int(self.self_id), peer, segs, sender)
        return {"message_id": msg.message_id}

    def _get_msg_data(self, msg: StoredMessage) -> dict[str, Any]:
        data = {
            "time": msg.time,
            "message_type": msg.message_type,
            "message_id": msg.message_id,
            "real_id": msg.message_id,
            "sender": msg.sender,
            "message": to_cq(msg.segments) if self.message_format == "string" else msg.segments,
            # beyond public.md, as NapCat/go-cqhttp answer: who and where
            "raw_message": to_cq(msg.segments),
            "user_id": msg.user_id,
        }
        if msg.group_id is not None:
            data["group_id"] = msg.group_id
        return data

    def _history(self, name: str, params: dict[str, Any]) -> dict[str, Any]:
        # Not in v11 proper; shaped like NapCat/go-cqhttp: messages oldest first, up to message_seq.
        kind = "group" if name == "get_group_msg_history" else "private"
        peer = _int_param(params, "group_id" if kind == "group" else "user_id")
        seq = params.get("message_seq") or params.get("message_id")
        count = _int_param(params, "count") if params.get("count") else 20
        chat = [m for m in self.messages.values() if m.message_type == kind and m.peer == peer]
        if seq:
            chat = [m for m in chat if m.message_id <= int(seq)]
        return {"messages": [self._event_of(m) for m in chat[-count:]]}

    # ------------------------------------------------------------ waiting

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(
        self,
        condition: Callable[[], bool],
        timeout: float = 10,  # noqa: ASYNC109 - one deadline across many re-checks
        what: str = "a condition",
    ) -> None:
        """Wait until ``condition()`` holds; re-checked whenever the impl's state changes."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not condition():
            remaining = end - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def wait_for_action(
        self,
        name: str,
        predicate: Callable[[Action], bool] | None = None,
        timeout: float = 10,  # noqa: ASYNC109 - the API the other tests were promised
        *,
        after: int = 0,
        answered: bool = False,
    ) -> Action:
        """The first action named ``name`` (from index ``after``) matching ``predicate``.

        With ``answered`` it also waits until the impl has sent the response.
        """
        found: list[Action] = []

        def match() -> bool:
            for action in self.actions[after:]:
                if action.name == name and (predicate is None or predicate(action)):
                    if answered and action.response is None:
                        return False
                    found.append(action)
                    return True
            return False

        await self.wait_until(match, timeout, f"action {name!r}")
        return found[0]

    def sent(
        self, chat: Literal["private", "group"] | None = None, peer: int | str | None = None
    ) -> list[StoredMessage]:
        """Messages the bot sent (optionally to one chat), oldest first."""
        return [
            m
            for m in self.messages.values()
            if m.user_id == int(self.self_id)
            and (chat is None or m.message_type == chat)
            and (peer is None or m.peer == int(peer))
        ]


# ---------------------------------------------------------------- standalone script

_COMMANDS = (
    *("private_message", "group_message", "push", "send_raw", "heartbeat", "drop"),
    "wait_connected",
    *("fail_next", "delay_next", "hold_next", "release", "wait_for_action", "actions", "sent"),
    "quit",
)


async def _command(impl: OneBotImpl, op: str, args: dict[str, Any]) -> Any:
    """Run one stdin command against ``impl``; the JSON-ready result."""
    if op not in _COMMANDS:
        raise ValueError(f"unknown op {op!r}; one of: {', '.join(_COMMANDS)}")
    if op == "wait_for_action":
        return (await impl.wait_for_action(args.pop("name"), None, **args)).as_dict()
    if op == "actions":
        return [a.as_dict() for a in impl.actions]
    if op == "sent":
        return [m.as_dict() for m in impl.sent(**args)]
    result = getattr(impl, op)(**args)
    return await result if asyncio.iscoroutine(result) else result


async def _script(argv: list[str] | None = None) -> int:
    """The command-line entry: serve or connect, then obey JSON lines on stdin."""
    parser = argparse.ArgumentParser(
        prog="python -m ania_nb.testing.onebot",
        description="A OneBot v11 implementation for tests. Forward mode (default) serves "
        "ws://HOST:PORT; --connect URL dials a bot's reverse-WS server instead. Prints "
        '{"ready": ..., "url": ...} once up, then reads one JSON command a line on stdin: '
        '{"id": 1, "op": "private_message", "args": {"user_id": 42, "message": "hi"}} and answers '
        '{"id": 1, "result": ...} or {"id": 1, "error": "..."}. Ops: '
        + ", ".join(_COMMANDS)
        + '. With --print-actions each answered action is printed as {"action": ...}. '
        "Exits on EOF (unless --no-stdin), the quit op, SIGINT or SIGTERM.",
    )
    parser.add_argument("--connect", metavar="URL", help="reverse mode: the bot's WS URL")
    parser.add_argument("--host", default="127.0.0.1", help="forward mode: listen address")
    parser.add_argument("--port", type=int, default=0, help="forward mode: port (0: any free one)")
    parser.add_argument("--token", help="access token (required of / sent to the bot)")
    parser.add_argument("--self-id", default="10000", help="the bot's QQ number")
    parser.add_argument("--format", choices=["array", "string"], default="array")
    parser.add_argument("--heartbeat", type=float, metavar="SECONDS", help="heartbeat interval")
    parser.add_argument("--report-sent", action="store_true", help="push message_sent events")
    parser.add_argument(
        "--buffered", action="store_true", help="a send queue per connection (several bots)"
    )
    parser.add_argument("--print-actions", action="store_true")
    parser.add_argument("--no-stdin", action="store_true", help="ignore stdin; run until a signal")
    opts = parser.parse_args(argv)

    def emit(payload: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")
        sys.stdout.flush()

    impl = OneBotImpl(
        opts.self_id,
        opts.token,
        opts.format,
        heartbeat_interval=opts.heartbeat,
        report_sent=opts.report_sent,
        buffered=opts.buffered,
    )
    if opts.print_actions:
        impl.on_action = lambda action: emit({"action": action.as_dict()})
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_MAX_FRAME)  # a command may carry a base64 image
    if not opts.no_stdin:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    done = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, done.set)
    try:
        if opts.connect:
            await impl.connect(opts.connect)
            emit({"ready": True, "url": opts.connect})
        else:
            emit({"ready": True, "url": await impl.serve(opts.host, opts.port)})
        pending: set[asyncio.Task[None]] = set()

        async def run(line: bytes) -> None:
            ident = None
            try:
                request = json.loads(line)
                ident = request.get("id")
                if request.get("op") == "quit":
                    done.set()
                    result = None
                else:
                    result = await _command(
                        impl, request.get("op"), dict(request.get("args") or {})
                    )
                emit({"id": ident, "result": result})
            except Exception as exc:  # a bad command is reported, the impl stays up
                emit({"id": ident, "error": f"{type(exc).__name__}: {exc}"})

        async def read() -> None:
            try:
                while line := await reader.readline():
                    if line.strip():
                        task = asyncio.create_task(run(line))  # a wait_* must not block others
                        pending.add(task)
                        task.add_done_callback(pending.discard)
            finally:
                done.set()

        reading = asyncio.create_task(read()) if not opts.no_stdin else None
        await done.wait()
        if reading is not None:
            reading.cancel()
    except (ConnectionError, OSError) as exc:
        emit({"ready": False, "error": str(exc)})
        return 2
    finally:
        await impl.aclose()
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(_script()))
