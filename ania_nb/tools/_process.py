"""Run a sync function tool in a child process that is killed when the call is cancelled.

A thread cannot be stopped from outside, so a sync tool that hangs keeps running after a run's
``stop()`` or timeout. ``@tool(process=True)`` runs each call in a fresh Python process instead
(no fork: the parent may be a threaded Jupyter kernel); cancelling the call kills it. The child
is started like multiprocessing's ``spawn`` (the parent's ``sys.path``, working directory and
main module, through `multiprocessing.spawn.prepare`) but with the cleared environment of every
child process (`ania_nb._env.child_env`: no API keys, only what ``security.pass_env`` lets
through). It imports the function by module and qualified name, validates the model's arguments
itself and sends back the result text or the exception. The child also watches its pipe to the
parent and exits when the parent is gone, so a killed kernel leaves no orphan behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import logging
import multiprocessing
import os
import pickle
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing import spawn
from multiprocessing.connection import Connection
from typing import Any

from ania_nb._env import child_env
from ania_nb.errors import ToolDefinitionError, ToolError, ToolSignal

_log = logging.getLogger(__name__)

__all__ = ["ProcessTarget", "check_resolves", "process_target", "resolve", "run_in_process"]

# The child's first lines use only the standard library: the parent's sys.path (where ania_nb
# and the tool's module are found) is only there once `spawn.prepare` has run.
_BOOTSTRAP = """\
import sys
from multiprocessing import spawn
from multiprocessing.connection import Connection
conn = Connection(int(sys.argv[1]))
spawn.prepare(conn.recv())
from ania_nb.tools._process import _child_main
_child_main(conn, *conn.recv())
"""
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


async def run_in_process(
    target: ProcessTarget, arguments: dict[str, Any], env: Mapping[str, str] | None = None
) -> str:
    """Run one call in a child process; cancellation kills and reaps the child, then re-raises.

    ``env``: the child's environment (default: `child_env` with the default policy).
    """
    child = _Child(target, arguments, child_env() if env is None else dict(env))
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

    def __init__(self, target: ProcessTarget, arguments: dict[str, Any], env: dict[str, str]):
        self.target = target
        self.arguments = arguments
        self.env = env
        self._killed = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None

    def run(self) -> tuple[Any, int | None]:
        """Start the child, wait for its one message and its exit (blocking: worker thread)."""
        if self._killed.is_set():
            return None, None
        ours, theirs = multiprocessing.Pipe(duplex=True)
        try:
            preparation = spawn.get_preparation_data(f"ania-nb tool {self.target.tool}")
            preparation.pop("authkey", None)  # a secret of this process; the child needs none
            argv = [spawn.get_executable(), *_interpreter_flags(), "-c", _BOOTSTRAP]
            proc = subprocess.Popen(
                [*argv, str(theirs.fileno())],
                env=self.env,
                stdin=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
            )
            self._proc = proc
            theirs.close()  # only the child holds its end now: its death means EOF here
            if self._killed.is_set():  # kill() ran before _proc was set
                proc.kill()
            try:
                ours.send(preparation)
                ours.send((self.target, self.arguments))
                message = ours.recv()
            except (EOFError, OSError):
                message = None
            try:
                proc.wait(_EXIT_GRACE)
            except subprocess.TimeoutExpired:  # lingering non-daemon threads in the child
                proc.kill()
                proc.wait()
            return message, proc.returncode
        finally:
            ours.close()
            theirs.close()

    def kill(self) -> None:
        """Kill the child (now, or as soon as it has started); never blocks."""
        self._killed.set()
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()


def _interpreter_flags() -> list[str]:
    """The flags this interpreter runs with (-X, -W, -O ...), as spawn passes them on."""
    return list(subprocess._args_from_interpreter_flags())  # type: ignore[attr-defined]


def _unwrap(target: ProcessTarget, message: Any, exitcode: int | None) -> str:
    if message is None:
        raise ToolError(
            f"tool '{target.tool}' stopped without a result "
            f"(its process exited with code {exitcode}; a traceback, if any, is on stderr)"
        )
    kind, payload = message
    if kind == "ok":
        return str(payload)
    blob, type_name, text, is_signal, child_traceback = payload
    if blob is not None:
        try:
            exc = pickle.loads(blob)
        except Exception:
            exc = None
        if isinstance(exc, Exception):  # never SystemExit & co. from a child into this process
            if not is_signal:  # the executor logs it; this process's frames alone say nothing
                exc.add_note(f"raised in the tool's process:\n{child_traceback}")
            raise exc
    if is_signal:
        raise ToolError(text)
    _log.warning("tool %r raised %s in its process:\n%s", target.tool, type_name, child_traceback)
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


def _describe(exc: BaseException) -> tuple[bytes | None, str, str, bool, str]:
    try:
        blob: bytes | None = pickle.dumps(exc)
    except Exception:
        blob = None
    child_traceback = "".join(traceback.format_exception(exc))
    return blob, type(exc).__name__, str(exc), isinstance(exc, ToolSignal), child_traceback
