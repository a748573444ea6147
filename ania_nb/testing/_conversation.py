"""What real servers refuse in a conversation: the check behind `ScriptedLLM(strict=True)`."""

from __future__ import annotations

import json
from typing import Any


def conversation_problem(messages: Any) -> str | None:
    """What makes `messages` an invalid Chat Completions conversation, or None if it is valid.

    As strict as real servers (llama.cpp, OpenAI): tool calls need unique non-empty string ids,
    ``"type": "function"``, non-empty string names and arguments that are JSON object text;
    each tool result must answer a call of the assistant message right before it, and every
    call must be answered before the conversation goes on; a message needs content or tool
    calls (null content only beside tool calls), and content parts need a type.
    """
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty array"
    open_ids: list[str] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            return f"{where} is not an object"
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in open_ids:
                return f"{where}: tool_call_id {call_id!r} answers no call of the message before"
            open_ids.remove(call_id)
            if not isinstance(message.get("content"), str | list):
                return f"{where}: a tool result's content must be a string"
            continue
        if open_ids:
            return f"{where}: tool call(s) {open_ids} of an earlier message have no result"
        if role not in ("system", "user", "assistant", "developer"):
            return f"{where}: unknown role {role!r}"
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            return f"{where}: content must be a string, an array of parts or null"
        if isinstance(content, list) and not all(
            isinstance(p, dict) and isinstance(p.get("type"), str) for p in content
        ):
            return f"{where}: every content part must be an object with a type"
        calls = message.get("tool_calls")
        if content is None and not (role == "assistant" and calls):
            what = "no content" if "content" not in message else "null content"
            return f"{where}: {what} and no tool_calls"
        if role != "assistant" or calls is None:
            continue
        if not isinstance(calls, list):
            return f"{where}: tool_calls must be an array"
        for position, call in enumerate(calls):
            problem = _call_problem(call, open_ids)
            if problem:
                return f"{where}.tool_calls[{position}]: {problem}"
            open_ids.append(call["id"])
    if open_ids:
        return f"tool call(s) {open_ids} have no result"
    return None


def _call_problem(call: Any, open_ids: list[str]) -> str | None:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return "a call must be an object with a function object"
    call_id, function = call.get("id"), call["function"]
    if call.get("type") != "function":
        return f"type must be 'function', got {call.get('type')!r}"
    if not isinstance(call_id, str) or not call_id:
        return f"id must be a non-empty string, got {call_id!r}"
    if call_id in open_ids:
        return f"id {call_id!r} is used twice"
    name = function.get("name")
    if not isinstance(name, str) or not name:
        return f"function name must be a non-empty string, got {name!r}"
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return f"arguments must be a string, got {type(arguments).__name__}"
    try:
        value = json.loads(arguments, parse_constant=_refuse)
    except (ValueError, RecursionError) as exc:
        return f"arguments are not valid JSON ({exc})"
    if not isinstance(value, dict):
        return "arguments must be a JSON object"
    return None


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
