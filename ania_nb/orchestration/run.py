"""The one run path: any `RunSpec` through the loop, gate, hooks, compaction and persistence.

Whatever happens — success, timeout, a model or store failure, a bug, a stop — the run ends
with a closed record and a ``run_end`` event, and the caller gets a `RunResult` (a stop is
recorded, announced, then re-raised as cancellation). A failed record write is logged and never
fails the model's work.

A run is never a ``success`` without an answer: a reply cut by the token cap, still empty after
the loop asked once more, or only a tool call written as text that was not run, ends as
``error`` (the text, if any, kept); after the iteration limit the error says so. What the loop
noticed but let through (repeated calls not run, an answer that is only a tool call written as
text) goes to ``RunResult.warnings`` and, prefixed ``warning:``, to the record's error field.

Before its first model call a run asks ``services.switch_model`` whether another model answers
it (a used-up daily quota's fallback: `ModelSwitch`); front ends hear it as a ``model_switch``
event, and a switch's notice goes before the reply of a successful run. The run's session is
the one work inside it counts for (`charging`: an embeddings endpoint's tokens, say).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..config import SecuritySettings
from ..engine.callbacks import RunEvent
from ..engine.context import ContextWindow
from ..engine.llm import LLMClient
from ..engine.loop import Gate, GateDecision, TextToolCalls, ToolCall, ToolCallResult, ToolLoop
from ..engine.messages import Message, estimate_tokens, for_storage, timestamped, user_message
from ..engine.repair import clean_text, repair_history
from ..engine.usage import Usage, charging
from ..errors import ResourceError, RunError
from ..governance.gate import CHECKPOINT
from ..governance.plan import has_side_effects
from ..result import RunResult, RunStatus
from ..tools import ToolContext
from .checkpoint import SUSPENDED, ApprovalSuspension, RunCheckpoint
from .spec import ONE_SHOT_KINDS, RunSpec
from .tool_view import ToolView

log = logging.getLogger(__name__)

TRUNCATED = (
    'the answer was cut off at the model\'s token limit (finish_reason "length"); raise '
    "llm.max_tokens or ask for a shorter answer"
)
EMPTY = (
    "the model returned an empty answer, also when asked once more for one; the tool results "
    "are in the record (a larger or instruction-tuned model may do better)"
)
LIMIT_REACHED = (
    "the run reached the iteration limit (agent.max_iterations = {limit}: that many rounds of "
    "tool calls) and the model's last reply {last}; the tool results are in the record (raise "
    "agent.max_iterations, or ask for less at once)"
)
LIMIT_LAST = {
    "empty": "was empty",
    "call": "was only a tool call, written as text, which was not run",
}


@dataclass(frozen=True)
class RunLimits:
    """Per-run limits taken from the config."""

    max_iterations: int = 20
    max_tool_result_chars: int = 20000
    stream: bool = False
    max_repeat_calls: int = 3  # agent.max_repeat_calls
    text_tool_calls: TextToolCalls = "auto"  # llm.text_tool_calls

    @classmethod
    def from_config(cls, config: Any) -> RunLimits:
        """The limits an `AniaConfig` sets (``agent.*`` and ``llm.*`` keys)."""
        agent, llm = config.agent, config.llm
        return cls(
            agent.max_iterations,
            agent.max_tool_result_chars,
            llm.stream,
            agent.max_repeat_calls,
            llm.text_tool_calls,
        )


@dataclass(frozen=True)
class ModelSwitch:
    """Another model answers a run: ``llm`` (e.g. ``quota.fallback_model`` once a quota is used up).

    It also summarises the history when the run compacts it. ``notice`` goes before the reply
    of the run if it succeeds with one ("" = none), and ``noticed()`` is then awaited (so the
    notice is given once, where its giver wants).
    """

    llm: LLMClient
    notice: str = ""
    noticed: Callable[[], Awaitable[None]] | None = None
    reason: str = ""  # why, for front ends and the log


@dataclass
class RunServices:
    """What a run needs from its agent: model clients, context window, governance points, limits.

    Built once per Agent and shared by every kind of run; nothing here is the whole Agent.
    """

    llm: LLMClient
    window: ContextWindow
    limits: RunLimits = field(default_factory=RunLimits)
    gate: Gate | None = None
    after_tool: Callable[[ToolCallResult, Any], Awaitable[None]] | None = None
    after_run: Callable[[RunSpec, RunResult], Awaitable[None]] | None = None
    price: Callable[[Usage], float | None] | None = None  # sets ``usage.cost`` at the end
    security: SecuritySettings | None = None  # what tools' child processes inherit
    suspension: ApprovalSuspension | None = None  # main runs keep approval checkpoints here
    switch_model: Callable[[RunSpec], Awaitable[ModelSwitch | None]] | None = None


def with_notice(outcome: RunResult, notice: str) -> RunResult:
    """``outcome`` with ``notice`` put before its reply (once: a reply that has one keeps it)."""
    if notice and not outcome.notice:
        outcome.text = f"{notice}\n\n{outcome.text}"
        outcome.notice = notice
    return outcome


async def execute_run(spec: RunSpec, services: RunServices) -> RunResult:
    """Run ``spec`` to its end and return the outcome (see the module docstring)."""
    return await _Run(spec, services).execute()


async def _uncancellable(work: Awaitable[object]) -> None:
    """Finish ``work`` even if cancelled again meanwhile (a second stop, a close).

    A stopped run's record must not stay ``running``.
    """
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


class _Run:
    """The state of one executing run."""

    def __init__(self, spec: RunSpec, services: RunServices) -> None:
        self.spec = spec
        self.services = services
        self.usage = spec.usage
        self.calls: list[ToolCallResult] = []
        self.run_id: int | None = None
        self.run_state: dict[str, Any] = {"usage": self.usage, "deadline": spec.deadline}
        self.older = 0  # how many messages of the history came before this run's turn
        self.sent = 0  # length of the message list at the last model call
        self.checkpoint: RunCheckpoint | None = None
        self.switch: ModelSwitch | None = None
        resumable = spec.kind == "main" and spec.conversation is not None
        if services.suspension is not None and resumable:
            self.checkpoint = RunCheckpoint(spec, services.suspension)
            self.run_state[CHECKPOINT] = self.checkpoint

    async def execute(self) -> RunResult:
        """Run to the end (see the module docstring); a main run keeps its checkpoint."""
        checkpoint, suspension = self.checkpoint, self.services.suspension
        with charging(self.spec.session):  # what the run's tools spend counts for its session
            if checkpoint is None or suspension is None:
                return await self._execute()
            checkpoint.task = asyncio.current_task()
            suspension.track(checkpoint)
            try:
                return await self._execute()
            finally:
                suspension.untrack(checkpoint)

    async def _execute(self) -> RunResult:
        spec = self.spec
        resume = spec.resume
        text = clean_text(spec.text)
        now = datetime.now().astimezone()
        turn = user_message(timestamped(clean_text(spec.prompt or text), now), list(spec.images))
        stored_turn = for_storage(user_message(timestamped(text, now), list(spec.images)))
        conv = spec.conversation
        try:
            self.run_id, loaded = await spec.record.begin(
                text,
                spec.sender,
                stored_turn,
                load_history=conv is not None and conv.history is None and resume is None,
            )
        except Exception as exc:  # nothing was stored: the run cannot start
            log.exception("could not start the record of a %s run", spec.kind)
            return await self._end(self._failed("error", f"could not record the run: {exc}"))
        self.run_state["run_id"] = self.run_id  # the gate marks side effects on the record
        if self.checkpoint is not None:
            self.checkpoint.run_id = self.run_id
        history: list[Message] = []
        if conv is not None and resume is None:
            if loaded is not None:
                conv.history = await self._repaired(loaded)
            conv.history = conv.history or []
            history = list(conv.history)  # before this turn
            conv.history.append(stored_turn)
        await self._emit("run_start", run_id=self.run_id, text=text)
        if spec.injected:
            await self._emit("knowledge", **spec.injected)
        final: list[Message] = []
        try:
            async with asyncio.timeout(spec.seconds_left):
                self.switch = await self._switched()  # before a compaction: it asks it too
                system = {"role": "system", "content": spec.system_prompt}
                if resume is None:
                    history = await self._fit(history, turn)
                    self.older = len(history)
                    messages = [system, *history, turn]
                else:  # the stored conversation, as the model saw it when the run stopped
                    messages = [system, *resume.conversation]
                loop = await self._loop()
                result = await loop.run(messages, resume.round if resume is not None else None)
            final = [for_storage(m) for m in result.final_messages]
            outcome = RunResult(result.text, "success", spec.session, self.usage, self.calls)
            outcome.warnings = result.warnings
            if result.truncated:  # a cut answer is never a success; the text is kept
                outcome.status, outcome.error = "error", TRUNCATED
            elif result.limit_reached and (result.empty or result.unrun_call):
                last = LIMIT_LAST["empty" if result.empty else "call"]
                limit = self.services.limits.max_iterations
                outcome.status = "error"
                outcome.error = LIMIT_REACHED.format(limit=limit, last=last)
            elif result.empty:
                outcome.status, outcome.error = "error", EMPTY
            elif result.unrun_call:  # a call nobody ran is no answer: never a silent success
                outcome.status, outcome.error = "error", result.unrun_call
            if outcome.ok and outcome.text.strip():
                await self._give_notice(outcome)
        except TimeoutError:
            outcome = self._failed("timeout", f"the request took longer than {spec.timeout:g} s")
        except asyncio.CancelledError:
            if self.checkpoint is not None and self.checkpoint.suspended:
                return await self._suspended()
            stopped = self._failed("stopped", "stopped by the user")
            await _uncancellable(self._close(stopped, []))
            if spec.kind in ONE_SHOT_KINDS:  # SubagentStop follows every child, stopped too
                await _uncancellable(self._end(stopped))
            else:
                await self._emit("run_end", status="stopped", error=stopped.error)
            raise
        except (RunError, ResourceError) as exc:
            outcome = self._failed("error", str(exc))
        except Exception as exc:  # a bug must still end the run cleanly
            log.exception("a %s run failed unexpectedly", spec.kind)
            outcome = self._failed("error", f"internal error: {type(exc).__name__}: {exc}")
        outcome.run_id = self.run_id
        await self._close(outcome, final)
        if resume is not None and conv is not None:  # its context was not the cached history
            conv.history, conv.last_prompt_tokens, conv.pending_tokens = None, 0, 0
        elif conv is not None and conv.history is not None:
            conv.history.extend(final)
            conv.last_prompt_tokens = self.usage.last_prompt_tokens
            conv.pending_tokens = estimate_tokens(final)
        return await self._end(outcome)

    async def _give_notice(self, outcome: RunResult) -> None:
        """Put the model switch's notice before the reply (once: ``noticed`` remembers it)."""
        switch = self.switch
        if switch is None or not switch.notice:
            return
        with_notice(outcome, switch.notice)
        if switch.noticed is not None:
            try:
                await switch.noticed()
            except Exception:  # the reply still goes out; the notice may come again
                log.exception("could not note the model switch's notice of %s", self.spec.session)

    async def _switched(self) -> ModelSwitch | None:
        """The model switch of this run, if its services name one (a failure: the usual model)."""
        if self.services.switch_model is None:
            return None
        try:
            switch = await self.services.switch_model(self.spec)
        except Exception:
            log.exception("could not tell which model answers run %s", self.run_id)
            return None
        if switch is not None:
            log.info(
                "run %s of %s answered by %s: %s",
                self.run_id,
                self.spec.session,
                switch.llm.model,
                switch.reason,
            )
            await self._emit("model_switch", model=switch.llm.model, reason=switch.reason)
        return switch

    async def _suspended(self) -> RunResult:
        """The run was suspended waiting for an approval: record it, end without raising.

        The stored round stays unfinished (no tool result is written); the approval's row
        keeps the checkpoint to resume from after a restart. Suspending is the Agent's own
        cancellation, so it is taken back; any other cancellation meanwhile still stops.
        """
        outcome = self._failed("interrupted", SUSPENDED)
        await _uncancellable(self._close(outcome, []))
        task = asyncio.current_task()
        if task is not None and task.uncancel() > 0:
            raise asyncio.CancelledError
        return await self._end(outcome)

    def _failed(self, status: RunStatus, error: str) -> RunResult:
        return RunResult(
            "", status, self.spec.session, self.usage, self.calls, self.run_id, error=error
        )

    async def _end(self, outcome: RunResult) -> RunResult:
        """Announce the end and run the after-run hooks (Stop / SubagentStop)."""
        await self._emit(
            "run_end", status=outcome.status, error=outcome.error, warnings=outcome.warnings
        )
        if self.services.after_run is not None:
            try:
                await self.services.after_run(self.spec, outcome)
            except Exception:
                log.exception("after-run hooks failed")
        return outcome

    async def _close(self, outcome: RunResult, final: Sequence[Message]) -> None:
        """Price the run and close its record; a failed write is logged, never raised."""
        if self.services.price is not None:
            try:
                self.usage.cost = self.services.price(self.usage)
            except Exception:
                log.exception("could not price run %s", self.run_id)
        recorded = outcome
        if outcome.warnings:  # the record has one text field for what went wrong
            notes = "; ".join(f"warning: {w}" for w in outcome.warnings)
            error = f"{outcome.error}; {notes}" if outcome.error else notes
            recorded = dataclasses.replace(outcome, error=error)
        uncounted = self.usage.uncounted()
        try:
            await self.spec.record.finish(self.run_id, recorded, final, uncounted)
        except Exception:
            log.exception("could not close the record of run %s", self.run_id)
        else:
            self.usage.mark_counted(len(uncounted))

    async def _repaired(self, history: list[Message]) -> list[Message]:
        """A stored history made valid again (and stored so), if it was not."""
        fixed, problems = repair_history(history)
        if problems:
            log.warning("repaired the history of %s: %s", self.spec.session, "; ".join(problems))
            try:
                await self.spec.record.replace_history(fixed)
            except Exception:
                log.exception("could not store the repaired history of %s", self.spec.session)
        return fixed

    # ---------------------------------------------------------------- context window

    def _fixed_part(self) -> int:
        """Measure this request's fixed part (system prompt + tool definitions) for the budget.

        Measured per request, not once: tools come and go (MCP loads, session tools), and the
        window is shared by every session of the agent.
        """
        tools = self.spec.tools
        definitions = tools.definitions() if tools is not None else None
        return self.services.window.fixed_part(self.spec.system_prompt, definitions or None)

    async def _fit(self, history: list[Message], turn: Message) -> list[Message]:
        """Compact the history first when the next request would be over budget."""
        conv, window = self.spec.conversation, self.services.window
        fixed = self._fixed_part()  # on every turn: a front end shows its warning from the first
        if conv is None or not history:
            return history
        # The whole prompt, fixed part included, as the provider would count it.
        size = conv.last_prompt_tokens + conv.pending_tokens + estimate_tokens([turn])
        if not conv.last_prompt_tokens:
            size = estimate_tokens([*history, turn]) + fixed
        if not window.needs_compaction(history, size, fixed_tokens=fixed):
            return history
        return await self._compact(history)

    async def _compact(self, history: list[Message]) -> list[Message]:
        """Replace the older history (in the store too) by its compaction; return it."""
        conv = self.spec.conversation
        assert conv is not None and conv.history is not None
        switched = self.switch.llm if self.switch is not None else None
        compaction = await self.services.window.compact(history, switched)
        self.usage.merge(compaction.usage)
        conv.history = [*compaction.messages, *conv.history[len(history) :]]
        conv.last_prompt_tokens = conv.pending_tokens = 0
        try:
            await self.spec.record.replace_history(conv.history)
        except Exception:
            log.exception("could not store the compacted history of %s", self.spec.session)
        return list(compaction.messages)

    async def _before_call(self, messages: list[Message]) -> None:
        """Before each model call: repair the sequence, compact older history when over budget.

        The budget check counts the provider's last prompt size plus what this run appended.
        """
        fixed, problems = repair_history(messages)
        if problems:
            log.warning("repaired a request of %s: %s", self.spec.session, "; ".join(problems))
            messages[:] = fixed
        if self.sent and self.older:  # the first call was sized by `_fit`
            # Last prompt as counted by the provider + what this run appended since.
            size = self.usage.last_prompt_tokens + estimate_tokens(messages[self.sent :])
            part = self._fixed_part()
            if self.services.window.needs_compaction(messages, size, fixed_tokens=part):
                compacted = await self._compact(messages[1 : 1 + self.older])
                messages[1 : 1 + self.older] = compacted
                self.older = len(compacted)
        self.sent = len(messages)

    # ---------------------------------------------------------------- loop wiring

    async def _loop(self) -> ToolLoop:
        spec, services = self.spec, self.services
        # Tools that register tools (mcp_load_*) reach the session table under a ToolView.
        executor = spec.tools.table if isinstance(spec.tools, ToolView) else spec.tools

        def make_context(call: ToolCall) -> ToolContext:
            return ToolContext(
                session=spec.session,
                callbacks=spec.callbacks,
                agent_kind=spec.kind,
                call_id=call.id,
                executor=executor,
                run_state=self.run_state,
                sender=spec.requester,
                admin_only_approval=spec.admin_only_approval,
                plan_mode=spec.plan_mode,
                requesters=spec.requesters,
                role=spec.role,
                security=services.security,
            )

        async def on_round(messages: list[Message], results: list[ToolCallResult]) -> None:
            stored = [for_storage(m) for m in messages]
            self.calls.extend(results)
            conv = spec.conversation
            if conv is not None and conv.history is not None:
                conv.history.extend(stored)
            # The round holds the results of the calls answered since the last step: their
            # tokens are counted in its transaction (a failed step leaves them to the next).
            uncounted = self.usage.uncounted()
            try:
                await spec.record.round(self.run_id, stored, results, uncounted)
            except Exception:
                log.exception("could not record a tool round of run %s", self.run_id)
            else:
                self.usage.mark_counted(len(uncounted))

        loop = ToolLoop(
            llm=services.llm,
            tools=spec.tools,
            make_context=make_context,
            session=spec.session,
            callbacks=spec.callbacks,
            gate=self._gate(),
            after_tool=services.after_tool,
            on_round=on_round,
            take_images=lambda: self.run_state.pop("images", []),
            before_call=self._before_call,
            max_iterations=services.limits.max_iterations,
            max_result_chars=services.limits.max_tool_result_chars,
            max_repeat_calls=services.limits.max_repeat_calls,
            has_side_effects=lambda name: has_side_effects(
                name, executor.get(name) if executor is not None else None
            ),
            text_tool_calls=services.limits.text_tool_calls,
            stream=services.limits.stream,
            usage=self.usage,
            progress=self.checkpoint.progress if self.checkpoint is not None else None,
        )
        if self.switch is not None:  # over the per-run model too: its quota is used up
            llm = self.switch.llm
        else:
            llm = await services.llm.with_model(spec.model) if spec.model else services.llm
        loop.llm = llm.for_run()  # once the fallback answered, this run asks it first
        return loop

    def _gate(self) -> Gate | None:
        """The services' gate; a resumed run's pending call is decided already."""
        gate, resume = self.services.gate, self.spec.resume
        if resume is None:
            return gate

        async def resumed_gate(call: ToolCall, ctx: Any) -> GateDecision | None:
            if call.id != resume.call_id:
                return await gate(call, ctx) if gate is not None else None
            if resume.decision is None:  # allowed: the gate ran up to the person's verdict
                ctx.approved = True
            return resume.decision

        return resumed_gate

    async def _emit(self, kind: str, **data: Any) -> None:
        await self.spec.callbacks.emit(RunEvent(kind, self.spec.session, data))
