"""``ania-nb chat``: try the bot without QQ — type as a QQ user, read the bot's replies.

The QQ side is `ania_nb.testing.onebot.OneBotImpl`, the OneBot v11 implementation the tests
use. By default ``ania-nb chat`` starts it as a forward-WebSocket server on 127.0.0.1 and starts
``ania-nb serve`` with the same config file, told (through ``ANIA_RUNNER__*`` variables) to dial
it with a one-time token: nothing else needs to run. With ``--connect`` it dials a ``serve``
that is already running in reverse mode instead (``runner.host``/``port``/``path`` and
``runner.access_token`` of the config).

Each line typed is a message from the current user; lines starting with ``:`` are the
simulator's own commands (``:help``). Slash commands (``/clock list``) and approval answers
(``允许`` / ``拒绝``, or the request id) are ordinary messages, as in QQ. At the end of input
(Ctrl-D, or a closed pipe) it waits until the bot has been quiet for ``--settle`` seconds, then
stops what it started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .onebot import Action, OneBotImpl

SEND_ACTIONS = frozenset({"send_msg", "send_private_msg", "send_group_msg"})
HELP = """\
Type a message and press Enter: it reaches the bot as from the current user.
  :private [QQ]        talk in a private chat (as QQ; default: the current user)
  :group GROUP [QQ]    talk in a group (as member QQ); messages there @ the bot
  :plain TEXT          in a group: send TEXT without @-ing the bot
  :who                 where you are and as whom
  :help                this text
  :quit                stop (as Ctrl-D does)
/commands (/clock list, /stop …) and approval answers (允许, 拒绝) are plain messages."""


@dataclass
class Place:
    """Where the person types: a private chat with ``user``, or ``group`` as member ``user``."""

    user: int
    group: int | None = None

    def label(self) -> str:
        """``private 10001`` or ``group 20001 as 10001``."""
        if self.group is None:
            return f"private {self.user}"
        return f"group {self.group} as {self.user}"


def render(action: Action) -> str:
    """A bot message as one printed block: its text, then its images and files, each named."""
    parts: list[str] = []
    for segment in action.segments:
        kind, data = segment.get("type"), segment.get("data") or {}
        if kind == "text":
            words = str(data.get("text", ""))
            parts.append(words.lstrip(" ") if parts and parts[-1].endswith(" ") else words)
        elif kind == "at":
            parts.append(f"@{data.get('qq')} ")
        elif kind == "image":
            parts.append(f"[image {str(data.get('file', ''))[:60]}]")
        elif kind == "reply":
            continue  # QQ shows the quote, not the id
        else:
            parts.append(f"[{kind}]")
    return "".join(parts).strip()


def target_of(action: Action) -> str:
    """Which chat a send action goes to: ``private 10001`` or ``group 20001``."""
    params = action.params
    kind = params.get("message_type") or ("group" if "group" in action.name else "private")
    if kind == "group" or (action.name == "send_msg" and params.get("group_id")):
        return f"group {params.get('group_id')}"
    return f"private {params.get('user_id')}"


def command(line: str, place: Place) -> tuple[Place | None, str | None, str | None]:
    """Apply a ``:command``: (the new place or None to quit, text to print, text to send)."""
    word, _, rest = line[1:].strip().partition(" ")
    args = rest.split()
    if word in ("quit", "q", "exit"):
        return None, None, None
    if word in ("help", "h", "?"):
        return place, HELP, None
    if word == "who":
        return place, f"you are in {place.label()}", None
    if word == "private":
        user = int(args[0]) if args and args[0].isdigit() else place.user
        new = Place(user)
        return new, f"now in {new.label()}", None
    if word == "group":
        if not args or not args[0].isdigit() or (len(args) > 1 and not args[1].isdigit()):
            return place, "usage: :group GROUP [QQ]  (numbers)", None
        new = Place(int(args[1]) if len(args) > 1 else place.user, int(args[0]))
        return new, f"now in {new.label()} (messages @ the bot; :plain TEXT does not)", None
    if word == "plain":
        if place.group is None:
            return place, ":plain is for groups (a private message always reaches the bot)", None
        return place, None, rest
    return place, f"unknown command :{word} (:help lists them)", None


class ChatSession:
    """The person's side: sends their lines, prints the bot's messages as they come."""

    def __init__(self, impl: OneBotImpl, place: Place, out: TextIO) -> None:
        self.impl = impl
        self.place = place
        self.out = out
        self.last_bot = asyncio.get_running_loop().time()
        impl.on_action = self._on_action

    def _on_action(self, action: Action) -> None:
        if action.name not in SEND_ACTIONS:
            return
        self.last_bot = asyncio.get_running_loop().time()
        where = target_of(action)
        here = self.place.label().split(" as ")[0]
        prefix = "bot › " if where == here else f"bot ({where}) › "
        text = render(action) or "(empty message)"
        self.say(prefix + text.replace("\n", "\n" + " " * len(prefix)))

    def say(self, text: str) -> None:
        """Print one block."""
        self.out.write(text + "\n")
        self.out.flush()

    async def send(self, text: str, *, mention: bool = True) -> None:
        """Send ``text`` from the current user where they are."""
        place = self.place
        if place.group is None:
            await self.impl.private_message(place.user, text, nickname=f"user{place.user}")
        else:
            await self.impl.group_message(
                place.group, place.user, text, at_bot=mention, nickname=f"user{place.user}"
            )

    async def handle(self, line: str) -> bool:
        """One typed line; False when the person quits."""
        line = line.rstrip("\r\n")
        if not line.strip():
            return True
        if line.startswith(":"):
            place, shown, plain = command(line, self.place)
            if place is None:
                return False
            self.place = place
            if shown:
                self.say(shown)
            if plain:
                await self.send(plain, mention=False)
            return True
        await self.send(line)
        return True

    async def settle(self, quiet: float, limit: float) -> None:
        """Wait until the bot sent nothing for ``quiet`` seconds (at most ``limit``)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + limit
        while True:  # each message moves `last_bot`: sleep to the quiet point, look again
            wake = min(self.last_bot + quiet, end)
            if loop.time() >= wake:
                return
            await asyncio.sleep(wake - loop.time())


async def _start_serve(config: Path | None, url: str, token: str) -> asyncio.subprocess.Process:
    """``ania-nb serve`` dialling ``url`` (forward mode) with ``token``; logs to our stderr."""
    env = {
        **os.environ,
        "ANIA_RUNNER__MODE": "forward",
        "ANIA_RUNNER__URL": url,
        "ANIA_RUNNER__ACCESS_TOKEN": token,
    }
    args = [sys.executable, "-m", "ania_nb", "serve", "--log-level", "WARNING"]
    if config is not None:
        args += ["--config", str(config)]
    return await asyncio.create_subprocess_exec(*args, env=env, stdin=asyncio.subprocess.DEVNULL)


async def run_chat(
    args: argparse.Namespace,
    connect: tuple[str, str | None] | None = None,
    lines: Callable[[], str] = sys.stdin.readline,
    out: TextIO = sys.stdout,
) -> int:
    """The ``ania-nb chat`` command: 0 after a clean end, 2 when the bot never connected.

    ``connect``: the URL and token of a running ``serve`` to dial (else one is started).
    """
    serve: asyncio.subprocess.Process | None = None
    token: str | None = secrets.token_urlsafe(16)  # one-time: the serve we start gets it
    url = ""
    if connect is not None:
        url, token = connect
    impl = OneBotImpl(args.self_id, token)
    session = ChatSession(impl, Place(args.user), out)
    try:
        if connect is not None:
            await impl.connect(url)
            session.say(f"dialling the bot at {url} …")
        else:
            url = await impl.serve()
            serve = await _start_serve(args.file, url, token or "")
            session.say("starting ania-nb serve …")
        try:
            await impl.wait_connected(timeout=args.wait_connect)
        except TimeoutError:
            session.say(f"the bot did not connect within {args.wait_connect:g} s")
            return 2
        session.say(f"connected to bot {args.self_id}; you are in {session.place.label()} (:help)")
        while True:
            line = await asyncio.to_thread(lines)
            if not line:  # end of input
                break
            if not await session.handle(line):
                break
            if serve is not None and serve.returncode is not None:
                session.say(f"ania-nb serve ended (exit code {serve.returncode})")
                return 1
        await session.settle(args.settle, args.wait)
        return 0
    finally:
        await impl.aclose()
        if serve is not None and serve.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                serve.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(serve.wait(), 30)
            except TimeoutError:
                serve.kill()
                await serve.wait()
