"""The `Router`: what reaches the Agent from a chat platform, and what goes back.

Platform-neutral: it sees `Incoming`/`Outgoing` and an `Adapter`, never a wire format. Every
message is first stored in the Agent's durable inbox (`Agent.accept`, keyed by adapter, bot id
and message id): a re-sent event is recognised and ignored. Then, in order [orig §9.3, §13.6]:

1. A reply to the session's pending tool approval is answered first — a verdict word (允许/同意/
   批准/allow/approve/yes/y, 拒绝/deny/reject/no/n, optionally followed by the request id) from
   the requester or an admin; anyone else is told why not and nothing else happens.
   ``show [<id>]`` (or ``查看 [<id>]``) sends the request's full text. During the shutdown
   grace the same reply answers a request suspended by the shutdown: the verdict is stored
   with it and the run goes on with it after the restart, without the card being posted again.
2. Group messages are answered per ``runner.group_trigger`` (an @-mention, also a reply to the
   bot, or every message); ``/clock …`` works without @. Other group messages are only stored
   and counted: after ``runner.group_clear_after`` of them the group's history and the tools
   its session loaded at run time (``mcp_load_*``) are cleared. Private messages are always
   answered.
3. The message is queued for its session (commands are routed at once) with the sender
   ``qq:<id>``; the model sees ``[nickname:<name> id:<id>]: <text>``, names and text
   neutralised and every further line of the text marked (`ania_nb.runner.chat`); a command's
   text is neutralised too (a custom command's arguments reach the model). A message for a busy
   session gets the queued notice, a full queue the overflow notice (each once per busy
   period). The reply — in groups @ every sender of the batch it answers — or a status text for
   stopped/timeout/error runs, the quota's reason for denied ones, is written by the run's
   finish step; a blank reply sends nothing.

**Everything sent is an outbox row** (`ania_nb.orchestration.delivery`): replies, notices,
command answers, approval cards, what runs send (text, images, files), clock results and
background replies. The router is the outbox's deliverer for every chat session: it renders a
row into an `Outgoing` at send time (`render`, a function of the row alone) and sends it,
per chat in order; a row that provably never reached the platform waits for the reconnect, one
that may have is never sent twice. Clock results in groups @ the task's creator. Only real
numeric user ids are ever mentioned (`mentionable`; never ``all`` nor the bot), and nobody in
private chats. Creating a Router makes it the outbox's ``callbacks_for``, so clock runs of chat
sessions can send media and ask approvals in their chat.

**What a chat reads.** Every text the router writes (notices, status texts, approval cards and
the answers to verdicts, refusals) comes from the message catalogue (`ania_nb.catalogue`) in
the chat's language: ``ui.language``, else Chinese. The model's own words (replies, what runs
send, clock and background results) are flattened from Markdown into plain chat text at render
time (``runner.markdown = "plain"``, `ania_nb.runner.markdown`); their images with a web URL
(`image_url_allowed`) go as images. A text longer than ``runner.message_chars`` is sent as
several messages, cut at paragraph, line or sentence ends.

A run the server's disk refused (an error naming no space left on device, a read-only file
system or a missing permission, `ania_nb._storage_cause`) is answered by a short text saying so
(the catalogue's ``storage.*`` texts), once per chat until a reply goes through again; a
message that could not even be stored is told the same, straight through the adapter (the
outbox is in that store).

`start` (also on the first message) registers the deliverer and recovers what a previous
process left (`Agent.recover`). `close` stops queueing messages (those arriving now are stored
and answered after the restart; each chat hears the shutdown notice once), suspends the runs
blocked only on an approval at once (`Agent.suspend_approvals`: the chat is told the request
will be posted again after the restart; a verdict given during the grace is kept instead,
`Agent.answer_suspended`), lets running replies and background subagents finish within one grace
period and stops the rest (each stopped background subagent's chat is told once, "background
task N was stopped by a restart"). After a restart the runner calls `Agent.resume_approvals`
once connected: the cards come back marked re-sent and a verdict continues the run (one given
during the grace continues it at once, without a card).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from .._storage_cause import NO_PERMISSION, NO_SPACE, READ_ONLY, named_cause
from ..catalogue import LANGUAGES, Language, language_for, say
from ..engine.callbacks import Callbacks
from ..engine.loop import UNRUN_CALL
from ..engine.untrusted import untrusted
from ..errors import StoreError, UsageError
from ..governance.approval import ApprovalRefused, parse_verdict_word
from ..governance.commands import parse_slash
from ..orchestration import Delivery
from ..orchestration.delivery import Deliverer, Posted, SendOutcome
from ..orchestration.inbox import Accepted, Inbound
from ..orchestration.outbox import delivery_of
from .chat import (
    ChatLink,
    approval_body,
    incoming_from_meta,
    incoming_meta,
    mentions_in,
    model_text,
)
from .markdown import plain, split
from .model import Adapter, AdapterError, ChatRef, Incoming, Outgoing, image_url_allowed

if TYPE_CHECKING:  # pragma: no cover
    from ..agent import Agent
    from ..config import RunnerSettings
    from ..orchestration import Session
    from ..store import InboxEntry, OutboxEntry

log = logging.getLogger("ania_nb.runner")

# The catalogue's status text of a reply that did not succeed (`ania_nb.catalogue`).
STATUS_KEYS = {
    "stopped": "status.stopped",
    "timeout": "status.timeout",
    "error": "status.error",
    "interrupted": "status.suspended",  # suspended waiting for an approval (shutdown)
}
# A run or a message the server's disk refused: said once per chat per incident (see `_told`).
STORAGE_KEYS = {
    NO_SPACE: "storage.no_space",
    READ_ONLY: "storage.read_only",
    NO_PERMISSION: "storage.no_permission",
}
STORAGE_TEXTS = frozenset(say(key, lang) for key in STORAGE_KEYS.values() for lang in LANGUAGES)
SHOW_WORDS = frozenset({"show", "查看"})  # "show <id>": an approval request's whole text
MAX_LINKS = 10_000  # chats remembered at once; idle ones beyond are forgotten first
STOP_WAIT = 10.0  # after the grace period: how long stopped replies get to report
IDLE_POLL = 0.02  # how often waits for "nothing runs any more" look
RECONNECT_POLL = 0.2  # the port has no reconnect event: how often a waiting chat looks
PRUNE_EVERY = 3600.0  # seconds between prunes of the inbox and outbox (also at start)


class Router:
    """Routes an adapter's messages to an Agent and the Agent's answers back (see the module)."""

    def __init__(self, agent: Agent, adapter: Adapter) -> None:
        self.agent = agent
        self.adapter = adapter
        self._links: OrderedDict[ChatRef, ChatLink] = OrderedDict()
        self._chores: set[asyncio.Task[Any]] = set()  # group clears
        self._closed = False
        self._closing: asyncio.Future[None] | None = None
        self._deadline: float | None = None
        self._starting: asyncio.Future[None] | None = None
        self.deliverer: Deliverer | None = None
        self._pruner: asyncio.Task[None] | None = None
        # Chats told of the current storage incident; any other reply sent ends the incident.
        self._told: set[ChatRef] = set()
        self._previous = agent.outbox.callbacks_for
        agent.outbox.callbacks_for = self.callbacks_for

    @property
    def settings(self) -> RunnerSettings:
        """The ``runner`` config section (read live: config_set may change it)."""
        return self.agent.config.runner

    @property
    def closed(self) -> bool:
        """Whether `close` was called (messages are stored, not answered, from then on)."""
        return self._closed

    @property
    def running(self) -> int:
        """Messages queued or being answered now, all chats."""
        return sum(len(s.queue) + len(s.batch) for s in self.agent.sessions)

    def language(self, chat: ChatRef) -> Language:
        """The language of what ``chat`` is sent: ``ui.language``, else the runner's ``zh``."""
        return language_for(self.agent.config.ui.language, chat.session)

    def sender_id(self, user_id: str) -> str:
        """A platform user id as the Agent's sender id, e.g. ``qq:12345``."""
        return f"{self.adapter.id_prefix}:{user_id}"

    def link(self, chat: ChatRef) -> ChatLink:
        """The router's state of ``chat`` (created on first use)."""
        found = self._links.get(chat)
        if found is not None:
            self._links.move_to_end(chat)
            return found
        if len(self._links) >= MAX_LINKS:
            for ref in list(self._links):
                if len(self._links) < MAX_LINKS:
                    break
                del self._links[ref]  # what a link remembers is only for notices and counts
        found = self._links[chat] = ChatLink(chat, self.agent, self.adapter, self._post)
        return found

    def callbacks_for(self, session: str) -> Callbacks:
        """The outbox's ``callbacks_for``: a chat session's clock runs reach its chat."""
        chat = ChatRef.from_session(session)
        if chat is None:
            return self._previous(session)
        return self.link(chat).callbacks()

    # ------------------------------------------------------------------ start

    async def start(self) -> None:
        """Serve the Agent's outbox and recover what a previous process left (once)."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        store = await self.agent.host.open_store()
        self.deliverer = Deliverer(
            store.outbox,
            self._send_row,
            serves=lambda session: ChatRef.from_session(session) is not None,
            ready=self._wait_connected,
            connected=lambda: self.adapter.connected,
        )
        self.agent.outbox.serve(self.deliverer)
        replica = await self.agent.serve_replica(
            self.settings.replica_id,
            callbacks_of=self._callbacks_of,
            route_stored=self._route_stored,
        )
        if replica.shared:
            log.info("replica %s of the store at %s", replica.id, store.db.location)
        recovery = await self.agent.recover(self._callbacks_of)  # prunes the mailbox too
        self._pruner = asyncio.create_task(self._prune_periodically(), name="ania-inbox-prune")
        if recovery != type(recovery)():
            log.info(
                "recovered after a restart: %d message(s) queued again (%d re-run), "
                "%d cut-off repl(ies) announced, %d message(s) whose sending was cut off, "
                "%d cut-off background subagent(s) announced",
                recovery.queued,
                recovery.rerun,
                recovery.notified,
                recovery.uncertain,
                recovery.children,
            )

    async def _prune_periodically(self) -> None:
        """Drop handled inbox and outbox rows older than ``runner.inbox_window``, hourly."""
        store = await self.agent.host.open_store()
        while True:
            await asyncio.sleep(PRUNE_EVERY)
            window = self.settings.inbox_window
            try:
                removed = await store.inbox.prune(window) + await store.outbox.prune(window)
            except Exception:
                log.exception("pruning the inbox and outbox failed (tried again later)")
                continue
            if removed:
                log.info("pruned %d handled inbox/outbox rows", removed)

    def _callbacks_of(self, entry: InboxEntry) -> Callbacks:
        """A recovered message's callbacks, from what `_route` stored with it."""
        chat = ChatRef.from_session(entry.session)
        if chat is None:
            return self._previous(entry.session)
        message = incoming_from_meta(entry.payload.get("meta") or {}, chat)
        return self.link(chat).callbacks(message)

    async def _route_stored(self, entry: InboxEntry) -> bool:
        """A row another replica stored: answered here when it is a verdict on a request here.

        That replica could not know of the approval this replica's run waits for; the text is
        the message's own (kept in the row), judged by the same rules as `_answer_approval`.
        """
        chat = ChatRef.from_session(entry.session)
        if chat is None or not self.agent.approvals.pending(entry.session):
            return False
        message = incoming_from_meta(entry.payload.get("meta") or {}, chat)
        text = message.text.strip()
        return await self._answer_approval(self.link(chat), message, text, inbox_id=entry.id)

    # ------------------------------------------------------------------ incoming

    async def handle(self, message: Incoming) -> None:
        """Take one message from the adapter: store it, then queue or answer it."""
        if message.from_self or self.agent.closed:
            return
        try:
            await self.start()
            await self._route(message)
        except StoreError as exc:  # the database is unreachable: nothing can be answered now
            log.error(
                "message %s in %s was not stored, so it is not answered: %s",
                message.message_id,
                message.chat,
                exc,
            )
            await self._tell_storage_failure(message, exc)
        except Exception:  # one bad message must not stop the adapter's event loop
            log.exception("could not route message %s in %s", message.message_id, message.chat)

    async def _tell_storage_failure(self, message: Incoming, exc: StoreError) -> None:
        """Tell the chat its message could not be stored because of the disk, once an incident.

        Sent straight through the adapter: the outbox is in the store that refused the write.
        """
        cause = exc.cause or named_cause(str(exc))
        chat = message.chat
        if cause is None or chat in self._told:
            return
        if chat.kind == "group" and not self._addressed(message):
            return
        self._told.add(chat)
        mentions = mentions_in(chat, [message.sender_id], self.adapter.self_id)
        try:
            text = say(STORAGE_KEYS[cause], self.language(chat))
            await self.adapter.send(Outgoing(chat, text, mentions=mentions))
        except AdapterError as exc:
            log.warning("could not tell %s that the store refused its message: %s", chat, exc)

    def _inbound(self, message: Incoming, text: str, kind: Any) -> Inbound:
        return Inbound(
            self.adapter.name,
            self.adapter.self_id or "",
            message.message_id,
            message.chat.session,
            self.sender_id(message.sender_id),
            text,
            kind=kind,
            meta=incoming_meta(message),
        )

    async def _route(self, message: Incoming) -> None:
        link = self.link(message.chat)
        text = message.text.strip()
        log.debug("%s: message %s from %s", link.session, message.message_id, message.sender_id)
        if await self._answer_approval(link, message, text):
            return
        command = parse_slash(text)
        if message.chat.kind == "group":
            if not self._addressed(message):
                if command is None or command[0] != "clock":
                    accepted = await self.agent.accept(self._inbound(message, text, "ignored"))
                    if not accepted.duplicate:
                        self._count_unaddressed(link)
                    return
            else:
                link.unaddressed = 0
        kind = "message" if command is None else "command"
        prompt = untrusted(text) if command is not None else model_text(message)
        state = self.agent.sessions.get(link.session)
        # The queued notice only when this message waits for an earlier one's answer.
        worker = state.worker if state is not None and state.answering else None
        accepted = await self.agent.accept(
            self._inbound(message, prompt, kind), link.callbacks(message)
        )
        await self._notices(link, message, accepted, worker)

    async def _notices(
        self, link: ChatLink, message: Incoming, accepted: Accepted, worker: object | None
    ) -> None:
        """The queued, overflow and shutdown notices, each once per busy period (or per chat)."""
        mentions = link.mention_of(message.sender_id)
        language = self.language(link.chat)
        if accepted.state == "held":
            if not link.held_noticed:
                link.held_noticed = True
                await self._post(link.chat, "notice", say("notice.held", language), mentions)
            return
        if worker is None:
            return
        if accepted.state == "queued" and link.noticed is not worker:
            link.noticed = worker
            notice = _notice(self.settings.queued_notice, "notice.queued", language)
            if notice:
                await self._post(link.chat, "notice", notice, mentions)
        elif accepted.state == "dropped" and link.overflowed is not worker:
            link.overflowed = worker  # one per busy period: a flood gets one, not hundreds
            notice = _notice(self.settings.overflow_notice, "notice.overflow", language)
            if notice:
                await self._post(link.chat, "notice", notice, mentions)

    def _addressed(self, message: Incoming) -> bool:
        trigger = self.settings.group_trigger
        if trigger == "all" or message.mentioned:
            return True
        return trigger == "mention_or_reply" and message.replied_to_bot

    async def _answer_approval(
        self, link: ChatLink, message: Incoming, text: str, *, inbox_id: int | None = None
    ) -> bool:
        """Answer the session's pending approval with ``text``; False when it is no answer.

        With none pending, a request suspended by the shutdown is answered (its verdict kept).
        ``inbox_id``: the message is stored already (by another replica).
        """
        approvals = self.agent.approvals
        pending = approvals.pending(link.session)
        suspended = not pending and bool(approvals.suspended(link.session))
        if suspended:
            pending = approvals.suspended(link.session)
        words = text.split()
        if not pending or not words or len(words) > 2:
            return False
        wanted = words[1] if len(words) == 2 else None
        if wanted is not None and wanted not in {r.id for r in pending}:
            return False
        show = words[0].lower() in SHOW_WORDS
        allow = None if show else parse_verdict_word(words[0])
        if not show and allow is None:
            return False
        if inbox_id is None:
            accepted = await self.agent.accept(self._inbound(message, text, "approval"))
            if accepted.inbox_id is None:
                return True  # a re-sent verdict: answered the first time
            inbox_id = accepted.inbox_id
        answers = (inbox_id,)
        mentions = link.mention_of(message.sender_id)
        language = self.language(link.chat)
        if show:
            request = next((r for r in pending if wanted in (None, r.id)), None)
            if request is None:
                shown = say("approval.none_to_show", language)
            else:
                shown = approval_body(request, language)
            await self._post(link.chat, "text", shown, mentions, answers=answers)
            return True
        approver = self.sender_id(message.sender_id)
        try:
            if suspended:
                request = await self.agent.answer_suspended(
                    wanted, session=link.session, allow=bool(allow), approver=approver
                )
            else:
                request = self.agent.answer_approval(
                    wanted, session=link.session, allow=bool(allow), approver=approver
                )
        except UsageError as exc:  # not the requester nor an admin, or already answered
            log.info("approval reply by %s in %s refused: %s", approver, link.session, exc)
            reason = exc.said(language) if isinstance(exc, ApprovalRefused) else str(exc)
            reply = say("approval.refused", language, reason=reason)
        else:
            log.info(
                "%s %s %s in %s",
                approver,
                "allowed" if allow else "denied",
                request.tool,
                link.session,
            )
            key = "approval.allowed" if allow else "approval.denied"
            reply = say(key, language, tool=request.tool_label, id=request.id)
            if suspended:  # answered during the shutdown grace: the run goes on after it
                reply += say("approval.kept", language)
        await self._post(link.chat, "text", reply, mentions, answers=answers)
        return True

    def _count_unaddressed(self, link: ChatLink) -> None:
        """Count a group message not for the bot; clear the group's context after enough."""
        after = self.settings.group_clear_after
        link.unaddressed += 1
        if not after or link.unaddressed < after:
            return
        state = self.agent.sessions.get(link.session)
        if (state is not None and state.busy) or self.agent.approvals.pending(link.session):
            return  # tried again with the next message
        link.unaddressed = 0
        self._chore(self._clear(link.session, state))

    async def _clear(self, session: str, state: Session | None) -> None:
        removed = await self.agent.clear_history(session)
        unloaded = drop_loaded_tools(state) if state is not None else []
        log.info(
            "%s: cleared %d history messages and %d loaded tools after %d unaddressed messages",
            session,
            removed,
            len(unloaded),
            self.settings.group_clear_after,
        )

    # ------------------------------------------------------------------ outbox

    async def deliver(self, delivery: Delivery) -> None:
        """Send a clock result or a background reply to its chat (through the outbox)."""
        if ChatRef.from_session(delivery.session) is None:
            return  # not a chat session (a notebook's)
        await self.start()
        await self.agent.outbox.post(delivery, kind=delivery.source or "text")

    async def _post(
        self,
        chat: ChatRef,
        kind: str,
        text: str = "",
        mentions: tuple[str, ...] = (),
        *,
        images: tuple[str, ...] = (),
        files: tuple[tuple[str, str], ...] = (),
        answers: tuple[int, ...] = (),
        wait: bool = False,
        model: bool = False,
    ) -> Posted:
        """Store a message for ``chat`` in the outbox and have it sent; its state (see `post`).

        ``model``: the text is the model's own (Markdown, flattened per ``runner.markdown``).
        """
        await self.start()
        meta: dict[str, object] = {
            "mentions": list(mentions),
            "images": list(images),
            "files": list(files),
        }
        if model:
            meta["model"] = True
        delivery = Delivery(chat.session, text, kind, meta=meta)
        return await self.agent.outbox.post(delivery, kind=kind, answers=answers, wait=wait)

    def render(self, entry: OutboxEntry) -> Outgoing | None:
        """The platform message of an outbox row (None: nothing to send). Depends on the row only.

        The adapter's own id is the one runtime input: the bot is never mentioned. The chat's
        language words the status texts; the model's words are flattened from Markdown
        (``runner.markdown = "plain"``), their sendable images taken out as images.
        """
        chat = ChatRef.from_session(entry.session)
        if chat is None:
            return None
        delivery = delivery_of(entry.session, entry.payload)
        meta = delivery.meta
        text = delivery.text.strip()
        own = self.adapter.self_id
        mark = f"{self.adapter.id_prefix}:"
        language = self.language(chat)
        if entry.kind == "reply":
            senders = [str(s).removeprefix(mark) for s in meta.get("senders") or ()]
            mentions = mentions_in(chat, senders, own) if meta.get("run_id") is not None else ()
            status = delivery.status
            images: tuple[str, ...] = ()
            if status == "denied":  # a quota's refusal: its reason is English
                reason = str(meta.get("error") or "")
                text = reason if language == "en" and reason else say("status.quota", language)
            elif status == "stopped":
                key = "status.shutdown" if meta.get("shutdown") else "status.stopped"
                text, mentions = say(key, language), ()
            elif status == "error" and str(meta.get("error") or "").startswith(UNRUN_CALL):
                text = say("status.unrun_call", language)  # the call's JSON means nothing here
            elif status == "error" and (cause := named_cause(str(meta.get("error") or ""))):
                text = say(STORAGE_KEYS[cause], language)  # a full disk, not "an error"
            else:
                text, images = self._model_text(text)
                if status != "success":
                    note = say(STATUS_KEYS.get(status, "status.error"), language)
                    text = f"{text}\n\n{note}" if text else note
            if not (text or images):
                return None
            return Outgoing(chat, text, mentions=mentions, images=images)
        if entry.kind in ("clock", "subagent") or delivery.source in ("clock", "subagent"):
            return self._render_background(chat, delivery, text, language)
        users = meta.get("mentions") or [
            str(s).removeprefix(mark) for s in meta.get("senders") or ()
        ]
        images = tuple(str(i) for i in meta.get("images") or ())
        if meta.get("model"):
            text, found = self._model_text(text)
            images = (*images, *found)
        files = tuple((str(f[0]), str(f[1])) for f in meta.get("files") or ())
        if not (text or images or files):
            return None
        return Outgoing(
            chat, text, mentions=mentions_in(chat, users, own), images=images, files=files
        )

    def _model_text(self, text: str) -> tuple[str, tuple[str, ...]]:
        """The model's Markdown as the chat gets it (``runner.markdown``) and its images."""
        if self.settings.markdown == "keep" or not text:
            return text, ()
        flat = plain(text, image_allowed=image_url_allowed)
        return flat.text, flat.images

    def _render_background(
        self, chat: ChatRef, delivery: Delivery, text: str, language: Language
    ) -> Outgoing | None:
        mentions: tuple[str, ...] = ()
        images: tuple[str, ...] = ()
        if delivery.source == "clock":
            # The task's creator, as stored: "qq:<id>" from a chat, else nobody. A stored id
            # that is no real user id (an old task's "qq:all") mentions nobody.
            creator = str(delivery.meta.get("created_by") or "")
            mark = f"{self.adapter.id_prefix}:"
            if creator.startswith(mark):
                mentions = mentions_in(chat, [creator.removeprefix(mark)], self.adapter.self_id)
            text, images = self._model_text(text)
        elif delivery.status != "success" and "child_id" not in delivery.meta:
            # The Agent's reply to a background result failed: a status text, like a reply's.
            if delivery.status in ("stopped", "interrupted"):
                return None
            reason = text.removeprefix(f"[{delivery.status}]").strip()
            key = STATUS_KEYS.get(delivery.status)
            text = say(key, language) if key is not None else reason
        else:
            text, images = self._model_text(text)
        if not (text or images):
            return None
        return Outgoing(chat, text, mentions=mentions, images=images)

    async def _send_row(self, entry: OutboxEntry) -> tuple[SendOutcome, str | None]:
        """The deliverer's send: render the row and send it; what happened (see `Deliverer`).

        A text over ``runner.message_chars`` goes as several messages (`split`): the mentions
        with the first, images and files with the last. Once one part went, a failure is never
        "unsent": sending the row again would repeat what arrived.
        """
        message = self.render(entry)
        if message is None:
            return "sent", "nothing to send"
        if message.text in STORAGE_TEXTS:
            if message.chat in self._told:
                return "sent", "the chat was told of this storage incident already"
            self._told.add(message.chat)
        elif entry.kind == "reply":
            self._told.clear()  # the store took a whole run again: the incident is over
        parts = _parts(message, self.settings.message_chars)
        for number, part in enumerate(parts):
            try:
                await self.adapter.send(part)
            except AdapterError as exc:
                if not exc.written and not number:
                    return "unsent", str(exc)
                why = str(exc) if not number else f"{exc} (after {number} of {len(parts)} parts)"
                return ("failed" if exc.refused else "uncertain"), why
        return "sent", None

    async def _wait_connected(self) -> None:
        """Return once the adapter is connected again (the deliverer's ``ready``)."""
        await _poll(lambda: self.adapter.connected, every=RECONNECT_POLL)

    def _chore(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(work)
        self._chores.add(task)
        task.add_done_callback(self._chore_done)

    def _chore_done(self, task: asyncio.Task[Any]) -> None:
        self._chores.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a runner chore failed", exc_info=task.exception())

    def _idle(self) -> bool:
        if any(s.busy for s in self.agent.sessions) or not self.agent.settled or self._chores:
            return False
        return self.deliverer is None or not self.deliverer.busy

    async def wait_idle(self) -> None:
        """Wait until nothing runs and every message so far was sent (or waits for a reconnect)."""
        await _poll(self._idle)

    # ------------------------------------------------------------------ close

    async def close(self, grace: float) -> None:
        """Stop queueing messages; let replies finish for ``grace`` seconds, then stop them.

        May be called again (e.g. on a second signal) with a shorter grace, which cuts the
        wait short; every call returns when the shutdown is done.
        """
        self._closed = True
        self.agent.stop_accepting()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, grace)
        if self._deadline is None or deadline < self._deadline:
            self._deadline = deadline
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._closing)

    def _busy_sessions(self) -> list[str]:
        return [s.name for s in self.agent.sessions if s.busy and ChatRef.from_session(s.name)]

    async def _shutdown(self) -> None:
        loop = asyncio.get_running_loop()
        # Nobody can answer an approval after the restart's cut: such runs end now (their
        # approval is asked again after the restart) instead of holding the grace period.
        suspended = await self.agent.suspend_approvals()
        if suspended:
            log.info("suspended %d run(s) waiting for an approval", suspended)
        # A second close may move the deadline closer: it is read on every look. Background
        # subagents share the deadline with the replies.
        await _poll(
            lambda: (
                (not self._busy_sessions() and not self.agent.background_running)
                or loop.time() >= (self._deadline or 0)
            )
        )
        # Still running: stopped, each chat told in the step that records it (sent below).
        stopped = await self.agent.stop_background()
        if stopped:
            log.info("stopped %d background subagent(s) still running (shutdown)", stopped)
        for session in self._busy_sessions():
            log.info("%s: stopping the reply (shutdown)", session)
            self.agent.stop(session)
        give_up = loop.time() + STOP_WAIT
        await _poll(
            lambda: (not self._busy_sessions() and self.agent.settled) or loop.time() >= give_up
        )
        if self.deliverer is not None:
            try:
                await asyncio.wait_for(self.deliverer.wait_idle(), max(give_up - loop.time(), 0.1))
            except TimeoutError:
                log.warning("some messages were not sent before the shutdown; sent after restart")
            await self.deliverer.aclose()
        if self._pruner is not None:
            self._pruner.cancel()
            await asyncio.gather(self._pruner, return_exceptions=True)
        chores = set(self._chores)
        for task in chores:
            task.cancel()
        if chores:
            await asyncio.gather(*chores, return_exceptions=True)
        if self.agent.outbox.callbacks_for == self.callbacks_for:
            self.agent.outbox.callbacks_for = self._previous


async def _poll(done: Callable[[], bool], *, every: float = IDLE_POLL) -> None:
    """Return once ``done()``: the Agent's sessions and the port have no change events."""
    while not done():  # noqa: ASYNC110 - nothing to wait on but the state itself
        await asyncio.sleep(every)


def _notice(setting: str | None, key: str, language: Language) -> str:
    """A notice's text: the setting as written, '' for none, the catalogue's when unset."""
    return say(key, language) if setting is None else setting


def _parts(message: Outgoing, limit: int) -> list[Outgoing]:
    """``message`` as the messages that carry it: its text split within ``limit`` characters."""
    pieces = split(message.text, limit) if len(message.text) > limit else [message.text]
    if len(pieces) <= 1:
        return [message]
    last = len(pieces) - 1
    return [
        Outgoing(
            message.chat,
            piece,
            mentions=message.mentions if number == 0 else (),
            images=message.images if number == last else (),
            files=message.files if number == last else (),
            reply_to=message.reply_to if number == 0 else None,
        )
        for number, piece in enumerate(pieces)
    ]


def drop_loaded_tools(state: Session) -> list[str]:
    """Remove the MCP tools a session loaded at run time (``mcp_load_*``); returns their names."""
    from ..mcp.tools import MCPTool  # the MCP SDK only when a group is cleared

    executor = state.executor
    dropped = []
    for name in executor.names():
        found = executor.get(name)
        if isinstance(found, MCPTool) and executor.shared.get(name) is not found:
            executor.remove(name)
            dropped.append(name)
    return dropped
