"""The two tool tables: the shared `ToolExecutor` and the per-session `SessionToolExecutor`.

Both hand out their definitions sorted by name and cached until the table changes, so the tool
list is byte-identical on every request (prompt-prefix caching). ``execute`` never raises for
anything a tool or the model did wrong: the failure becomes a deterministic text for the model.
Tables are guarded by a `threading.Lock` because sync tools run in worker threads and may
register tools (``ctx.executor.add``) while sibling calls read the table.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ania_nb.errors import ToolDefinitionError, ToolSignal
from ania_nb.text import cut
from ania_nb.tools.base import BaseTool, Tool, ToolArgumentsError, ToolContext, result_to_text, tool
from ania_nb.tools.schema import dumps_canonical

__all__ = ["SessionToolExecutor", "ToolExecutor", "ToolOutcome", "as_tool"]

_log = logging.getLogger(__name__)

_RAW_ARGUMENTS_LIMIT = 500
_ERROR_PREFIX = "Error executing tool: "
# The engine stores arguments that are not a JSON object as {"_raw": text} (engine/_llm_wire.py
# safe_arguments) so the history stays valid; the model must hear about the text it sent.
_WRAPPED_KEY = "_raw"


@dataclass(frozen=True)
class ToolOutcome:
    """The result of one tool call: the text for the model, the error (if any) and timing."""

    text: str
    error: str | None
    duration_ms: int


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    """Accept a tool, a `BaseTool` subclass, or a plain typed function (wrapped with `tool`)."""
    if isinstance(obj, type):
        if issubclass(obj, BaseTool):
            return obj()
        raise ToolDefinitionError(f"{obj.__qualname__} is a class but not a BaseTool subclass")
    if isinstance(obj, Tool):
        return obj
    if callable(obj):
        return tool(obj)
    raise ToolDefinitionError(f"cannot register {obj!r} as a tool: not a Tool or a function")


class _Table:
    """A lock-guarded name → tool table with a change counter and a definitions cache."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tools: dict[str, Tool] = {}
        self._version = 0
        self._cache: tuple[object, list[dict[str, Any]], str] | None = None

    @property
    def version(self) -> int:
        """A counter that increments on every change to this table."""
        return self._version

    def add(self, obj: Tool | Callable[..., Any], *, replace: bool = False) -> Tool:
        """Register a tool (a plain function is wrapped with `tool`); returns the tool."""
        new = as_tool(obj)
        with self._lock:
            if new.name in self._tools and not replace:
                raise ToolDefinitionError(
                    f"a tool named {new.name!r} is already registered; "
                    "pass replace=True to replace it or choose another name",
                    tool=new.name,
                )
            self._tools[new.name] = new
            self._version += 1
        return new

    def remove(self, name: str) -> bool:
        """Unregister a tool of this table; False if there was none by that name."""
        with self._lock:
            if self._tools.pop(name, None) is None:
                return False
            self._version += 1
            return True

    def _snapshot(self) -> tuple[int, dict[str, Tool]]:
        with self._lock:
            return self._version, dict(self._tools)

    def _visible(self) -> tuple[object, dict[str, Tool]]:
        """Return the cache key and the tools this executor exposes (overridden by the session)."""
        return self._snapshot()

    def get(self, name: str) -> Tool | None:
        """Return the tool registered under ``name``, or None."""
        return self._visible()[1].get(name)

    def names(self) -> list[str]:
        """All visible tool names, sorted."""
        return sorted(self._visible()[1])

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __len__(self) -> int:
        return len(self._visible()[1])

    def _definitions(self) -> tuple[list[dict[str, Any]], str]:
        key, tools = self._visible()
        cached = self._cache
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        definitions = [tools[name].definition() for name in sorted(tools)]
        # One tuple assignment so a concurrent reader never sees a list with another's JSON.
        self._cache = (key, definitions, dumps_canonical(definitions))
        return definitions, self._cache[2]

    def definitions(self) -> list[dict[str, Any]]:
        """Return the OpenAI tool list, sorted by name; the same object until the table changes."""
        return self._definitions()[0]

    def definitions_json(self) -> str:
        """`definitions` serialised with `dumps_canonical` (cached alongside)."""
        return self._definitions()[1]

    def _prepare(self, ctx: ToolContext) -> ToolContext:
        return ctx

    async def execute(
        self, name: str, arguments: str | Mapping[str, Any] | None, ctx: ToolContext | None = None
    ) -> ToolOutcome:
        """Run one tool call; every failure except cancellation becomes an error outcome."""
        start = time.perf_counter()
        found = self.get(name)
        if found is None:
            error = f"tool '{name}' not found. Available tools: [{', '.join(self.names())}]"
            return _outcome(start, error=error)
        args = _parse_arguments(name, arguments, found)
        if isinstance(args, str):
            return _outcome(start, error=args)
        try:
            text = await found.invoke(args, self._prepare(ctx or ToolContext()))
        except ToolArgumentsError as exc:
            error = f"{exc}\nExpected schema: {dumps_canonical(found.parameters_schema())}"
            return _outcome(start, error=error)
        except ToolSignal as exc:
            return _outcome(start, error=str(exc))
        except Exception as exc:  # a tool bug must not kill the run; the model is told instead
            # The model only sees "KeyError: 'b'": the developer needs the traceback.
            _log.warning("tool %r raised %s", name, type(exc).__name__, exc_info=True)
            error = f"tool '{name}' execution failed: {type(exc).__name__}: {exc}"
            return _outcome(start, error=error)
        return _outcome(start, text=text if isinstance(text, str) else result_to_text(text))


class ToolExecutor(_Table):
    """The shared tool table (built-ins, MCP managers), used by every session."""


class SessionToolExecutor(_Table):
    """One session's tools layered over a shared `ToolExecutor`; session tools win on a clash."""

    def __init__(self, shared: ToolExecutor) -> None:
        super().__init__()
        self.shared = shared

    def _visible(self) -> tuple[object, dict[str, Tool]]:
        shared_version, tools = self.shared._snapshot()
        own_version, own = self._snapshot()
        tools.update(own)  # a session tool replaces the shared one, so no name is sent twice
        return (shared_version, own_version), tools

    def _definitions(self) -> tuple[list[dict[str, Any]], str]:
        if not self._tools:  # no session tools: reuse the shared cached list and its JSON
            return self.shared._definitions()
        return super()._definitions()

    def _prepare(self, ctx: ToolContext) -> ToolContext:
        # Tools that register tools (mcp_load_*) reach this session through ctx.executor.
        return ctx if ctx.executor is not None else dataclasses.replace(ctx, executor=self)


def _outcome(start: float, *, text: str | None = None, error: str | None = None) -> ToolOutcome:
    duration_ms = round((time.perf_counter() - start) * 1000)
    if error is not None:
        return ToolOutcome(text=_ERROR_PREFIX + error, error=error, duration_ms=duration_ms)
    return ToolOutcome(text=text or "", error=None, duration_ms=duration_ms)


_JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def _parse_arguments(
    name: str, arguments: str | Mapping[str, Any] | None, found: Tool
) -> dict[str, Any] | str:
    """Return the arguments as a dict, or the error text explaining why they cannot be one."""
    if arguments is None:
        return {}
    if isinstance(arguments, Mapping):
        return _unwrap(name, dict(arguments), found)
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments, default=str)
    if not raw.strip():
        return {}  # some providers send "" for a call without arguments
    try:
        value = json.loads(raw)
        problem = None
    except json.JSONDecodeError as exc:
        value, problem = None, str(exc)
    if problem is None:
        if isinstance(value, dict):
            return _unwrap(name, value, found)
        problem = f"arguments must be a JSON object, got {_JSON_TYPES.get(type(value), 'null')}"
    shown = cut(raw, _RAW_ARGUMENTS_LIMIT, marker="...")
    return (
        f"failed to parse arguments for tool '{name}': {problem}\n"
        f"Arguments: {shown}\n"
        f"Expected schema: {dumps_canonical(found.parameters_schema())}"
    )


def _unwrap(name: str, value: dict[str, Any], found: Tool) -> dict[str, Any] | str:
    wrapped = value.get(_WRAPPED_KEY)
    if (
        len(value) == 1
        and isinstance(wrapped, str)
        and _WRAPPED_KEY not in found.parameters_schema().get("properties", {})
    ):
        return _parse_arguments(name, wrapped, found)
    return value
