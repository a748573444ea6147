"""The history validator: a conversation sent to the model is always a valid sequence.

Providers reject (HTTP 400, or 500 on llama.cpp) a conversation where a tool result does not
follow the assistant message that asked for it, a call has no id or name, or arguments are not
JSON — and they keep rejecting it on every later turn. `repair_history` fixes such a list and
says what it changed; it runs on a history loaded from the store and before each request.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ._llm_wire import clean_text, safe_arguments
from .messages import Message

__all__ = ["MISSING_RESULT", "clean_text", "repair_history", "valid_arguments"]

MISSING_RESULT = "(no result was recorded for this tool call)"


def valid_arguments(raw: Any) -> str:
    """Arguments as JSON object text (see `safe_arguments`); an object or null is serialised."""
    if raw is None:
        return "{}"
    if not isinstance(raw, str):
        raw = json.dumps(raw, ensure_ascii=False, default=str)
    return safe_arguments(raw)


def repair_history(messages: Sequence[Message]) -> tuple[list[Message], list[str]]:
    """A valid copy of ``messages`` and a list of what was repaired (empty when nothing was).

    Repairs: tool calls without a usable id get one; calls without a name are named
    ``invalid_tool_call``; arguments become JSON object text; a call without ``"type":
    "function"`` gets it; a tool result that answers no open call is dropped; an open call with
    no result gets a placeholder result; a message with neither content nor tool calls (or null
    content without them) gets empty text — llama-server refuses all of these with a 500.
    """
    out: list[Message] = []
    problems: list[str] = []
    open_ids: list[str] = []  # calls of the last assistant message still waiting for a result

    def close_open() -> None:
        for call_id in open_ids:
            out.append({"role": "tool", "tool_call_id": call_id, "content": MISSING_RESULT})
            problems.append(f"added a missing result for tool call {call_id}")
        open_ids.clear()

    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if isinstance(call_id, str) and call_id in open_ids:
                open_ids.remove(call_id)
                out.append(message)
            else:
                problems.append(f"dropped a tool result that answers no open call ({call_id!r})")
            continue
        close_open()
        if role == "assistant" and message.get("tool_calls"):
            fixed, ids = _fix_calls(message["tool_calls"], index, problems)
            if fixed != message["tool_calls"]:
                message = {**message, "tool_calls": fixed}
                if not fixed:
                    del message["tool_calls"]
            open_ids.extend(ids)
        elif role == "assistant" and "tool_calls" in message:
            message = {k: v for k, v in message.items() if k != "tool_calls"}  # [] or None
        if message.get("content") is None and not message.get("tool_calls"):
            message = {**message, "content": ""}
            problems.append(f"gave message {index}, which had no content, empty text")
        out.append(message)
    close_open()
    return out, problems


def _fix_calls(
    calls: Any, index: int, problems: list[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    fixed: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, call in enumerate(calls if isinstance(calls, list) else []):
        call = call if isinstance(call, dict) else {}
        fn: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id or call_id in seen:
            call_id = f"call_{index}_{n}"
            problems.append(f"gave tool call {n} of message {index} the id {call_id}")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            name = "invalid_tool_call"
            problems.append(f"named the unnamed tool call {call_id} {name!r}")
        arguments = valid_arguments(fn.get("arguments"))
        if arguments != fn.get("arguments"):
            problems.append(f"made the arguments of tool call {call_id} valid JSON")
        seen.add(call_id)
        if call.get("type") != "function":
            problems.append(f'gave tool call {call_id} "type": "function"')
        kept = (call_id, "function", name, arguments)
        if kept == (call.get("id"), call.get("type"), fn.get("name"), fn.get("arguments")):
            fixed.append(call)  # valid: kept as sent (provider-specific keys included)
        else:
            function = {"name": name, "arguments": arguments}
            fixed.append({"id": call_id, "type": "function", "function": function})
    return fixed, [c["id"] for c in fixed]
