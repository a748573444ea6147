"""Notebook-aware tools: the user's variables and cells, Python in their namespace, new cells.

`cell_tools` makes the two that need the kernel's shell: ``notebook_cells`` (read-only) and
``propose_cell`` (a new cell for the user to review, via IPython's ``set_next_input`` payload).
"""

from __future__ import annotations

import ast
import contextlib
import io
import sys
import traceback
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, Field

from ..errors import ToolError
from ..text import cut, flatten
from ..tools import BaseTool, ToolContext

MAX_OUTPUT = 4000
TRUNCATED = "\n...(truncated)"
OUTPUT_TRUNCATED = "\n...(output truncated)"
_HIDDEN = {"In", "Out", "exit", "quit", "get_ipython", "open"}


def _preview(value: Any, limit: int = 120) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not break the listing
        text = f"<repr failed: {type(exc).__name__}>"
    return flatten(text, limit)


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
            detail = describe_value(params.name, self.namespace[params.name], detailed=True)
            return cut(detail, MAX_OUTPUT, marker=TRUNCATED)
        names = _visible(self.namespace)
        if not names:
            return "the notebook has no user variables yet"
        text = "\n".join(describe_value(n, self.namespace[n]) for n in names)
        return cut(text, MAX_OUTPUT, marker=TRUNCATED)


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
        return "run Python: " + flatten(str(arguments.get("code", "")), 300)

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
    return cut(text, MAX_OUTPUT, marker=OUTPUT_TRUNCATED)


# ------------------------------------------------------------------ cells

MAX_CELL_SOURCE = 1500  # per cell in a listing; one cell asked for by number gets MAX_OUTPUT
MAX_CELLS = 20
_AGENT_PREFIXES = ("%%agent", "%agent", "%ania")


def _package_dirs(*names: str) -> tuple[str, ...]:
    import importlib.util
    import os

    dirs = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            dirs += [os.path.join(d, "") for d in spec.submodule_search_locations]
    return tuple(dirs)


_KERNEL_CODE = _package_dirs("IPython", "ipykernel")


class CellsParams(BaseModel):
    """notebook_cells parameters."""

    count: Annotated[
        int, Field(description="How many recent cells to show (default 5, at most 20).")
    ] = 5
    cell: Annotated[
        int, Field(description="Show only this cell (its In[n] number) in full; 0 = recent.")
    ] = 0


class ProposeParams(BaseModel):
    """propose_cell parameters."""

    code: Annotated[str, Field(description="The code for the new cell, as the user should run it.")]


def _cut(text: str, limit: int) -> str:
    return cut(text, limit, marker=f"\n...(cut, {len(text)} characters)")


def _cell_number(shell: Any, filename: str) -> int | None:
    """The In[n] number of a cell's code object filename, None for any other file."""
    known = getattr(getattr(shell, "compile", None), "_filename_map", None)
    number = known.get(filename) if isinstance(known, dict) else None
    return number if isinstance(number, int) else None


def last_error(shell: Any) -> str | None:
    """The last error a cell raised, with its traceback from the first cell frame on."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if not isinstance(exc, BaseException):
        return None
    found = list(traceback.extract_tb(exc.__traceback__))
    # IPython's own frames (run_code, exec, a magic's plumbing) say nothing about the user's
    # code: they are left out before the first cell frame, or all of them when there is none.
    first = next((i for i, f in enumerate(found) if _cell_number(shell, f.filename)), None)
    if first is None:
        found = [f for f in found if not f.filename.startswith(_KERNEL_CODE)]
    frames = traceback.StackSummary.from_list(found[first or 0 :])
    where = ""
    for frame in frames:
        number = _cell_number(shell, frame.filename)
        if number is not None:
            frame.filename = f"Cell In[{number}]"
            where = where or f" (raised in In[{number}])"
    text = "Traceback (most recent call last):\n" + "".join(frames.format())
    text += "".join(traceback.format_exception_only(type(exc), exc))
    text, limit = text.rstrip(), MAX_OUTPUT // 2
    # The innermost frames and the error itself matter most: keep the end.
    text = cut(text, limit, marker="...(earlier frames cut)\n", keep="end")
    return f"Last error{where}:\n" + text


class NotebookCellsTool(BaseTool[CellsParams]):
    """Show the notebook's recent cells (sources, returned values) and the last error's traceback.

    Use it to see what the user ran, e.g. to fix the error above. Read-only. Printed output
    and plots are not kept by the kernel, so only returned values show; %%agent cells are
    listed by their first line.
    """

    name = "notebook_cells"

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def execute(self, params: CellsParams, ctx: ToolContext) -> str:
        """List recent cells (or one) and the last error."""
        sources: list[str] = list(getattr(self.shell.history_manager, "input_hist_raw", []))
        outputs: dict[int, Any] = getattr(self.shell.history_manager, "output_hist", {})
        current = self.shell.execution_count  # the cell running now: the agent's own
        numbered = [(n, src) for n, src in enumerate(sources) if n and n != current and src]
        if params.cell:
            found = [(n, src) for n, src in numbered if n == params.cell]
            if not found:
                have = f"In[{numbered[0][0]}]..In[{numbered[-1][0]}]" if numbered else "none"
                return f"no cell In[{params.cell}]; cells run in this kernel: {have}"
            picked, limit = found, MAX_OUTPUT
        else:
            count = min(max(params.count, 1), MAX_CELLS)
            picked, limit = numbered[-count:], MAX_CELL_SOURCE
        parts = [self._cell(n, src, outputs, limit) for n, src in picked]
        if not parts:
            parts.append("no cells have run in this kernel yet (besides this one)")
        error = last_error(self.shell)
        if error:
            parts.append(error)
        return _cut("\n\n".join(parts), MAX_OUTPUT * 2)

    @staticmethod
    def _cell(number: int, source: str, outputs: dict[int, Any], limit: int) -> str:
        source = source.rstrip()
        if source.startswith(_AGENT_PREFIXES):  # its conversation is the history already
            return f"In [{number}]: {source.splitlines()[0]}  (an agent cell)"
        text = f"In [{number}]:\n{_cut(source, limit)}"
        if number in outputs:
            text += f"\nOut[{number}]: {_preview(outputs[number], 300)}"
        return text


class ProposeCellTool(BaseTool[ProposeParams]):
    """Put code into a new cell below the current one for the user to read, edit and run.

    Runs nothing (allowed in plan mode): prefer it to the python tool when the user should
    review the code first. Several proposals in one run become one cell.
    """

    name = "propose_cell"

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self._proposed: tuple[int, list[str]] = (-1, [])

    async def execute(self, params: ProposeParams, ctx: ToolContext) -> str:
        """Send IPython's ``set_next_input`` payload (JupyterLab inserts the cell below)."""
        # On the loop thread, where the kernel collects the cell's payloads for its reply.
        code = params.code.strip("\n")
        if not code.strip():
            raise ToolError("code must not be empty")
        count, pieces = self._proposed
        if count != self.shell.execution_count:  # a new %%agent cell: start a new proposal
            pieces = []
        pieces.append(code)
        self._proposed = (self.shell.execution_count, pieces)
        # The kernel keeps one set_next_input per execution (the last replaces earlier ones).
        self.shell.set_next_input("\n\n".join(pieces), replace=False)
        lines = code.count("\n") + 1
        return (
            f"proposed a new cell below with {lines} line(s) of code; the user decides whether "
            "to run it (it has not run)"
        )


def cell_tools(shell: Any) -> list[BaseTool[Any]]:
    """The cell tools of a kernel's shell: ``notebook_cells`` and ``propose_cell``."""
    return [NotebookCellsTool(shell), ProposeCellTool(shell)]
