"""The function form of a tool: `tool` turns a typed (sync or async) function into a `FunctionTool`.

Parameters become a pydantic model (docstring ``Args:`` lines give the descriptions), a
``ToolContext`` parameter receives the call's context, and ``@tool(process=True)`` runs a sync
function in a child process that stop, timeout and cancellation kill.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
from collections.abc import Callable
from typing import Annotated, Any, Union, get_origin, get_type_hints, overload

from pydantic import BaseModel, Field, create_model

from ania_nb._env import child_env
from ania_nb.errors import ToolDefinitionError
from ania_nb.tools._process import ProcessTarget, check_resolves, process_target, run_in_process
from ania_nb.tools.base import (
    ToolContext,
    _ModelTool,
    _refuse_generator,
    check_tool_name,
    invoke_callable,
    result_to_text,
)
from ania_nb.tools.schema import accepted_arguments, has_description, model_schema, parse_docstring

__all__ = ["FunctionTool", "tool"]


# --------------------------------------------------------------------------- function tools


def _is_context(annotation: Any) -> bool:
    if annotation is ToolContext:
        return True
    # Optional[ToolContext] / ToolContext | None
    args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
    return get_origin(annotation) in (Union, types.UnionType) and args == [ToolContext]


class FunctionTool(_ModelTool):
    """A tool made from a typed function by `tool`; still callable like the function."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        side_effects: bool = False,
        process: bool = False,
    ) -> None:
        fname = getattr(func, "__qualname__", repr(func))
        owner = f"tool function {fname}"
        self.func = func
        self.name: str = check_tool_name(name or getattr(func, "__name__", ""), owner)
        summary, arg_docs = parse_docstring(inspect.getdoc(func))
        self.description: str = inspect.cleandoc(description).strip() if description else summary
        if not self.description:
            raise ToolDefinitionError(
                f"{owner} has no description; add a docstring or pass description='...'",
                tool=self.name,
            )
        self.side_effects: bool = side_effects
        _refuse_generator(func, owner, self.name)
        self.process: bool = process
        self._target: ProcessTarget | None = None
        if process:
            self._target = process_target(func, owner, self.name)
        self._ctx_param: str | None = None
        self._field_to_param: dict[str, str] = {}
        self.params_model = self._build_model(func, owner, arg_docs)
        try:
            self._schema = model_schema(self.params_model)
        except ToolDefinitionError as exc:
            raise ToolDefinitionError(f"{owner}: {exc}", tool=self.name) from exc
        self._accepted = accepted_arguments(self.params_model)
        if process and self._ctx_param is not None:
            raise ToolDefinitionError(
                f"{owner}: process=True tools cannot take a ToolContext "
                f"({self._ctx_param!r}): it does not cross into the child process",
                tool=self.name,
            )
        functools.update_wrapper(self, func)

    def _build_model(
        self, func: Callable[..., Any], owner: str, arg_docs: dict[str, str]
    ) -> type[BaseModel]:
        try:
            hints = get_type_hints(func, include_extras=True)
        except Exception as exc:
            raise ToolDefinitionError(
                f"{owner}: cannot resolve its type hints ({type(exc).__name__}: {exc})",
                tool=self.name,
            ) from exc
        fields: dict[str, Any] = {}
        for param in inspect.signature(func).parameters.values():
            where = f"{owner}, parameter {param.name!r}"
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolDefinitionError(
                    f"{where}: *args/**kwargs cannot be described to the model; "
                    "declare each parameter explicitly",
                    tool=self.name,
                )
            if param.kind is param.POSITIONAL_ONLY:
                raise ToolDefinitionError(
                    f"{where}: positional-only parameters are not supported (remove the '/')",
                    tool=self.name,
                )
            if param.name not in hints:
                raise ToolDefinitionError(
                    f"{where} has no type annotation; annotate it (e.g. {param.name}: str)",
                    tool=self.name,
                )
            annotation = hints[param.name]
            if _is_context(annotation):
                self._ctx_param = param.name
                continue
            default = ... if param.default is param.empty else param.default
            doc = arg_docs.get(param.name)
            if doc and not has_description(annotation, default):
                annotation = Annotated[annotation, Field(description=doc)]
            # Names that shadow BaseModel attributes (json, copy, schema...) travel as aliases.
            field_name = param.name
            if hasattr(BaseModel, field_name) or field_name.startswith("model_"):
                field_name = f"param_{field_name}"
                annotation = Annotated[annotation, Field(alias=param.name)]
            self._field_to_param[field_name] = param.name
            fields[field_name] = (annotation, default)
        words = re.split(r"[^0-9a-zA-Z]+", getattr(func, "__name__", self.name))
        model_name = "".join(w[:1].upper() + w[1:] for w in words) + "Params"
        try:
            return create_model(model_name, __module__=func.__module__, **fields)
        except Exception as exc:
            raise ToolDefinitionError(
                f"{owner}: its parameters cannot form a model ({type(exc).__name__}: {exc})",
                tool=self.name,
            ) from exc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the original function directly."""
        return self.func(*args, **kwargs)

    async def invoke(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        """Validate the arguments, call the function (sync ones in a thread), return text."""
        params = self._validate(arguments)
        if self._target is not None:
            check_resolves(self._target, self.func)
            # The child validates the model's own arguments again: they always pickle.
            env = child_env(ctx.security)  # cleared: no API keys in the child
            return await run_in_process(self._target, dict(arguments), env)
        return result_to_text(await invoke_callable(self.func, **self._kwargs(params, ctx)))

    def call_here(self, arguments: dict[str, Any]) -> str:
        """Validate and call in this thread (the child side of ``process=True``)."""
        params = self._validate(arguments)
        return result_to_text(self.func(**self._kwargs(params, None)))

    def _kwargs(self, params: Any, ctx: ToolContext | None) -> dict[str, Any]:
        kwargs = {param: getattr(params, fld) for fld, param in self._field_to_param.items()}
        if self._ctx_param is not None:
            kwargs[self._ctx_param] = ctx
        return kwargs

    def __repr__(self) -> str:
        return f"<FunctionTool {self.name!r}>"


@overload
def tool(func: Callable[..., Any], /) -> FunctionTool: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    process: bool = False,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...
def tool(
    func: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    side_effects: bool = False,
    process: bool = False,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a typed sync or async function into a tool: ``@tool`` or ``@tool(name=...)``.

    The parameters schema is pydantic's own for the signature (``$ref``-free); parameters it
    cannot describe (``*args``, callables, iterators, ...) are refused here, and argument keys
    the function does not take are reported back to the model.

    A sync tool runs in a worker thread and **cannot be interrupted**: after ``stop()``, a run
    timeout or a cancelled call, the run moves on but the thread keeps running the function to
    its end. Prefer ``async def`` tools for work that waits, or pass ``process=True`` to run each
    call in a child process that is killed on stop, timeout or cancellation (the function must
    be defined at module level in an importable ``.py`` file, takes no `ToolContext`, and each
    call pays for starting a Python process).

    Example::

        @tool
        def add(a: int, b: Annotated[int, "the second addend"]) -> int:
            '''Add two numbers.'''
            return a + b
    """

    def wrap(fn: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(
            fn, name=name, description=description, side_effects=side_effects, process=process
        )

    return wrap(func) if func is not None else wrap
