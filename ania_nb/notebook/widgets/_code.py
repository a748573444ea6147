r"""Tool arguments as a person reads them: code as highlighted code blocks, the rest as fields.

``python.code``, ``bash.command`` and any string argument with a line break are shown with
their line breaks, syntax-highlighted by Pygments (it ships with IPython; without it the code is
shown escaped) and numbered when long, in a scrollable block — never as one flattened line or as
JSON with literal ``\\n``. Hidden characters (control, zero-width, bidi overrides) are shown as
``\\uXXXX`` so nothing in an argument can hide or reorder what follows, and values under
``env``/``headers`` are masked, as in the approval text the gate builds.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from ..._preview import reveal
from ...governance.approval_text import approval_text, ordered_arguments, split_commands
from ...governance.secrets import SECRET_CONTAINERS, mask_json

# (tool, argument) -> Pygments lexer name of arguments that are always code.
CODE_ARGUMENTS = {
    ("python", "code"): "python",
    ("bash", "command"): "bash",
    ("notebook_run", "code"): "python",
    ("propose_cell", "code"): "python",
}
NUMBERED_FROM = 6  # lines: shorter blocks go without line numbers
BLOCK = (
    "margin:2px 0 6px;max-height:24em;overflow:auto;border:1px solid #d0d7de;border-radius:4px;"
    "background:#f6f8fa;color:#1f2328"
)
PRE = "margin:0;padding:4px 6px;white-space:pre;font-size:12px;line-height:1.4;tab-size:4"
NUMBER = (
    "display:inline-block;min-width:{w}ch;margin-right:1ch;color:#8c959f;user-select:none;"
    "text-align:right"
)
FIELD = "white-space:pre-wrap;word-break:break-word"


def parse_arguments(arguments: str) -> dict[str, Any] | None:
    """The arguments as a JSON object, None when they are not one."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def masked(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Values under env/headers masked (their names shown), as the gate's approval text does."""
    return {
        k: mask_json(v, secret=True) if k.lower() in SECRET_CONTAINERS else v
        for k, v in arguments.items()
    }


def expected_details(
    tool: str, arguments: str, order: Sequence[str] = (), shell_keys: Sequence[str] = ()
) -> str:
    """The approval details the gate builds for this call (used to match a card to its call)."""
    parsed = parse_arguments(arguments)
    shown: Mapping[str, Any] | str = masked(parsed) if parsed is not None else arguments
    return approval_text(tool, shown, order=order, shell_keys=shell_keys)


def code_language(tool: str, key: str, value: Any, arguments: Mapping[str, Any]) -> str | None:
    """The lexer for an argument shown as code ("text" when unknown), None for a plain field."""
    if not isinstance(value, str):
        return None
    known = CODE_ARGUMENTS.get((tool, key))
    if known is not None:
        return known
    if "\n" not in value:
        return None
    for name_key in ("path", "file_path", "filename", "name"):
        name = arguments.get(name_key)
        if isinstance(name, str) and "." in name:
            return _lexer_name_for_file(name)
    return "text"


@cache
def _lexer_name_for_file(name: str) -> str:
    try:
        from pygments.lexers import get_lexer_for_filename
        from pygments.util import ClassNotFound
    except ImportError:
        return "text"
    try:
        return str(get_lexer_for_filename(name).aliases[0])
    except (ClassNotFound, IndexError):
        return "text"


def highlighted_lines(code: str, language: str) -> list[str]:
    """The code as HTML lines (escaped; Pygments spans with inline colours when installed)."""
    try:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import get_lexer_by_name
        from pygments.util import ClassNotFound
    except ImportError:
        return [html.escape(line) for line in code.split("\n")]
    try:
        lexer = get_lexer_by_name(language, stripnl=False, ensurenl=False)
    except ClassNotFound:
        lexer = get_lexer_by_name("text", stripnl=False, ensurenl=False)
    # nowrap: just the spans; HtmlFormatter closes and reopens spans at each line break.
    formatter = HtmlFormatter(nowrap=True, noclasses=True, nobackground=True)
    out = highlight(code, lexer, formatter)
    lines = out.split("\n")
    want = code.count("\n") + 1
    return lines[:want] + [""] * (want - len(lines))


def code_block(code: str, language: str, *, numbered: bool | None = None) -> str:
    """A highlighted, scrollable code block; numbered when long (or when ``numbered``)."""
    code = reveal(code)  # hidden characters as \\uXXXX; newlines and tabs kept
    lines = highlighted_lines(code, language)
    if numbered is None:
        numbered = len(lines) >= NUMBERED_FROM
    if numbered:
        style = NUMBER.format(w=len(str(len(lines))))
        lines = [
            f'<span class="ania-lineno" style="{style}">{n}</span>{line}'
            for n, line in enumerate(lines, 1)
        ]
    body = "\n".join(lines)
    return (
        f'<div class="ania-code" data-language="{html.escape(language)}" style="{BLOCK}">'
        f'<pre style="{PRE}">{body}</pre></div>'
    )


def arguments_html(
    tool: str,
    arguments: str,
    *,
    order: Sequence[str] = (),
    shell_keys: Sequence[str] = (),
) -> str:
    """Every argument in full: code as highlighted blocks, other values as ``key: value``."""
    parsed = parse_arguments(arguments)
    if parsed is None:
        note = "<small>(the arguments are not a JSON object; shown as sent)</small>"
        return note + code_block(arguments, "text")
    if not parsed:
        return "<small>(no arguments)</small>"
    shown = masked(parsed)
    parts = []
    for key in ordered_arguments(shown, order):
        value = shown[key]
        name = html.escape(reveal(key))
        language = code_language(tool, key, value, shown)
        if language is not None:
            lines = value.count("\n") + 1
            count = f"{lines} line{'s' if lines != 1 else ''}"
            parts.append(f"<div><b>{name}</b> <small>({count})</small></div>")
            parts.append(code_block(value, language))
            if key in shell_keys:
                parts.append(_commands_html(value))
        elif isinstance(value, (dict, list)) and value:
            text = json.dumps(value, ensure_ascii=False, indent=2)
            parts.append(f"<div><b>{name}</b></div>{code_block(text, 'json')}")
        else:
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            field = f'<code style="{FIELD}">{html.escape(reveal(text))}</code>'
            parts.append(f"<div><b>{name}</b>: {field}</div>")
    return "".join(parts)


def _commands_html(command: str) -> str:
    """The separate commands of a shell line, when there is more than one."""
    commands = split_commands(command)
    if commands is None:
        return "<small>(the shell line could not be parsed: read it character by character)</small>"
    if len(commands) < 2:
        return ""
    items = "".join(f"<li><code>{html.escape(reveal(c))}</code></li>" for c in commands)
    return f'<small>it runs {len(commands)} commands:</small><ol style="margin:0">{items}</ol>'


def arguments_text(tool: str, arguments: str) -> str:
    """The arguments as plain text: code with its line breaks, indented under its name."""
    parsed = parse_arguments(arguments)
    if parsed is None:
        return reveal(arguments)
    lines = []
    shown = masked(parsed)
    for key in ordered_arguments(shown):
        value = shown[key]
        if code_language(tool, key, value, shown) is not None:
            lines.append(f"{key}:")
            lines += ["    " + line if line else "" for line in reveal(value).split("\n")]
        else:
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            lines.append(f"{key}: {reveal(text)}")
    return "\n".join(lines)
