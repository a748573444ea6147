"""Per-session state (queue, running request, cached conversation) and its bounded table.

Idle sessions are evicted from memory — least recently used beyond ``max_sessions``, or unused
for ``idle_seconds`` — never while busy or waiting for an approval. Their history stays in the
store and is loaded again on the next message; tools a session loaded at run time (``mcp_load_*``)
must be loaded again.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engine.callbacks import Callbacks
from ..engine.usage import Usage
from ..prompts import QUEUED_HEADER
from .spec import Conversation

if TYPE_CHECKING:  # pragma: no cover
    from ..result import RunResult
    from ..tools import Role, SessionToolExecutor
    from .checkpoint import Resumption


@dataclass(eq=False)  # compared by identity: each is one caller's message
class Pending:
    """One message waiting for (or being handled by) a run; its caller awaits ``future``."""

    text: str
    sender: str | None
    images: tuple[str, ...]
    callbacks: Callbacks
    future: asyncio.Future[RunResult]
    model: str | None = None  # a per-run model override
    plan: bool = False  # plan mode for this message's run only
    synthetic: bool = False  # injected by the agent (a background result): nobody awaits it
    role: Role | None = None  # an injected message's: whoever started the work; None: the sender's
    inbox_id: int | None = None  # its durable inbox row (accepted by a front end), if any
    meta: dict[str, Any] = field(default_factory=dict)  # the front end's data of the message
    settled: bool = False  # its inbox row was answered by its run's own finish step
    resume: Resumption | None = None  # a stored run to continue (answered alone, never batched)


@dataclass
class Session:
    """Everything the agent keeps in memory for one conversation."""

    name: str
    executor: SessionToolExecutor
    queue: list[Pending] = field(default_factory=list)
    worker: asyncio.Task[None] | None = None
    current: asyncio.Task[RunResult] | None = None
    batch: list[Pending] = field(default_factory=list)  # the messages the current run answers
    conversation: Conversation = field(default_factory=Conversation)
    last_used: float = field(default_factory=time.monotonic)
    # Tokens of background work for the session (counted by that work's own run records),
    # shown in the next run's usage. Only touched on the event loop: no lock needed.
    derived: Usage = field(default_factory=Usage)
    claimed: bool = False  # its worker holds a reference on the session's replica claim

    def take_derived(self) -> Usage:
        """The derived-usage tally, handed to the next run (which starts a new one)."""
        usage, self.derived = self.derived, Usage()
        return usage

    @property
    def busy(self) -> bool:
        """Whether a request is in flight."""
        return self.worker is not None and not self.worker.done()

    @property
    def answering(self) -> bool:
        """Whether a message now would wait for an earlier one: a run goes on, or some wait.

        Not the same as `busy`: a worker whose run's reply is out may still be tidying up
        (releasing a replica claim, looking for more); a message then is answered next.
        """
        running = self.current is not None and not self.current.done()
        return self.busy and (running or bool(self.queue))


class SessionTable:
    """Sessions by name, bounded by count and idle time (see the module docstring)."""

    def __init__(
        self,
        create: Callable[[str], Session],
        *,
        max_sessions: int = 1000,
        idle_seconds: float = 3600.0,
        in_use: Callable[[str], bool] = lambda name: False,
    ) -> None:
        self._create = create
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self.max_sessions = max_sessions
        self.idle_seconds = idle_seconds
        self._in_use = in_use  # e.g. an approval is pending

    def get(self, name: str) -> Session | None:
        """The session if it is in memory."""
        return self._sessions.get(name)

    def open(self, name: str) -> Session:
        """The session, created (or re-created after eviction) on first use; marks it used."""
        found = self._sessions.get(name)
        if found is None:
            self.evict()
            found = self._sessions[name] = self._create(name)
        else:
            self._sessions.move_to_end(name)
        found.last_used = time.monotonic()
        return found

    def evict(self) -> int:
        """Drop idle sessions beyond the limits; returns how many were dropped."""
        now = time.monotonic()
        over = len(self._sessions) - self.max_sessions + 1  # room for one more
        dropped = 0
        for name, state in list(self._sessions.items()):  # oldest first
            stale = now - state.last_used > self.idle_seconds
            if not (stale or over > 0):
                break
            if state.busy or state.queue or state.derived.total_tokens or self._in_use(name):
                continue
            del self._sessions[name]
            over -= 1
            dropped += 1
        return dropped

    def names(self) -> list[str]:
        """Names of the sessions in memory, least recently used first."""
        return list(self._sessions)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._sessions.values()))

    def __len__(self) -> int:
        return len(self._sessions)


def merge_batch(batch: list[Pending]) -> tuple[str, tuple[str, ...]]:
    """One prompt for every message of a batch (queued messages are answered together)."""
    images = tuple(url for p in batch for url in p.images)
    if len(batch) == 1:
        return batch[0].text, images
    body = "\n".join(f"{i}. {p.text}" for i, p in enumerate(batch, 1))
    return QUEUED_HEADER.format(n=len(batch)) + "\n" + body, images


def senders_of(batch: list[Pending]) -> str | None:
    """Distinct senders of a batch, in order, comma-separated."""
    seen = list(dict.fromkeys(p.sender for p in batch if p.sender))
    return ", ".join(seen) or None
