"""Function-parameter schemas: from pydantic models, docstrings and MCP ``inputSchema``.

Tool definitions are resent on every request, so the bytes must never change between calls.
Parameter schemas are pydantic's own validation-mode JSON schema (so they say exactly what the
validator accepts), made self-contained and canonical here: ``$ref``s inlined, ``title`` and
``default`` noise removed, ``oneOf``/``const`` spelt ``anyOf``/``enum``, ``required`` sorted and
keys in one fixed order; the single function `dumps_canonical` serialises them.
"""

from __future__ import annotations

import copy
import inspect
import json
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, get_args, get_origin

from pydantic import AliasChoices, AliasPath, BaseModel, TypeAdapter
from pydantic.errors import PydanticInvalidForJsonSchema, PydanticUserError
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from ania_nb.errors import ToolDefinitionError

__all__ = [
    "accepted_arguments",
    "dumps_canonical",
    "has_description",
    "model_schema",
    "normalize_input_schema",
    "parse_docstring",
]


def dumps_canonical(obj: Any) -> str:
    """Serialise a tool definition (or list of them) the one way used on the wire."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=False)


# --------------------------------------------------------------------------- pydantic models


class _Unsupported(Exception):
    """A type pydantic validates but a tool schema cannot honestly describe."""


class _ToolSchemaGenerator(GenerateJsonSchema):
    """Pydantic's generator, refusing lazy iterables and reading ``Annotated[T, "text"]``."""

    def generator_schema(self, schema: core_schema.GeneratorSchema) -> JsonSchemaValue:
        """Refuse: Iterable/Iterator/Generator arguments are validated lazily, inside the tool."""
        raise _Unsupported(
            "Iterable/Iterator/Generator parameters are validated only while the tool iterates "
            "them, so bad items would fail the tool instead of being reported; use list[...]"
        )

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        """Pydantic's model schema plus descriptions given as plain ``Annotated`` strings."""
        json_schema = super().model_schema(schema)
        properties = json_schema.get("properties")
        if isinstance(properties, dict):
            for name, info in schema["cls"].model_fields.items():
                prop = properties.get(wire_name(name, info))
                text = None if info.description else _str_metadata(info.metadata)
                if isinstance(prop, dict) and text and "description" not in prop:
                    prop["description"] = text
        return json_schema


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """Build the OpenAI function ``parameters`` object for a pydantic model.

    Raises `ToolDefinitionError` for models that cannot be described (self-referencing models,
    callables, arbitrary classes, lazy iterables, non-finite constraints).
    """
    try:
        raw = model.model_json_schema(by_alias=True, schema_generator=_ToolSchemaGenerator)
    except (_Unsupported, PydanticInvalidForJsonSchema, PydanticUserError) as exc:
        raise ToolDefinitionError(_explain_unsupported(model, exc)) from None
    defs = raw.pop("$defs", {})
    schema = _clean(_inline(raw, defs, ()))
    schema.pop("description", None)  # the params model's docstring: the tool has its own
    schema.pop("type", None)
    schema.setdefault("properties", {})
    schema["required"] = sorted(schema.get("required", []))
    if accepted_arguments(model) is not None:
        schema["additionalProperties"] = False  # unknown keys are refused (see base._ModelTool)
    try:
        json.dumps(schema, allow_nan=False)
    except ValueError as exc:
        raise ToolDefinitionError(
            f"parameter model {model.__name__!r} puts a value JSON cannot carry in its "
            f"schema ({exc})"
        ) from None
    return _ordered({"type": "object", **schema})


def _explain_unsupported(model: type[BaseModel], exc: Exception) -> str:
    # Name the offending parameter: retry field by field (only on this error path).
    for name, info in model.model_fields.items():
        try:
            TypeAdapter(info.rebuild_annotation()).json_schema(
                schema_generator=_ToolSchemaGenerator
            )
        except (_Unsupported, PydanticInvalidForJsonSchema, PydanticUserError) as field_exc:
            return (
                f"parameter {wire_name(name, info)!r} of type {_type_name(info.annotation)} "
                f"cannot be described to the model: {_first_line(field_exc)}"
            )
        except Exception:  # a field that fails alone for another reason: keep looking
            continue
    return (
        f"parameter model {model.__name__!r} cannot be described to the model: {_first_line(exc)}"
    )


def _first_line(exc: Exception) -> str:
    # pydantic appends "For further information visit <url>" on later lines.
    return str(exc).strip().splitlines()[0]


def _type_name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) else repr(tp).replace("typing.", "")


def wire_name(name: str, info: FieldInfo) -> str:
    """The key the model must send for field ``name`` (the model validates by alias)."""
    if isinstance(info.validation_alias, str):
        return info.validation_alias
    return info.alias or name


def accepted_arguments(model: type[BaseModel]) -> frozenset[str] | None:
    """Every top-level key the validator accepts, or None when the model allows extra keys."""
    config = model.model_config
    if config.get("extra") == "allow":
        return None
    by_name = bool(config.get("populate_by_name") or config.get("validate_by_name"))
    names: set[str] = set()
    for name, info in model.model_fields.items():
        names.add(wire_name(name, info))
        if by_name:
            names.add(name)
        alias = info.validation_alias
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
        for choice in choices:
            if isinstance(choice, str):
                names.add(choice)
            elif isinstance(choice, AliasPath) and isinstance(choice.path[0], str):
                names.add(choice.path[0])
    return frozenset(names)


def _str_metadata(metadata: Sequence[Any]) -> str | None:
    for item in metadata:
        if isinstance(item, str) and item.strip():
            return item.strip()
        if isinstance(item, FieldInfo) and item.description:
            return item.description
    return None


# Keywords whose values are subschemas (everything else is data and is copied as it is).
_SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = (
    "items",
    "additionalProperties",
    "additionalItems",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)
# Noise for the model (title), values pydantic fills in itself (default), or OpenAPI-only.
_DROPPED = ("title", "default", "$defs", "discriminator", "$schema")


def _walk(node: dict[str, Any], fn: Any) -> dict[str, Any]:
    """Apply ``fn`` to every direct subschema of ``node`` (returns a new dict)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: fn(v) if isinstance(v, dict) else v for k, v in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [fn(v) if isinstance(v, dict) else v for v in value]
        elif key in _SCHEMA_ONE and isinstance(value, dict):
            out[key] = fn(value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _inline(node: dict[str, Any], defs: dict[str, Any], stack: tuple[str, ...]) -> dict[str, Any]:
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return _walk(node, lambda sub: _inline(sub, defs, stack))
    key = ref.rsplit("/", 1)[-1]
    target = defs.get(key)
    if not isinstance(target, dict):
        raise ToolDefinitionError(f"cannot resolve schema reference {ref!r}")
    if key in stack:
        names = [str(defs[k].get("title", k)) for k in (*stack[stack.index(key) :], key)]
        raise ToolDefinitionError(
            f"parameter model {names[0]!r} refers to itself ({' -> '.join(names)}); recursive "
            "models cannot be expressed as a tool schema, flatten the structure or use a dict field"
        )
    # Keys beside the $ref (a field's own description) win over the referenced definition's.
    siblings = {k: v for k, v in node.items() if k != "$ref"}
    return {**_inline(target, defs, (*stack, key)), **_inline(siblings, defs, stack)}


def _clean(node: dict[str, Any]) -> dict[str, Any]:
    node = _walk(node, _clean)
    for key in _DROPPED:
        node.pop(key, None)
    if "const" in node and "enum" not in node:
        node["enum"] = [node.pop("const")]  # Literal["x"] reads like every other Literal
    if "oneOf" in node:
        node["anyOf"] = node.get("anyOf", []) + node.pop("oneOf")
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], dict):
        del node["allOf"]
        node = {**all_of[0], **node}
    any_of = node.get("anyOf")
    if isinstance(any_of, list):
        node["anyOf"] = _flat_any_of(any_of)
        if len(node["anyOf"]) == 1 and isinstance(node["anyOf"][0], dict):
            node = {**node.pop("anyOf")[0], **node}
    if isinstance(node.get("required"), list):
        node["required"] = sorted(node["required"])
    return _ordered(node)


def _flat_any_of(members: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for member in members:
        if isinstance(member, dict) and list(member) == ["anyOf"]:
            flat.extend(member["anyOf"])
        elif member not in flat:
            flat.append(member)
    return flat


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    # One key order everywhere: type, description, then alphabetical (properties keep their
    # declaration order, enum and anyOf their declared order: both are data, not keys).
    head = [k for k in ("type", "description") if k in node]
    return {k: node[k] for k in [*head, *sorted(k for k in node if k not in head)]}


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
    """Turn an MCP tool's ``inputSchema`` into an OpenAI ``parameters`` object [orig §2.2].

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
