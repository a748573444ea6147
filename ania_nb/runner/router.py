"""The `Router`: what reaches the Agent from a chat platform, and what goes back.

Platform-neutral: it sees `Incoming`/`Outgoing` and an `Adapter`, never a wire format. For each
message, in order [orig §9.3, §13.6]:

1. A reply to the session's pending tool approval is answered first — a verdict word (允许/同意/
   批准/allow/approve/yes/y, 拒绝/deny/reject/no/n, optionally followed by the request id) from
   the requester or an admin; anyone else is told why not and nothing else happens.
   ``show [<id>]`` sends the request's full text.
2. Group messages are answered per ``runner.group_trigger`` (an @-mention, also a reply to the
   bot, or every message); ``/clock …`` works without @. Other group messages are only counted:
   after ``runner.group_clear_after`` of them the group's history and the tools its session
   loaded at run time (``mcp_load_*``) are cleared. Private messages are always answered.
3. The message goes to `Agent.chat` (commands are routed there) with the sender ``qq:<id>``;
   the model sees ``[nickname:<name> id:<id>]: <text>``, names and text neutralised and every
   further line of the text marked (`ania_nb.runner.chat`); a command's text is neutralised
   too (a custom command's arguments reach the model). A message for a busy session gets the
   queued notice (once per busy period), a full queue the overflow notice. The reply is sent
   when the run ends — in groups @ every sender of the batch it answers — or a status text for
   stopped/timeout/error runs, the quota's reason for denied ones; a blank reply sends nothing.

Clock results and the replies to background subagents arrive through `deliver` (subscribe it to
``agent.outbox``); clock results in groups @ the task's creator. Only real numeric user ids are
ever mentioned (`mentionable`; never ``all`` nor the bot), and nobody in private chats.
Creating a Router makes it the outbox's ``callbacks_for``, so clock runs of chat sessions can
send media and ask approvals in their chat. `close` stops accepting messages, suspends the runs
blocked only on an approval at once (`Agent.suspend_approvals`: the chat is told the request
will be posted again after the restart), lets running replies finish within a grace period and
stops the rest. After a restart the runner calls `Agent.resume_approvals` once connected: the
cards come back marked re-sent and a verdict continues the run; its reply arrives like a
background reply, through `deliver`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from ..engine.callbacks import Callbacks
from ..engine.untrusted import untrusted
from ..errors import AniaError, SessionBusyError, UsageError
from ..governance.approval import parse_verdict_word
from ..governance.commands import parse_slash
from .chat import ChatLink, mentions_in, model_text
from .model import Adapter, AdapterError, ChatRef, Incoming, Outgoing

if TYPE_CHECKING:  # pragma: no cover
    from ..agent import Agent
    from ..config import RunnerSettings
    from ..orchestration import Delivery, Session
    from ..result import RunResult

log = logging.getLogger("ania_nb.runner")

STOPPED_TEXT = "AI 响应已被停止"
TIMEOUT_TEXT = "请求超时"
ERROR_TEXT = "无法解析的错误信息，请查看日志"
SHUTDOWN_TEXT = "服务正在关闭，这次的回复已停止，请稍后再发一次~"
SUSPENDED_TEXT = "服务正在重启：待审批的工具调用已保存，重启后会重新发送审批请求，批准后继续回复"
STATUS_TEXTS = {
    "stopped": STOPPED_TEXT,
    "timeout": TIMEOUT_TEXT,
    "error": ERROR_TEXT,
    "interrupted": SUSPENDED_TEXT,  # suspended waiting for an approval (shutdown)
}
MAX_LINKS = 10_000  # chats remembered at once; idle ones beyond are forgotten first
STOP_WAIT = 10.0  # after the grace period: how long stopped replies get to report
RESEND_WINDOW = 60.0  # how long a reply waits for a dropped connection to come back
RESEND_POLL = 0.2


class Router:
    """Routes an adapter's messages to an Agent and the Agent's answers back (see the module)."""

    def __init__(self, agent: Agent, adapter: Adapter) -> None:
        self.agent = agent
        self.adapter = adapter
        self._links: OrderedDict[ChatRef, ChatLink] = OrderedDict()
        self._replies: dict[asyncio.Task[None], str] = {}  # reply task -> session
        self._chores: set[asyncio.Task[Any]] = set()  # acks, notices, clears
        self._closed = False
        self._closing: asyncio.Future[None] | None = None
        self._deadline: float | None = None
        self._hurry: asyncio.Event | None = None
        self._previous = agent.outbox.callbacks_for
        agent.outbox.callbacks_for = self.callbacks_for

    @property
    def settings(self) -> RunnerSettings:
        """The ``runner`` config section (read live: config_set may change it)."""
        return self.agent.config.runner

    @property
    def closed(self) -> bool:
        """Whether `close` was called (messages are ignored from then on)."""
        return self._closed

    @property
    def running(self) -> int:
        """Messages whose reply has not been sent yet."""
        return len(self._replies)

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
            for ref, old in list(self._links.items()):
                if len(self._links) < MAX_LINKS:
                    break
                if old.idle:
                    del self._links[ref]
        found = self._links[chat] = ChatLink(chat, self.agent, self.adapter, self._send)
        return found

    def callbacks_for(self, session: str) -> Callbacks:
        """The outbox's ``callbacks_for``: a chat session's clock runs reach its chat."""
        chat = ChatRef.from_session(session)
        if chat is None:
            return self._previous(session)
        return self.link(chat).callbacks()

    # ------------------------------------------------------------------ incoming

    async def handle(self, message: Incoming) -> None:
        """Take one message from the adapter; returns at once (the reply is a task)."""
        if self._closed or message.from_self:
            return
        try:
            self._route(message)
        except Exception:  # one bad message must not stop the adapter's event loop
            log.exception("could not route message %s in %s", message.message_id, message.chat)

    def _route(self, message: Incoming) -> None:
        link = self.link(message.chat)
        text = message.text.strip()
        log.debug("%s: message %s from %s", link.session, message.message_id, message.sender_id)
        if self._answer_approval(link, message, text):
            return
        command = parse_slash(text)
        if message.chat.kind == "group":
            if not self._addressed(message):
                if command is None or command[0] != "clock":
                    self._count_unaddressed(link)
                    return
            else:
                link.unaddressed = 0
        prompt = untrusted(text) if command is not None else model_text(message)
        callbacks = link.callbacks(message)
        if command is None:
            self._queued_notice(link, message)
        link.stop_noticed = False
        link.waiting[id(callbacks)] = message
        task = asyncio.create_task(
            self._reply(link, message, prompt, callbacks), name=f"ania-reply-{link.session}"
        )
        self._replies[task] = link.session
        task.add_done_callback(self._reply_done)

    def _reply_done(self, task: asyncio.Task[None]) -> None:
        self._replies.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("a reply task failed", exc_info=task.exception())

    def _addressed(self, message: Incoming) -> bool:
        trigger = self.settings.group_trigger
        if trigger == "all" or message.mentioned:
            return True
        return trigger == "mention_or_reply" and message.replied_to_bot

    def _answer_approval(self, link: ChatLink, message: Incoming, text: str) -> bool:
        """Answer the session's pending approval with ``text``; False when it is no answer."""
        pending = self.agent.approvals.pending(link.session)
        words = text.split()
        if not pending or not words or len(words) > 2:
            return False
        wanted = words[1] if len(words) == 2 else None
        if wanted is not None and wanted not in {r.id for r in pending}:
            return False
        mentions = link.mention_of(message.sender_id)
        if words[0].lower() == "show":
            request = next(r for r in pending if wanted in (None, r.id))
            self._chore(self._send(Outgoing(link.chat, request.text(), mentions=mentions)))
            return True
        allow = parse_verdict_word(words[0])
        if allow is None:
            return False
        approver = self.sender_id(message.sender_id)
        try:
            request = self.agent.answer_approval(
                wanted, session=link.session, allow=allow, approver=approver
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
        self._chore(self._send(Outgoing(link.chat, reply, mentions=mentions)))
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

    def _queued_notice(self, link: ChatLink, message: Incoming) -> None:
        """Tell a sender their message waits, once per busy period of the session."""
        state = self.agent.sessions.get(link.session)
        notice = self.settings.queued_notice
        if state is None or not state.busy or not notice or link.noticed is state.worker:
            return
        if len(state.queue) >= self.agent.config.agent.queue_size:
            return  # it will not wait: the overflow notice follows
        link.noticed = state.worker
        mentions = link.mention_of(message.sender_id)
        self._chore(self._send(Outgoing(link.chat, notice, mentions=mentions)))

    async def _reply(
        self, link: ChatLink, message: Incoming, prompt: str, callbacks: Callbacks
    ) -> None:
        sender = self.sender_id(message.sender_id)
        try:
            try:
                result = await self.agent.chat(prompt, link.session, callbacks, sender=sender)
            except SessionBusyError:
                notice = self.settings.overflow_notice
                if notice:
                    mentions = link.mention_of(message.sender_id)
                    await self._send(Outgoing(link.chat, notice, mentions=mentions))
                return
            except AniaError as exc:
                log.warning("message %s in %s failed: %s", message.message_id, link.session, exc)
                await self._send(Outgoing(link.chat, ERROR_TEXT))
                return
            await self._send_result(link, message, result)
        finally:
            link.waiting.pop(id(callbacks), None)

    async def _send_result(self, link: ChatLink, message: Incoming, result: RunResult) -> None:
        """Send a run's reply (or its status) once, whichever of its messages comes first."""
        if not link.first_answer(result):
            return
        batch = link.batch_of(result, message)
        mentions: tuple[str, ...] = ()
        if result.run_id is not None:  # command answers: no @
            mentions = link.mention_of(*(m.sender_id for m in batch))
        if result.status == "success":
            text = result.text.strip()
        elif result.status == "denied":
            text = result.error or "denied"
        elif result.status == "stopped":
            if link.stop_noticed:
                return  # one notice per stop, not one per dropped message
            link.stop_noticed = True
            text, mentions = (SHUTDOWN_TEXT if self._closed else STOPPED_TEXT), ()
        else:
            log.warning(
                "run %s of %s: %s: %s", result.run_id, link.session, result.status, result.error
            )
            partial = result.text.strip()
            text = STATUS_TEXTS.get(result.status, ERROR_TEXT)
            text = f"{partial}\n\n{text}" if partial else text
        if text:
            await self._send(Outgoing(link.chat, text, mentions=mentions), resend=True)

    # ------------------------------------------------------------------ outbox

    async def deliver(self, delivery: Delivery) -> None:
        """Send a clock result or a background reply to its chat (an outbox subscriber)."""
        chat = ChatRef.from_session(delivery.session)
        if chat is None:
            return  # not a chat session (a notebook's)
        text = delivery.text.strip()
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
                return
            reason = text.removeprefix(f"[{delivery.status}]").strip()
            text = STATUS_TEXTS.get(delivery.status) or reason
        if not text:
            return
        message = Outgoing(chat, text, mentions=mentions)
        try:
            await self.adapter.send(message)
        except AdapterError as exc:
            if self.adapter.connected:  # the platform refused it: sending again changes nothing
                log.warning("could not deliver to %s: %s", delivery.session, exc)
                return
            # The publisher (the clock) must not wait for a reconnect: resend in the background.
            log.warning(
                "could not deliver to %s: %s (sent again once reconnected)", delivery.session, exc
            )
            self._chore(self._resend(message))
        except Exception:
            log.exception("delivering to %s failed", delivery.session)

    # ------------------------------------------------------------------ sending

    async def _send(self, message: Outgoing, *, resend: bool = False) -> str | None:
        """Send; a failure is logged (the platform is down or refused), never raised.

        With ``resend``, a message that failed because the connection dropped is sent again
        once the adapter is back (within `RESEND_WINDOW` seconds): a reply finished during a
        reconnect is not lost.
        """
        try:
            return await self.adapter.send(message)
        except AdapterError as exc:
            lost = not self.adapter.connected
            again = " (sent again once reconnected)" if resend and lost else ""
            log.warning("could not send to %s: %s%s", message.chat.session, exc, again)
            if again:
                return await self._resend(message)
        except Exception:
            log.exception("sending to %s failed", message.chat.session)
        return None

    async def _resend(self, message: Outgoing) -> str | None:
        """Wait for the adapter to reconnect, then send ``message`` once more."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + RESEND_WINDOW
        while not self.adapter.connected:  # the port has no reconnect event: poll
            if loop.time() >= give_up:
                log.warning(
                    "%s stayed disconnected: a message to %s is lost",
                    self.adapter.name,
                    message.chat.session,
                )
                return None
            await asyncio.sleep(RESEND_POLL)
        try:
            return await self.adapter.send(message)
        except Exception as exc:
            log.warning("could not send to %s again: %s", message.chat.session, exc)
            return None

    def _chore(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(work)
        self._chores.add(task)
        task.add_done_callback(self._chore_done)

    def _chore_done(self, task: asyncio.Task[Any]) -> None:
        self._chores.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a runner chore failed", exc_info=task.exception())

    async def wait_idle(self) -> None:
        """Wait until every reply, notice and acknowledgement so far has been sent."""
        while self._replies or self._chores:
            await asyncio.wait({*self._replies, *self._chores})

    # ------------------------------------------------------------------ close

    async def close(self, grace: float) -> None:
        """Stop accepting messages; let replies finish for ``grace`` seconds, then stop them.

        May be called again (e.g. on a second signal) with a shorter grace, which cuts the
        wait short; every call returns when the shutdown is done.
        """
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, grace)
        if self._hurry is None:
            self._hurry = asyncio.Event()
        if self._deadline is None or deadline < self._deadline:
            self._deadline = deadline
            self._hurry.set()
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._closing)

    async def _shutdown(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._hurry is not None
        # Nobody can answer an approval after the restart's cut: such runs end now (their
        # approval is asked again after the restart) instead of holding the grace period.
        suspended = await self.agent.suspend_approvals()
        if suspended:
            log.info("suspended %d run(s) waiting for an approval", suspended)
        while self._replies:
            assert self._deadline is not None
            left = self._deadline - loop.time()
            if left <= 0:
                break
            self._hurry.clear()
            hurry = asyncio.ensure_future(self._hurry.wait())
            try:
                await asyncio.wait(
                    {*self._replies, hurry}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                hurry.cancel()
        sessions = set(self._replies.values())
        for session in sessions:
            log.info("%s: stopping the reply (shutdown)", session)
            self.agent.stop(session)
        pending = {*self._replies, *self._chores}
        if pending:
            await asyncio.wait(pending, timeout=STOP_WAIT)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self.agent.outbox.callbacks_for == self.callbacks_for:
            self.agent.outbox.callbacks_for = self._previous


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
