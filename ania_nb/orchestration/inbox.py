"""What a durable front end hands the Agent: an `Inbound` message, answered by an `Accepted`.

A front end that must answer every message exactly once (the chat runner) calls
``Agent.accept(inbound)`` for each platform event. The event becomes an inbox row (see
`ania_nb.store.mailbox`) in one transaction *before* anything else happens to it; a key already
there is a re-sent event and nothing more happens. Then, by ``kind``:

- ``message``: queued for its session like `Agent.chat`'s messages (batched, the global run
  limit); the run's steps mark the row ``running`` and ``answered`` with the reply's outbox row;
- ``command``: a slash command, routed at once; its answer is an outbox row (a custom command
  that becomes a prompt is queued as a message);
- ``approval``: a verdict reply; the front end answers it and posts the answer with
  ``answers=(inbox_id,)`` (`Outbox.post`);
- ``ignored``: stored only (an unaddressed group message).

Work of the Agent itself writes inbox rows too: a background subagent's result is a row of
source `AGENT_SOURCE` (key ``bg:<id>``), carrying the role of the run that started the work
(`stored_role`).

`Agent.recover` (at start) answers what a previous process left: pending rows are queued again,
rows whose run died are re-run or announced (``runner.resume``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ..catalogue import Language, say
from ..store import InboxEntry, InboxRow, OutboxRow
from ..store.mailbox import InboxStateName
from ..text import cut
from ..tools import Role
from .outbox import Delivery, delivery_payload

AGENT_SOURCE = "agent"  # inbox rows the Agent's own work writes (background results)
EXCERPT_CHARS = 30  # of each cut-off message quoted in the restart notice

InboundKind = Literal["message", "command", "approval", "ignored"]
AcceptedState = Literal[
    "duplicate", "queued", "answered", "dropped", "held", "stored", "ignored", "deferred"
]


@dataclass(frozen=True)
class Inbound:
    """One incoming event of a durable front end.

    ``source``/``account``/``key`` identify it on its platform (adapter, bot id, message id)
    and make the inbox key. ``text`` is what the model reads (already neutralised by the front
    end); ``meta`` is the front end's own data of the message (to rebuild its callbacks after
    a restart), stored with it.
    """

    source: str
    account: str
    key: str
    session: str
    sender: str | None
    text: str
    kind: InboundKind = "message"
    images: tuple[str, ...] = ()
    model: str | None = None
    plan: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    def row(self) -> InboxRow:
        """The inbox row of this event."""
        payload = {
            "text": self.text,
            "images": list(self.images),
            "model": self.model,
            "plan": self.plan,
            "meta": self.meta,
        }
        state: InboxStateName = "ignored" if self.kind == "ignored" else "pending"
        return InboxRow(
            self.source,
            self.account,
            self.key,
            self.session,
            self.sender,
            payload,
            kind=self.kind,
            state=state,
        )


@dataclass(frozen=True)
class Accepted:
    """What became of an `Inbound`.

    ``state``: ``duplicate`` (its key was there: nothing happened), ``queued`` (a run will
    answer it), ``answered`` (a command, answered at once: ``reply``), ``dropped`` (the
    session's queue was full), ``held`` (the Agent is shutting down: stored, answered after the
    restart), ``stored`` (an approval reply for the front end to answer), ``ignored``,
    ``deferred`` (another replica answers its session now: that one was told, and answers it).
    """

    inbox_id: int | None
    state: AcceptedState
    reply: str | None = None

    @property
    def duplicate(self) -> bool:
        """Whether the event had been accepted before (a re-sent event)."""
        return self.state == "duplicate"


@dataclass(frozen=True)
class Recovery:
    """What `Agent.recover` did at start."""

    queued: int = 0  # pending rows queued again (re-runs included)
    rerun: int = 0  # rows of runs a crash cut off, answered again
    notified: int = 0  # rows of runs a crash cut off, whose chat was told
    uncertain: int = 0  # outbox rows that may or may not have been sent (not sent again)
    children: int = 0  # background subagents a crash cut off, whose chat was told


def inbound_of(entry: InboxEntry) -> Inbound:
    """The `Inbound` a stored inbox row was made from (to queue it again after a restart)."""
    payload = entry.payload
    kind = entry.kind if entry.kind in ("message", "command", "approval", "ignored") else "message"
    return Inbound(
        entry.source,
        entry.account,
        entry.message_key,
        entry.session,
        entry.sender,
        str(payload.get("text") or ""),
        kind=kind,  # type: ignore[arg-type]
        images=tuple(payload.get("images") or ()),
        model=payload.get("model"),
        plan=bool(payload.get("plan")),
        meta=dict(payload.get("meta") or {}),
    )


def stored_role(inbound: Inbound) -> Role | None:
    """The role an Agent-written message carries (its launcher's); None for a platform's.

    Only rows of `AGENT_SOURCE` may carry one: a platform's message gets its sender's role.
    """
    if inbound.source != AGENT_SOURCE:
        return None
    stored = inbound.meta.get("role")
    return next((role for role in get_args(Role) if role == stored), "member")


def restart_notice(session: str, entries: list[InboxEntry], language: Language = "zh") -> OutboxRow:
    """The one notice a chat gets for its messages whose reply a restart cut off.

    The text quotes each message (``meta["text"]`` if the front end kept the user's own words,
    else what the model read), cut to `EXCERPT_CHARS`; ``meta["senders"]`` are whom to mention.
    """
    quoted = []
    for entry in entries:
        meta = entry.payload.get("meta") or {}
        words = str(meta.get("text") or entry.payload.get("text") or "").strip()
        excerpt = cut(" ".join(words.split()), EXCERPT_CHARS)
        quoted.append(say("notice.restart_quote", language, text=excerpt))
    what = say("notice.restart_join", language).join(quoted)
    delivery = Delivery(
        session,
        say("notice.restart", language, what=what or say("notice.restart_yours", language)),
        "restart",
        title="restart notice",
        status="interrupted",
        meta={
            "notice": "restart",
            "inbox": [e.id for e in entries],
            "senders": list(dict.fromkeys(e.sender for e in entries if e.sender)),
        },
    )
    return OutboxRow(session, "notice", delivery_payload(delivery))
