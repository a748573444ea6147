"""Function-parameter schemas: from pydantic models, docstrings and MCP ``inputSchema``.

Tool definitions are resent on every request, so the bytes must never change between calls:
the schemas here are built by our own small rules (no ``$ref``, ``title`` or ``anyOf``, no
defaults) and serialised by the single function `dumps_canonical`.
"""

from __future__ import annotations

import copy
import enum
import inspect
import json
import re
import types
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from decimal import Decimal
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ania_nb.errors import ToolDefinitionError

__all__ = [
    "dumps_canonical",
    "has_description",
    "model_schema",
    "normalize_input_schema",
    "parse_docstring",
]

_ARRAY_ORIGINS: tuple[type, ...] = (list, tuple, set, frozenset, Sequence, AbstractSet)
_UNION_ORIGINS: tuple[Any, ...] = (Union, types.UnionType)


def dumps_canonical(obj: Any) -> str:
    """Serialise a tool definition (or list of them) the one way used on the wire."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=False)


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Build the OpenAI function ``parameters`` object for a pydantic model."""
    return _object_schema(model, ())


def _object_schema(model: type[BaseModel], stack: tuple[type, ...]) -> dict[str, Any]:
    if model in stack:
        chain = " -> ".join(m.__name__ for m in (*stack, model))
        raise ToolDefinitionError(
            f"parameter model {model.__name__!r} refers to itself ({chain}); recursive models "
            "cannot be expressed as a tool schema, flatten the structure or use a dict field"
        )
    stack = (*stack, model)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, info in model.model_fields.items():
        key = _wire_name(name, info)
        prop = _type_schema(info.annotation, stack)
        description = info.description or _str_metadata(info.metadata)
        if description and "description" not in prop:
            prop = _with_description(prop, description)
        elif description:
            prop["description"] = description
        properties[key] = prop
        if info.is_required():
            required.append(key)
    return {"type": "object", "properties": properties, "required": required}


def _wire_name(name: str, info: FieldInfo) -> str:
    # The model validates by alias, so the model must be told the alias.
    if isinstance(info.validation_alias, str):
        return info.validation_alias
    return info.alias or name


def _str_metadata(metadata: Sequence[Any]) -> str | None:
    for item in metadata:
        if isinstance(item, str) and item.strip():
            return item.strip()
        if isinstance(item, FieldInfo) and item.description:
            return item.description
    return None


def _with_description(schema: dict[str, Any], description: str) -> dict[str, Any]:
    # Keep "type" first and "description" second so generated schemas read naturally.
    out: dict[str, Any] = {}
    if "type" in schema:
        out["type"] = schema["type"]
    out["description"] = description
    out.update((k, v) for k, v in schema.items() if k != "type")
    return out


def _type_schema(tp: Any, stack: tuple[type, ...]) -> dict[str, Any]:
    origin = get_origin(tp)
    if origin is Annotated:
        inner, *metadata = get_args(tp)
        schema = _type_schema(inner, stack)
        description = _str_metadata(metadata)
        return _with_description(schema, description) if description else schema
    if origin in _UNION_ORIGINS:
        return _union_schema([a for a in get_args(tp) if a is not type(None)], stack)
    if origin is Literal:
        return _enum_schema(list(get_args(tp)))
    if origin is not None:
        return _generic_schema(tp, origin, stack)
    if isinstance(tp, type):
        return _class_schema(tp, stack)
    return {"type": "string"}


def _union_schema(members: list[Any], stack: tuple[type, ...]) -> dict[str, Any]:
    schemas = [_type_schema(m, stack) for m in members]
    if not schemas:
        return {"type": "string"}
    # Never anyOf: one shape if the members agree on a JSON type, else the lenient string.
    if len({json.dumps(s.get("type")) for s in schemas}) == 1:
        return schemas[0]
    return {"type": "string"}


def _generic_schema(tp: Any, origin: Any, stack: tuple[type, ...]) -> dict[str, Any]:
    args = get_args(tp)
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return {"type": "object"}
    if isinstance(origin, type) and issubclass(origin, _ARRAY_ORIGINS):
        item_types = [a for a in args if a is not Ellipsis]
        items = _union_schema(item_types, stack) if item_types else {"type": "string"}
        return {"type": "array", "items": items}
    if isinstance(origin, type):
        return _class_schema(origin, stack)
    return {"type": "string"}


def _class_schema(tp: type, stack: tuple[type, ...]) -> dict[str, Any]:
    # Order matters: Enum before int (IntEnum), bool before int (bool subclasses int).
    if issubclass(tp, enum.Enum):
        return _enum_schema([member.value for member in tp])
    if issubclass(tp, bool):
        return {"type": "boolean"}
    if issubclass(tp, int | float | Decimal):
        return {"type": "number"}
    if issubclass(tp, BaseModel):
        return _object_schema(tp, stack)
    if issubclass(tp, Mapping):
        return {"type": "object"}
    if issubclass(tp, str | bytes):
        return {"type": "string"}
    if issubclass(tp, _ARRAY_ORIGINS):
        return {"type": "array", "items": {"type": "string"}}
    return {"type": "string"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float | Decimal):
        return "number"
    return "string"


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    values = [v.value if isinstance(v, enum.Enum) else v for v in values]
    # Values JSON cannot carry natively (dates, bytes, ...) travel as their string form.
    values = [v if isinstance(v, str | int | float | bool | None) else str(v) for v in values]
    kinds = list(dict.fromkeys(_json_type(v) for v in values))
    kind: str | list[str] = kinds[0] if len(kinds) == 1 else kinds
    return {"type": kind, "enum": values}


# --------------------------------------------------------------------------- docstrings

_SECTION_RE = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?):\s*$"
)
_ARG_RE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (summary, {parameter: description})."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    entry_indent: int | None = None
    for line in lines:
        header = _SECTION_RE.match(line)
        if header:
            section, current, entry_indent = header.group(1), None, None
            continue
        if section is None:
            summary.append(line)
            continue
        if section not in ("Args", "Arguments", "Parameters", "Params") or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        entry = _ARG_RE.match(line.strip())
        if entry and (entry_indent is None or indent <= entry_indent):
            entry_indent, current = indent, entry.group(1)
            args[current] = entry.group(2).strip()
        elif current is not None:  # continuation line, indented under its entry
            args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(summary).strip(), args


def has_description(annotation: Any, default: Any) -> bool:
    """Whether a parameter already declares a description (``Field`` or ``Annotated`` text)."""
    if isinstance(default, FieldInfo) and default.description:
        return True
    if get_origin(annotation) is Annotated:
        return _str_metadata(get_args(annotation)[1:]) is not None
    return False


# --------------------------------------------------------------------------- MCP inputSchema


def normalize_input_schema(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """Turn an MCP tool's ``inputSchema`` into an OpenAI ``parameters`` object (reference §2.2).

    The input is never mutated.
    """
    if not isinstance(schema, Mapping):
        return {"type": "object", "properties": {}, "required": []}
    out: dict[str, Any] = copy.deepcopy(dict(schema))
    out.setdefault("type", "object")
    if not isinstance(out.get("properties"), Mapping):
        out["properties"] = {}
    if "required" not in out:
        out["required"] = _flagged_required(out["properties"])
    elif isinstance(out["required"], list):
        out["required"] = sorted({r for r in out["required"] if isinstance(r, str)})
    else:
        out["required"] = []
    _fix_properties(out["properties"])
    return out


def _flagged_required(properties: Mapping[str, Any]) -> list[str]:
    # Some servers mark required-ness per property ("required": true) instead of in a list.
    return sorted(
        name
        for name, prop in properties.items()
        if isinstance(prop, Mapping) and prop.get("required") is True and "default" not in prop
    )


def _fix_properties(properties: dict[str, Any]) -> None:
    for name, prop in properties.items():
        if isinstance(prop, dict):
            _fix_property(name, prop)


def _fix_object(obj: dict[str, Any]) -> None:
    props = obj.get("properties")
    if not isinstance(props, dict):
        return
    if "required" not in obj and _flagged_required(props):
        obj["required"] = _flagged_required(props)
    _fix_properties(props)


def _fix_property(name: str, prop: dict[str, Any]) -> None:
    if isinstance(prop.get("required"), bool):
        del prop["required"]  # non-standard per-property flag, already folded into the parent
    description = prop.get("description")
    if not isinstance(description, str) or not description:
        description = f"Parameter: {name}"
    values = prop.get("enum")
    if isinstance(values, list) and values:
        rendered = " ".join(v if isinstance(v, str) else _dumps_value(v) for v in values)
        description = f"{description} (allowed values: [{rendered}])"
    prop["description"] = description
    _fix_object(prop)
    items = prop.get("items")
    if isinstance(items, dict):
        _fix_object(items)


def _dumps_value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def function_definition(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI function-tool entry; the one place its key order is decided (stable bytes)."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }
