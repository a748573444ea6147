"""What a shell hook's answer means: its exit code, its plain stdout, or Claude Code's JSON.

A hook that exits 0 may print a JSON object (Claude Code's hook output); it is honoured:

- ``continue: false`` (+ ``stopReason``): stop. Before any other decision. A UserPromptSubmit
  turn is refused with that reason; at PreToolUse/PostToolUse the run ends (status ``error``,
  ``"stopped by a <Event> hook: <reason>"``); elsewhere it is logged.
- ``hookSpecificOutput.permissionDecision`` (PreToolUse): ``deny`` blocks the call with
  ``permissionDecisionReason``; ``ask`` makes a person approve this call even if the tool needs
  no approval; ``allow`` skips the person's approval (never an admin's: ``config_set``,
  ``config_file_set`` and the other admin tools still ask an admin). Legacy ``decision:
  "approve"`` / ``"block"`` + ``reason`` mean allow / deny there. An unknown decision blocks
  the call (a guard we cannot read must not let it through), and so does ``updatedInput``
  (changing a call's input is not supported; running it unchanged would betray the hook).
- ``decision: "block"`` + ``reason`` at UserPromptSubmit refuses the turn; at PostToolUse the
  reason is given to the model with the call's result; at Stop/SubagentStop it is logged (a run
  that already ended is not resumed).
- ``hookSpecificOutput.additionalContext``: context for the model (SessionStart,
  UserPromptSubmit: before the prompt; PreToolUse, PostToolUse: with the call's result).
- ``systemMessage``: a note for the user, never the model: logged as a warning.
- ``suppressOutput``: the plain output is not logged.

Plain stdout on exit 0 is context for the model at SessionStart and UserPromptSubmit only;
elsewhere, as in Claude Code, it is transcript output (logged at debug level), not context.
Exit 2 blocks with stderr as the reason (PostToolUse: the reason goes to the model).

Stdout that starts with ``{`` (after a byte-order mark and whitespace) is a JSON answer and
must be one: a JSON object, whole (not cut at the 64 KiB pipe cap), of Claude Code's schema
(each field of its type, ``hookSpecificOutput.hookEventName`` exactly the event's name when
given, ``permissionDecision`` exactly ``allow``, ``deny`` or ``ask`` — lowercase, as Claude Code
writes them). An answer that is not fails closed where a hook can block: at PreToolUse,
UserPromptSubmit and PostToolUse it counts as a block whose reason names the problem ("hook
output was cut at 64 KiB", "hook output is not valid JSON: …", "hookSpecificOutput.
permissionDecision must be a str, got ['deny']"), because a guard whose answer cannot be read
must not let the call through. Elsewhere (SessionStart, Stop, SubagentStop, PreCompact) it is
a non-blocking error like exit 1.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from typing import Any, Literal

from ..text import cut

MAX_CONTEXT_CHARS = 2000
CONTEXT_EVENTS = frozenset({"SessionStart", "UserPromptSubmit"})  # plain stdout is context there
# Where a hook's block means something: an answer we cannot read blocks there (fail closed).
FAIL_CLOSED_EVENTS = frozenset({"PreToolUse", "UserPromptSubmit", "PostToolUse"})
Decision = Literal["", "allow", "ask"]
_WIDE_BOMS = (  # longest first: the UTF-32 LE mark starts with the UTF-16 LE one
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


class _UnreadableOutput(ValueError):
    """A hook printed JSON whose fields we cannot read."""


@dataclass(frozen=True)
class HookResult:
    """What one hook decided.

    ``block`` (with ``reason``) refuses; ``context`` goes to the model; ``decision`` is a
    PreToolUse ``allow`` or ``ask``; ``stop`` (``continue: false``) ends the turn or run with
    ``stop_reason``; ``message`` is for the user only; ``output`` is transcript-only stdout.
    """

    block: bool = False
    reason: str = ""
    context: str = ""
    decision: Decision = ""
    stop: bool = False
    stop_reason: str = ""
    message: str = ""
    output: str = ""
    quiet: bool = False  # suppressOutput: the output is not logged


def decode_output(raw: bytes) -> str:
    """A hook's output as text: UTF-8 without a byte-order mark (bad bytes become U+FFFD).

    A JSON answer written in UTF-16 or UTF-32 with its byte-order mark is read as such, so a
    ``deny`` in another encoding is not mistaken for plain text.
    """
    for mark, encoding in _WIDE_BOMS:
        if raw.startswith(mark):
            wide = raw.decode(encoding, "replace").lstrip("\ufeff")
            if wide.lstrip().startswith("{"):
                return wide
            break
    return raw.decode("utf-8", "replace").removeprefix("\ufeff")


def from_exit(
    event: str, code: int, out: str, err: str, *, out_cut: bool = False
) -> HookResult | None:
    """The meaning of a finished shell hook; None for an error exit (the caller reports it).

    ``out_cut``: stdout went past the pipe cap, so ``out`` is only its start. Raises
    `_UnreadableOutput` for a JSON answer that cannot be read (see the module docstring;
    `unreadable` says what that means for the event).
    """
    if code == 2:
        return HookResult(block=True, reason=cut(err or out, MAX_CONTEXT_CHARS))
    if code != 0:
        return None
    data = _json_object(out, out_cut)
    if data is None:
        if event in CONTEXT_EVENTS:
            return HookResult(context=cut(out, MAX_CONTEXT_CHARS))
        return HookResult(output=cut(out, MAX_CONTEXT_CHARS))
    return from_json(event, data)


def from_json(event: str, data: dict[str, Any]) -> HookResult:
    """Claude Code's JSON hook output, read for ``event``."""
    stop = _get(data, "continue", bool, True) is False
    stop_reason = _get(data, "stopReason", str, "")
    message = _get(data, "systemMessage", str, "")
    quiet = _get(data, "suppressOutput", bool, False)
    legacy = _get(data, "decision", str, "")
    reason = _get(data, "reason", str, "")
    specific = _get(data, "hookSpecificOutput", dict, {})
    named = _get(specific, "hookEventName", str, event, "hookSpecificOutput.")
    if named != event:  # exactly: "pretooluse" is not an answer for PreToolUse
        raise _UnreadableOutput(f"hookSpecificOutput.hookEventName is {named!r}, not {event!r}")
    context = _get(specific, "additionalContext", str, "", "hookSpecificOutput.")
    permission = _get(specific, "permissionDecision", str, "", "hookSpecificOutput.")
    why = _get(specific, "permissionDecisionReason", str, "", "hookSpecificOutput.")
    common = {
        "context": cut(context.strip(), MAX_CONTEXT_CHARS),
        "stop": stop,
        "stop_reason": cut(stop_reason.strip(), MAX_CONTEXT_CHARS),
        "message": cut(message.strip(), MAX_CONTEXT_CHARS),
        "quiet": quiet,
    }
    if event == "PreToolUse":
        if specific.get("updatedInput") is not None:  # running the unchanged call would be wrong
            text = "the hook asked to change the call's input (updatedInput): not supported"
            return HookResult(block=True, reason=text, **common)
        if not permission and legacy:  # the deprecated form; the new one wins when both are set
            permission = {"approve": "allow", "block": "deny"}.get(legacy, legacy)
            why = why or reason
        if permission == "deny":
            return HookResult(block=True, reason=cut(why.strip(), MAX_CONTEXT_CHARS), **common)
        if permission in ("allow", "ask"):
            decision: Decision = "allow" if permission == "allow" else "ask"
            return HookResult(decision=decision, reason=why.strip(), **common)
        if permission:  # fail closed: a guard whose answer we cannot read must not let it pass
            text = (
                f"the hook answered an unknown permissionDecision {permission!r} "
                "(one of allow, deny, ask, lowercase)"
            )
            return HookResult(block=True, reason=text, **common)
        return HookResult(**common)
    if legacy == "block":
        return HookResult(block=True, reason=cut(reason.strip(), MAX_CONTEXT_CHARS), **common)
    if legacy not in ("", "approve"):
        raise _UnreadableOutput(f"decision must be 'block' (or left out), got {legacy!r}")
    return HookResult(**common)


def unreadable(event: str, problem: str) -> HookResult | None:
    """What an unreadable JSON answer means: a block where hooks can block, else nothing."""
    if event not in FAIL_CLOSED_EVENTS:
        return None
    reason = f"the hook's answer cannot be read, so it counts as a block: {problem}"
    return HookResult(block=True, reason=cut(reason, MAX_CONTEXT_CHARS))


def _json_object(out: str, out_cut: bool) -> dict[str, Any] | None:
    """The JSON answer in ``out``; None for plain text (not starting with ``{``)."""
    text = out.lstrip("\ufeff").strip()
    if not text.startswith("{"):
        return None
    if out_cut:
        raise _UnreadableOutput(
            "hook output was cut at 64 KiB (the pipe cap): the JSON is not whole"
        )
    try:
        value = json.loads(text)
    except RecursionError:
        raise _UnreadableOutput("hook output is not valid JSON: nested too deeply") from None
    except ValueError as exc:
        raise _UnreadableOutput(f"hook output is not valid JSON: {exc}") from None
    if not isinstance(value, dict):  # pragma: no cover - text starting with { is an object
        raise _UnreadableOutput("hook output is not a JSON object")
    return value


def _get(data: dict[str, Any], key: str, kind: type, default: Any, where: str = "") -> Any:
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise _UnreadableOutput(f"{where}{key} must be a {kind.__name__}, got {value!r}")
    return value
