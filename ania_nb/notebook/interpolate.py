"""Prompt interpolation: ``{name}``, ``{In[3]}``, ``{Out[3]}`` from the user namespace.

Like jupyter-ai's magics: fields that cannot be resolved stay as written, ``{{`` and ``}}``
escape braces, and a prompt that is not a valid format string (say, JSON) is left untouched.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any


class _Keep:
    """A value that formats back to the original ``{field}`` text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __format__(self, spec: str) -> str:
        return "{" + self.text + (":" + spec if spec else "") + "}"


class _Formatter(string.Formatter):
    def __init__(self, namespace: Mapping[str, Any]) -> None:
        self.namespace = namespace

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        try:
            return super().get_field(field_name, args, kwargs)
        except (KeyError, IndexError, AttributeError, TypeError, ValueError):
            return _Keep(field_name), field_name

    def get_value(self, key: int | str, args: Any, kwargs: Any) -> Any:
        if isinstance(key, int):
            raise KeyError(key)
        return self.namespace[key]

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if isinstance(value, _Keep):
            return value
        return super().convert_field(value, conversion)


def interpolate(template: str, namespace: Mapping[str, Any]) -> str:
    """Fill ``{expr}`` fields from ``namespace``; unknown fields and invalid templates stay."""
    try:
        return _Formatter(namespace).vformat(template, (), {})
    except (ValueError, IndexError):
        return template
