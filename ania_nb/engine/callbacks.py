"""The callbacks bridge: how tools and the loop reach the front end without knowing it.

Every callback is optional and may be a plain function or a coroutine function. A tool asks
``callbacks.has("send_image")`` before relying on one, and degrades to a clear text otherwise.
Clock runs and subagents use ``callbacks.background()``, which drops intermediate text: only the
final reply is delivered, by the orchestration layer.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from .._preview import reveal
from ..text import cut

log = logging.getLogger(__name__)

CallbackName = Literal[
    "send_text",
    "send_image",
    "send_file",
    "get_msg_history",
    "get_private_file_url",
    "load_images",
    "take_loaded_images",
    "load_local_image",
    "request_approval",
    "on_event",
]


@dataclass(frozen=True)
class ApprovalRequest:
    """A tool call waiting for a human verdict, as shown to the front end.

    ``summary`` is a one-line headline; ``details`` is the whole call (every argument in full,
    control characters visible, shell lines split into commands) and is what a person must be
    able to read before answering. ``requesters`` are the senders whose messages the run
    answers (any of them may answer, besides admins); ``resent`` marks a request posted again
    after a restart (its front end says so). Front ends show `headline` and `tool_label`, never
    ``summary`` and ``tool`` raw: a right-to-left override or a zero-width character in them
    would reorder or hide what the person reads.
    """

    id: str
    session: str
    tool: str
    summary: str
    requester: str | None = None
    admin_only: bool = False
    details: str = ""
    requesters: tuple[str, ...] = ()
    resent: bool = False  # posted again after a restart (the run waits in the store)

    @property
    def headline(self) -> str:
        """``summary`` with control and invisible characters escaped, as ``details`` are."""
        return reveal(self.summary)

    @property
    def tool_label(self) -> str:
        """The tool's name with control and invisible characters escaped."""
        return reveal(self.tool)

    def text(self, limit: int | None = None) -> str:
        """Headline and details for a chat message, cut at ``limit`` characters.

        A cut text ends with how to see the rest (reply ``show <id>``).
        """
        full = f"{self.headline}\n{self.details}" if self.details else self.headline
        if limit is None:
            return full

        def more(rest: int) -> str:
            return f"\n… {rest} more characters: reply `show {self.id}` to see them all"

        return cut(full, limit, marker=more)


@dataclass(frozen=True)
class Verdict:
    """A human's answer to an `ApprovalRequest` (or the automatic one on timeout/stop)."""

    allowed: bool
    reason: str = ""
    approver: str | None = None
    outcome: str = ""  # allowed, denied, timeout, stopped or error ("" when not asked)


@dataclass(frozen=True)
class RunEvent:
    """A progress event for live front ends (run widget, logs).

    kinds: ``run_start``, ``text_delta`` (data: text), ``assistant_text`` (data: text),
    ``tool_start`` / ``tool_end`` (data: call id, name, arguments, result, error, duration; on
    ``tool_end`` also ``outcome`` — ok, error, denied, blocked, timeout, stopped — and ``stage``,
    the gate stage that stopped the call: role, plan, hook, admin, human or None),
    ``usage`` (data: Usage dict), ``model_switch`` (data: model, reason: another model answers
    the run, e.g. a used-up quota's fallback), ``run_end`` (data: status, error, and from a run
    that went through the loop ``warnings``: repeated calls not run, an answer that is only a
    text call).
    """

    kind: str
    session: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Callbacks:
    """Optional hooks into the front end; each may be sync or async."""

    send_text: Callable[[str], Any] | None = None
    send_image: Callable[[str], Any] | None = None
    send_file: Callable[[str, str], Any] | None = None
    get_msg_history: Callable[[int, int], Any] | None = None
    get_private_file_url: Callable[[str], Any] | None = None
    load_images: Callable[[], Any] | None = None
    take_loaded_images: Callable[[], Any] | None = None
    load_local_image: Callable[[str], Any] | None = None
    request_approval: Callable[[ApprovalRequest], Any] | None = None
    on_event: Callable[[RunEvent], Any] | None = None

    def has(self, name: CallbackName) -> bool:
        """Whether the front end provides this callback."""
        return getattr(self, name) is not None

    async def call(self, name: CallbackName, *args: Any) -> Any:
        """Invoke a callback (awaiting it if async); returns None when it is absent."""
        fn = getattr(self, name)
        if fn is None:
            return None
        result = fn(*args)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def emit(self, event: RunEvent) -> None:
        """Deliver a progress event; a failing display is logged, never fatal to the run."""
        if self.on_event is None:
            return
        try:
            await self.call("on_event", event)
        except Exception:
            log.exception("on_event callback failed for %s", event.kind)

    async def deliver(self, name: CallbackName, *args: Any) -> Any:
        """Like `call`, but a failing front end is logged instead of failing the run."""
        try:
            return await self.call(name, *args)
        except Exception:
            log.exception("callback %s failed", name)
            return None

    def background(self) -> Callbacks:
        """A copy that drops intermediate text and live events (clock runs, subagents, teams)."""
        return replace(self, send_text=None, on_event=None)

    def provided(self) -> list[str]:
        """Names of the callbacks that are set, sorted."""
        return sorted(f.name for f in fields(self) if getattr(self, f.name) is not None)


NO_CALLBACKS = Callbacks()
