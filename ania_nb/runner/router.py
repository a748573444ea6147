"""The `Router`: what reaches the Agent from a chat platform, and what goes back.

Platform-neutral: it sees `Incoming`/`Outgoing` and an `Adapter`, never a wire format. Every
message is first stored in the Agent's durable inbox (`Agent.accept`, keyed by adapter, bot id
and message id): a re-sent event is recognised and ignored. Then, in order [orig §9.3, §13.6]:

1. A reply to the session's pending tool approval is answered first — a verdict word (允许/同意/
   批准/allow/approve/yes/y, 拒绝/deny/reject/no/n, optionally followed by the request id) from
   the requester or an admin; anyone else is told why not and nothing else happens.
   ``show [<id>]`` sends the request's full text. During the shutdown grace the same reply
   answers a request suspended by the shutdown: the verdict is stored with it and the run
   goes on with it after the restart, without the card being posted again.
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

A run the server's disk refused (an error naming no space left on device, a read-only file
system or a missing permission, `ania_nb._storage_cause`) is answered by a short text saying so
(`STORAGE_TEXTS`), once per chat until a reply goes through again; a message that could not
even be stored is told the same, straight through the adapter (the outbox is in that store).

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
from ..engine.callbacks import Callbacks
from ..engine.loop import UNRUN_CALL
from ..engine.untrusted import untrusted
from ..errors import StoreError, UsageError
from ..governance.approval import parse_verdict_word
from ..governance.commands import parse_slash
from ..orchestration import Delivery
from ..orchestration.delivery import Deliverer, Posted, SendOutcome
from ..orchestration.inbox import Accepted, Inbound
from ..orchestration.outbox import delivery_of
from .chat import ChatLink, incoming_from_meta, incoming_meta, mentions_in, model_text
from .model import Adapter, AdapterError, ChatRef, Incoming, Outgoing

if TYPE_CHECKING:  # pragma: no cover
    from ..agent import Agent
    from ..config import RunnerSettings
    from ..orchestration import Session
    from ..store import InboxEntry, OutboxEntry

log = logging.getLogger("ania_nb.runner")

STOPPED_TEXT = "AI 响应已被停止"
TIMEOUT_TEXT = "请求超时"
ERROR_TEXT = "无法解析的错误信息，请查看日志"
SHUTDOWN_TEXT = "服务正在关闭，这次的回复已停止，请稍后再发一次~"
HELD_TEXT = "服务正在重启，你的消息已保存，重启后回复你~"
SUSPENDED_TEXT = "服务正在重启：待审批的工具调用已保存，重启后会重新发送审批请求，批准后继续回复"
KEPT_TEXT = "重启后继续"  # added to a verdict's answer during the shutdown grace
# An answer that is only a tool call the engine did not run: not the JSON, but why.
UNRUN_CALL_TEXT = (
    '模型把工具调用写成了文字，没有执行（llm.text_tool_calls = false）；请管理员设为 "auto" 后再试'
)
# A run or a message the server's disk refused: said once per chat per incident (see `_told`).
STORAGE_TEXTS = {
    NO_SPACE: "服务器存储空间已满，暂时无法回复，请联系管理员清理磁盘",
    READ_ONLY: "服务器存储为只读，暂时无法回复，请联系管理员",
    NO_PERMISSION: "服务器存储无法写入（没有权限），暂时无法回复，请联系管理员",
}
STATUS_TEXTS = {
    "stopped": STOPPED_TEXT,
    "timeout": TIMEOUT_TEXT,
    "error": ERROR_TEXT,
    "interrupted": SUSPENDED_TEXT,  # suspended waiting for an approval (shutdown)
}
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
            await self.adapter.send(Outgoing(chat, STORAGE_TEXTS[cause], mentions=mentions))
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
        worker = state.worker if state is not None and state.busy else None
        accepted = await self.agent.accept(
            self._inbound(message, prompt, kind), link.callbacks(message)
        )
        await self._notices(link, message, accepted, worker)

    async def _notices(
        self, link: ChatLink, message: Incoming, accepted: Accepted, worker: object | None
    ) -> None:
        """The queued, overflow and shutdown notices, each once per busy period (or per chat)."""
        mentions = link.mention_of(message.sender_id)
        if accepted.state == "held":
            if not link.held_noticed:
                link.held_noticed = True
                await self._post(link.chat, "notice", HELD_TEXT, mentions)
            return
        if worker is None:
            return
        if accepted.state == "queued" and link.noticed is not worker:
            link.noticed = worker
            if self.settings.queued_notice:
                await self._post(link.chat, "notice", self.settings.queued_notice, mentions)
        elif accepted.state == "dropped" and link.overflowed is not worker:
            link.overflowed = worker  # one per busy period: a flood gets one, not hundreds
            if self.settings.overflow_notice:
                await self._post(link.chat, "notice", self.settings.overflow_notice, mentions)

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
        show = words[0].lower() == "show"
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
        if show:
            request = next((r for r in pending if wanted in (None, r.id)), None)
            shown = request.text() if request is not None else "没有待审批的请求"
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
            reply = f"无法审批：{exc}"
        else:
            log.info(
                "%s %s %s in %s",
                approver,
                "allowed" if allow else "denied",
                request.tool,
                link.session,
            )
            reply = f"{'已允许' if allow else '已拒绝'}：{request.tool}（请求 {request.id}）"
            if suspended:
                reply = f"{reply}，{KEPT_TEXT}"
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
    ) -> Posted:
        """Store a message for ``chat`` in the outbox and have it sent; its state (see `post`)."""
        await self.start()
        delivery = Delivery(
            chat.session,
            text,
            kind,
            meta={"mentions": list(mentions), "images": list(images), "files": list(files)},
        )
        return await self.agent.outbox.post(delivery, kind=kind, answers=answers, wait=wait)

    def render(self, entry: OutboxEntry) -> Outgoing | None:
        """The platform message of an outbox row (None: nothing to send). Depends on the row only.

        The adapter's own id is the one runtime input: the bot is never mentioned.
        """
        chat = ChatRef.from_session(entry.session)
        if chat is None:
            return None
        delivery = delivery_of(entry.session, entry.payload)
        meta = delivery.meta
        text = delivery.text.strip()
        own = self.adapter.self_id
        mark = f"{self.adapter.id_prefix}:"
        if entry.kind == "reply":
            senders = [str(s).removeprefix(mark) for s in meta.get("senders") or ()]
            mentions = mentions_in(chat, senders, own) if meta.get("run_id") is not None else ()
            status = delivery.status
            if status == "denied":
                text = str(meta.get("error") or "denied")
            elif status == "stopped":
                text, mentions = (SHUTDOWN_TEXT if meta.get("shutdown") else STOPPED_TEXT), ()
            elif status == "error" and str(meta.get("error") or "").startswith(UNRUN_CALL):
                text = UNRUN_CALL_TEXT  # the call's JSON means nothing to the people here
            elif status == "error" and (cause := named_cause(str(meta.get("error") or ""))):
                text = STORAGE_TEXTS[cause]  # a full disk, not "an error nobody can read"
            elif status != "success":
                partial = text
                text = STATUS_TEXTS.get(status, ERROR_TEXT)
                text = f"{partial}\n\n{text}" if partial else text
            return Outgoing(chat, text, mentions=mentions) if text else None
        if entry.kind in ("clock", "subagent") or delivery.source in ("clock", "subagent"):
            return self._render_background(chat, delivery, text)
        users = meta.get("mentions") or [
            str(s).removeprefix(mark) for s in meta.get("senders") or ()
        ]
        images = tuple(str(i) for i in meta.get("images") or ())
        files = tuple((str(f[0]), str(f[1])) for f in meta.get("files") or ())
        if not (text or images or files):
            return None
        return Outgoing(
            chat, text, mentions=mentions_in(chat, users, own), images=images, files=files
        )

    def _render_background(self, chat: ChatRef, delivery: Delivery, text: str) -> Outgoing | None:
        mentions: tuple[str, ...] = ()
        if delivery.source == "clock":
            # The task's creator, as stored: "qq:<id>" from a chat, else nobody. A stored id
            # that is no real user id (an old task's "qq:all") mentions nobody.
            creator = str(delivery.meta.get("created_by") or "")
            mark = f"{self.adapter.id_prefix}:"
            if creator.startswith(mark):
                mentions = mentions_in(chat, [creator.removeprefix(mark)], self.adapter.self_id)
        elif delivery.status != "success" and "child_id" not in delivery.meta:
            # The Agent's reply to a background result failed: a status text, like a reply's.
            if delivery.status in ("stopped", "interrupted"):
                return None
            reason = text.removeprefix(f"[{delivery.status}]").strip()
            text = STATUS_TEXTS.get(delivery.status) or reason
        return Outgoing(chat, text, mentions=mentions) if text else None

    async def _send_row(self, entry: OutboxEntry) -> tuple[SendOutcome, str | None]:
        """The deliverer's send: render the row and send it; what happened (see `Deliverer`)."""
        message = self.render(entry)
        if message is None:
            return "sent", "nothing to send"
        if message.text in STORAGE_TEXTS.values():
            if message.chat in self._told:
                return "sent", "the chat was told of this storage incident already"
            self._told.add(message.chat)
        elif entry.kind == "reply":
            self._told.clear()  # the store took a whole run again: the incident is over
        try:
            await self.adapter.send(message)
        except AdapterError as exc:
            if not exc.written:
                return "unsent", str(exc)
            return ("failed" if exc.refused else "uncertain"), str(exc)
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
