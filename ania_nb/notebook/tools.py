"""Notebook-aware tools: look at the user's variables, run Python in their namespace."""

from __future__ import annotations

import ast
import contextlib
import io
import traceback
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, Field

from ..errors import ToolError
from ..tools import BaseTool, ToolContext

MAX_OUTPUT = 4000
_HIDDEN = {"In", "Out", "exit", "quit", "get_ipython", "open"}


def _preview(value: Any, limit: int = 120) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not break the listing
        text = f"<repr failed: {type(exc).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_value(name: str, value: Any, *, detailed: bool = False) -> str:
    """One line (or a short block when ``detailed``) describing a variable."""
    kind = type(value).__name__
    shape = getattr(value, "shape", None)
    if kind == "DataFrame" and hasattr(value, "dtypes"):
        head = f"{name}: DataFrame shape={tuple(shape or ())}"
        columns = ", ".join(f"{c}:{t}" for c, t in list(value.dtypes.items())[:30])
        lines = [head, f"  columns: {columns}"]
        if detailed:
            lines.append(
                "  head:\n" + "\n".join("    " + r for r in str(value.head(5)).splitlines())
            )
            lines.append(f"  missing values per column: {dict(value.isna().sum())}")
        return "\n".join(lines)
    parts = [f"{name}: {kind}"]
    if shape is not None:
        parts.append(f"shape={tuple(shape)}")
    elif hasattr(value, "__len__") and not isinstance(value, type):
        with contextlib.suppress(Exception):
            parts.append(f"len={len(value)}")
    parts.append("= " + _preview(value, 400 if detailed else 120))
    return " ".join(parts)


def _visible(namespace: dict[str, Any]) -> list[str]:
    import types

    names = []
    for name, value in namespace.items():
        if name.startswith("_") or name in _HIDDEN or isinstance(value, types.ModuleType):
            continue
        names.append(name)
    return sorted(names)


class VarsParams(BaseModel):
    """notebook_vars parameters."""

    name: Annotated[
        str, Field(description="A variable to describe in detail; empty lists all variables.")
    ] = ""


class PythonParams(BaseModel):
    """python parameters."""

    code: Annotated[str, Field(description="Python code to run in the notebook's namespace.")]


class NotebookVarsTool(BaseTool[VarsParams]):
    """List the notebook's variables (names, types, shapes, short previews) or describe one.

    Read-only. DataFrames are summarised (shape, columns with dtypes; head and missing values
    when asked for by name). Output is truncated to 4000 characters.
    """

    name = "notebook_vars"

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace

    def execute(self, params: VarsParams, ctx: ToolContext) -> str:
        """Describe the namespace."""
        if params.name:
            if params.name not in self.namespace:
                known = ", ".join(_visible(self.namespace)) or "none"
                return f"no variable named {params.name!r}; variables: {known}"
            return describe_value(params.name, self.namespace[params.name], detailed=True)[
                :MAX_OUTPUT
            ]
        names = _visible(self.namespace)
        if not names:
            return "the notebook has no user variables yet"
        text = "\n".join(describe_value(n, self.namespace[n]) for n in names)
        return text if len(text) <= MAX_OUTPUT else text[:MAX_OUTPUT] + "\n...(truncated)"


class PythonTool(BaseTool[PythonParams]):
    """Run Python code in the notebook's namespace and get its printed output and last value.

    Changes the user's variables, so it needs approval when approval is on and plan mode
    blocks it. Output (stdout, stderr, the last expression's repr, or the traceback) is
    truncated to 4000 characters.
    """

    name = "python"
    side_effects = True

    def __init__(self, namespace: dict[str, Any], *, ask: bool = True) -> None:
        self.namespace = namespace
        self.ask = ask

    def needs_approval(self, arguments: Mapping[str, Any]) -> bool:
        """The gate asks the user before any code runs (unless created with ``ask=False``)."""
        return self.ask

    def approval_summary(self, arguments: Mapping[str, Any]) -> str:
        """What the approval request shows."""
        return "run Python: " + " ".join(str(arguments.get("code", "")).split())[:300]

    async def execute(self, params: PythonParams, ctx: ToolContext) -> str:
        """Run the code like a cell would: on the kernel's thread, in the user namespace."""
        if self.ask and not ctx.approved:
            # The tool gate asks; reaching here unapproved means the gate was bypassed.
            raise ToolError("python: running code needs the user's approval, and it was not given")
        # Deliberately on the loop thread, as a cell runs: user objects (plots, GUI handles,
        # DataFrames being mutated) are not safe to touch from a worker thread.
        return run_code(params.code, self.namespace)


def run_code(code: str, namespace: dict[str, Any]) -> str:
    """Execute ``code`` in ``namespace``; return captured output and the last value's repr."""
    try:
        tree = ast.parse(code, mode="exec")
    except SyntaxError as exc:
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    last = None
    tail = tree.body[-1] if tree.body else None
    if isinstance(tail, ast.Expr):  # the value of a trailing expression is shown, as in a cell
        tree.body.pop()
        last = ast.Expression(tail.value)
    out, err = io.StringIO(), io.StringIO()
    value: Any = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(compile(tree, "<agent>", "exec"), namespace)
            if last is not None:
                value = eval(compile(last, "<agent>", "eval"), namespace)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            err.write(f"{type(exc).__name__}\n")
        else:
            err.write("".join(traceback.format_exception(exc)[-6:]))
    text = out.getvalue()
    if err.getvalue():
        text += ("\n" if text and not text.endswith("\n") else "") + "stderr: " + err.getvalue()
    if value is not None:
        text += ("\n" if text and not text.endswith("\n") else "") + _preview(value, 2000)
    text = text.rstrip() or "(no output)"
    return text if len(text) <= MAX_OUTPUT else text[:MAX_OUTPUT] + "\n...(output truncated)"
