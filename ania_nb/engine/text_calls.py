"""Tool calls a model wrote as text instead of sending ``tool_calls``.

Small local models (and servers started without a tool-call parser, e.g. llama-server without
``--jinja``) often answer with the call in their chat template's text form. Recognised forms:

* Hermes / Qwen 2.5: ``<tool_call>{"name": "f", "arguments": {...}}</tool_call>`` (the closing
  tag may be missing: it is often the stop sequence);
* Qwen 3 coder / Llama 3.1: ``<function=f><parameter=city>Oslo</parameter></function>`` (inside
  ``<tool_call>`` or bare) and ``<function=f>{"city": "Oslo"}</function>``;
* a fenced code block (```` ```json ````, ```` ```tool_call ```` or none) or the whole reply
  being a JSON call object or a list of them; ``"parameters"`` is accepted for
  ``"arguments"`` and the OpenAI shape ``{"function": {...}}`` is unwrapped;
* Llama 3.1's ``<|python_tag|>`` and Mistral's ``[TOOL_CALLS]`` prefixes before such JSON.

`find_text_calls` only reads text: the loop decides what to do (run them when
``llm.text_tool_calls`` is on, else flag a reply that is nothing but a call).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from ._llm_wire import safe_arguments

__all__ = ["TextCall", "TextCalls", "find_text_calls"]


@dataclass(frozen=True)
class TextCall:
    """One call found in text: the tool's name and its arguments as JSON object text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class TextCalls:
    """The calls found in a reply, the reply without them, and whether nothing else was there."""

    calls: list[TextCall] = field(default_factory=list)
    text: str = ""
    whole: bool = False


_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)
_FUNCTION = re.compile(r"<function=([^<>\s]{1,200})>\s*(.*?)\s*(?:</function>|\Z)", re.DOTALL)
_FENCE = re.compile(r"```[ \t]*([A-Za-z_]{0,20})[ \t]*\n(.*?)\n?[ \t]*```", re.DOTALL)
_FENCE_LANGS = {"", "json", "tool_call", "tool_code", "function_call"}
_PREFIXES = ("<|python_tag|>", "[TOOL_CALLS]")
MAX_CHARS = 100_000
"""Longer replies are not searched: a call is short, and a runaway reply must stay cheap."""


def find_text_calls(content: str | None, names: Collection[str] | None = None) -> TextCalls:
    """The tool calls written in ``content`` (see the module docstring); none found: empty.

    ``names`` are the offered tools: JSON in a code fence or a bare reply counts only when
    every call in it names one of them (it may just be JSON the user asked for). Tagged forms
    (``<tool_call>``, ``<function=…>``) are explicit and count whatever the name.
    """
    if not content or not content.strip() or len(content) > MAX_CHARS:
        return TextCalls(text=content or "")
    calls: list[TextCall] = []
    rest = content
    if "<tool_call>" in rest:
        rest = _TAGGED.sub(lambda m: _take(m, _tagged(m.group(1)), calls), rest)
    if "<function=" in rest:
        rest = _FUNCTION.sub(lambda m: _take(m, _function(m.group(1), m.group(2)), calls), rest)
    if "```" in rest:

        def fenced(match: re.Match[str]) -> str:
            if match.group(1).lower() not in _FENCE_LANGS:
                return match.group(0)
            return _take(match, _json_calls(match.group(2), names), calls)

        rest = _FENCE.sub(fenced, rest)
    if not calls:
        found = _json_calls(_unprefixed(rest), names)
        if found:
            return TextCalls(found, "", True)
    text = rest.strip()
    return TextCalls(calls, text, bool(calls) and not text)


def _take(match: re.Match[str], found: list[TextCall] | None, calls: list[TextCall]) -> str:
    """Keep the calls of a matched block and cut it from the text; not a call: leave it."""
    if not found:
        return match.group(0)
    calls.extend(found)
    return ""


def _unprefixed(text: str) -> str:
    text = text.strip()
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            return text[len(prefix) :].strip()
    return text


def _tagged(body: str) -> list[TextCall] | None:
    """The calls inside one ``<tool_call>`` block: JSON or ``<function=…>`` forms."""
    function = _FUNCTION.search(body)
    if function is not None:
        call = _function(function.group(1), function.group(2))
        return call
    return _json_calls(_unprefixed(body), None)


def _function(name: str, body: str) -> list[TextCall] | None:
    """A ``<function=name>`` block: ``<parameter=…>`` tags or a JSON object as arguments."""
    parameters = _parameters(body)
    if parameters:
        return [TextCall(name, json.dumps({k: _scalar(v) for k, v in parameters}))]
    if not body.strip():
        return [TextCall(name, "{}")]
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # deeply nested brackets overflow the parser
        return None
    return (
        [TextCall(name, json.dumps(value, ensure_ascii=False))] if isinstance(value, dict) else None
    )


def _parameters(body: str) -> list[tuple[str, str]]:
    """The ``<parameter=name>value</parameter>`` pairs of a function block, in one pass.

    Split, not a regex: a findall would rescan to the end for every unclosed tag (quadratic;
    a runaway reply of 20,000 open tags took 110 s).
    """
    pairs = []
    for piece in body.split("<parameter=")[1:]:
        name, opened, rest = piece.partition(">")
        value, closed, _ = rest.partition("</parameter>")
        if opened and closed and name and not any(c.isspace() for c in name):
            pairs.append((name, value.removeprefix("\n").removesuffix("\n")))
    return pairs


def _scalar(text: str) -> Any:
    """A parameter tag's value: JSON when it parses (numbers, booleans, lists), else the text."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # deeply nested brackets overflow the parser
        return text


def _json_calls(text: str, names: Collection[str] | None) -> list[TextCall] | None:
    """The call object(s) ``text`` is made of, or None when it is anything else."""
    text = text.strip()
    if not text or text[0] not in "[{":
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # deeply nested brackets overflow the parser
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_call(item) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    found = [c for c in calls if c is not None]
    if names is not None and any(c.name not in names for c in found):
        return None
    return found


def _call(item: Any) -> TextCall | None:
    """A call from ``{"name", "arguments" | "parameters"}`` (or OpenAI's nested shape)."""
    if isinstance(item, dict) and isinstance(item.get("function"), dict):
        item = item["function"]
    if not isinstance(item, dict) or set(item) - {"name", "arguments", "parameters", "type", "id"}:
        return None
    name = item.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):
        return TextCall(name.strip(), safe_arguments(arguments))  # double-encoded, or broken
    if arguments is None:
        return TextCall(name.strip(), "{}")
    if not isinstance(arguments, dict):
        return None
    return TextCall(name.strip(), json.dumps(arguments, ensure_ascii=False))
