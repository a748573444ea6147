"""The tool loop: model → every tool call of the round concurrently → results in call order → again.

Tools are reached through the `ToolRunner` protocol and per-call contexts come from the caller,
so the engine does not depend on the tools package. The gate (plan mode, hooks, approvals) runs
inside each call's own task: a call waiting for a human never delays its siblings.

Habits of small models are contained here: a call repeated with the same arguments and result
(any result, for a tool with side effects) is answered from the earlier result (`RepeatGuard`);
tool calls written as text are run as ``text_tool_calls`` says (by default when they end the
reply), and what is call-shaped but not run is never a silent answer: an answer that is only
such a call is ``LoopResult.unrun_call``, anything else a warning (`find_text_calls`);
an empty final answer after tool rounds is asked for once more (after the iteration-limit notice,
which already asked, it is not), then reported as ``LoopResult.empty``. An empty answer with no
tool round before it is left alone: nothing was done that the user is owed an answer about.
Tool results lose chat-template control tokens before they become messages
(`strip_control_tokens`): web pages, documents and MCP servers are untrusted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ..text import cut
from .callbacks import NO_CALLBACKS, Callbacks, RunEvent
from .concurrency import gather_all
from .llm import Completion, LLMClient, RetryNotice
from .messages import EMPTY_REPLY_MESSAGE, LIMIT_MESSAGE, Message, strip_think, user_message
from .repair import clean_text
from .repeats import EFFECT_REPEAT_ERROR, REPEAT_ERROR, Claim, RepeatGuard, repeat_text
from .text_calls import TextCalls, find_text_calls
from .untrusted import strip_control_tokens
from .usage import Usage

log = logging.getLogger(__name__)

LOADED_IMAGES_TEXT = "These are the images you asked to load, each labelled by its marker:"

TextToolCalls = bool | Literal["auto"]
"""``llm.text_tool_calls``: run calls written as text always (True), never (False), or when
they end the reply ("auto": the reply is only calls, or the model's words then calls)."""

UNRUN_CALL = "the answer is only a tool call written as text"
"""How the error of such an answer begins (front ends tell their users in their own words)."""
TEXT_CALL_ERROR = (
    UNRUN_CALL + " ({names}), which was not run "
    '(llm.text_tool_calls = false); set it to "auto" (the default) or true to run calls a '
    "model writes as text"
)
TEXT_CALL_WARNING = (
    "the answer contains a tool call written as text ({names}) that was not run ({why})"
)
UNREAD_CALL_WARNING = (
    "the answer contains text shaped like a tool call that could not be read as one, so it "
    "was not run: {shown}"
)


class ToolOutcomeLike(Protocol):
    """What a tool runner returns for one call."""

    @property
    def text(self) -> str:
        """The result text the model sees."""
        ...

    @property
    def error(self) -> str | None:
        """The failure, if the call failed."""
        ...

    @property
    def duration_ms(self) -> int:
        """How long the call took."""
        ...


class ToolRunner(Protocol):
    """The executor seen from the loop: definitions to send and a way to run a call."""

    def definitions(self) -> list[dict[str, Any]]:
        """Tool definitions for the request, sorted by name."""
        ...

    async def execute(self, name: str, arguments: str, ctx: Any) -> ToolOutcomeLike:
        """Run one call; never raises except on cancellation."""
        ...


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for."""

    id: str
    name: str
    arguments: str


ToolOutcomeKind = Literal["ok", "error", "denied", "blocked", "timeout", "stopped"]
"""How a call ended: ran fine, failed, or was stopped by the gate (denied by a person, blocked
by the run's role, plan mode or a hook, or an approval that timed out or was stopped)."""

GateStage = Literal["role", "plan", "hook", "admin", "human"]
"""Which gate stage decided a call that did not run."""


@dataclass(frozen=True)
class GateDecision:
    """The gate stopped a call: ``text`` becomes its result; ``outcome`` and ``stage`` say why."""

    text: str
    outcome: ToolOutcomeKind = "blocked"
    stage: GateStage = "hook"


@dataclass
class ToolCallResult:
    """What happened to one call: its result text as the model sees it, and how it went.

    ``outcome`` is the structured verdict front ends show (never parse ``result``); ``stage`` is
    the gate stage that decided a call that did not run.
    """

    id: str
    name: str
    arguments: str
    result: str
    error: str | None = None
    duration_ms: int = 0
    outcome: ToolOutcomeKind = "ok"
    stage: GateStage | None = None

    @property
    def blocked(self) -> bool:
        """Whether the gate stopped the call before it ran."""
        return self.stage is not None


def cap_result(text: str, limit: int) -> str:
    """Cut an oversized tool result (it would stay in the history and crowd the context)."""
    return cut(text, limit, marker=f"\n...(tool result truncated: {len(text)} characters in total)")


Gate = Callable[[ToolCall, Any], Awaitable[GateDecision | None]]
"""Returns a decision that stops the call (its text becomes the result) or None to proceed."""


@dataclass
class RoundProgress:
    """The tool round in flight, as a checkpoint would store it (see `ToolLoop.progress`).

    ``messages`` is the conversation before the round (the loop's own list: read, never kept
    past the round), ``assistant`` the message with the round's ``calls``, ``finished`` the
    results of the calls that ended so far. ``waiting`` holds the calls waiting for a person
    (the approval manager marks them); ``on_change`` is told of every change, so an owner can
    act when the run becomes blocked only on approvals.
    """

    messages: list[Message] = field(default_factory=list)
    assistant: Message | None = None
    calls: list[ToolCall] = field(default_factory=list)
    finished: dict[str, ToolCallResult] = field(default_factory=dict)
    waiting: set[str] = field(default_factory=set)
    on_change: Callable[[], None] | None = None

    @property
    def blocked_on_approval(self) -> bool:
        """Every call of the round that has not ended waits for a person (and one does)."""
        unfinished = {c.id for c in self.calls} - set(self.finished)
        return bool(unfinished) and unfinished <= self.waiting

    def start(self, messages: list[Message], assistant: Message, calls: list[ToolCall]) -> None:
        """A round begins."""
        self.messages, self.assistant, self.calls = messages, assistant, calls
        self.finished, self.waiting = {}, set()
        self._changed()

    def ended(self, result: ToolCallResult) -> None:
        """One call of the round ended."""
        self.finished[result.id] = result
        self.waiting.discard(result.id)
        self._changed()

    def asking(self, call_id: str, on: bool) -> None:
        """A call starts (``on``) or stops waiting for a person."""
        if on:
            self.waiting.add(call_id)
        else:
            self.waiting.discard(call_id)
        self._changed()

    def clear(self) -> None:
        """The round is over (its messages are part of the conversation now)."""
        self.messages, self.assistant, self.calls = [], None, []
        self.finished, self.waiting = {}, set()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


@dataclass(frozen=True)
class ResumedRound:
    """A tool round to finish before the loop asks the model again (a run resumed later).

    ``assistant`` is the stored message with the round's ``calls``; ``finished`` the results of
    the calls that had ended. The other calls are run now (through the gate, which decides
    what was already decided).
    """

    assistant: Message
    calls: list[ToolCall]
    finished: dict[str, ToolCallResult] = field(default_factory=dict)


@dataclass
class LoopResult:
    """The outcome of one loop: final text, usage and every tool call in order.

    ``final_messages`` are the messages after the last tool round (the iteration-limit notice,
    if any, and the final answer); unlike rounds they were not passed to ``on_round``.
    """

    text: str
    usage: Usage
    tool_calls: list[ToolCallResult] = field(default_factory=list)
    final_messages: list[Message] = field(default_factory=list)
    truncated: bool = False  # the final answer was cut by the model's token limit
    empty: bool = False  # empty after tool rounds, even when asked once more
    warnings: list[str] = field(default_factory=list)  # for the run record (repeats, text calls)
    unrun_call: str | None = None  # the answer is only a text call that was not run: why
    limit_reached: bool = False  # agent.max_iterations rounds ran; the answer came after


@dataclass
class ToolLoop:
    """One run of the loop over a message list (which it extends in place)."""

    llm: LLMClient
    tools: ToolRunner | None
    make_context: Callable[[ToolCall], Any]
    session: str = "default"
    callbacks: Callbacks = NO_CALLBACKS
    gate: Gate | None = None
    after_tool: Callable[[ToolCallResult, Any], Awaitable[None]] | None = None
    on_round: Callable[[list[Message], list[ToolCallResult]], Awaitable[None]] | None = None
    """Told of each finished tool round: its messages (assistant, tool results, loaded images)
    and its calls in call order — the point to persist them."""
    take_images: Callable[[], list[str]] | None = None
    """Images that tools of the round queued (URLs / data URIs), shown to the model next round."""
    before_call: Callable[[list[Message]], Awaitable[None]] | None = None
    """Told before each model call with the full message list (which it may compact in place)."""
    max_iterations: int = 20
    max_result_chars: int = 20000
    max_repeat_calls: int = 3
    """Identical calls (same arguments, same result) run per loop before repeats are refused."""
    has_side_effects: Callable[[str], bool] | None = None
    """Whether the tool of this name changes things: its identical calls count as repeats
    whatever their results (see `RepeatGuard`)."""
    text_tool_calls: TextToolCalls = "auto"
    """Run tool calls the model wrote as text (see `TextToolCalls`, `find_text_calls`)."""
    stream: bool = False
    usage: Usage = field(default_factory=Usage)
    progress: RoundProgress | None = None
    """Kept up to date with the round in flight (checkpoints of approvals; see `RoundProgress`)."""
    results: list[ToolCallResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    _repeats: RepeatGuard = field(default_factory=RepeatGuard, init=False, repr=False)
    _unrun: str | None = field(default=None, init=False, repr=False)

    async def run(self, messages: list[Message], resume: ResumedRound | None = None) -> LoopResult:
        """Run rounds until the model answers without tools (or the iteration limit).

        With ``resume``, its round is finished first (its text was shown when it was asked).
        """
        self._repeats = RepeatGuard(self.max_repeat_calls)
        self._unrun = None
        names: set[str] = set()
        for _ in range(self.max_iterations):
            if resume is not None:
                await self._round(messages, resume.assistant, resume.calls, resume.finished)
                resume = None
                continue
            definitions = self.tools.definitions() if self.tools is not None else []
            names = {d["function"]["name"] for d in definitions}
            completion = await self._call(messages, definitions)
            message = self._text_calls(completion, len(messages), names)
            if not message.get("tool_calls"):
                return await self._final(messages, [], completion, ask=bool(self.results))
            text = strip_think(message.get("content"))
            if text:
                await self._emit("assistant_text", text=text)
                await self.callbacks.deliver("send_text", text)
            # The client normalised ids and names; wrapped arguments run as the model sent
            # them so the executor can name the real parse error.
            calls = [
                ToolCall(c["id"], c["function"]["name"], completion.arguments_for(c))
                for c in message["tool_calls"]
            ]
            await self._round(messages, message, calls, {})
        limit = user_message(LIMIT_MESSAGE)
        messages.append(limit)
        completion = await self._call(messages, [])
        if not completion.message.get("tool_calls"):  # no tools were offered: none is run
            self._flag_text_calls(
                find_text_calls(strip_think(completion.message.get("content")), names)
            )
        result = await self._final(messages, [limit], completion, ask=False)
        result.limit_reached = True
        return result

    def _text_calls(self, completion: Completion, turn: int, names: set[str]) -> Message:
        """The reply, its text tool calls made real ones when ``text_tool_calls`` says so."""
        message = completion.message
        if message.get("tool_calls") or not names:
            return message
        # Reasoning inlined as <think> may mention a call it then decided against.
        found = find_text_calls(strip_think(message.get("content")), names)
        mode = self.text_tool_calls
        if not found.calls or not (mode is True or (mode == "auto" and found.trailing)):
            self._flag_text_calls(found)
            return message
        calls = [
            {
                "id": f"call_text_{turn}_{n}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for n, c in enumerate(found.calls)
        ]
        # Stored and re-sent as a normal call: the conversation stays valid for any server.
        completion.message = {**message, "content": found.text or None, "tool_calls": calls}
        return completion.message

    def _flag_text_calls(self, found: TextCalls) -> None:
        """Note call-shaped text that is not run: never a silent answer."""
        called = ", ".join(dict.fromkeys(c.name for c in found.calls))
        if found.whole:
            self._unrun = TEXT_CALL_ERROR.format(names=called)
        elif found.calls:
            why = (
                "llm.text_tool_calls = false"
                if self.text_tool_calls is False
                else 'more text follows it; llm.text_tool_calls = "auto" runs only calls that '
                "end the answer, true runs every one"
            )
            self.warnings.append(TEXT_CALL_WARNING.format(names=called, why=why))
        for shown in found.unread:
            self.warnings.append(UNREAD_CALL_WARNING.format(shown=shown))

    async def _final(
        self, messages: list[Message], before: list[Message], completion: Completion, *, ask: bool
    ) -> LoopResult:
        """Finish on ``completion``; empty after tool rounds: ask once more (``ask``), no tools."""
        message = completion.message
        if strip_think(message.get("content")) or completion.truncated or not self.results:
            return self._finish(messages, before, message, completion.truncated)
        if ask:  # a small model often ends with nothing after its tool calls: ask once, plainly
            nudge = user_message(EMPTY_REPLY_MESSAGE)
            messages.append(nudge)
            before = [*before, nudge]
            completion = await self._call(messages, [])
        result = self._finish(messages, before, completion.message, completion.truncated)
        result.empty = not result.text and not result.truncated
        return result

    async def _call(self, messages: list[Message], definitions: list[dict[str, Any]]) -> Completion:
        if self.before_call is not None:
            await self.before_call(messages)
        on_delta = on_retry = None
        if self.stream and self.callbacks.has("on_event"):

            async def on_delta(piece: str) -> None:
                await self._emit("text_delta", text=piece)

            async def on_retry(notice: RetryNotice) -> None:
                # The front end takes back what it streamed (discard) and shows the retry.
                await self._emit(
                    "retry",
                    model=notice.model,
                    attempt=notice.attempt,
                    delay=notice.delay,
                    error=notice.error,
                    discard=notice.discard_output,
                )

        completion = await self.llm.complete(
            messages,
            tools=definitions or None,
            stream=self.stream,
            on_delta=on_delta,
            on_retry=on_retry,
        )
        self.usage.add_completion(completion, messages, definitions)
        if self.callbacks.on_event is not None:
            await self._emit("usage", **self.usage.to_dict())
        return completion

    def _finish(
        self, messages: list[Message], before: list[Message], message: Message, truncated: bool
    ) -> LoopResult:
        final = dict(message)
        final.pop("tool_calls", None)
        if final.get("content") is None:
            final["content"] = ""  # null content without tool calls is refused by some servers
        messages.append(final)
        text = strip_think(final.get("content"))
        warnings = list(dict.fromkeys([*self.warnings, *self._repeats.warnings()]))
        return LoopResult(
            text,
            self.usage,
            self.results,
            [*before, final],
            truncated,
            False,
            warnings,
            self._unrun,
        )

    async def _round(
        self,
        messages: list[Message],
        message: Message,
        calls: list[ToolCall],
        finished: dict[str, ToolCallResult],
    ) -> None:
        """Run one tool round (``finished``: calls that already ended) and append it."""
        if self.progress is not None:
            self.progress.start(messages, message, calls)
            for result in finished.values():
                self.progress.ended(result)
        results = await self._run_tools(calls, finished)
        round_messages = [message]
        round_messages += [
            {"role": "tool", "tool_call_id": r.id, "content": r.result} for r in results
        ]
        images = list(self.take_images() if self.take_images else ())
        images += await self.callbacks.call("take_loaded_images") or ()
        if images:
            round_messages.append(user_message(LOADED_IMAGES_TEXT, list(images)))
        messages.extend(round_messages)
        if self.progress is not None:
            self.progress.clear()
        if self.on_round is not None:
            await self.on_round(round_messages, results)

    async def _run_tools(
        self, calls: list[ToolCall], finished: dict[str, ToolCallResult]
    ) -> list[ToolCallResult]:
        # Claimed in call order before any runs, so parallel duplicates are counted as well.
        effectful = self.has_side_effects or (lambda name: False)
        claims = [
            self._repeats.claim(call.name, call.arguments, effectful=effectful(call.name))
            for call in calls
        ]
        runs = (self._run_one(c, k, finished.get(c.id)) for c, k in zip(calls, claims, strict=True))
        results = list(await gather_all(*runs))
        self.results.extend(results)
        return results

    async def _run_one(
        self, call: ToolCall, claim: Claim, done: ToolCallResult | None = None
    ) -> ToolCallResult:
        if done is not None:  # ended before the run was suspended: not run again
            self._repeats.ran(claim, done.result)
            return done
        if self.callbacks.on_event is not None:
            await self._emit("tool_start", id=call.id, name=call.name, arguments=call.arguments)
        if claim.repeat:
            result = await self._repeated(call, claim)
        else:
            try:
                result = await self._execute(call)
            except BaseException:
                self._repeats.abandon(claim)  # repeats waiting on this call must not hang
                raise
            self._repeats.ran(claim, result.result)
        if self.progress is not None:
            self.progress.ended(result)
        if self.callbacks.on_event is not None:
            await self._emit(
                "tool_end",
                id=call.id,
                name=call.name,
                arguments=call.arguments,
                result=result.result,
                error=result.error,
                duration_ms=result.duration_ms,
                blocked=result.blocked,
                outcome=result.outcome,
                stage=result.stage,
            )
        return result

    async def _repeated(self, call: ToolCall, claim: Claim) -> ToolCallResult:
        """A repeat is not run (nor gated): the model is told the earlier identical result."""
        try:
            earlier = await claim.result
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            earlier = "(the earlier identical call did not finish)"
        text = repeat_text(call.name, claim.count, earlier, effectful=claim.effectful)
        error = (EFFECT_REPEAT_ERROR if claim.effectful else REPEAT_ERROR).format(count=claim.count)
        return ToolCallResult(call.id, call.name, call.arguments, text, error, 0, "error")

    async def _execute(self, call: ToolCall) -> ToolCallResult:
        """Gate then run one call; every failure becomes an error result."""
        ctx = self.make_context(call)
        started = time.perf_counter()
        try:
            decision = await self.gate(call, ctx) if self.gate is not None else None
            if decision is not None:
                result = ToolCallResult(
                    call.id,
                    call.name,
                    call.arguments,
                    decision.text,
                    decision.text,
                    outcome=decision.outcome,
                    stage=decision.stage,
                )
            elif self.tools is None:
                text = f"Error executing tool: tool '{call.name}' not found. Available tools: []"
                result = ToolCallResult(call.id, call.name, call.arguments, text, text, 0, "error")
            else:
                out = await self.tools.execute(call.name, call.arguments, ctx)
                # Web pages, documents, MCP servers: what a tool returns may carry template
                # tokens that would open a new turn on the server (see `untrusted`).
                text = strip_control_tokens(clean_text(out.text))
                text = cap_result(text, self.max_result_chars)
                result = ToolCallResult(
                    call.id,
                    call.name,
                    call.arguments,
                    text,
                    out.error,
                    out.duration_ms,
                    "error" if out.error is not None else "ok",
                )
        except Exception as exc:  # a broken gate must not take the round down
            log.warning("the gate or executor failed on tool %r", call.name, exc_info=True)
            text = f"Error executing tool: {type(exc).__name__}: {exc}"
            elapsed = int((time.perf_counter() - started) * 1000)
            result = ToolCallResult(
                call.id, call.name, call.arguments, text, text, elapsed, "error"
            )
        if self.after_tool is not None:
            await self.after_tool(result, ctx)
        return result

    async def _emit(self, kind: str, **data: Any) -> None:
        await self.callbacks.emit(RunEvent(kind, self.session, data))
