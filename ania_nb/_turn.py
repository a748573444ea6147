"""One turn of a session: a batch of waiting messages answered by one run of the tool loop.

The turn stores the user's message, compacts the history when it is over budget, runs the loop
(tools, gate, images), persists each finished round, and closes the run record — whatever the
outcome (success, timeout, error, stop).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ._session import Pending, Session, merge_batch, senders_of
from .engine.callbacks import Callbacks, RunEvent, Verdict
from .engine.loop import LoopHooks, ToolCall, ToolCallResult, ToolLoop
from .engine.messages import Message, for_storage, timestamped, user_message
from .engine.usage import Usage
from .errors import RunError
from .result import RunResult, RunStatus
from .store import ToolCallRecord
from .tools import ToolContext

if TYPE_CHECKING:  # pragma: no cover
    from ._runtime import Runtime
    from .agent import Agent


class Turn:
    """Answers one batch of a session's messages."""

    def __init__(self, agent: Agent, rt: Runtime, state: Session, batch: list[Pending]) -> None:
        self.agent = agent
        self.rt = rt
        self.store = rt.store
        self.state = state
        self.batch = batch

    async def run(self) -> RunResult:
        """Run the batch: store the user's turn, loop with tools, store the outcome."""
        agent, rt, store, state, batch = self.agent, self.rt, self.store, self.state, self.batch
        text, images = merge_batch(batch)
        callbacks = batch[-1].callbacks
        prepared = await agent.governance.before_turn(state.name, text)
        if prepared.blocked is not None:
            return await self._refused(text, prepared.blocked)
        now = datetime.now().astimezone()
        turn = user_message(timestamped(prepared.prompt, now), images)
        # The history keeps what the user said, not the injected hook/plan/todo context.
        stored_turn = for_storage(user_message(timestamped(text, now), images))
        run_id, loaded = await store.journal.begin(
            state.name,
            text,
            sender=senders_of(batch),
            message=stored_turn,
            load_history=state.history is None,
        )
        if loaded is not None:
            state.history = loaded
        assert state.history is not None
        history = list(state.history)  # before this turn
        state.history.append(stored_turn)
        usage = Usage()  # one tally: compaction tokens, then every loop call
        calls: list[ToolCallResult] = []  # finished rounds, in call order
        await _emit(callbacks, "run_start", state.name, run_id=run_id, text=text)

        def failed(status: RunStatus, error: str) -> RunResult:
            return RunResult("", status, state.name, usage, calls, run_id, error=error)

        final: list[Message] = []
        try:
            async with asyncio.timeout(agent.config.agent.run_timeout):
                if rt.window.needs_compaction(history, state.last_prompt_tokens):
                    history = await self._compact(history, stored_turn, usage)
                messages = [{"role": "system", "content": agent.system_prompt}, *history, turn]
                loop = self._make_loop(callbacks, run_id, calls, usage, batch[-1].sender)
                if batch[-1].model:
                    loop.llm = await rt.llm.with_model(batch[-1].model)
                result = await loop.run(messages)
            state.last_prompt_tokens = usage.last_prompt_tokens
            final = [for_storage(m) for m in result.final_messages]
            outcome = RunResult(result.text, "success", state.name, usage, calls, run_id)
        except TimeoutError:
            limit = agent.config.agent.run_timeout
            outcome = failed("timeout", f"the request took longer than {limit:g} s")
        except asyncio.CancelledError:
            await store.journal.finish(
                state.name, run_id, "stopped", usage=usage.to_dict(), error="stopped by the user"
            )
            await _emit(callbacks, "run_end", state.name, status="stopped")
            raise
        except RunError as exc:
            outcome = failed("error", str(exc))
        await store.journal.finish(
            state.name,
            run_id,
            outcome.status,
            messages=final,
            usage=usage.to_dict(),
            reply=outcome.text or None,
            error=outcome.error,
        )
        state.history.extend(final)
        await _emit(callbacks, "run_end", state.name, status=outcome.status, error=outcome.error)
        if outcome.ok:
            await agent.governance.after_run(state.name, outcome.text)
        return outcome

    async def _refused(self, text: str, reason: str) -> RunResult:
        """A UserPromptSubmit hook blocked the turn: record it; the history is left as it was."""
        state, store, batch = self.state, self.store, self.batch
        run_id = await store.runs.start(state.name, text, senders_of(batch))
        error = f"blocked by a UserPromptSubmit hook: {reason}"
        await store.runs.finish(run_id, "error", error=error)
        await _emit(batch[-1].callbacks, "run_end", state.name, status="error", error=error)
        return RunResult("", "error", state.name, run_id=run_id, error=error)

    def _make_loop(
        self,
        callbacks: Callbacks,
        run_id: int,
        calls: list[ToolCallResult],
        usage: Usage,
        sender: str | None,
    ) -> ToolLoop:
        agent, state, store = self.agent, self.state, self.store
        run_state: dict[str, Any] = {"usage": usage}  # tools that call models add to it

        async def approve(tool: str, summary: str) -> Verdict:
            return await agent.approvals.request(
                session=state.name,
                tool=tool,
                summary=summary,
                callbacks=callbacks,
                requester=sender,
            )

        def make_context(call: ToolCall) -> ToolContext:
            return ToolContext(
                session=state.name,
                callbacks=callbacks,
                agent_kind="main",
                call_id=call.id,
                executor=state.executor,
                run_state=run_state,
                approve=approve,
                sender=sender,
            )

        async def on_round(messages: list[Message], results: list[ToolCallResult]) -> None:
            stored = [for_storage(m) for m in messages]
            records = [
                ToolCallRecord(r.name, r.arguments, r.result, r.error, r.duration_ms)
                for r in results
            ]
            await store.journal.record_round(state.name, run_id, stored, records)
            assert state.history is not None
            state.history.extend(stored)
            calls.extend(results)

        return ToolLoop(
            llm=self.rt.llm,
            tools=state.executor,
            make_context=make_context,
            session=state.name,
            callbacks=callbacks,
            hooks=LoopHooks(
                gate=agent.hooks.tool_gate,
                after_tool=agent.governance.after_tool,
                on_round=on_round,
                take_images=lambda: run_state.pop("images", []),
            ),
            max_iterations=agent.config.agent.max_iterations,
            max_result_chars=agent.config.agent.max_tool_result_chars,
            stream=agent.config.llm.stream,
            usage=usage,
        )

    async def _compact(
        self, history: list[Message], stored_turn: Message, usage: Usage
    ) -> list[Message]:
        """Replace an over-budget history (in the store too) by its compaction; return it."""
        state = self.state
        compaction = await self.rt.window.compact(history)
        await self.store.history.replace(state.name, [*compaction.messages, stored_turn])
        state.history = [*compaction.messages, stored_turn]
        state.last_prompt_tokens = 0
        usage.merge(compaction.usage)
        return list(compaction.messages)


async def _emit(callbacks: Callbacks, kind: str, session: str, **data: Any) -> None:
    await callbacks.emit(RunEvent(kind, session, data))
