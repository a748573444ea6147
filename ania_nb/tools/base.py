"""What a tool is: the `Tool` protocol, its call context, and the class form `BaseTool[P]`.

Every tool (class-based, function-based via `ania_nb.tools.tool`, MCP) satisfies `Tool`: a
name, a description, a parameters schema, and ``invoke`` which validates the model's arguments
and returns the text fed back to the model. Sync tool code runs in a worker thread (or, with
``@tool(process=True)``, in a child process that can be killed).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Generic,
    Literal,
    Protocol,
    TypeVar,
    runtime_checkable,
)

from pydantic import BaseModel, ValidationError

from ania_nb.engine.callbacks import NO_CALLBACKS, Callbacks
from ania_nb.errors import ToolDefinitionError, ToolError
from ania_nb.text import cut
from ania_nb.tools.schema import (
    accepted_arguments,
    function_definition,
    model_schema,
)

if TYPE_CHECKING:
    from ania_nb.config import SecuritySettings
    from ania_nb.tools.executor import SessionToolExecutor

__all__ = [
    "BaseTool",
    "FunctionTool",
    "Role",
    "Tool",
    "ToolArgumentsError",
    "ToolContext",
    "check_tool_name",
    "invoke_callable",
    "result_to_text",
    "tool",
]

P = TypeVar("P", bound=BaseModel)

_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_GOT_LIMIT = 200

Role = Literal["member", "trusted", "admin"]
"""Who stands behind a run in its chat, lowest first (`ania_nb.governance.roles`)."""


@dataclass
class ToolContext:
    """Everything a tool may need besides its arguments: session, front end, run scratch."""

    session: str = "default"
    callbacks: Callbacks = NO_CALLBACKS
    agent_kind: str = "main"  # main / clock / subagent / team_member
    call_id: str = ""
    executor: SessionToolExecutor | None = None
    run_state: dict[str, Any] = field(default_factory=dict)  # shared by the tools of one run
    extras: dict[str, Any] = field(default_factory=dict)
    sender: str | None = None  # who asked (approvals name them as the requester)
    admin_only_approval: bool = False  # nobody stands behind the run: only an admin may approve
    approved: bool = False  # set by the gate once a person allowed this very call
    plan_mode: bool = False  # plan mode for this run only (the session may be in it too)
    requesters: tuple[str, ...] = ()  # every sender the run answers (any may approve)
    # The run's role (the highest of its requesters'); a context made outside a run is the
    # local caller's, like ``sender=None``.
    role: Role = "admin"
    security: SecuritySettings | None = None  # what child processes inherit (process=True)

    def queue_image(self, url: str) -> None:
        """Queue an image (URL or data URI) for the model to see after this tool round."""
        self.run_state.setdefault("images", []).append(url)


@runtime_checkable
class Tool(Protocol):
    """The interface every tool satisfies (class, function and MCP tools alike)."""

    @property
    def name(self) -> str:
        """The function name the model calls (``^[a-zA-Z0-9_-]{1,64}$``)."""
        ...

    @property
    def description(self) -> str:
        """What the tool does, for the model."""
        ...

    @property
    def side_effects(self) -> bool:
        """Whether the tool changes the world (plan mode blocks such tools)."""
        ...

    def parameters_schema(self) -> dict[str, Any]:
        """Return the OpenAI ``parameters`` object (shared and cached: do not mutate)."""
        ...

    def definition(self) -> dict[str, Any]:
        """Return the OpenAI ``{"type": "function", "function": {...}}`` entry."""
        ...

    async def invoke(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        """Validate ``arguments`` and run; raises `ToolArgumentsError` when they are invalid."""
        ...


class ToolArgumentsError(ToolError):
    """The model called a tool with arguments that do not match its parameters."""

    def __init__(self, message: str, *, tool: str, field: str | None = None) -> None:
        super().__init__(message)
        self.tool = tool
        self.field = field

    @classmethod
    def from_validation_error(cls, tool: str, exc: ValidationError) -> ToolArgumentsError:
        """Explain each pydantic error on its own line, naming the field and what was sent."""
        return cls.from_problems(tool, _explain(exc))

    @classmethod
    def from_problems(cls, tool: str, problems: list[tuple[str, str]]) -> ToolArgumentsError:
        """Build the error from (field, explanation) pairs: one line each, the first field kept."""
        lines = [line for _, line in problems]
        head = f"invalid arguments for tool '{tool}'"
        if len(lines) == 1:
            message = f"{head}: {lines[0]}"
        else:
            message = f"{head} ({len(lines)} errors):\n" + "\n".join(lines)
        return cls(message, tool=tool, field=problems[0][0] if problems else None)


def _explain(exc: ValidationError) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(part) for part in err["loc"])
        subject = f"field '{loc}'" if loc else "arguments"
        if err["type"] == "missing":
            problems.append((loc, f"{subject} is required"))
        else:
            problems.append((loc, f"{subject}: {err['msg']} (got {_show(err.get('input'))})"))
    return problems


def _unknown_keys(unknown: list[str], schema: dict[str, Any]) -> str:
    shown = ", ".join(_show(key) for key in unknown)
    noun = "argument" if len(unknown) == 1 else "arguments"
    names = list(schema.get("properties", {}))
    if not names:
        return f"unknown {noun} {shown} (this tool takes no arguments)"
    return f"unknown {noun} {shown} (accepted: {', '.join(repr(n) for n in names)})"


def _show(value: Any) -> str:
    # Strings as the model sees them in Python repr ('x'); everything else as JSON.
    text = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    return cut(text, _GOT_LIMIT, marker="...")


def check_tool_name(name: object, owner: str) -> str:
    """Return ``name`` if it is a valid OpenAI function name, else raise `ToolDefinitionError`."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ToolDefinitionError(
            f"{owner}: tool name {name!r} is invalid; use 1-64 characters from a-z, A-Z, 0-9, "
            "'_' and '-'",
            tool=name if isinstance(name, str) else None,
        )
    return name


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return str(value)


def result_to_text(value: Any) -> str:
    """Convert a tool's return value to the text fed back to the model."""
    if isinstance(value, str):
        return value
    if value is None:
        return "done"
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False, default=_json_default)


async def invoke_callable(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Await an async callable, or run a sync one in a worker thread so the loop stays free."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


class _ModelTool:
    """What class and function tools share: a pydantic params model and its cached schema."""

    name: str
    description: str
    params_model: type[BaseModel]
    _schema: dict[str, Any]
    _accepted: frozenset[str] | None  # top-level keys the validator takes; None: any

    def parameters_schema(self) -> dict[str, Any]:
        """Return the OpenAI ``parameters`` object, computed once (shared: do not mutate)."""
        return self._schema

    def definition(self) -> dict[str, Any]:
        """Return the OpenAI function-tool entry."""
        return function_definition(self.name, self.description, self._schema)

    def _validate(self, arguments: dict[str, Any]) -> Any:
        # Unknown keys are reported, never silently dropped: the model believes it set them.
        problems: list[tuple[str, str]] = []
        accepted = self._accepted
        if accepted is not None and any(key not in accepted for key in arguments):
            unknown = [key for key in arguments if key not in accepted]
            problems.append((str(unknown[0]), _unknown_keys(unknown, self._schema)))
            arguments = {k: v for k, v in arguments.items() if k in accepted}
        try:
            params = self.params_model.model_validate(arguments)
        except ValidationError as exc:
            problems += _explain(exc)
        if problems:
            raise ToolArgumentsError.from_problems(self.name, problems)
        return params


class BaseTool(_ModelTool, Generic[P]):
    """Class form of a tool: ``class Add(BaseTool[AddParams])`` with an ``execute`` method.

    ``name`` is required; ``description`` defaults to the class docstring; ``side_effects``
    marks tools that change the world (plan mode blocks them). ``execute`` may be sync (it then
    runs in a worker thread) or async, and may return any value (see `result_to_text`).
    """

    # name, description, params_model and the schema are per-class values (set on the class).
    side_effects: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        params = _params_from_bases(cls)
        if params is None and cls.__dict__.get("__parameters__"):
            return  # still generic (an intermediate base such as MCPTool[P]); checked later
        owner = f"tool class {cls.__qualname__}"
        if params is None:
            raise ToolDefinitionError(
                f"{owner} does not name its parameter model; declare it as "
                f"class {cls.__name__}(BaseTool[{cls.__name__}Params]) with a pydantic model"
            )
        check_tool_name(getattr(cls, "name", None), owner)
        own_doc = cls.__dict__.get("__doc__")
        if "description" not in cls.__dict__ and own_doc:
            cls.description = inspect.cleandoc(own_doc).strip()
        description = getattr(cls, "description", "")
        if not isinstance(description, str) or not description.strip():
            raise ToolDefinitionError(
                f"{owner} has no description; add a class docstring or set description = '...'",
                tool=cls.name,
            )
        if cls.execute is BaseTool.execute:
            raise ToolDefinitionError(f"{owner} does not implement execute()", tool=cls.name)
        _refuse_generator(cls.execute, f"{owner}: execute()", cls.name)
        cls.params_model = params
        try:
            cls._schema = model_schema(params)
        except ToolDefinitionError as exc:
            raise ToolDefinitionError(f"{owner}: {exc}", tool=cls.name) from exc
        cls._accepted = accepted_arguments(params)

    def execute(self, params: P, ctx: ToolContext) -> Any | Awaitable[Any]:
        """Run the tool with validated parameters (override as ``def`` or ``async def``)."""
        raise NotImplementedError

    async def invoke(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        """Validate the arguments (lax, as pydantic coerces), run ``execute``, return text."""
        params = self._validate(arguments)
        return result_to_text(await invoke_callable(self.execute, params, ctx))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} tool {self.name!r}>"


def _refuse_generator(fn: Callable[..., Any], owner: str, name: str) -> None:
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise ToolDefinitionError(
            f"{owner} is a generator (it yields); a tool must return its result, "
            "e.g. collect the items into a list and return that",
            tool=name,
        )


def _params_from_bases(cls: type) -> type[BaseModel] | None:
    # types.get_original_bases is 3.12+; __orig_bases__ holds BaseTool[X] on 3.11 too.
    for base in cls.__dict__.get("__orig_bases__", ()):
        for arg in getattr(base, "__args__", ()):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    inherited = getattr(cls, "params_model", None)
    return inherited if isinstance(inherited, type) else None


# The function form lives in its own module; importable from here as before.
from ania_nb.tools.function import FunctionTool, tool  # noqa: E402
