"""Hooks: Python functions and shell commands told of engine events, able to block some.

Python hooks (registered with `Agent.add_hook`) run first, in registration order; an exception
in one is logged and ignored. Shell hooks from the hooks file (``hooks.enable``) run next, in
file order, each with the event as JSON on stdin (``tool_input`` is the call's arguments as a
JSON object; a raw string only when they are not valid JSON):

- exit 0: pass; Claude Code's JSON output is honoured (see `hook_output`); plain stdout is
  context for the model at SessionStart and UserPromptSubmit, transcript output elsewhere;
  stdout starting with ``{`` must be a whole, well-formed JSON answer, else it is a block at
  PreToolUse, UserPromptSubmit and PostToolUse (fail closed) and an error elsewhere;
- exit 2: block; the reason is the trimmed stderr (else stdout);
- any other exit, a timeout or a failure to start: a logged, non-blocking error.

The timeout bounds the whole hook: at its end the hook's process group is killed and its
pipes are closed, so even a child that left the group (``setsid``) cannot hold the run. Only
the first 64 KiB of each pipe are kept, so a flooding hook cannot fill memory; a JSON answer
longer than that is cut and so cannot be read, which blocks (see above).

The first block (or ``continue: false``) ends the event's run of hooks. Contexts of all hooks
are joined with newlines; ``ask`` wins over ``allow``. Whether a block, a stop or a context is
honoured depends on the event (see `Governance` and `ToolGate`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import weakref
from collections import defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .._env import child_env
from .._subprocess import run_capped
from ..errors import RunError, UsageError
from ..text import cut
from ._files import WatchedJSON
from .hook_config import HOOK_EVENTS, HookTable, ShellHook, parse_hooks
from .hook_output import HookResult, _UnreadableOutput, decode_output, from_exit, unreadable

if TYPE_CHECKING:  # pragma: no cover
    from ..config import HooksSettings, SecuritySettings
    from ..tools import ToolContext

log = logging.getLogger(__name__)

MAX_PAYLOAD_TEXT = 1000
DEFAULT_BLOCK_REASON = "a hook blocked this"
DEFAULT_STOP_REASON = "a hook stopped this"
MAX_OUTPUT_BYTES = 64 * 1024  # kept per pipe; the context is cut to 2000 characters anyway
_RUN_TASKS = "hook_call_tasks"  # run_state: the tasks of the run's calls (weakly)
_RUN_STOP = "hook_stop"  # run_state: why a hook stopped the run
PRE_TOOL_OUTCOME = "pre_tool_use"  # ToolContext.extras: the call's PreToolUse outcome


@dataclass
class HookOutcome:
    """What all hooks of one event decided together.

    ``blocked``/``reason``: the first block; ``stopped``/``stop_reason``: a ``continue: false``;
    ``ask``/``allow``: PreToolUse permission decisions (ask wins); ``context``: for the model;
    ``output``: transcript-only stdout; ``messages``: notes for the user (``systemMessage``).
    """

    blocked: bool = False
    reason: str = ""
    context: str = ""
    errors: list[str] = field(default_factory=list)
    stopped: bool = False
    stop_reason: str = ""
    ask: bool = False
    allow: bool = False
    output: str = ""
    messages: list[str] = field(default_factory=list)


class PythonHook(Protocol):
    """An in-process hook: gets the event name and its payload; may be sync or async.

    Return None (pass), a string (context) or a `HookResult` (e.g. ``HookResult(block=True,
    reason="…")``).
    """

    def __call__(
        self, event: str, payload: dict[str, Any]
    ) -> HookResult | str | Awaitable[HookResult | str | None] | None:
        """Handle one event."""
        ...


def payload_for(
    event: str,
    session: str,
    agent_kind: str = "main",
    *,
    tool_name: str = "",
    tool_input: str = "",
    tool_result: str = "",
    prompt: str = "",
) -> dict[str, Any]:
    """The JSON object a hook receives (snake_case; empty optional fields left out).

    With a ``tool_name``, ``tool_input`` is always there: the arguments as a JSON object (as
    Claude Code sends them), or the raw string when they are not a JSON object.
    """
    payload: dict[str, Any] = {
        "hook_event_name": event,
        "session_id": session,
        "agent_kind": agent_kind,
    }
    optional = {
        "tool_name": tool_name,
        "tool_result": cut(tool_result, MAX_PAYLOAD_TEXT),
        "prompt": prompt,
    }
    payload.update({k: v for k, v in optional.items() if v})
    if tool_name:
        payload["tool_input"] = tool_input_object(tool_input)
    return payload


def tool_input_object(arguments: str) -> dict[str, Any] | str:
    """A call's arguments as the JSON object they encode, else the raw string."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


class HookRunner:
    """Runs the Python and shell hooks of an event."""

    def __init__(self, settings: HooksSettings, security: SecuritySettings | None = None) -> None:
        self.settings = settings
        self.security = security  # which inherited variables shell hooks must not see
        self.file: WatchedJSON[HookTable] = WatchedJSON(
            settings.file, parse_hooks, {}, what="hooks file"
        )
        self._python: defaultdict[str, list[PythonHook]] = defaultdict(list)

    def adopt_python_hooks(self, other: HookRunner) -> None:
        """Take over the Python hooks registered on ``other`` (a runner being replaced)."""
        for event, hooks in other._python.items():
            self._python[event].extend(hooks)

    def add(self, event: str, hook: PythonHook) -> None:
        """Register a Python hook for an event."""
        if event not in HOOK_EVENTS:
            raise UsageError(f"unknown hook event {event!r}; use one of {', '.join(HOOK_EVENTS)}")
        if not callable(hook):
            raise UsageError(f"a hook must be callable, got {hook!r}")
        self._python[event].append(hook)

    async def run(self, event: str, payload: dict[str, Any]) -> HookOutcome:
        """Run the event's hooks until the first block."""
        outcome = HookOutcome()
        contexts: list[str] = []
        outputs: list[str] = []
        try:
            for hook in list(self._python.get(event, ())):
                result = await self._call_python(event, hook, payload, outcome)
                if result is not None and _apply(event, result, outcome, contexts, outputs):
                    return outcome
            if self.settings.enable:
                table = await self.file.get()
                tool = payload.get("tool_name", "")
                for spec in table.get(event, ()):
                    if spec.matches(tool):
                        result = await self._call_shell(spec, payload, outcome)
                        if result is not None and _apply(event, result, outcome, contexts, outputs):
                            return outcome
            return outcome
        finally:
            outcome.context = "\n".join(contexts)
            outcome.output = "\n".join(outputs)
            if outcome.ask:  # Claude Code's precedence: deny > ask > allow
                outcome.allow = False

    async def _call_python(
        self, event: str, hook: PythonHook, payload: dict[str, Any], outcome: HookOutcome
    ) -> HookResult | None:
        try:
            value = hook(event, dict(payload))
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:  # one broken hook must not break the agent
            log.exception("%s hook %r failed", event, hook)
            outcome.errors.append(f"{event} hook {getattr(hook, '__name__', hook)!r}: {exc}")
            return None
        if value is None or isinstance(value, HookResult):
            return value
        return HookResult(context=str(value))

    async def _call_shell(
        self, spec: ShellHook, payload: dict[str, Any], outcome: HookOutcome
    ) -> HookResult | None:
        timeout = spec.effective_timeout(self.settings.timeout)
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        try:
            done = await run_capped(
                ["sh", "-c", spec.command],
                time_limit=timeout,
                keep=MAX_OUTPUT_BYTES,
                env=child_env(self.security),  # no ANIA_* or other secret variables
                stdin=data,
            )
        except OSError as exc:
            _error(outcome, spec, f"cannot start: {exc}")
            return None
        if done.timed_out:
            _error(outcome, spec, f"timed out after {timeout:g} s and was killed")
            return None
        out = decode_output(done.stdout).strip()
        err = decode_output(done.stderr).strip()
        code = done.returncode
        try:
            result = from_exit(
                spec.event, code if code is not None else -1, out, err, out_cut=done.stdout_cut
            )
        except _UnreadableOutput as exc:
            _error(outcome, spec, f"unreadable JSON output: {exc}")
            return unreadable(spec.event, str(exc))  # a block where hooks can block
        if result is None:
            _error(outcome, spec, f"exit code {code}: {cut(err, 200)}")
        return result


def enter_call(ctx: ToolContext) -> str | None:
    """Note the running call's task in its run; the reason if a hook already stopped the run.

    A hook's ``continue: false`` ends the run from inside one call; `stop_run` cancels the
    calls of the run still going, so none outlives it.
    """
    tasks = ctx.run_state.setdefault(_RUN_TASKS, weakref.WeakSet())
    task = asyncio.current_task()
    if task is not None:
        tasks.add(task)
    stop = ctx.run_state.get(_RUN_STOP)
    return stop if isinstance(stop, str) else None


def stop_run(ctx: ToolContext, event: str, reason: str) -> RunError:
    """Cancel the run's other calls; the error the caller raises to end the run."""
    ctx.run_state[_RUN_STOP] = reason
    current = asyncio.current_task()
    for task in list(ctx.run_state.get(_RUN_TASKS, ())):
        if task is not current and not task.done():
            task.cancel()
    return RunError(f"stopped by a {event} hook: {reason}", session=ctx.session)


def _apply(
    event: str,
    result: HookResult,
    outcome: HookOutcome,
    contexts: list[str],
    outputs: list[str],
) -> bool:
    """Fold one result into the outcome; True when it blocks or stops (run no more hooks)."""
    if result.context.strip():
        contexts.append(result.context.strip())
    if result.output.strip():
        outputs.append(result.output.strip())
        if not result.quiet:
            log.debug("%s hook output: %s", event, result.output.strip())
    if result.message:
        outcome.messages.append(result.message)
        log.warning("%s hook message: %s", event, result.message)
    if result.stop:  # continue: false wins over any decision
        outcome.stopped = True
        outcome.stop_reason = result.stop_reason.strip() or DEFAULT_STOP_REASON
        return True
    if result.block:
        outcome.blocked = True
        outcome.reason = result.reason.strip() or DEFAULT_BLOCK_REASON
        return True
    if result.decision == "ask":
        outcome.ask = True
        log.info("%s hook asks for a person's approval: %s", event, result.reason or "-")
    elif result.decision == "allow":
        outcome.allow = True
    return False


def _error(outcome: HookOutcome, spec: ShellHook, problem: str) -> None:
    text = f"{spec.event} hook {spec.command!r}: {problem}"
    log.warning("%s", text)
    outcome.errors.append(text)
