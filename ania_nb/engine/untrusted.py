"""Untrusted text in a prompt: what chat users, documents, web pages and tools wrote.

Such text reaches the model inside ania-nb's own prompt structure, so it must neither speak the
chat template's language nor imitate the markers of that structure.

**Control tokens.** Servers that render the chat template and then tokenize the prompt with
special tokens parsed (llama.cpp, vLLM and others do by default) turn a literal ``<|im_start|>``
typed by a user into the real token: ``<|im_start|>system`` in a document opens a system turn.
`strip_control_tokens` replaces each of these by a space (a space, so that removing one never
joins its neighbours into another token):

- every ``<|name|>`` token (letters, digits, ``_ . -``): ChatML ``<|im_start|>`` ``<|im_end|>``
  ``<|im_sep|>``, ``<|endoftext|>``; Llama 3 ``<|begin_of_text|>`` ``<|start_header_id|>``
  ``<|end_header_id|>`` ``<|eot_id|>`` ``<|eom_id|>`` ``<|python_tag|>``; Phi, Zephyr and GLM
  ``<|system|>`` ``<|user|>`` ``<|assistant|>`` ``<|end|>`` ``<|observation|>``; gpt-oss
  ``<|start|>`` ``<|message|>`` ``<|channel|>`` ``<|return|>`` ``<|call|>``; Command-R
  ``<|START_OF_TURN_TOKEN|>`` …; Qwen's ``<|vision_start|>`` …;
- DeepSeek's full-width ``<｜…｜>`` tokens (``<｜begin▁of▁sentence｜>``, ``<｜User｜>``,
  ``<｜Assistant｜>``, ``<｜tool▁calls▁begin｜>`` …);
- Mistral's ``[INST]`` ``[/INST]`` ``[SYSTEM_PROMPT]`` ``[/SYSTEM_PROMPT]`` ``[TOOL_CALLS]``
  ``[AVAILABLE_TOOLS]`` ``[/AVAILABLE_TOOLS]`` ``[TOOL_RESULTS]`` ``[/TOOL_RESULTS]``
  ``[TOOL_CONTENT]``; Llama 2's ``<<SYS>>`` ``<</SYS>>``;
- Gemma's ``<start_of_turn>`` ``<end_of_turn>``; GLM's ``[gMASK]`` ``<sop>`` ``<eop>``;
- the tool turns of Qwen and Hermes templates: ``<tool_call>`` ``</tool_call>``
  ``<tool_response>`` ``</tool_response>``.

Matching ignores case. Kept, because they are ordinary text far more often than tokens and
open no turn: ``<s>`` ``</s>`` (HTML strike-through; Llama 2's sequence marks), ``<bos>``
``<eos>`` ``<pad>``, ``<think>`` ``</think>``.

**Markers.** `defuse_markers` turns the opening bracket of each marker of ania-nb's prompt
format into ``(``, however it is spelled: in any case, with full-width or look-alike brackets,
colons and letters, with spaces or invisible characters inside:

- ``[nickname:`` — the sender line that starts each chat message (`ania_nb.runner.chat`);
- ``[message_seq:`` — get_msg_history's header of each message;
- ``<knowledge>`` and ``</knowledge>`` — the auto-injected knowledge block
  (`ania_nb.knowledge.inject`).

`untrusted` does both; `one_line` makes a name or title a single short line.
"""

from __future__ import annotations

import re
import unicodedata

from ..text import cut

__all__ = [
    "CONTROL_TOKENS",
    "KNOWLEDGE_END",
    "KNOWLEDGE_START",
    "defuse_markers",
    "one_line",
    "strip_control_tokens",
    "untrusted",
]

KNOWLEDGE_START = "<knowledge>"
KNOWLEDGE_END = "</knowledge>"

CONTROL_TOKENS = re.compile(
    r"<\|[A-Za-z0-9_.\-]{1,64}\|>"
    r"|<｜[^｜<>\s]{1,64}｜>"
    r"|\[/?(?:INST|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_RESULTS|TOOL_CONTENT)\]"
    r"|\[TOOL_CALLS\]|\[gMASK\]"
    r"|<</?SYS>>"
    r"|<(?:start_of_turn|end_of_turn|sop|eop)>"
    r"|</?(?:tool_call|tool_response)>",
    re.IGNORECASE,
)
"""The chat-template control tokens `strip_control_tokens` removes (see the module)."""

# Characters that read like a marker's bracket, colon or slash but that NFKC leaves alone.
_LOOKALIKES = str.maketrans(
    {
        **dict.fromkeys("⟦〚【〔〖⁅❲⦋⦍⦏⟬⸢⸤", "["),
        **dict.fromkeys("‹〈〈⟨❮⧼", "<"),
        **dict.fromkeys("∶꞉ː˸։׃⁚", ":"),
        **dict.fromkeys("⁄∕⧸", "/"),
    }
)
_MARKER = re.compile(r"\[\s*(?:nickname|message_seq)\s*:|<\s*/?\s*knowledge\b")
_MARKER_WORDS = ("nickname", "message_seq", "knowledge")
# Format characters: zero-width spaces and joiners, bidi controls, the soft hyphen, BOM.
_FORMAT = re.compile(
    r"[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff]"
)
# What a single-line label drops: control, format, private-use, unassigned, surrogate,
# line and paragraph separator characters.
_HIDDEN = frozenset({"Cc", "Cf", "Co", "Cn", "Cs", "Zl", "Zp"})


def strip_control_tokens(text: str) -> str:
    """``text`` with every chat-template control token (`CONTROL_TOKENS`) replaced by a space."""
    if "<" not in text and "[" not in text:
        return text
    return CONTROL_TOKENS.sub(" ", text)


def _fold(ch: str) -> str:
    """One character as the marker search compares it (invisible ones vanish)."""
    if ch.isascii():
        return ch.lower()
    if unicodedata.category(ch) == "Cf":
        return ""
    return unicodedata.normalize("NFKC", ch.translate(_LOOKALIKES)).casefold()


def defuse_markers(text: str) -> str:
    """``text`` with the opening bracket of every prompt marker (see the module) made ``(``."""
    quick = unicodedata.normalize("NFKC", _FORMAT.sub("", text)).casefold()
    if not any(word in quick for word in _MARKER_WORDS):
        return text
    folded: list[str] = []
    origin: list[int] = []  # folded position -> index of the character in ``text``
    for index, ch in enumerate(text):
        for part in _fold(ch):
            folded.append(part)
            origin.append(index)
    chars = list(text)
    for match in _MARKER.finditer("".join(folded)):
        chars[origin[match.start()]] = "("
    return "".join(chars)


def untrusted(text: str) -> str:
    """``text`` from an untrusted source, fit to put into a prompt (both steps of the module)."""
    return defuse_markers(strip_control_tokens(text))


def one_line(text: str, limit: int) -> str:
    """A name or title as one line of at most ``limit`` characters, nothing hidden in it.

    NFKC-normalised; control, invisible and line-separating characters dropped; whitespace runs
    made one space; control tokens removed; cut with ``…``.
    """
    text = unicodedata.normalize("NFKC", strip_control_tokens(text))
    spaced = (" " if ch.isspace() else ch for ch in text)  # newlines and separators too
    line = " ".join("".join(ch for ch in spaced if unicodedata.category(ch) not in _HIDDEN).split())
    return cut(line, limit)
