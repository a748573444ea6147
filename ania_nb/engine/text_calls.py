"""Tool calls a model wrote as text instead of sending ``tool_calls``.

Small local models (and servers whose template does not parse them, even llama-server with
``--jinja``) often answer with the call in their chat template's text form. Recognised forms:

* Hermes / Qwen 2.5: ``<tool_call>{"name": "f", "arguments": {...}}</tool_call>`` (the closing
  tag may be missing: it is often the stop sequence), also as ``<tools>…</tools>`` or
  ``<tool_calls>…</tool_calls>``, one call or several (one per line, or a list);
* Qwen 3 coder / Llama 3.1: ``<function=f><parameter=city>Oslo</parameter></function>`` (inside
  a tag or bare) and ``<function=f>{"city": "Oslo"}</function>``;
* attributes: ``<function name="f" arguments='{"city": "Oslo"}'/>`` (``parameters=`` too, the
  arguments quoted or a bare JSON object);
* a fenced code block (```` ```json ````, ```` ```tool_call ```` or none) or the reply's end
  (the whole reply, or what follows the model's own announcement) being JSON calls: one object,
  several (one per line, or separated by commas), a list of them, or any of these in doubled
  template braces ``{{…}}``; ``"parameters"`` is accepted for ``"arguments"`` and the OpenAI
  shape ``{"function": {...}}`` is unwrapped;
* Llama 3.1's ``<|python_tag|>`` and Mistral's ``[TOOL_CALLS]`` prefixes before such JSON.

Every pass is linear in the reply's length (replies past `MAX_CHARS` are not searched).
`find_text_calls` only reads text: the loop decides what to do (``llm.text_tool_calls``).
"""

from __future__ import annotations

import html
import itertools
import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from ..text import cut
from ._llm_wire import safe_arguments

__all__ = ["TextCall", "TextCalls", "find_text_calls"]


@dataclass(frozen=True)
class TextCall:
    """One call found in text: the tool's name and its arguments as JSON object text."""

    name: str
    arguments: str


@dataclass(frozen=True)
class TextCalls:
    """What a reply holds: its calls, the reply without them, and how they sit in it.

    ``whole``: nothing else was there. ``trailing``: nothing but the model's own words come
    before the calls and nothing after them (an announcement, then the call). ``unread``:
    call-shaped blocks (a ``<tool_call>`` tag, a ``<function…>`` block) that could not be read
    as a call, so they are neither calls nor, really, an answer.
    """

    calls: list[TextCall] = field(default_factory=list)
    text: str = ""
    whole: bool = False
    trailing: bool = False
    unread: list[str] = field(default_factory=list)


_TAGS = ("tool_call", "tools", "tool_calls")
_TAGGED = re.compile(r"<(tool_calls?|tools)>\s*(.*?)\s*(?:</\1>|\Z)", re.DOTALL)
_FUNCTION = re.compile(r"<function=([^<>\s]{1,200})>\s*(.*?)\s*(?:</function>|\Z)", re.DOTALL)
_ATTR_OPEN = "<function name"
_ATTR_HEAD = re.compile(r"""\s*=\s*(["']?)([A-Za-z0-9_.\-]{1,64})\1\s*""")
_ATTR_ARGS = re.compile(r"""(?:arguments|parameters|args)\s*=\s*""")
_ATTR_END = re.compile(r"\s*/?>(?:\s*</function>)?")
_FENCE = re.compile(r"```[ \t]*([A-Za-z_]{0,20})[ \t]*\n(.*?)\n?[ \t]*```", re.DOTALL)
_FENCE_LANGS = {"", "json", "tool_call", "tool_code", "function_call", "tools"}
_PREFIXES = ("<|python_tag|>", "[TOOL_CALLS]")
_LINE_START = re.compile(r"^[ \t]*(?=[\[{]|<\|python_tag\|>)", re.MULTILINE)
_MARK = "\ue000"  # where a call stood, while the passes run (a private-use character)
_SEPARATORS = " \t\r\n,;"
MAX_CHARS = 100_000
"""Longer replies are not searched: a call is short, and a runaway reply must stay cheap."""
SHOWN_CHARS = 80  # of an unread call-shaped block, in the warning
MAX_TAIL_TRIES = 5
"""Line starts tried as the beginning of calls that end a reply (each try reads to the end)."""


def find_text_calls(content: str | None, names: Collection[str] | None = None) -> TextCalls:
    """The tool calls written in ``content`` (see the module docstring); none found: empty.

    ``names`` are the offered tools: JSON in a code fence or in plain text counts only when
    every call in it names one of them (it may just be JSON the user asked for). Tagged forms
    (``<tool_call>``, ``<function…>``) are explicit and count whatever the name: the loop runs
    them, and the executor tells the model a name is unknown as it does for native calls.
    """
    if not content or not content.strip() or len(content) > MAX_CHARS:
        return TextCalls(text=content or "")
    calls: list[TextCall] = []
    unread: list[str] = []
    rest = content.replace(_MARK, "")
    if any(f"<{tag}>" in rest for tag in _TAGS):
        rest = _TAGGED.sub(lambda m: _take(m, _tagged(m.group(2)), calls, unread), rest)
    if "<function=" in rest:
        rest = _FUNCTION.sub(
            lambda m: _take(m, _function(m.group(1), m.group(2)), calls, unread), rest
        )
    if _ATTR_OPEN in rest:
        rest = _attribute_calls(rest, calls, unread)
    if "```" in rest:

        def fenced(match: re.Match[str]) -> str:
            if match.group(1).lower() not in _FENCE_LANGS:
                return match.group(0)
            return _take(match, _json_calls(match.group(2), names), calls, None)

        rest = _FENCE.sub(fenced, rest)
    rest = _tail_calls(rest, names, calls)
    if not calls:
        return TextCalls(text=content, unread=unread)
    trailing = rest.rstrip().endswith(_MARK)
    text = rest.replace(_MARK, "").strip()
    return TextCalls(calls, text, not text, trailing, unread)


def _take(
    match: re.Match[str],
    found: list[TextCall] | None,
    calls: list[TextCall],
    unread: list[str] | None,
) -> str:
    """Keep the calls of a matched block and mark its place; not a call: leave it (noted)."""
    if not found:
        if unread is not None:
            unread.append(cut(match.group(0), SHOWN_CHARS))
        return match.group(0)
    calls.extend(found)
    return _MARK


def _unprefixed(text: str) -> str:
    text = text.strip()
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            return text[len(prefix) :].strip()
    return text


def _tagged(body: str) -> list[TextCall] | None:
    """The calls inside one tag block: JSON or ``<function…>`` forms."""
    function = _FUNCTION.search(body)
    if function is not None:
        return _function(function.group(1), function.group(2))
    if _ATTR_OPEN in body:
        found: list[TextCall] = []
        rest = _attribute_calls(body, found, [])
        return found if found and not rest.replace(_MARK, "").strip() else None
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


def _attribute_calls(text: str, calls: list[TextCall], unread: list[str]) -> str:
    """``<function name="f" arguments='{…}'/>`` blocks made calls (their places marked).

    Split at each opening rather than searched by one regex: a piece ends at the next opening,
    so an unclosed quote is looked for only up to there (linear time).
    """
    pieces = text.split(_ATTR_OPEN)
    out = [pieces[0]]
    for piece in pieces[1:]:
        parsed = _attribute_call(piece)
        if parsed is None:
            unread.append(cut(_ATTR_OPEN + piece, SHOWN_CHARS))
            out.append(_ATTR_OPEN + piece)
        else:
            call, end = parsed
            calls.append(call)
            out.append(_MARK + piece[end:])
    return "".join(out)


def _attribute_call(piece: str) -> tuple[TextCall, int] | None:
    """The call at the start of ``piece`` (what follows ``<function name``) and where it ends."""
    head = _ATTR_HEAD.match(piece)
    if head is None:
        return None
    name, at = head.group(2), head.end()
    arguments: Any = {}
    given = _ATTR_ARGS.match(piece, at)
    if given is not None:
        at = given.end()
        quote = piece[at : at + 1]
        if quote in ("'", '"'):
            close = piece.find(quote, at + 1)
            if close < 0:
                return None
            raw, at = html.unescape(piece[at + 1 : close]), close + 1
        else:
            raw = None
        try:
            if raw is None:
                arguments, at = json.JSONDecoder().raw_decode(piece, at)
            else:
                arguments = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            return None
        if not isinstance(arguments, dict):
            return None
    end = _ATTR_END.match(piece, at)
    if end is None:
        return None
    return TextCall(name, json.dumps(arguments, ensure_ascii=False)), end.end()


def _tail_calls(text: str, names: Collection[str] | None, calls: list[TextCall]) -> str:
    """JSON calls that end ``text`` (all of it, or after the model's words) made calls.

    Tried from the first few line starts that open a JSON value: each try reads to the end, so
    a bounded number keeps this linear.
    """
    for start in itertools.islice(_LINE_START.finditer(text), MAX_TAIL_TRIES):
        tail = text[start.end() :]
        if _MARK in tail:  # calls found by another pass come later: this is no tail
            return text
        found = _json_calls(_unprefixed(tail), names)
        if found:
            calls.extend(found)
            return text[: start.start()] + _MARK
    return text


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
    """The call object(s) ``text`` is made of, or None when it is anything else.

    Doubled template braces (``{{…}}``) are read as single ones when the text does not parse
    as it is.
    """
    text = text.strip()
    if not text or text[0] not in "[{":
        return None
    values = _json_values(text)
    if values is None and text.startswith("{{"):
        values = _json_values(text.replace("{{", "{").replace("}}", "}"))
        if values is None and text.endswith("}}"):
            values = _json_values(text[1:-1])
    if not values:
        return None
    items = [item for value in values for item in (value if isinstance(value, list) else [value])]
    calls = [_call(item) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    found = [c for c in calls if c is not None]
    if names is not None and any(c.name not in names for c in found):
        return None
    return found


def _json_values(text: str) -> list[Any] | None:
    """The JSON values ``text`` consists of (separated by blanks, commas or semicolons)."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    at = 0
    while True:
        while at < len(text) and text[at] in _SEPARATORS:
            at += 1
        if at == len(text):
            return values
        try:
            value, at = decoder.raw_decode(text, at)
        except (ValueError, RecursionError):  # deeply nested brackets overflow the parser
            return None
        values.append(value)


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
