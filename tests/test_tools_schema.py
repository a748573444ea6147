"""Schema generation from pydantic models, MCP inputSchema normalisation, canonical bytes."""

from __future__ import annotations

import copy
import enum
import os
import subprocess
import sys
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pytest
from pydantic import BaseModel, Field

from ania_nb.errors import ToolDefinitionError
from ania_nb.tools import dumps_canonical, model_schema, normalize_input_schema
from ania_nb.tools.schema import parse_docstring

EMPTY = {"type": "object", "properties": {}, "required": []}


def forbidden_keys(node: Any, path: str = "$") -> list[str]:
    """Paths of $ref / title / anyOf / default keys anywhere (property names excepted)."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("$ref", "title", "anyOf", "allOf", "oneOf", "default", "$defs"):
                found.append(f"{path}.{key}")
            if key == "properties" and isinstance(value, dict):
                for name, prop in value.items():  # a property may be *named* "title"
                    found += forbidden_keys(prop, f"{path}.properties.{name}")
            else:
                found += forbidden_keys(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            found += forbidden_keys(item, f"{path}[{i}]")
    return found


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Address(BaseModel):
    street: str = Field(description="street and number")
    zip_code: int | None = None


class Item(BaseModel):
    name: str
    qty: int = 1


class Everything(BaseModel):
    title: str = Field(description="a property named title is fine")
    count: int
    ratio: float = 0.5
    price: Decimal = Decimal("1")
    flag: bool = False
    tags: list[str] = []
    points: tuple[int, ...] = ()
    ids: set[int] = set()
    seq: Sequence[float] = ()
    untyped: list = []  # type: ignore[type-arg]
    address: Address
    items: list[Item] = []
    extra: dict[str, int] = {}
    mode: Literal["fast", "slow"] = "fast"
    color: Color = Color.RED
    level: Level = Level.LOW
    maybe: Optional[int] = None  # noqa: UP045  (the old spelling must work too)
    maybe_required: int | None
    note: Annotated[str, "a note from Annotated"] = ""
    annotated_field: Annotated[int, Field(description="from Annotated Field")] = 0
    anything: Any = None


@pytest.fixture(scope="module")
def everything() -> dict[str, Any]:
    return model_schema(Everything)


def test_top_level_shape_and_order(everything: dict[str, Any]) -> None:
    assert list(everything) == ["type", "properties", "required"]
    assert everything["type"] == "object"
    assert list(everything["properties"]) == list(Everything.model_fields)


def test_required_is_fields_without_default(everything: dict[str, Any]) -> None:
    assert everything["required"] == ["title", "count", "address", "maybe_required"]


def test_scalar_mapping(everything: dict[str, Any]) -> None:
    props = everything["properties"]
    assert props["count"] == {"type": "number"}
    assert props["ratio"] == {"type": "number"}
    assert props["price"] == {"type": "number"}
    assert props["flag"] == {"type": "boolean"}
    assert props["anything"] == {"type": "string"}
    assert props["extra"] == {"type": "object"}


def test_arrays(everything: dict[str, Any]) -> None:
    props = everything["properties"]
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["points"] == {"type": "array", "items": {"type": "number"}}
    assert props["ids"] == {"type": "array", "items": {"type": "number"}}
    assert props["seq"] == {"type": "array", "items": {"type": "number"}}
    assert props["untyped"] == {"type": "array", "items": {"type": "string"}}


def test_nested_model_has_nested_required(everything: dict[str, Any]) -> None:
    assert everything["properties"]["address"] == {
        "type": "object",
        "properties": {
            "street": {"type": "string", "description": "street and number"},
            "zip_code": {"type": "number"},
        },
        "required": ["street"],
    }


def test_list_of_models(everything: dict[str, Any]) -> None:
    assert everything["properties"]["items"] == {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "qty": {"type": "number"}},
            "required": ["name"],
        },
    }


def test_literal_and_enums(everything: dict[str, Any]) -> None:
    props = everything["properties"]
    assert props["mode"] == {"type": "string", "enum": ["fast", "slow"]}
    assert props["color"] == {"type": "string", "enum": ["red", "green"]}
    assert props["level"] == {"type": "number", "enum": [1, 2]}


def test_optional_unwraps_and_is_required_only_without_default(everything: dict[str, Any]) -> None:
    props = everything["properties"]
    assert props["maybe"] == {"type": "number"}
    assert props["maybe_required"] == {"type": "number"}
    assert "maybe" not in everything["required"]


def test_descriptions(everything: dict[str, Any]) -> None:
    props = everything["properties"]
    assert props["title"] == {"type": "string", "description": "a property named title is fine"}
    assert props["note"] == {"type": "string", "description": "a note from Annotated"}
    assert props["annotated_field"] == {"type": "number", "description": "from Annotated Field"}


def test_no_ref_title_anyof_or_defaults(everything: dict[str, Any]) -> None:
    assert forbidden_keys(everything) == []
    # and the probe itself can fail: pydantic's own schema is full of them
    assert forbidden_keys(Everything.model_json_schema()) != []


def test_empty_model_has_empty_required() -> None:
    class NoParams(BaseModel):
        pass

    assert model_schema(NoParams) == EMPTY


def test_alias_is_the_wire_name() -> None:
    class Aliased(BaseModel):
        from_: str = Field(alias="from")

    assert model_schema(Aliased) == {
        "type": "object",
        "properties": {"from": {"type": "string"}},
        "required": ["from"],
    }


def test_same_model_twice_is_not_recursion() -> None:
    class Route(BaseModel):
        start: Address
        end: Address

    schema = model_schema(Route)
    assert schema["properties"]["start"] == schema["properties"]["end"]


def test_self_referencing_model_names_the_model() -> None:
    class Node(BaseModel):
        value: int
        children: list[Node] = []

    Node.model_rebuild()
    with pytest.raises(ToolDefinitionError, match=r"'Node' refers to itself \(Node -> Node\)"):
        model_schema(Node)


def test_union_of_different_types_falls_back_to_string() -> None:
    class U(BaseModel):
        either: int | str
        numbers: int | float

    props = model_schema(U)["properties"]
    assert props["either"] == {"type": "string"}
    assert props["numbers"] == {"type": "number"}


def test_parse_docstring_google_style() -> None:
    summary, args = parse_docstring(
        """Search the web.

        Second paragraph of the summary.

        Args:
            query (str): what to search
                for, in any language.
            page: 1-based page.

        Returns:
            text: not a parameter.
        """
    )
    assert summary == "Search the web.\n\nSecond paragraph of the summary."
    assert args == {"query": "what to search for, in any language.", "page": "1-based page."}


# --------------------------------------------------------------------------- MCP inputSchema


@pytest.mark.parametrize("bad", [None, "not a schema", 42, ["a"]])
def test_null_or_invalid_schema_is_empty_object(bad: Any) -> None:
    assert normalize_input_schema(bad) == EMPTY


def test_missing_type_and_properties() -> None:
    assert normalize_input_schema({}) == EMPTY
    assert normalize_input_schema({"properties": None}) == EMPTY


def test_required_derived_from_boolean_flags_sorted() -> None:
    out = normalize_input_schema(
        {
            "type": "object",
            "properties": {
                "zeta": {"type": "string", "description": "z", "required": True},
                "alpha": {"type": "string", "description": "a", "required": True},
                "dflt": {"type": "string", "description": "d", "required": True, "default": "x"},
                "opt": {"type": "string", "description": "o", "required": False},
            },
        }
    )
    assert out["required"] == ["alpha", "zeta"]
    assert all("required" not in prop for prop in out["properties"].values())


def test_required_non_list_becomes_empty_and_list_is_sorted() -> None:
    props = {"b": {"type": "string", "description": "b"}, "a": {"type": "string"}}
    assert normalize_input_schema({"properties": props, "required": "a"})["required"] == []
    assert normalize_input_schema({"properties": props, "required": ["b", "a"]})["required"] == [
        "a",
        "b",
    ]


def test_descriptions_filled_recursively() -> None:
    out = normalize_input_schema(
        {
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "properties": {"id": {"type": "number"}},
                },
                "rows": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"cell": {"type": "string"}}},
                },
                "kept": {"type": "string", "description": "own words"},
            },
            "required": [],
        }
    )
    props = out["properties"]
    assert props["user"]["description"] == "Parameter: user"
    assert props["user"]["properties"]["id"]["description"] == "Parameter: id"
    assert props["rows"]["items"]["properties"]["cell"]["description"] == "Parameter: cell"
    assert "description" not in props["rows"]["items"]  # items is not a named parameter
    assert props["kept"]["description"] == "own words"


def test_enum_values_appended_like_the_original() -> None:
    out = normalize_input_schema(
        {
            "properties": {
                "unit": {"type": "string", "description": "Unit", "enum": ["c", "f"]},
                "level": {"type": "number", "enum": [1, 2.5, True, None]},
            }
        }
    )
    props = out["properties"]
    assert props["unit"]["description"] == "Unit (allowed values: [c f])"
    assert props["unit"]["enum"] == ["c", "f"]
    assert props["level"]["description"] == "Parameter: level (allowed values: [1 2.5 true null])"


def test_nested_boolean_required_folds_into_nested_list() -> None:
    out = normalize_input_schema(
        {"properties": {"o": {"type": "object", "properties": {"k": {"required": True}}}}}
    )
    nested = out["properties"]["o"]
    assert nested["required"] == ["k"]
    assert nested["properties"]["k"] == {"description": "Parameter: k"}


def test_input_is_not_mutated() -> None:
    original = {
        "properties": {
            "a": {"type": "string", "required": True, "enum": ["x"]},
            "o": {"type": "object", "properties": {"b": {"type": "number"}}},
        }
    }
    snapshot = copy.deepcopy(original)
    out = normalize_input_schema(original)
    assert original == snapshot
    assert out["properties"]["a"]["description"] == "Parameter: a (allowed values: [x])"


def test_extra_keys_are_kept() -> None:
    out = normalize_input_schema(
        {"type": "object", "properties": {}, "additionalProperties": False, "required": []}
    )
    assert out == {**EMPTY, "additionalProperties": False}


# --------------------------------------------------------------------------- determinism


def test_dumps_canonical_is_compact_and_keeps_order() -> None:
    assert dumps_canonical({"b": 1, "a": ["é", None]}) == '{"b":1,"a":["é",null]}'


_SCRIPT = """
from pydantic import BaseModel, Field
from typing import Literal
from ania_nb.tools import dumps_canonical, model_schema, normalize_input_schema

class Inner(BaseModel):
    x: int
    y: list[str] = []

class Params(BaseModel):
    query: str = Field(description="what to look for")
    inner: Inner
    many: list[Inner] = []
    mode: Literal["a", "b"] = "a"
    flags: set[str] = set()

mcp = {"properties": {"z": {"required": True}, "a": {"enum": ["p", 2]}}}
print(dumps_canonical([model_schema(Params), normalize_input_schema(mcp)]))
"""


def test_schema_bytes_identical_across_processes() -> None:
    runs = [
        subprocess.run(
            [sys.executable, "-c", _SCRIPT],
            capture_output=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=Path(__file__).resolve().parents[1],
        ).stdout
        for seed in ("1", "2")
    ]
    assert runs[0] == runs[1]
    assert b'"required":["query","inner"]' in runs[0]
