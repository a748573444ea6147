"""Hooks: Python functions and shell commands told of engine events, able to block some.

Python hooks (registered with `Agent.add_hook`) run first, in registration order; an exception
in one is logged and ignored. Shell hooks from the hooks file (``hooks.enable``) run next, in
file order, each with the event as JSON on stdin:

- exit 0: pass; the trimmed stdout (≤ 2000 characters) becomes context for the model;
- exit 2: block; the reason is the trimmed stderr (else stdout);
- any other exit, a timeout or a failure to start: a logged, non-blocking error.

The first block ends the event's run. Contexts of all hooks are joined with newlines. Whether a
block or a context is honoured depends on the event (see `Governance`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import signal
from collections import defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import UsageError
from ._files import WatchedJSON
from .hook_config import HOOK_EVENTS, HookTable, ShellHook, parse_hooks

if TYPE_CHECKING:  # pragma: no cover
    from ..config import HooksSettings

log = logging.getLogger(__name__)

MAX_CONTEXT_CHARS = 2000
MAX_PAYLOAD_TEXT = 1000
DEFAULT_BLOCK_REASON = "a hook blocked this"


@dataclass(frozen=True)
class HookResult:
    """What one hook decided: block (with a reason) or pass (with optional context)."""

    block: bool = False
    reason: str = ""
    context: str = ""


@dataclass
class HookOutcome:
    """What all hooks of one event decided together."""

    blocked: bool = False
    reason: str = ""
    context: str = ""
    errors: list[str] = field(default_factory=list)


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
    """The JSON object a hook receives (snake_case; empty optional fields left out)."""
    payload: dict[str, Any] = {
        "hook_event_name": event,
        "session_id": session,
        "agent_kind": agent_kind,
    }
    optional = {
        "tool_name": tool_name,
        "tool_input": tool_input,
        "tool_result": cut(tool_result, MAX_PAYLOAD_TEXT),
        "prompt": prompt,
    }
    payload.update({k: v for k, v in optional.items() if v})
    return payload


class HookRunner:
    """Runs the Python and shell hooks of an event."""

    def __init__(self, settings: HooksSettings) -> None:
        self.settings = settings
        self.file: WatchedJSON[HookTable] = WatchedJSON(
            settings.file, parse_hooks, {}, what="hooks file"
        )
        self._python: defaultdict[str, list[PythonHook]] = defaultdict(list)

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
        for hook in list(self._python.get(event, ())):
            result = await self._call_python(event, hook, payload, outcome)
            if result is not None and _apply(result, outcome, contexts):
                return outcome
        if self.settings.enable:
            table = await self.file.get()
            tool = payload.get("tool_name", "")
            for spec in table.get(event, ()):
                if spec.matches(tool):
                    result = await self._call_shell(spec, payload, outcome)
                    if result is not None and _apply(result, outcome, contexts):
                        return outcome
        outcome.context = "\n".join(contexts)
        return outcome

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
            proc = await asyncio.create_subprocess_exec(
                "sh",
                "-c",
                spec.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group, killed as a whole
            )
        except OSError as exc:
            _error(outcome, spec, f"cannot start: {exc}")
            return None
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(data), timeout)
        except TimeoutError:
            await _kill(proc)
            _error(outcome, spec, f"timed out after {timeout:g} s and was killed")
            return None
        except BaseException:
            await _kill(proc)
            raise
        out = stdout.decode("utf-8", "replace").strip()
        err = stderr.decode("utf-8", "replace").strip()
        if proc.returncode == 0:
            return HookResult(context=cut(out, MAX_CONTEXT_CHARS))
        if proc.returncode == 2:
            return HookResult(block=True, reason=cut(err or out, MAX_CONTEXT_CHARS))
        _error(outcome, spec, f"exit code {proc.returncode}: {cut(err, 200)}")
        return None


def _apply(result: HookResult, outcome: HookOutcome, contexts: list[str]) -> bool:
    """Fold one result into the outcome; True when it blocks (stop running hooks)."""
    if result.block:
        outcome.blocked = True
        outcome.reason = result.reason.strip() or DEFAULT_BLOCK_REASON
        outcome.context = "\n".join(contexts)
        return True
    if result.context.strip():
        contexts.append(result.context.strip())
    return False


def _error(outcome: HookOutcome, spec: ShellHook, problem: str) -> None:
    text = f"{spec.event} hook {spec.command!r}: {problem}"
    log.warning("%s", text)
    outcome.errors.append(text)


async def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        await asyncio.shield(proc.communicate())  # reap it and close its pipes


def cut(text: str, limit: int) -> str:
    """``text`` cut after ``limit`` characters, marked with ``…`` (as the hooks' payloads are)."""
    return text if len(text) <= limit else text[:limit] + "…"
