"""Function and class tools, and the shared / session executors, driven through real calls."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import traceback
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

import ania_nb.tools as tools_pkg
from ania_nb.errors import ToolDefinitionError, ToolError, ToolSignal
from ania_nb.tools import (
    BaseTool,
    FunctionTool,
    SessionToolExecutor,
    Tool,
    ToolArgumentsError,
    ToolContext,
    ToolExecutor,
    dumps_canonical,
    result_to_text,
    tool,
)

# --------------------------------------------------------------------------- sample tools


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


ADD_SCHEMA = '{"type":"object","additionalProperties":false,"properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"]}'  # noqa: E501


@tool
def ping() -> str:
    """Answer pong."""
    return "pong"


@tool
def fail_tool_error() -> str:
    """Fail on purpose, for the model."""
    raise ToolError("the city 'Atlantis' does not exist")


@tool
def fail_denied() -> str:
    """Be denied."""
    raise ToolSignal("blocked by plan mode")  # any tool signal passes its message on


@tool
def boom() -> str:
    """Crash with a bug."""
    raise ValueError("bad value")


class Row(BaseModel):
    name: str


@tool
def rows(items: list[Row]) -> int:
    """Count rows."""
    return len(items)


def make(name: str, text: str) -> FunctionTool:
    """A no-argument tool with a given name that returns ``text``."""

    def fn() -> str:
        return text

    return FunctionTool(fn, name=name, description=f"returns {text}")


# --------------------------------------------------------------------------- @tool


async def test_sync_tool_runs_off_the_loop_thread() -> None:
    @tool
    def where() -> int:
        """Report the thread."""
        return threading.get_ident()

    executor = ToolExecutor()
    executor.add(where)
    outcome = await executor.execute("where", "{}")
    assert int(outcome.text) != threading.get_ident()


async def test_async_tool_runs_on_the_loop() -> None:
    @tool
    async def where() -> int:
        """Report the thread."""
        await asyncio.sleep(0)
        return threading.get_ident()

    assert int(await where.invoke({}, ToolContext())) == threading.get_ident()


def test_tool_keeps_the_function_callable() -> None:
    assert add(2, 3) == 5
    assert add.__name__ == "add"
    assert isinstance(add, Tool)
    assert add.params_model.__name__ == "AddParams"


def test_docstring_summary_and_args_section() -> None:
    @tool(side_effects=True)
    def web_search(query: str, page: int = 1) -> str:
        """Search the web.

        Args:
            query (str): what to look
                for.
            page: 1-based page number.
        """
        return query

    assert web_search.side_effects is True
    assert web_search.definition() == {
        "type": "function",
        "function": {
            "name": "web_search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "query": {"type": "string", "description": "what to look for."},
                    "page": {"type": "integer", "description": "1-based page number."},
                },
                "required": ["query"],
            },
        },
    }


def test_field_and_annotated_descriptions_win_over_docstring() -> None:
    @tool(name="describe", description="  Explicit description.  ")
    def fn(
        a: Annotated[int, Field(description="from Annotated Field")],
        b: Annotated[int, "from Annotated text"],
        c: int = Field(3, description="from default Field", ge=0),
        d: int = 4,
    ) -> None:
        """Ignored.

        Args:
            a: docstring a
            b: docstring b
            c: docstring c
            d: docstring d
        """

    assert fn.name == "describe"
    assert fn.description == "Explicit description."
    props = fn.parameters_schema()["properties"]
    assert [props[k]["description"] for k in "abcd"] == [
        "from Annotated Field",
        "from Annotated text",
        "from default Field",
        "docstring d",
    ]
    assert fn.parameters_schema()["required"] == ["a", "b"]


async def test_field_constraints_from_default_still_validate() -> None:
    @tool
    def pos(c: int = Field(3, description="non-negative", ge=0)) -> int:
        """Echo c."""
        return c

    assert await pos.invoke({}, ToolContext()) == "3"
    with pytest.raises(ToolArgumentsError, match="field 'c': Input should be greater than"):
        await pos.invoke({"c": -1}, ToolContext())


async def test_context_is_injected_and_hidden_from_the_schema() -> None:
    @tool
    async def whoami(greeting: str, ctx: ToolContext) -> str:
        """Say who is calling."""
        ctx.run_state["seen"] = True
        return f"{greeting} {ctx.session}/{ctx.agent_kind}"

    assert whoami.parameters_schema()["properties"].keys() == {"greeting"}
    ctx = ToolContext(session="nb:1", agent_kind="subagent")
    assert await whoami.invoke({"greeting": "hi"}, ctx) == "hi nb:1/subagent"
    assert ctx.run_state == {"seen": True}


async def test_parameter_shadowing_basemodel_attributes() -> None:
    @tool
    def shadow(json: str, copy: int = 1) -> str:
        """Use awkward names."""
        return f"{json}:{copy}"

    assert list(shadow.parameters_schema()["properties"]) == ["json", "copy"]
    assert await shadow.invoke({"json": "j", "copy": 2}, ToolContext()) == "j:2"


async def test_lax_coercion() -> None:
    assert await add.invoke({"a": "3", "b": 4.0}, ToolContext()) == "7"


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: tool(name="bad name")(ping.func), r"tool name 'bad name' is invalid"),
        (lambda: tool(name="x" * 65)(ping.func), r"is invalid"),
        (lambda: tool(_varargs), r"_varargs, parameter 'args': \*args/\*\*kwargs"),
        (lambda: tool(_varkw), r"_varkw, parameter 'kw': \*args/\*\*kwargs"),
        (lambda: tool(_unannotated), r"_unannotated, parameter 'b' has no type annotation"),
        (lambda: tool(_posonly), r"_posonly, parameter 'a': positional-only"),
        (lambda: tool(_undocumented), r"_undocumented has no description"),
        (lambda: tool(_generator), r"_generator is a generator \(it yields\); a tool must return"),
        (lambda: tool(_async_generator), r"_async_generator is a generator"),
        (lambda: tool(_lazy_param), r"_lazy_param: parameter 'items' .* use list\[\.\.\.\]"),
        (lambda: tool(_callable_param), r"_callable_param: parameter 'fn' .* cannot be described"),
    ],
)
def test_bad_function_definitions(build: Any, match: str) -> None:
    with pytest.raises(ToolDefinitionError, match=match):
        build()


def _varargs(*args: int) -> None:
    """Doc."""


def _varkw(a: int, **kw: int) -> None:
    """Doc."""


def _unannotated(a: int, b) -> None:  # type: ignore[no-untyped-def]
    """Doc."""


def _posonly(a: int, /) -> None:
    """Doc."""


def _undocumented(a: int) -> None:
    pass


def _generator(n: int) -> Iterator[int]:
    """Doc."""
    yield n


async def _async_generator(n: int) -> AsyncIterator[int]:
    """Doc."""
    yield n


def _lazy_param(items: Iterable[int]) -> int:
    """Doc."""
    return sum(items)


def _callable_param(fn: Callable[[int], int]) -> int:
    """Doc."""
    return fn(1)


# --------------------------------------------------------------------------- BaseTool


class Greeting(BaseModel):
    who: str
    times: int = 1


class AsyncGreet(BaseTool[Greeting]):
    """Greet someone,

    politely."""

    name = "greet"

    async def execute(self, params: Greeting, ctx: ToolContext) -> str:
        await asyncio.sleep(0)
        return " ".join([f"hello {params.who}"] * params.times)


class SyncGreet(BaseTool[Greeting]):
    """Greet from a thread."""

    name = "sync_greet"
    side_effects = True

    def execute(self, params: Greeting, ctx: ToolContext) -> dict[str, Any]:
        return {"who": params.who, "thread": threading.get_ident()}


async def test_base_tool_async_execute() -> None:
    greet = AsyncGreet()
    assert isinstance(greet, Tool)
    assert greet.description == "Greet someone,\n\npolitely."
    assert greet.side_effects is False
    assert await greet.invoke({"who": "Ania", "times": 2}, ToolContext()) == "hello Ania hello Ania"


async def test_base_tool_sync_execute_runs_in_a_thread() -> None:
    tool_ = SyncGreet()
    assert tool_.side_effects is True
    result = json.loads(await tool_.invoke({"who": "Ania"}, ToolContext()))
    assert result["who"] == "Ania"
    assert result["thread"] != threading.get_ident()


def test_base_tool_schema_is_cached_per_class() -> None:
    assert AsyncGreet().parameters_schema() is AsyncGreet().parameters_schema()
    assert AsyncGreet().parameters_schema()["required"] == ["who"]


def test_base_tool_bad_definitions() -> None:
    with pytest.raises(ToolDefinitionError, match=r"NoParams does not name its parameter model"):

        class NoParams(BaseTool):  # type: ignore[type-arg]
            """Doc."""

            name = "no_params"

    with pytest.raises(ToolDefinitionError, match=r"BadName: tool name 'has space' is invalid"):

        class BadName(BaseTool[Greeting]):
            """Doc."""

            name = "has space"

    with pytest.raises(ToolDefinitionError, match=r"NoDoc has no description"):

        class NoDoc(BaseTool[Greeting]):
            name = "no_doc"

    with pytest.raises(ToolDefinitionError, match=r"NoExecute does not implement execute"):

        class NoExecute(BaseTool[Greeting]):
            """Doc."""

            name = "no_execute"

    with pytest.raises(ToolDefinitionError, match=r"Yields: execute\(\) is a generator"):

        class Yields(BaseTool[Greeting]):
            """Doc."""

            name = "yields"

            def execute(self, params: Greeting, ctx: ToolContext) -> Iterator[str]:
                yield params.who


def test_recursive_params_model_is_a_definition_error() -> None:
    class Tree(BaseModel):
        kids: list[Tree] = []

    Tree.model_rebuild()
    with pytest.raises(ToolDefinitionError, match=r"TreeTool: .*'Tree' refers to itself"):

        class TreeTool(BaseTool[Tree]):
            """Doc."""

            name = "tree"

            def execute(self, params: Tree, ctx: ToolContext) -> None:
                return None


def test_generic_intermediate_base_is_allowed() -> None:
    from typing import TypeVar

    P = TypeVar("P", bound=BaseModel)

    class Middle(BaseTool[P]):
        """Shared behaviour."""

    class Leaf(Middle[Greeting]):
        """A concrete leaf."""

        name = "leaf"

        def execute(self, params: Greeting, ctx: ToolContext) -> str:
            return params.who

    assert Leaf.params_model is Greeting


# --------------------------------------------------------------------------- conversion


class Out(BaseModel):
    x: int


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain", "plain"),
        (None, "done"),
        (Out(x=1), '{"x":1}'),
        ({"città": [1, 2.5, True, None]}, '{"città": [1, 2.5, true, null]}'),
        ([Out(x=2)], '[{"x": 2}]'),
        (3, "3"),
        ({1, 2} - {1, 2}, '"set()"'),
    ],
)
def test_result_to_text(value: Any, text: str) -> None:
    assert result_to_text(value) == text


# --------------------------------------------------------------------------- execute


@pytest.fixture
def shared() -> ToolExecutor:
    executor = ToolExecutor()
    for t in (ping, add, boom, fail_tool_error, fail_denied, rows):
        executor.add(t)
    return executor


async def test_success_outcome(shared: ToolExecutor) -> None:
    outcome = await shared.execute("add", '{"a": 1, "b": 2}')
    assert (outcome.text, outcome.error) == ("3", None)
    assert isinstance(outcome.duration_ms, int)
    assert outcome.duration_ms >= 0


async def test_unknown_tool_lists_session_and_shared_names_sorted(shared: ToolExecutor) -> None:
    session = SessionToolExecutor(shared)
    session.add(make("aaa_session", "x"))
    outcome = await session.execute("nope", "{}")
    names = "aaa_session, add, boom, fail_denied, fail_tool_error, ping, rows"
    expected = f"Error executing tool: tool 'nope' not found. Available tools: [{names}]"
    assert outcome.text == expected
    assert outcome.error == outcome.text.removeprefix("Error executing tool: ")


@pytest.mark.parametrize("empty", [None, "", "   \n", {}])
async def test_empty_arguments_mean_no_arguments(shared: ToolExecutor, empty: Any) -> None:
    outcome = await shared.execute("ping", empty)
    assert (outcome.text, outcome.error) == ("pong", None)


async def test_malformed_json(shared: ToolExecutor) -> None:
    outcome = await shared.execute("add", '{"a": 1,')
    assert outcome.text == (
        "Error executing tool: failed to parse arguments for tool 'add': "
        "Expecting property name enclosed in double quotes: line 1 column 9 (char 8)\n"
        'Arguments: {"a": 1,\n'
        f"Expected schema: {ADD_SCHEMA}"
    )


async def test_arguments_the_engine_stored_wrapped_are_reported_as_sent(
    shared: ToolExecutor,
) -> None:
    # engine/_llm_wire.py stores non-object arguments as {"_raw": text} to keep history valid
    outcome = await shared.execute("add", json.dumps({"_raw": "[1, 2]"}))
    assert outcome.text == (
        "Error executing tool: failed to parse arguments for tool 'add': "
        "arguments must be a JSON object, got array\n"
        "Arguments: [1, 2]\n"
        f"Expected schema: {ADD_SCHEMA}"
    )
    from_mapping = await shared.execute("add", {"_raw": '{"a": 1,'})
    assert from_mapping.error is not None
    assert from_mapping.error.startswith("failed to parse arguments for tool 'add': Expecting")
    # a real key next to it is not the engine's wrapping: reported as an unknown argument
    mixed = await shared.execute("add", {"_raw": "x", "a": 1, "b": 2})
    assert mixed.error is not None and "unknown argument '_raw'" in mixed.error


async def test_raw_arguments_truncated_to_500(shared: ToolExecutor) -> None:
    raw = "{" + "x" * 1000
    outcome = await shared.execute("add", raw)
    assert f"\nArguments: {raw[:497]}...\n" in outcome.text  # 500 characters, the "..." included


async def test_non_object_json(shared: ToolExecutor) -> None:
    outcome = await shared.execute("add", "[1, 2]")
    assert outcome.text == (
        "Error executing tool: failed to parse arguments for tool 'add': "
        "arguments must be a JSON object, got array\n"
        "Arguments: [1, 2]\n"
        f"Expected schema: {ADD_SCHEMA}"
    )


async def test_wrong_type_names_the_field(shared: ToolExecutor) -> None:
    outcome = await shared.execute("add", '{"a": 1, "b": "x"}')
    assert outcome.text == (
        "Error executing tool: invalid arguments for tool 'add': field 'b': Input should be a "
        "valid integer, unable to parse string as an integer (got 'x')\n"
        f"Expected schema: {ADD_SCHEMA}"
    )


async def test_missing_fields_one_line_each(shared: ToolExecutor) -> None:
    outcome = await shared.execute("add", '{"b": [1]}')
    assert outcome.text == (
        "Error executing tool: invalid arguments for tool 'add' (2 errors):\n"
        "field 'a' is required\n"
        "field 'b': Input should be a valid integer (got [1])\n"
        f"Expected schema: {ADD_SCHEMA}"
    )


async def test_unknown_keys_are_reported_with_the_accepted_ones(shared: ToolExecutor) -> None:
    outcome = await shared.execute("add", '{"a": 1, "b": 2, "c": 3, "verbose": true}')
    assert outcome.text == (
        "Error executing tool: invalid arguments for tool 'add': unknown arguments 'c', "
        "'verbose' (accepted: 'a', 'b')\n"
        f"Expected schema: {ADD_SCHEMA}"
    )
    lone = await shared.execute("ping", '{"x": 1}')
    assert lone.error == (
        "invalid arguments for tool 'ping': unknown argument 'x' (this tool takes no arguments)\n"
        'Expected schema: {"type":"object","additionalProperties":false,"properties":{},'
        '"required":[]}'
    )


async def test_unknown_keys_and_field_errors_come_together(shared: ToolExecutor) -> None:
    outcome = await shared.execute("add", '{"a": "x", "sum": 3}')
    assert outcome.error == (
        "invalid arguments for tool 'add' (3 errors):\n"
        "unknown argument 'sum' (accepted: 'a', 'b')\n"
        "field 'a': Input should be a valid integer, unable to parse string as an integer "
        "(got 'x')\n"
        "field 'b' is required\n"
        f"Expected schema: {ADD_SCHEMA}"
    )


async def test_unknown_keys_for_class_tools_and_aliases() -> None:
    with pytest.raises(
        ToolArgumentsError, match=r"unknown argument 'whom' \(accepted: 'who', 'times'\)"
    ):
        await AsyncGreet().invoke({"who": "x", "whom": "y"}, ToolContext())

    @tool
    def shadow(json: str) -> str:
        """A parameter that travels under an alias."""
        return json

    assert await shadow.invoke({"json": "j"}, ToolContext()) == "j"
    with pytest.raises(ToolArgumentsError, match=r"unknown argument 'param_json'") as info:
        await shadow.invoke({"param_json": "j"}, ToolContext())
    assert info.value.field == "param_json"


async def test_a_model_that_allows_extra_keys_still_gets_them() -> None:
    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        who: str

    class OpenTool(BaseTool[Open]):
        """Echo every argument."""

        name = "open_tool"

        def execute(self, params: Open, ctx: ToolContext) -> dict[str, Any]:
            return params.model_dump()

    assert "additionalProperties" in OpenTool().parameters_schema()
    text = await OpenTool().invoke({"who": "a", "more": 1}, ToolContext())
    assert json.loads(text) == {"who": "a", "more": 1}


async def test_nested_field_path_is_dotted() -> None:
    with pytest.raises(ToolArgumentsError) as info:
        await rows.invoke({"items": [{"name": "ok"}, {}]}, ToolContext())
    assert info.value.tool == "rows"
    assert info.value.field == "items.1.name"
    assert str(info.value) == "invalid arguments for tool 'rows': field 'items.1.name' is required"


async def test_tool_error_and_denied_pass_their_message(shared: ToolExecutor) -> None:
    outcome = await shared.execute("fail_tool_error", "{}")
    assert outcome.text == "Error executing tool: the city 'Atlantis' does not exist"
    assert outcome.error == "the city 'Atlantis' does not exist"
    denied = await shared.execute("fail_denied", "{}")
    assert denied.text == "Error executing tool: blocked by plan mode"


async def test_unexpected_exception_is_contained(shared: ToolExecutor) -> None:
    outcome = await shared.execute("boom", "{}")
    assert outcome.text == (
        "Error executing tool: tool 'boom' execution failed: ValueError: bad value"
    )


async def test_a_crashing_tool_is_logged_at_warning_with_its_traceback(
    shared: ToolExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ania_nb.tools"):
        await shared.execute("boom", "{}")
    [record] = [r for r in caplog.records if r.name == "ania_nb.tools.executor"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "tool 'boom' raised ValueError"
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    frames = [frame.name for frame in traceback.extract_tb(record.exc_info[2])]
    assert frames[-1] == "boom"  # down to the line in the tool that raised


async def test_a_run_whose_tool_crashes_logs_what_the_model_only_summarises(
    llm: Any, make_agent: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    from ania_nb.testing import reply, tool_call

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        table = {"a": "1"}
        return table[key]

    llm.script(reply(tool_calls=[tool_call("lookup", {"key": "b"})]), reply("sorry"))
    agent = make_agent(tools=[lookup])
    with caplog.at_level(logging.WARNING):
        result = await agent.chat("look b up")
    assert result.tool_calls[0].error == "tool 'lookup' execution failed: KeyError: 'b'"
    [record] = [r for r in caplog.records if r.name == "ania_nb.tools.executor"]
    assert "return table[key]" in caplog.text  # the source line, from the logged traceback
    assert record.levelno == logging.WARNING


async def test_cancellation_propagates() -> None:
    started = asyncio.Event()

    @tool
    async def hang() -> str:
        """Wait forever."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    executor = ToolExecutor()
    executor.add(hang)
    task = asyncio.create_task(executor.execute("hang", "{}"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# --------------------------------------------------------------------------- tables


def test_add_remove_contains_len_version() -> None:
    executor = ToolExecutor()
    assert executor.version == 0

    def double(x: int) -> int:
        """Double x."""
        return 2 * x

    wrapped = executor.add(double)
    assert isinstance(wrapped, FunctionTool)
    assert executor.get("double") is wrapped
    assert "double" in executor
    assert len(executor) == 1
    assert executor.version == 1
    with pytest.raises(ToolDefinitionError, match="'double' is already registered"):
        executor.add(double)
    executor.add(double, replace=True)
    assert executor.version == 2
    executor.add(AsyncGreet)  # a BaseTool class is instantiated
    assert executor.names() == ["double", "greet"]
    assert executor.remove("double") is True
    assert executor.remove("double") is False
    assert executor.version == 4
    assert "double" not in executor
    with pytest.raises(ToolDefinitionError, match="not a BaseTool subclass"):
        executor.add(Greeting)  # type: ignore[arg-type]


async def test_session_tool_overrides_shared(shared: ToolExecutor) -> None:
    shared.add(make("clash", "shared"))
    session = SessionToolExecutor(shared)
    session.add(make("clash", "session"))
    names = [d["function"]["name"] for d in session.definitions()]
    assert names.count("clash") == 1
    clash = next(d for d in session.definitions() if d["function"]["name"] == "clash")
    assert clash["function"]["description"] == "returns session"
    assert (await session.execute("clash", "{}")).text == "session"
    assert (await shared.execute("clash", "{}")).text == "shared"
    assert session.remove("clash") is True
    assert (await session.execute("clash", "{}")).text == "shared"
    assert session.remove("ping") is False  # shared tools are not the session's to remove


def test_definitions_sorted_cached_and_rebuilt(shared: ToolExecutor) -> None:
    session = SessionToolExecutor(shared)
    first = session.definitions()
    names = [d["function"]["name"] for d in first]
    assert names == sorted(names)
    assert session.definitions() is first
    assert session.definitions_json() is session.definitions_json()
    assert json.loads(session.definitions_json()) == first
    assert shared.definitions() is shared.definitions()

    session.add(make("zzz", "z"))
    second = session.definitions()
    assert second is not first
    assert second[-1]["function"]["name"] == "zzz"

    shared.add(make("aaa", "a"))
    third = session.definitions()
    assert third is not second
    assert third[0]["function"]["name"] == "aaa"

    shared.remove("aaa")
    session.remove("zzz")
    assert session.definitions() is not third
    assert session.definitions() == first


def test_definitions_json_independent_of_insertion_order() -> None:
    tools = [ping, add, rows, AsyncGreet(), make("m", "m")]
    one, two = ToolExecutor(), ToolExecutor()
    for t in tools:
        one.add(t)
    for t in reversed(tools):
        two.add(t)
    assert one.definitions_json() == two.definitions_json()
    assert one.definitions_json() == dumps_canonical(two.definitions())


async def test_concurrent_calls_registering_session_tools(shared: ToolExecutor) -> None:
    @tool
    def spawn(i: int, ctx: ToolContext) -> int:
        """Register a tool in the caller's session, then read the table."""
        assert ctx.executor is not None
        ctx.executor.add(make(f"dyn_{i:02d}", str(i)))
        return len(ctx.executor.definitions())

    @tool
    async def spawn_async(i: int, ctx: ToolContext) -> int:
        """Same, from the loop."""
        assert ctx.executor is not None
        ctx.executor.add(make(f"dyn_{i:02d}", str(i)))
        return len(ctx.executor.definitions())

    session = SessionToolExecutor(shared)
    session.add(spawn)
    session.add(spawn_async)
    base = len(session)
    outcomes = await asyncio.gather(
        *(
            session.execute("spawn" if i % 2 else "spawn_async", {"i": i}, ToolContext())
            for i in range(20)
        )
    )
    assert all(o.error is None for o in outcomes)
    assert all(base < int(o.text) <= base + 20 for o in outcomes)
    dynamic = [n for n in session.names() if n.startswith("dyn_")]
    assert dynamic == [f"dyn_{i:02d}" for i in range(20)]
    assert session.version == 2 + 20
    definitions = session.definitions()
    assert [d["function"]["name"] for d in definitions] == session.names()
    assert json.loads(session.definitions_json()) == definitions
    assert (await session.execute("dyn_07", None)).text == "7"
    assert "dyn_07" not in shared


def test_public_surface_is_sorted_and_complete() -> None:
    assert tools_pkg.__all__ == sorted(tools_pkg.__all__)
    assert all(hasattr(tools_pkg, name) for name in tools_pkg.__all__)
