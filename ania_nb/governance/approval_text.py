"""What a person sees before approving a call: every argument, in full, nothing hidden.

A model can pad an argument so the dangerous part (a second command after blank lines, a path
after a long name, a right-to-left override) falls outside a short summary. So the approval text
shows every argument whole, in a fixed key order (the tool's parameter order, then the rest
sorted — never the model's order), with newlines, tabs, other control characters and invisible
or direction-changing characters made visible; a shell command is also split into the separate
commands it would run. Front ends with little room (chat) show a bounded prefix with a
"N more characters" note and offer the whole text on request (`ApprovalRequest.text`).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from .._preview import reveal
from ..catalogue import Language, say

_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "|&", "\n"})


def visible(text: str) -> str:
    """``text`` with hidden characters escaped (see `reveal`) and line breaks and tabs marked.

    Newlines stay line breaks, marked ``↵``; tabs are marked ``→``.
    """
    return reveal(text).replace("\t", "→\t").replace("\n", "↵\n")


def split_commands(command: str) -> list[str] | None:
    """The separate commands of a shell line; None when it cannot be parsed.

    Splits at ``;``, ``&&``, ``||``, ``|``, ``&`` and newlines, outside quotes.
    """
    lexer = shlex.shlex(command.replace("\n", " ; "), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = ""
    commands: list[list[str]] = [[]]
    try:
        for token in lexer:
            if token in _SEPARATORS or set(token) <= set(";&|"):
                commands.append([])
            else:
                commands[-1].append(token)
    except ValueError:
        return None
    return [" ".join(_word(w) for w in words) for words in commands if words]


def _word(word: str) -> str:
    """A word as written, quoted only where quotes carry meaning (spaces, separators)."""
    return shlex.quote(word) if not word or any(c in word for c in " \t;&|'\"") else word


def ordered_arguments(arguments: Mapping[str, Any], order: Sequence[str] = ()) -> list[str]:
    """Argument names in the tool's parameter order, then any others sorted."""
    known = [k for k in order if k in arguments]
    return known + sorted(k for k in arguments if k not in known)


def approval_text(
    tool: str,
    arguments: Mapping[str, Any] | str,
    *,
    order: Sequence[str] = (),
    shell_keys: Sequence[str] = (),
    language: Language = "en",
) -> str:
    """The full approval text of a call (``arguments`` raw text when they are not an object).

    ``language`` words the lines around the arguments (`ania_nb.catalogue`).
    """
    if isinstance(arguments, str):
        return f"{say('approval.args_raw', language, tool=tool)}\n{visible(arguments)}"
    head = "approval.args_count" if arguments else "approval.args_none"
    lines = [say(head, language, tool=tool, count=len(arguments))]
    for key in ordered_arguments(arguments, order):
        value = arguments[key]
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        lines.append(say("approval.arg", language, name=visible(key), count=len(text)))
        lines.append(visible(text))
        if key in shell_keys and isinstance(value, str):
            commands = split_commands(value)
            if commands is None:
                lines.append(say("approval.shell_unparsed", language))
            elif len(commands) > 1:
                lines.append(say("approval.shell_commands", language, count=len(commands)))
                lines.extend(f"  {n}. {visible(c)}" for n, c in enumerate(commands, 1))
    return "\n".join(lines)
