"""Property tests: a tool's JSON schema says exactly what its validator accepts.

Hypothesis builds function signatures (int/float/str/bool, lists, Optional, Literal, unions,
nested models and dataclasses with defaults, with constraints), wraps them with `FunctionTool`
and throws near-miss JSON arguments at them. Two directions, checked with ``jsonschema``:

* whatever the tool accepts in strict JSON terms (pydantic strict mode, no coercion of "3" into
  3) the schema accepts: the schema hides nothing the tool takes;
* whatever the schema accepts the tool accepts (lax, as it really validates): the schema
  promises nothing the tool refuses.

Lax coercions (``"3"`` for an int) are leniency on top and are deliberately not advertised.
One known pydantic quirk is tolerated in the first direction, and only it: a ``Literal`` looks
values up with Python equality, so ``Literal[1]`` also takes ``true`` (``1 == True``) even in
strict mode, while the schema's ``"enum": [1]`` rightly does not list it.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import re
from typing import Annotated, Any, Literal, Optional, Union

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import Field, ValidationError, create_model

from ania_nb.tools import FunctionTool, ToolArgumentsError

# Strings never hold a newline: Python's re (used by jsonschema) lets "$" match before a final
# "\n", while JSON Schema's regex dialect (and pydantic's Rust regex) do not.
ALPHABET = "ab1é"
PATTERNS = [r"^[a-z]+$", r"^a", r"1", r"^[ab]{2}"]
LITERALS = ["a", "b", 1, 2, True, None]
_names = itertools.count()

Spec = tuple[Any, ...]


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


_SCALAR_KINDS = ["int", "float", "str", "bool", "literal"]
_CONTAINER_KINDS = ["list", "optional", "union", "model", "dataclass"]


def _spec_of(kind: str, depth: int) -> st.SearchStrategy[Spec]:
    bound = _maybe(st.integers(-3, 3))
    if kind in ("int", "float"):
        return st.tuples(st.just(kind), bound, bound)
    if kind == "str":
        return st.tuples(
            st.just(kind),
            _maybe(st.integers(0, 3)),
            _maybe(st.integers(0, 5)),
            _maybe(st.sampled_from(PATTERNS)),
        )
    if kind == "bool":
        return st.just((kind,))
    if kind == "literal":
        values = st.lists(
            st.sampled_from(LITERALS), min_size=1, max_size=3, unique_by=lambda v: (type(v), v)
        )
        return st.tuples(st.just(kind), values.map(tuple))
    inner = specs(depth + 1)
    if kind == "list":
        return st.tuples(st.just(kind), inner, _maybe(st.integers(0, 2)), _maybe(st.integers(1, 3)))
    if kind == "optional":
        return st.tuples(st.just(kind), inner)
    if kind == "union":
        return st.tuples(st.just(kind), inner, inner)
    return st.tuples(st.just(kind), _fields(inner))


def specs(depth: int = 0) -> st.SearchStrategy[Spec]:
    """A parameter type: the kind is drawn first (evenly), nesting stops at depth 2."""
    kinds = _SCALAR_KINDS + (_CONTAINER_KINDS if depth < 2 else [])
    return st.sampled_from(kinds).flatmap(lambda kind: _spec_of(kind, depth))


def _fields(inner: st.SearchStrategy[Spec]) -> st.SearchStrategy[tuple[tuple[Spec, bool], ...]]:
    return st.lists(st.tuples(inner, st.booleans()), min_size=1, max_size=3).map(tuple)


PARAMETERS = specs()


def _constrained(tp: Any, **constraints: Any) -> Any:
    given_ = {k: v for k, v in constraints.items() if v is not None}
    return Annotated[tp, Field(**given_)] if given_ else tp


def annotation(spec: Spec) -> Any:
    """The Python type a spec stands for."""
    kind = spec[0]
    if kind == "int":
        return _constrained(int, ge=spec[1], le=spec[2])
    if kind == "float":
        return _constrained(float, ge=spec[1], le=spec[2])
    if kind == "str":
        return _constrained(str, min_length=spec[1], max_length=spec[2], pattern=spec[3])
    if kind == "bool":
        return bool
    if kind == "literal":
        return Literal.__getitem__(spec[1])
    if kind == "list":
        return _constrained(list[annotation(spec[1])], min_length=spec[2], max_length=spec[3])
    if kind == "optional":
        return Optional[annotation(spec[1])]  # noqa: UP045
    if kind == "union":
        return Union[annotation(spec[1]), annotation(spec[2])]  # noqa: UP007
    name = f"{kind.title()}{next(_names)}"
    fields = [(f"f{i}", annotation(sub), required) for i, (sub, required) in enumerate(spec[1])]
    if kind == "model":
        return create_model(
            name, **{n: (tp, ... if required else None) for n, tp, required in fields}
        )
    ordered = sorted(fields, key=lambda f: not f[2])  # dataclass: fields without default first
    return dataclasses.make_dataclass(
        name,
        [
            (n, tp) if required else (n, tp, dataclasses.field(default=None))
            for n, tp, required in ordered
        ],
    )


def _bounded(lo: int | None, hi: int | None) -> tuple[int, int]:
    return (-5 if lo is None else lo), (5 if hi is None else hi)


def valid(spec: Spec) -> st.SearchStrategy[Any]:
    """JSON values the spec should accept (empty when its constraints contradict)."""
    kind = spec[0]
    if kind == "int":
        lo, hi = _bounded(spec[1], spec[2])
        return st.integers(lo, hi) if lo <= hi else st.nothing()
    if kind == "float":
        lo, hi = _bounded(spec[1], spec[2])
        return st.floats(lo, hi) | st.integers(lo, hi) if lo <= hi else st.nothing()
    if kind == "str":
        low, high, pattern = spec[1] or 0, spec[2], spec[3]
        if high is not None and high < low:
            return st.nothing()
        text = st.text(ALPHABET, min_size=low, max_size=high if high is not None else low + 4)
        return text.filter(lambda s: re.search(pattern, s) is not None) if pattern else text
    if kind == "bool":
        return st.booleans()
    if kind == "literal":
        return st.sampled_from(spec[1])
    if kind == "list":
        low, high = spec[2] or 0, spec[3]
        if high is not None and high < low:
            return st.nothing()
        items = valid(spec[1])
        if items.is_empty:  # no valid item: only the empty list, if that is allowed
            return st.just([]) if low == 0 else st.nothing()
        return st.lists(items, min_size=low, max_size=high if high is not None else 3)
    if kind == "optional":
        return st.none() | valid(spec[1])
    if kind == "union":
        return valid(spec[1]) | valid(spec[2])
    return valid_object(spec[1])


def valid_object(fields: tuple[tuple[Spec, bool], ...]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects with every required field and some optional ones, all valid."""
    return st.fixed_dictionaries(
        {f"f{i}": valid(spec) for i, (spec, required) in enumerate(fields) if required},
        optional={
            f"f{i}": valid(spec) for i, (spec, required) in enumerate(fields) if not required
        },
    )


# Values just off each scalar kind: wrong JSON type, a coercible spelling, out of every bound.
_OFF: dict[str, list[Any]] = {
    "int": [-6, -4, 4, 6, 2.5, -1.5, 1.0, "3", True, None],
    "float": [-6.5, -3.5, 3.5, 6, "1.5", True, None],
    "str": ["", "a", "ab", "b1", "aé1ab", "abab1é", 0, None],
    "bool": [0, 1, "true", None, "yes"],
    "literal": [*LITERALS, 1.0, 0, "1", "c", False],
}
_SHAPES: list[Any] = [None, "x", 0, [], {}]


def variants(spec: Spec, value: Any) -> list[Any]:
    """Every value one change away from ``value`` (valid for ``spec``), at any depth."""
    kind = spec[0]
    if kind in _OFF:
        return _OFF[kind]
    if kind == "optional":
        return variants(spec[1], value)
    if kind == "union":
        return variants(spec[1], value) + variants(spec[2], value)
    if kind == "list":
        out: list[Any] = [*_SHAPES, [None]]
        if isinstance(value, list) and value:
            out.append([*value, value[0]])  # one item too many
            out.append(value[1:])  # one item too few
            out += [[item, *value[1:]] for item in variants(spec[1], value[0])]
        return out
    return _SHAPES + object_variants(spec[1], value) if isinstance(value, dict) else _SHAPES


def object_variants(fields: tuple[tuple[Spec, bool], ...], value: dict[str, Any]) -> list[Any]:
    """``value`` with one field replaced by a variant or removed, or with an unknown key."""
    out: list[Any] = [{**value, "zz": 1}]
    for i, (spec, _) in enumerate(fields):
        key = f"f{i}"
        out.append({k: v for k, v in value.items() if k != key})
        out += [{**value, key: other} for other in variants(spec, value.get(key))]
    return out


def generated_tool(fields: tuple[tuple[Spec, bool], ...]) -> FunctionTool:
    """A `FunctionTool` over a function whose signature is the generated one."""
    params = [
        inspect.Parameter(
            f"f{i}",
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if required else None,
            annotation=annotation(spec),
        )
        for i, (spec, required) in enumerate(fields)
    ]

    def generated(**kwargs: Any) -> None:
        return None

    generated.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    generated.__annotations__ = {p.name: p.annotation for p in params}
    return FunctionTool(generated, description="Generated.")


def _enum_by_python_equality(
    validator: Any, enums: list[Any], instance: Any, schema: dict[str, Any]
) -> Any:
    if not any(instance == value for value in enums):
        yield jsonschema.ValidationError(f"{instance!r} is not one of {enums!r}")


_json_type = jsonschema.Draft202012Validator.VALIDATORS["type"]


def _type_unless_an_enum_lists_it(
    validator: Any, types: Any, instance: Any, schema: dict[str, Any]
) -> Any:
    enums = schema.get("enum")
    if isinstance(enums, list) and any(instance == value for value in enums):
        return  # the enum decides (pydantic's Literal sets "type" from its values)
    yield from _json_type(validator, types, instance, schema)


# The schema as pydantic's Literal reads it (see the module docstring), for the first direction.
PythonEqualityValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {"enum": _enum_by_python_equality, "type": _type_unless_an_enum_lists_it},
)


def tool_accepts(tool: FunctionTool, arguments: dict[str, Any]) -> bool:
    """What ``invoke`` accepts: the unknown-key check, then pydantic in lax mode."""
    try:
        tool._validate(arguments)
    except ToolArgumentsError:
        return False
    return True


def tool_accepts_strictly(tool: FunctionTool, arguments: dict[str, Any]) -> bool:
    """The same, but without coercions: pydantic strict mode on the JSON text."""
    if not tool_accepts(tool, arguments):
        return False
    try:
        tool.params_model.model_validate_json(json.dumps(arguments), strict=True)
    except ValidationError:
        return False
    return True


@settings(
    max_examples=100,
    deadline=None,
    database=None,  # no example files in the working tree
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
@given(fields=_fields(PARAMETERS), data=st.data())
def test_schema_and_validator_agree(fields: tuple[tuple[Spec, bool], ...], data: Any) -> None:
    tool = generated_tool(fields)
    schema = tool.parameters_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    python_equality = PythonEqualityValidator(schema)
    objects = valid_object(fields)
    if objects.is_empty:  # contradictory constraints: only near misses can be tried
        samples: list[dict[str, Any]] = [{}]
    else:
        samples = [data.draw(objects) for _ in range(3)]
    # Each valid sample, and everything one change away from it (hypothesis picks the samples,
    # the near misses are enumerated so every constraint and type is probed every time).
    for arguments in [*samples, *(v for s in samples for v in object_variants(fields, s))]:
        in_schema = validator.is_valid(arguments)
        if tool_accepts_strictly(tool, arguments):
            assert python_equality.is_valid(arguments), (
                f"the tool takes {arguments!r} but the schema refuses it: {schema}"
            )
        if in_schema:
            assert tool_accepts(tool, arguments), (
                f"the schema allows {arguments!r} but the tool refuses it: {schema}"
            )


def test_the_checks_can_fail() -> None:
    # A schema that forgot a constraint is caught by the second direction ...
    tool = generated_tool(((("int", 0, None), True),))
    loose = {**tool.parameters_schema(), "properties": {"f0": {"type": "integer"}}}
    assert jsonschema.Draft202012Validator(loose).is_valid({"f0": -1})
    assert not tool_accepts(tool, {"f0": -1})
    # ... one that says number where the tool takes only integers by the first one, and the
    # Python-equality reading of enums tolerates 1 == True but nothing wider.
    assert tool_accepts_strictly(tool, {"f0": 3})
    assert not PythonEqualityValidator({"type": "string"}).is_valid(3)
    literal = generated_tool(((("literal", (1,)), True),))
    assert tool_accepts_strictly(literal, {"f0": True})  # the quirk itself
    assert PythonEqualityValidator(literal.parameters_schema()).is_valid({"f0": True})
    assert not PythonEqualityValidator(literal.parameters_schema()).is_valid({"f0": "1"})
