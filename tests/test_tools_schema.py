"""Schema generation from pydantic models, MCP inputSchema normalisation, canonical bytes.

Parameter schemas are pydantic's own JSON schema made self-contained and canonical, so they say
what the validator accepts (tests/test_tools_schema_property.py checks that with hypothesis).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pytest
from pydantic import BaseModel, ConfigDict, Field, create_model
from typing_extensions import TypedDict  # pydantic needs this one before Python 3.12

from ania_nb.errors import ToolDefinitionError
from ania_nb.tools import dumps_canonical, model_schema, normalize_input_schema
from ania_nb.tools.schema import parse_docstring

EMPTY = {"type": "object", "properties": {}, "required": []}


FORBIDDEN = ("$ref", "$defs", "title", "default", "allOf", "oneOf", "const", "discriminator")


def forbidden_keys(node: Any, path: str = "$") -> list[str]:
    """Paths of $ref / title / default / oneOf ... keys anywhere (property names excepted)."""
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in FORBIDDEN:
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
    # Unknown keys are refused by the tool (not silently dropped), and the schema says so.
    assert list(everything) == ["type", "additionalProperties", "properties", "required"]
    assert everything["type"] == "object"
    assert everything["additionalProperties"] is False
    assert list(everything["properties"]) == list(Everything.model_fields)


def test_required_is_fields_without_default_sorted(everything: dict[str, Any]) -> None:
    assert everything["required"] == ["address", "count", "maybe_required", "title"]


def test_scalar_mapping(everything: dict[str, Any]) -> None:
    props = everything["properties"]
    assert props["count"] == {"type": "integer"}
    assert props["ratio"] == {"type": "number"}
    assert props["price"] == {"anyOf": [{"type": "number"}, {"type": "string"}]}
    assert props["flag"] == {"type": "boolean"}
    assert props["anything"] == {}
    assert props["extra"] == {"type": "object", "additionalProperties": {"type": "integer"}}


def test_arrays(everything: dict[str, Any]) -> None:
    props = everything["properties"]
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["points"] == {"type": "array", "items": {"type": "integer"}}
    assert props["ids"] == {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    assert props["seq"] == {"type": "array", "items": {"type": "number"}}
    assert props["untyped"] == {"type": "array", "items": {}}


def test_nested_model_has_nested_required(everything: dict[str, Any]) -> None:
    assert everything["properties"]["address"] == {
        "type": "object",
        "properties": {
            "street": {"type": "string", "description": "street and number"},
            "zip_code": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        },
        "required": ["street"],
    }


def test_list_of_models(everything: dict[str, Any]) -> None:
    assert everything["properties"]["items"] == {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}},
            "required": ["name"],
        },
    }


def test_literal_and_enums(everything: dict[str, Any]) -> None:
    props = everything["properties"]
    assert props["mode"] == {"type": "string", "enum": ["fast", "slow"]}
    assert props["color"] == {"type": "string", "enum": ["red", "green"]}
    assert props["level"] == {"type": "integer", "enum": [1, 2]}


def test_optional_is_nullable_and_required_only_without_default(
    everything: dict[str, Any],
) -> None:
    props = everything["properties"]
    nullable_int = {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert props["maybe"] == nullable_int
    assert props["maybe_required"] == nullable_int
    assert "maybe" not in everything["required"]


def test_descriptions(everything: dict[str, Any]) -> None:
    props = everything["properties"]
    assert props["title"] == {"type": "string", "description": "a property named title is fine"}
    assert props["note"] == {"type": "string", "description": "a note from Annotated"}
    assert props["annotated_field"] == {"type": "integer", "description": "from Annotated Field"}


def test_no_ref_title_const_or_defaults(everything: dict[str, Any]) -> None:
    assert forbidden_keys(everything) == []
    # and the probe itself can fail: pydantic's own schema is full of them
    assert forbidden_keys(Everything.model_json_schema()) != []


def test_empty_model_has_empty_required() -> None:
    class NoParams(BaseModel):
        pass

    assert model_schema(NoParams) == {**EMPTY, "additionalProperties": False}


def test_alias_is_the_wire_name() -> None:
    class Aliased(BaseModel):
        from_: str = Field(alias="from")

    assert model_schema(Aliased) == {
        "type": "object",
        "additionalProperties": False,
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

    class Holder(BaseModel):
        root: Node

    Node.model_rebuild()
    Holder.model_rebuild()
    for model in (Node, Holder):
        with pytest.raises(ToolDefinitionError, match=r"'Node' refers to itself \(Node -> Node\)"):
            model_schema(model)


def test_unions_are_any_of_in_declared_order() -> None:
    class U(BaseModel):
        either: int | str
        numbers: int | float
        nested: int | str | None = None

    props = model_schema(U)["properties"]
    assert props["either"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert props["numbers"] == {"anyOf": [{"type": "integer"}, {"type": "number"}]}
    assert props["nested"] == {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]}


def test_literals_are_full_enums() -> None:
    class L(BaseModel):
        mixed: Literal["a", 1, True]
        single: Literal["only"]
        maybe: Literal["x", "y"] | None = None

    props = model_schema(L)["properties"]
    assert props["mixed"] == {"enum": ["a", 1, True]}
    assert props["single"] == {"type": "string", "enum": ["only"]}
    assert props["maybe"] == {"anyOf": [{"type": "string", "enum": ["x", "y"]}, {"type": "null"}]}


@dataclasses.dataclass
class Point:
    """A point on the plane."""

    x: int
    y: int = 0
    tags: list[str] = dataclasses.field(default_factory=list)


class Options(TypedDict, total=False):
    verbose: bool
    depth: int


class Shapes(BaseModel):
    point: Point
    options: Options = {}
    where: Address | None = Field(None, description="a field description wins")
    best: Address


def test_dataclass_typeddict_and_nested_model_objects() -> None:
    props = model_schema(Shapes)["properties"]
    assert props["point"] == {
        "type": "object",
        "description": "A point on the plane.",
        "properties": {
            "x": {"type": "integer"},
            "y": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["x"],
    }
    assert props["options"] == {
        "type": "object",
        "properties": {"verbose": {"type": "boolean"}, "depth": {"type": "integer"}},
    }
    address = model_schema(Address)
    del address["additionalProperties"]  # only the top level refuses unknown keys
    assert props["where"] == {
        "description": "a field description wins",
        "anyOf": [address, {"type": "null"}],
    }
    assert props["best"] == address


def test_constraints_are_kept() -> None:
    class C(BaseModel):
        n: int = Field(ge=1, le=10, multiple_of=2)
        x: float = Field(0, gt=0, lt=1)
        s: str = Field(pattern=r"^[a-z]+$", min_length=2, max_length=8)
        items: list[int] = Field(min_length=1, max_length=3)

    props = model_schema(C)["properties"]
    assert props["n"] == {"type": "integer", "maximum": 10, "minimum": 1, "multipleOf": 2}
    assert props["x"] == {"type": "number", "exclusiveMaximum": 1, "exclusiveMinimum": 0}
    assert props["s"] == {"type": "string", "maxLength": 8, "minLength": 2, "pattern": "^[a-z]+$"}
    assert props["items"] == {
        "type": "array",
        "items": {"type": "integer"},
        "maxItems": 3,
        "minItems": 1,
    }


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = 9


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool = True


def test_discriminated_union_is_any_of_without_openapi_keys() -> None:
    class Pets(BaseModel):
        pet: Cat | Dog = Field(discriminator="kind")

    pet = model_schema(Pets)["properties"]["pet"]
    assert [branch["properties"]["kind"] for branch in pet["anyOf"]] == [
        {"type": "string", "enum": ["cat"]},
        {"type": "string", "enum": ["dog"]},
    ]
    assert forbidden_keys(pet) == []


def test_extra_policy_of_the_model_is_what_the_schema_says() -> None:
    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        a: int

    class Closed(BaseModel):
        model_config = ConfigDict(extra="forbid")
        a: int

    assert model_schema(Open)["additionalProperties"] is True
    assert model_schema(Closed)["additionalProperties"] is False


def _key_order_problems(node: Any, path: str = "$") -> list[str]:
    problems: list[str] = []
    if isinstance(node, dict):
        keys = [k for k in node if k not in ("type", "description")]
        head = [k for k in node if k in ("type", "description")]
        if head != [k for k in ("type", "description") if k in node] or list(node) != [
            *head,
            *sorted(keys),
        ]:
            problems.append(f"{path}: {list(node)}")
        for key, value in node.items():
            if key == "properties":
                for name, prop in value.items():
                    problems += _key_order_problems(prop, f"{path}.properties.{name}")
            elif key not in ("enum", "examples"):
                problems += _key_order_problems(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            problems += _key_order_problems(item, f"{path}[{i}]")
    return problems


def test_every_node_has_one_key_order(everything: dict[str, Any]) -> None:
    assert _key_order_problems(everything) == []
    assert _key_order_problems(model_schema(Shapes)) == []
    assert _key_order_problems({"type": "x", "b": 1, "a": 2}) != []  # the probe can fail


class _Opaque:
    pass


@pytest.mark.parametrize(
    ("annotation", "match"),
    [
        (Callable[[int], int], r"parameter 'value' of type .*Callable.* cannot be described"),
        (Iterable[int], r"parameter 'value' .* validated only while the tool iterates"),
        (_Opaque, r"parameter 'value' of type _Opaque cannot be described"),
    ],
)
def test_types_without_a_schema_are_definition_errors(annotation: Any, match: str) -> None:
    model = create_model(
        "Bad", __config__=ConfigDict(arbitrary_types_allowed=True), value=(annotation, ...)
    )
    with pytest.raises(ToolDefinitionError, match=match):
        model_schema(model)


def test_non_finite_constraint_is_a_definition_error() -> None:
    class Inf(BaseModel):
        x: float = Field(examples=[float("inf")])

    cannot_carry = r"'Inf' puts a value JSON cannot carry in its schema"
    with pytest.raises(ToolDefinitionError, match=cannot_carry):
        model_schema(Inf)


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
    assert b'"required":["inner","query"]' in runs[0]
