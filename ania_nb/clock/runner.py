"""One run of a clock task: a fresh one-shot ``clock`` run against the task's target session.

The model gets ``【定时任务】<title>``, a new line and ``<content>`` (plus the note); the target's
system prompt plus the clock scene; the target's session tools (todo excepted, and only those
the role of the task's creator in the target chat may use: ``created_by``, empty = the local
user) and, with subagents enabled, the clock variant of the subagent tools, whose results are
drained into the same conversation before the final reply [orig §4.4]. Intermediate text
is dropped; only the final non-blank reply — or a timeout notice — is published on the host's
outbox.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..agents.clock_children import ClockChildren
from ..catalogue import Language, language_for, say
from ..engine.untrusted import untrusted
from ..engine.usage import Usage
from ..orchestration import Conversation, OneShotJob
from ..orchestration.records import call_records
from ..orchestration.run import with_notice
from .model import MAX_TIMEOUT
from .schedule import describe_period

if TYPE_CHECKING:  # pragma: no cover
    from ..engine.loop import ToolCallResult
    from ..engine.messages import Message
    from ..engine.usage import Tokens
    from ..orchestration import AgentHost
    from ..result import RunResult
    from ..store import RunJournal
    from .model import ClockTask
    from .store import ClockStore

CHILDREN_HIDDEN = frozenset({"clock_create"})

log = logging.getLogger(__name__)

SCENE_PROMPT = (
    "## Scheduled task\n"
    "You are running a scheduled task of the clock for the session {target}; nobody is chatting "
    "with you right now. Do what the task says, using your tools as needed, then write the "
    "message the user should receive: only your final reply is delivered to {target} (your "
    "intermediate text is not), and nobody can answer questions during the run. If there is "
    "nothing worth reporting, say so in one short sentence."
)
CLOSED_ERROR = "the clock was closed while the task ran"
STOPPED_ERROR = "stopped: its target session was stopped while the task ran"


def trigger_text(task: ClockTask) -> str:
    """What the model gets: ``【定时任务】<title>``, a new line, the content and the note.

    A chat member may have written them: they are neutralised like chat text (no control
    tokens, no working sender-line or knowledge markers).
    """
    text = f"【定时任务】{task.title}\n{task.content}"
    if task.note.strip():
        text += f"\n（备注：{task.note.strip()}）"
    return untrusted(text)


def task_timeout(task: ClockTask, default: float) -> float:
    """The task's run budget in seconds: its own or the default, at most 1800."""
    seconds = task.timeout if task.timeout > 0 else default
    if seconds <= 0:
        seconds = 120.0
    return float(min(seconds, MAX_TIMEOUT))


def timeout_notice(task: ClockTask, seconds: float, language: Language = "en") -> str:
    """The text the target gets when a run timed out (in its front end's ``language``)."""
    title, period = task.title or task.id, describe_period(seconds)
    return say("notice.timed_out", language, title=title, period=period)


@dataclass
class Outcome:
    """How a task run ended: what goes into its log entry and what the target gets."""

    status: str
    reply: str | None = None
    error: str | None = None
    usage: Usage = field(default_factory=Usage)
    delivery: str | None = None  # text published to the target (final reply or notice)


class TaskLogRecorder:
    """The `RunRecorder` of clock runs: the task-log entry and a run record of the target.

    Tool calls go to both as they happen. The entry is opened before the run (to detect
    overlaps) and closed by the clock after the last drain round; the run record (in
    ``agent.runs()``, sender ``clock:<task id>``) is opened by the first round and closed by
    `close`, so one task run is one record however many drain rounds it took.
    """

    def __init__(
        self, store: ClockStore, entry_id: int, runs: RunJournal | None = None, session: str = ""
    ) -> None:
        """Record into the log entry ``entry_id`` (and a run record of ``session``)."""
        self.store = store
        self.entry_id = entry_id
        self.runs = runs
        self.session = session
        self.run_id: int | None = None

    async def begin(
        self, text: str, sender: str | None, turn: Message, *, load_history: bool
    ) -> tuple[int | None, list[Message] | None]:
        """Open the run record once; a clock run starts without stored history."""
        if self.runs is not None and self.run_id is None:
            try:
                self.run_id = await self.runs.start(self.session, text, sender=sender)
            except Exception:  # the task log still records the run
                log.exception("could not open the run record of clock entry %s", self.entry_id)
        return self.entry_id, [] if load_history else None

    async def round(
        self,
        run_id: int | None,
        messages: Sequence[Message],
        calls: Sequence[ToolCallResult],
        tokens: Sequence[tuple[str, Tokens]] = (),
    ) -> None:
        """Append the round's tool calls to the entry and the run record; count its tokens."""
        records = call_records(calls)
        if records:
            await self.store.add_tool_calls(self.entry_id, records)
        if self.runs is None:
            return
        if self.run_id is None:  # no record could be opened: its tokens still count
            await self.runs.count(self.session, tokens)
        elif records or tokens:
            await self.runs.record_round(self.session, self.run_id, (), records, counted=tokens)

    async def close(self, status: str, usage: Usage, reply: str | None, error: str | None) -> None:
        """Close the run record (best effort: a failure is logged).

        The rounds counted their calls already; what is left (a failed step's) counts here.
        """
        if self.runs is None:
            return
        uncounted = usage.uncounted()
        if self.run_id is None:  # no record could be opened: its tokens still count
            try:
                await self.runs.count(self.session, uncounted)
            except Exception:
                log.exception("could not count the tokens of clock entry %s", self.entry_id)
            else:
                usage.mark_counted(len(uncounted))
            return
        run_id, self.run_id = self.run_id, None
        try:
            await self.runs.finish(
                self.session,
                run_id,
                status,
                usage=usage.to_dict(),
                reply=reply,
                error=error,
                counted=uncounted,
            )
        except Exception:
            log.exception("could not close the run record %s of a clock run", run_id)
        else:
            usage.mark_counted(len(uncounted))

    async def finish(
        self,
        run_id: int | None,
        outcome: RunResult,
        messages: Sequence[Message],
        tokens: Sequence[tuple[str, Tokens]] = (),
    ) -> None:
        """Count the final answer's tokens; the clock closes the entry once every round is done."""
        if tokens:
            await self.round(run_id, (), (), tokens)

    async def replace_history(self, messages: Sequence[Message]) -> None:
        """Clock runs keep no history."""


async def run_task(host: AgentHost, store: ClockStore, task: ClockTask, entry_id: int) -> Outcome:
    """Run ``task`` once (its log entry ``entry_id`` is open) and return how it ended.

    Cancellation propagates (the caller closes the entry).
    """
    config = host.config
    denied = await host.quota_denial(task.target)
    if denied is not None:  # logged, not delivered: nobody asked for this run just now
        return Outcome("denied", error=denied)
    budget = task_timeout(task, config.clock.default_timeout)
    deadline = time.monotonic() + budget
    target = task.target
    usage = Usage()
    conversation = Conversation(history=[])
    system_prompt = host.system_prompt_for(target) + "\n\n" + SCENE_PROMPT.format(target=target)
    children = (  # its async subagents [orig §4.4]
        # A clock run's own clock_create is capped (clock.max_tasks_per_run); its children
        # get none, or they would be a way around the cap.
        ClockChildren(host, session=target, deadline=deadline, usage=usage, hidden=CHILDREN_HIDDEN)
        if config.subagent.enable
        else None
    )
    extra = children.tools() if children is not None else []

    # The run acts for the task's creator: their role in the target chat decides its tools.
    role = host.role_of(target, task.created_by or None)
    journal = (await host.open_store()).journal
    recorder = TaskLogRecorder(store, entry_id, journal, target)

    def job(text: str) -> OneShotJob:
        return OneShotJob(
            kind="clock",
            session=target,
            text=text,
            system_prompt=system_prompt,
            timeout=max(0.001, deadline - time.monotonic()),
            callbacks=host.outbox.callbacks_for(target),
            usage=usage,
            record=recorder,
            sender=f"clock:{task.id}",
            conversation=conversation,
            extra_tools=extra,
            role=role,
        )

    async def continue_with(text: str) -> RunResult:
        return await host.run_one_shot(job(text))

    try:
        result = first = await host.run_one_shot(job(trigger_text(task)))
        if children is not None and result.ok:
            result = await children.drain(result, continue_with)
            if result.ok:  # the delivered reply is the last one: it carries the first's notice
                result = with_notice(result, first.notice)
    except asyncio.CancelledError:
        await asyncio.shield(recorder.close("stopped", usage, None, "the clock run was stopped"))
        raise
    finally:
        if children is not None:
            await _quietly(children.cancel_all())
    language = language_for(config.ui.language, target)
    outcome = _outcome(task, result, usage, budget, language)
    await recorder.close(result.status, usage, outcome.reply, outcome.error)
    return outcome


def _outcome(
    task: ClockTask, result: RunResult, usage: Usage, budget: float, language: Language
) -> Outcome:
    reply = result.text.strip() or None
    if result.status == "success":
        return Outcome("success", reply=reply, usage=usage, delivery=reply)
    if result.status == "timeout":
        notice = timeout_notice(task, budget, language)
        return Outcome("timeout", reply=reply, error=result.error, usage=usage, delivery=notice)
    return Outcome("error", reply=reply, error=result.error or result.status, usage=usage)


async def _quietly(work: Awaitable[None]) -> None:
    """Await a clean-up step; its failure is logged, never raised over the run's outcome."""
    try:
        await work
    except Exception:
        log.exception("cleaning up the subagents of a clock run failed")
