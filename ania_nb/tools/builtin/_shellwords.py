"""Whether a shell line is one simple command: what `bash.whitelist` may let through unasked.

A whitelist rule is a regex on the text, but the shell runs more than the text's first command:
``ls; rm -rf ~``, ``ls && x``, ``ls | sh``, ``ls $(x)``, ``ls `x` ``, ``ls > ~/.profile``,
``ls <(x)``, ``(x)``, ``ls # …`` or a second line all run (or write) something the rule never
named. So a line may skip approval only if it is a single simple command: words, quoted strings
and backslash escapes, nothing else. Conservative on purpose — anything this scanner does not
understand is "not simple" and needs a person's approval (never refused for that reason):

- outside quotes: no ``; & | < > ( ) $ ` #``, no newline or other control character;
- inside double quotes: no ``$`` or backtick (expansions run code: ``"$(x)"``);
- single quotes are literal; an unterminated quote or a trailing backslash is not simple;
- no leading ``NAME=value`` assignment (``LD_PRELOAD=./x.so ls`` changes what ``ls`` runs).
"""

from __future__ import annotations

import re
import unicodedata

# Characters that start an operator, an expansion, a redirection, a subshell or a comment.
_UNQUOTED_SPECIAL = frozenset(";&|<>()$`#")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")


def simple_command_problem(command: str) -> str | None:
    """Why ``command`` is not one simple command (None when it is)."""
    text = command.strip(" \t")
    if not text:
        return "empty command"
    if _ASSIGNMENT.match(text):
        return "starts with a variable assignment"
    quote = ""  # "", "'" or '"'
    escaped = False
    for ch in text:
        if ch != "\t" and unicodedata.category(ch) == "Cc":
            return f"contains the control character {ch!r}"  # newlines included
        if escaped:
            escaped = False
        elif quote == "'":
            if ch == "'":
                quote = ""
        elif quote == '"':
            if ch == '"':
                quote = ""
            elif ch == "\\":
                escaped = True
            elif ch in "$`":
                return f"{ch!r} inside double quotes (an expansion)"
        elif ch == "\\":
            escaped = True
        elif ch in "'\"":
            quote = ch
        elif ch in _UNQUOTED_SPECIAL:
            return f"contains {ch!r} (an operator, expansion, redirection or comment)"
    if quote:
        return "has an unterminated quote"
    if escaped:
        return "ends with a backslash"
    return None


def is_simple_command(command: str) -> bool:
    """Whether ``command`` is a single simple command (see the module docstring)."""
    return simple_command_problem(command) is None
