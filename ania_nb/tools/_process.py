"""Run a sync function tool in a child process that is killed when the call is cancelled.

A thread cannot be stopped from outside, so a sync tool that hangs keeps running after a run's
``stop()`` or timeout. ``@tool(process=True)`` runs each call in a fresh ``spawn`` process
instead (no fork: the parent may be a threaded Jupyter kernel); cancelling the call kills it.
The child imports the function by module and qualified name, validates the model's arguments
itself and sends back the result text or the exception. The child also watches its pipe to the
parent and exits when the parent is gone, so a killed kernel leaves no orphan behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import multiprocessing
import os
import pickle
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from ania_nb.errors import ToolDefinitionError, ToolError, ToolSignal

__all__ = ["ProcessTarget", "check_resolves", "process_target", "resolve", "run_in_process"]

_SPAWN = multiprocessing.get_context("spawn")
_EXIT_GRACE = 2.0  # seconds a child may take to exit after sending its result
_REAP_TIMEOUT = 10.0  # seconds a cancelled call waits for the killed child to be reaped


@dataclass(frozen=True)
class ProcessTarget:
    """Where a child process finds the tool function: module, qualified name, tool name."""

    module: str
    qualname: str
    tool: str


def process_target(func: Callable[..., Any], owner: str, tool: str) -> ProcessTarget:
    """Check ``func`` can be imported by name in a new process; raise `ToolDefinitionError`."""
    where = f"{owner}: process=True"
    if inspect.iscoroutinefunction(func):
        raise ToolDefinitionError(
            f"{where} is for sync functions; an async tool is cancelled directly, "
            "drop process=True",
            tool=tool,
        )
    module = getattr(func, "__module__", None)
    qualname = getattr(func, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise ToolDefinitionError(
            f"{where} needs a plain function (a new process imports it by name), "
            f"not {type(func).__name__}",
            tool=tool,
        )
    if "<" in qualname:
        raise ToolDefinitionError(
            f"{where} needs a function defined at module level (a new process imports it by "
            f"name); {qualname} is defined inside a function or is a lambda",
            tool=tool,
        )
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if module == "__main__" and not main_file:
        raise ToolDefinitionError(
            f"{where} needs a function a new process can import; {qualname} is defined in an "
            "interactive session (notebook or REPL): move it into a .py module and import it",
            tool=tool,
        )
    if main_file and getattr(main, "__spec__", None) is None and not os.path.isfile(main_file):
        # spawn re-runs the main program in every child: a program read from stdin cannot be.
        raise ToolDefinitionError(
            f"{where} cannot start child processes from a program read from {main_file} "
            "(each child re-runs the main program); run it from a .py file",
            tool=tool,
        )
    return ProcessTarget(module, qualname, tool)


def resolve(target: ProcessTarget) -> Any:
    """Import ``target`` (module attribute chain); the object may be the function or its tool."""
    obj: Any = importlib.import_module(target.module)
    for part in target.qualname.split("."):
        obj = getattr(obj, part)
    return obj


def check_resolves(target: ProcessTarget, func: Callable[..., Any]) -> None:
    """Raise `ToolError` unless ``target`` names ``func`` (or a tool wrapping it) here too."""
    # Checked at call time: a decorator runs before its result is bound to the module name.
    try:
        found = resolve(target)
    except Exception:
        found = None
    if found is not func and getattr(found, "func", None) is not func:
        raise ToolError(
            f"tool '{target.tool}' cannot run: a new process would not find it as "
            f"{target.module}.{target.qualname}; define it at module level under that name"
        )


async def run_in_process(target: ProcessTarget, arguments: dict[str, Any]) -> str:
    """Run one call in a child process; cancellation kills and reaps the child, then re-raises."""
    child = _Child(target, arguments)
    job = asyncio.ensure_future(asyncio.to_thread(child.run))
    try:
        message, exitcode = await asyncio.shield(job)
    except BaseException:
        child.kill()
        # Reaped before the cancellation goes on, so "stopped" means the process is gone.
        await asyncio.wait({job}, timeout=_REAP_TIMEOUT)
        raise
    return _unwrap(target, message, exitcode)


class _Child:
    """One child process, started and awaited in a worker thread, killable from the loop."""

    def __init__(self, target: ProcessTarget, arguments: dict[str, Any]) -> None:
        self.target = target
        self.arguments = arguments
        self._killed = threading.Event()
        self._proc: Any = None

    def run(self) -> tuple[Any, int | None]:
        """Start the child, wait for its one message and its exit (blocking: worker thread)."""
        if self._killed.is_set():
            return None, None
        ours, theirs = _SPAWN.Pipe(duplex=True)
        proc = _SPAWN.Process(
            target=_child_main,
            args=(theirs, self.target, self.arguments),
            name=f"ania-nb tool {self.target.tool}",
            daemon=True,
        )
        try:
            proc.start()
            self._proc = proc
            theirs.close()  # only the child holds its end now: its death means EOF here
            if self._killed.is_set():  # kill() ran before _proc was set
                proc.kill()
            try:
                message = ours.recv()
            except (EOFError, OSError):
                message = None
            proc.join(_EXIT_GRACE)
            if proc.exitcode is None:  # lingering non-daemon threads in the child
                proc.kill()
                proc.join()
            return message, proc.exitcode
        finally:
            ours.close()
            theirs.close()

    def kill(self) -> None:
        """Kill the child (now, or as soon as it has started); never blocks."""
        self._killed.set()
        proc = self._proc
        if proc is not None:
            proc.kill()


def _unwrap(target: ProcessTarget, message: Any, exitcode: int | None) -> str:
    if message is None:
        raise ToolError(
            f"tool '{target.tool}' stopped without a result "
            f"(its process exited with code {exitcode}; a traceback, if any, is on stderr)"
        )
    kind, payload = message
    if kind == "ok":
        return str(payload)
    blob, type_name, text, is_signal = payload
    if blob is not None:
        try:
            exc = pickle.loads(blob)
        except Exception:
            exc = None
        if isinstance(exc, Exception):  # never SystemExit & co. from a child into this process
            raise exc
    if is_signal:
        raise ToolError(text)
    # The same words the executor uses for an exception raised in this process.
    raise ToolError(f"tool '{target.tool}' execution failed: {type_name}: {text}")


# --------------------------------------------------------------------------- in the child


def _child_main(conn: Connection, target: ProcessTarget, arguments: dict[str, Any]) -> None:
    threading.Thread(target=_exit_with_parent, args=(conn,), daemon=True).start()
    try:
        message: tuple[str, Any] = ("ok", _call(target, arguments))
    except BaseException as exc:
        message = ("error", _describe(exc))
    conn.send(message)


def _exit_with_parent(conn: Connection) -> None:
    # The parent never writes: recv returns only with EOF, when the parent has gone away.
    with contextlib.suppress(BaseException):
        conn.recv()
    os._exit(1)


def _call(target: ProcessTarget, arguments: dict[str, Any]) -> str:
    from ania_nb.tools.base import FunctionTool

    obj = resolve(target)
    if not isinstance(obj, FunctionTool):  # FunctionTool(fn, process=True) left fn unwrapped
        obj = FunctionTool(obj, name=target.tool, description="(child process)")
    return obj.call_here(arguments)


def _describe(exc: BaseException) -> tuple[bytes | None, str, str, bool]:
    try:
        blob: bytes | None = pickle.dumps(exc)
    except Exception:
        blob = None
    return blob, type(exc).__name__, str(exc), isinstance(exc, ToolSignal)
