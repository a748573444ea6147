"""Per-session state: the queue of waiting messages, the running request and the cached history."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .engine.callbacks import Callbacks
from .engine.messages import Message
from .prompts import QUEUED_HEADER

if TYPE_CHECKING:  # pragma: no cover
    from .result import RunResult
    from .tools import SessionToolExecutor


@dataclass
class Pending:
    """One message waiting for (or being handled by) a run; its caller awaits ``future``."""

    text: str
    sender: str | None
    images: tuple[str, ...]
    callbacks: Callbacks
    future: asyncio.Future[RunResult]
    model: str | None = None  # a per-run model override


@dataclass
class Session:
    """Everything the agent keeps for one conversation."""

    name: str
    executor: SessionToolExecutor
    queue: list[Pending] = field(default_factory=list)
    worker: asyncio.Task[None] | None = None
    current: asyncio.Task[RunResult] | None = None
    history: list[Message] | None = None  # loaded from the store on first use
    last_prompt_tokens: int = 0

    @property
    def busy(self) -> bool:
        """Whether a request is in flight."""
        return self.worker is not None and not self.worker.done()


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
