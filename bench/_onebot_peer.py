"""A thin OneBot v11 implementation for the runner bench: reverse WebSocket, Universal client.

Written from the spec (``communication/ws-reverse.md``, ``event/message.md``), not from the
adapter: it dials the runner with ``X-Self-ID``, ``X-Client-Role: Universal`` and
``Authorization: Bearer``, sends the lifecycle event and ``message`` events in array form, and
answers ``send_private_msg`` / ``send_group_msg`` / ``send_msg`` / ``get_login_info`` /
``get_status`` (anything else: ``failed``, retcode 1404), echoing ``echo``. A reply to a chat
resolves the future its last message is waiting on, stamped when the action frame arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

TOKEN = "bench-token"
SELF_ID = 10000
GROUP_BASE = 7_000_000


def chat_of(uid: int) -> tuple[str, int]:
    """Even user ids chat privately, odd ones in their own group (one speaker per group)."""
    return ("group", GROUP_BASE + uid) if uid % 2 else ("private", uid)


class OneBotPeer:
    """A thin OneBot v11 implementation (reverse WS, Universal client) driving the runner."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token
        self.ws: Any = None
        self.next_id = 1
        self.waiters: dict[tuple[str, int], asyncio.Future[tuple[float, str]]] = {}
        self.actions: dict[str, int] = {}
        self.unexpected = 0  # sends nobody was waiting for (notices, duplicates)
        self._reader: asyncio.Task[None] | None = None

    async def connect(self, deadline: float = 20.0) -> None:
        """Dial the runner (retrying until ``deadline`` s), then send the lifecycle event."""
        from websockets.asyncio.client import connect

        headers = {
            "X-Self-ID": str(SELF_ID),
            "X-Client-Role": "Universal",
            "Authorization": f"Bearer {self.token}",
        }
        end = time.monotonic() + deadline
        while True:
            try:
                self.ws = await connect(self.url, additional_headers=headers, max_size=None)
                break
            except OSError:
                if time.monotonic() > end:
                    raise
                await asyncio.sleep(0.2)
        self._reader = asyncio.create_task(self._read())
        await self.ws.send(
            json.dumps(
                {
                    "time": int(time.time()),
                    "self_id": SELF_ID,
                    "post_type": "meta_event",
                    "meta_event_type": "lifecycle",
                    "sub_type": "connect",
                }
            )
        )

    async def _read(self) -> None:
        async for frame in self.ws:
            arrived = time.perf_counter()
            msg = json.loads(frame)
            action = msg.get("action")
            if action is None:
                continue
            self.actions[action] = self.actions.get(action, 0) + 1
            params = msg.get("params") or {}
            data: Any = None
            status, retcode = "ok", 0
            if action in ("send_private_msg", "send_group_msg", "send_msg"):
                data = {"message_id": self._new_id()}
                if "group_id" in params:
                    key = ("group", int(params["group_id"]))
                else:
                    key = ("private", int(params.get("user_id", 0)))
                waiter = self.waiters.pop(key, None)
                if waiter is not None and not waiter.done():
                    waiter.set_result((arrived, _plain_text(params.get("message"))))
                else:
                    self.unexpected += 1
            elif action == "get_login_info":
                data = {"user_id": SELF_ID, "nickname": "bench-bot"}
            elif action == "get_status":
                data = {"online": True, "good": True}
            else:
                status, retcode = "failed", 1404
            reply = {"status": status, "retcode": retcode, "data": data}
            if "echo" in msg:
                reply["echo"] = msg["echo"]
            await self.ws.send(json.dumps(reply))

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    async def message(self, uid: int, text: str) -> tuple[float, asyncio.Future]:
        """Send one message event of user ``uid``; (send time, future of the reply)."""
        kind, cid = chat_of(uid)
        segments: list[dict[str, Any]] = [{"type": "text", "data": {"text": text}}]
        raw = text
        event: dict[str, Any] = {
            "time": int(time.time()),
            "self_id": SELF_ID,
            "post_type": "message",
            "message_type": kind,
            "message_id": self._new_id(),
            "user_id": uid,
            "font": 0,
            "sender": {"user_id": uid, "nickname": f"user{uid}"},
        }
        if kind == "group":
            segments.insert(0, {"type": "at", "data": {"qq": str(SELF_ID)}})
            raw = f"[CQ:at,qq={SELF_ID}] {text}"
            segments[1]["data"]["text"] = " " + text
            event.update(sub_type="normal", group_id=cid, anonymous=None)
            event["sender"]["card"] = ""
        else:
            event["sub_type"] = "friend"
        event["message"] = segments
        event["raw_message"] = raw
        future: asyncio.Future[tuple[float, str]] = asyncio.get_running_loop().create_future()
        self.waiters[(kind, cid)] = future
        t0 = time.perf_counter()
        await self.ws.send(json.dumps(event))
        return t0, future

    async def close(self) -> None:
        """Close the socket."""
        if self.ws is not None:
            await self.ws.close()
        if self._reader is not None:
            with contextlib.suppress(BaseException):
                await self._reader


def _plain_text(message: Any) -> str:
    """The text of an outgoing message (array or string form)."""
    if isinstance(message, str):
        return message
    if isinstance(message, list):
        return "".join(
            str(s.get("data", {}).get("text", "")) for s in message if s.get("type") == "text"
        )
    return ""
