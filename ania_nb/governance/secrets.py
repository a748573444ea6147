"""Masking secret values inside the JSON config files the AI may read (mcp, hooks, commands).

Masked like `config_get` masks keys (`ania_nb.config.mask`): every value under ``env`` or
``headers``; the value of any key whose name looks secret (token, secret, password, api key,
authorization, credential, cookie …); inside any string, ``NAME=value`` with a secret-looking
name, ``Bearer``/``Basic`` credentials and URL passwords or secret query parameters; in argument
lists, the value after a secret-looking flag (``--token xyz``) or in ``--token=xyz``.

`restore_masked` undoes it for a file written back: a value sent back exactly in its masked
form keeps the stored secret, so reading and rewriting a file never destroys its credentials.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..config import mask

SECRET_KEY = re.compile(
    r"(^|[_\-.])auth([_\-.]|$)|authorization|token|secret|passw|pwd|api[_\-]?key|credential"
    r"|private[_\-]?key|access[_\-]?key|session[_\-]?key|cookie|bearer|signature",
    re.IGNORECASE,
)
SECRET_CONTAINERS = frozenset({"env", "headers", "environment"})
_ASSIGNMENT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=((?:\"[^\"]*\")|(?:'[^']*')|[^\s&;|]+)")
_SCHEME_AUTH = re.compile(r"\b(Bearer|Basic|Token)(\s+)([A-Za-z0-9._~+/=\-]+)", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.\-]*://[^/\s:@]+:)([^@\s/]+)(@)", re.IGNORECASE)
_SECRET_FLAG = re.compile(r"^--?([A-Za-z][\w\-]*)(=(.*))?$", re.DOTALL)


def secret_key(name: str) -> bool:
    """Whether a JSON key, header or variable name looks like it names a secret."""
    return bool(SECRET_KEY.search(name))


def mask_string(text: str) -> str:
    """``text`` with secrets embedded in it masked (assignments, auth schemes, URL passwords)."""
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + mask(m.group(2)) + m.group(3), text)
    text = _SCHEME_AUTH.sub(lambda m: m.group(1) + m.group(2) + mask(m.group(3)), text)

    def assignment(m: re.Match[str]) -> str:
        return f"{m.group(1)}={mask(m.group(2))}" if secret_key(m.group(1)) else m.group(0)

    return _ASSIGNMENT.sub(assignment, text)


def mask_json(node: Any, *, secret: bool = False) -> Any:
    """A copy of a parsed JSON value with every secret value masked."""
    if isinstance(node, dict):
        return {
            k: mask_json(v, secret=secret or k.lower() in SECRET_CONTAINERS or secret_key(str(k)))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return _mask_list(node, secret=secret)
    if secret and isinstance(node, (str, int, float)) and not isinstance(node, bool):
        text = str(node)
        key, sep, value = text.partition("=")
        if isinstance(node, str) and sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            return f"{key}={mask(value)}"  # env as a list of KEY=VALUE items
        return mask(text)
    if isinstance(node, str):
        return mask_string(node)
    return node


def _mask_list(items: list[Any], *, secret: bool) -> list[Any]:
    out: list[Any] = []
    flagged = False  # the previous item was a secret-looking flag: this one is its value
    for item in items:
        if flagged and isinstance(item, str) and not item.startswith("-"):
            out.append(mask(item))
            flagged = False
            continue
        flagged = False
        if isinstance(item, str) and not secret:
            match = _SECRET_FLAG.match(item)
            if match and secret_key(match.group(1)):
                if match.group(2) is None:
                    flagged = True
                    out.append(item)
                else:
                    out.append(item[: match.start(3)] + mask(match.group(3)))
                continue
        out.append(mask_json(item, secret=secret))
    return out


def mask_json_text(text: str) -> tuple[str, bool]:
    """The file text with secret values masked, and whether anything was masked.

    Text that is not JSON is masked as one string (assignments, auth schemes, URL passwords).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        masked = mask_string(text)
        return masked, masked != text
    shown = mask_json(data)
    if shown == data:
        return text, False
    return json.dumps(shown, ensure_ascii=False, indent=2), True


def restore_masked(new_text: str, old_text: str) -> str:
    """``new_text`` with values left in their masked form replaced by the stored secrets."""
    try:
        new, old = json.loads(new_text), json.loads(old_text)
    except json.JSONDecodeError:
        return new_text
    restored = _restore(new, mask_json(old), old)
    if restored == new:
        return new_text
    return json.dumps(restored, ensure_ascii=False, indent=2)


def _restore(new: Any, shown: Any, old: Any) -> Any:
    if isinstance(new, dict) and isinstance(shown, dict) and isinstance(old, dict):
        return {
            k: _restore(v, shown[k], old[k]) if k in shown and k in old else v
            for k, v in new.items()
        }
    if isinstance(new, list) and isinstance(shown, list) and isinstance(old, list):
        return [
            _restore(v, shown[i], old[i]) if i < len(shown) and i < len(old) else v
            for i, v in enumerate(new)
        ]
    if isinstance(new, str) and new == shown and shown != old:
        return old
    return new
