"""``@tool(process=True)``: sync tools in a child process that dies with the call.

The tools live at module level because the child process imports them by name (this module is
importable in the child: spawn passes the parent's ``sys.path``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from ania_nb.errors import ToolDefinitionError, ToolError
from ania_nb.testing import reply, tool_call
from ania_nb.tools import FunctionTool, ToolContext, ToolExecutor, tool

# --------------------------------------------------------------------------- tools (module level)


@tool(process=True)
def double(x: int) -> dict[str, int]:
    """Double x and say which process did it."""
    return {"value": 2 * x, "pid": os.getpid()}


@tool(process=True)
def hang(pid_file: str) -> str:
    """Write this process's pid, then sleep forever."""
    Path(pid_file).write_text(str(os.getpid()))
    while True:
        time.sleep(3600)


class Unpicklable(Exception):
    def __init__(self, a: int, b: int) -> None:  # unpickling calls cls(*args): one arg only
        super().__init__(f"{a}+{b}")


@tool(process=True)
def fail(kind: str) -> str:
    """Fail in the way asked for."""
    if kind == "value":
        raise ValueError("bad value")
    if kind == "tool":
        raise ToolError("the city 'Atlantis' does not exist")
    if kind == "unpicklable":
        raise Unpicklable(1, 2)
    if kind == "exit":
        sys.exit(4)
    os._exit(3)


def plain_function(x: int) -> int:
    """Wrapped without rebinding the module name."""
    return x + 1


def rebound(x: int) -> int:
    """Its module name is rebound below, so a new process would find something else."""
    return x


REBOUND_TOOL = FunctionTool(rebound, process=True)
rebound = plain_function  # type: ignore[assignment]


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie waiting to be reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state != "Z"


async def wait_for(check: Callable[[], bool], what: str) -> None:
    """Poll until ``check()``; the bound only keeps a broken build from hanging the suite."""
    deadline = time.monotonic() + 120
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.02)


async def started_hang(
    tmp_path: Path, call: Callable[[dict[str, Any]], Awaitable[Any]], children: list[int]
) -> Any:
    """Start ``call`` on the hang tool in a task; return (task, pid) once the child runs."""
    pid_file = tmp_path / "pid"
    task = asyncio.ensure_future(call({"pid_file": str(pid_file)}))
    await wait_for(lambda: (pid_file.exists() and pid_file.read_text() != "") or task.done(), "pid")
    assert not task.done(), task.result()
    pid = int(pid_file.read_text())
    children.append(pid)
    assert pid != os.getpid() and alive(pid)
    return task, pid


@pytest.fixture
async def children() -> AsyncIterator[list[int]]:
    """Pids to SIGKILL after the test: a broken build must fail the test, not hang the suite.

    Async so that it is torn down before the event loop, whose closing waits for the thread
    still reading from a child that was not killed.
    """
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def executor() -> ToolExecutor:
    table = ToolExecutor()
    for t in (double, hang, fail, REBOUND_TOOL):
        table.add(t)
    return table


# --------------------------------------------------------------------------- results and errors


async def test_a_process_tool_returns_its_value_from_another_process(
    executor: ToolExecutor,
) -> None:
    outcome = await executor.execute("double", '{"x": 21}')
    assert outcome.error is None
    result = json.loads(outcome.text)
    assert result["value"] == 42
    assert result["pid"] != os.getpid()
    assert double(2)["pid"] == os.getpid()  # calling the function directly stays in-process


async def test_arguments_are_validated_before_any_process_starts(executor: ToolExecutor) -> None:
    outcome = await executor.execute("double", '{"x": "many", "y": 1}')
    assert outcome.error is not None
    assert outcome.error.startswith(
        "invalid arguments for tool 'double' (2 errors):\nunknown argument 'y' (accepted: 'x')\n"
    )


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("value", "tool 'fail' execution failed: ValueError: bad value"),
        ("tool", "the city 'Atlantis' does not exist"),
        ("unpicklable", "tool 'fail' execution failed: Unpicklable: 1+2"),
        ("exit", "tool 'fail' execution failed: SystemExit: 4"),
        (
            "crash",
            "tool 'fail' stopped without a result (its process exited with code 3; "
            "a traceback, if any, is on stderr)",
        ),
    ],
)
async def test_errors_reach_the_model_as_usual(
    executor: ToolExecutor, kind: str, error: str
) -> None:
    outcome = await executor.execute("fail", {"kind": kind})
    assert outcome.error == error


@pytest.mark.parametrize(
    ("kind", "logger"),
    [("value", "ania_nb.tools.executor"), ("unpicklable", "ania_nb.tools._process")],
)
async def test_a_crash_in_the_child_is_logged_with_the_childs_traceback(
    executor: ToolExecutor, caplog: pytest.LogCaptureFixture, kind: str, logger: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="ania_nb.tools"):
        await executor.execute("fail", {"kind": kind})
    [record] = [r for r in caplog.records if r.name == logger]
    assert record.levelno == logging.WARNING
    # The child's frames: this process only re-raised what the child sent back.
    assert 'File "' + __file__ + '"' in caplog.text and ", in fail\n" in caplog.text


async def test_a_name_that_no_longer_leads_to_the_function_is_a_tool_error() -> None:
    with pytest.raises(ToolError, match=r"would not find it as test_tools_process\.rebound"):
        await REBOUND_TOOL.invoke({"x": 1}, ToolContext())


async def test_plain_function_wrapped_in_place_runs_in_a_process() -> None:
    wrapped = FunctionTool(plain_function, name="plus_one", process=True)
    assert await wrapped.invoke({"x": 1}, ToolContext()) == "2"


# --------------------------------------------------------------------------- killing


async def test_cancelling_the_call_kills_the_child(
    executor: ToolExecutor, tmp_path: Path, children: list[int]
) -> None:
    task, pid = await started_hang(tmp_path, lambda args: executor.execute("hang", args), children)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not alive(pid)  # killed and reaped before the cancellation finished


async def test_a_timeout_kills_the_child(
    executor: ToolExecutor, tmp_path: Path, children: list[int]
) -> None:
    timeouts: list[asyncio.Timeout] = []

    async def call(args: dict[str, Any]) -> Any:
        async with asyncio.timeout(None) as timeout:
            timeouts.append(timeout)
            return await executor.execute("hang", args)

    task, pid = await started_hang(tmp_path, call, children)
    timeouts[0].reschedule(asyncio.get_running_loop().time())  # expire now
    with pytest.raises(TimeoutError):
        await task
    assert not alive(pid)


async def test_agent_stop_kills_the_child(
    llm: Any, make_agent: Any, tmp_path: Path, children: list[int]
) -> None:
    pid_file = tmp_path / "pid"
    llm.script(reply(tool_calls=[tool_call("hang", {"pid_file": str(pid_file)})]), reply("ok"))
    agent = make_agent(tools=[hang])
    run = asyncio.ensure_future(agent.chat("hang", session="p"))
    await wait_for(lambda: (pid_file.exists() and pid_file.read_text() != "") or run.done(), "pid")
    pid = int(pid_file.read_text())
    children.append(pid)
    assert alive(pid)
    assert agent.stop("p") is True
    assert (await run).status == "stopped"
    await wait_for(lambda: not alive(pid), "the child to die")


_ORPHAN_PARENT = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
import test_tools_process as m
from ania_nb.tools import ToolContext
asyncio.run(m.hang.invoke({"pid_file": sys.argv[2]}, ToolContext()))
"""


async def test_the_child_exits_when_its_parent_is_killed(
    tmp_path: Path, children: list[int]
) -> None:
    pid_file = tmp_path / "pid"
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _ORPHAN_PARENT, str(Path(__file__).parent), str(pid_file)
    )
    try:
        await wait_for(lambda: pid_file.exists() and pid_file.read_text() != "", "pid")
        pid = int(pid_file.read_text())
        children.append(pid)
        assert alive(pid)
        parent.send_signal(signal.SIGKILL)
        await parent.wait()
        await wait_for(lambda: not alive(pid), "the orphaned child to exit")
    finally:
        if parent.returncode is None:
            parent.kill()
            await parent.wait()


# --------------------------------------------------------------------------- definitions


def test_process_tools_that_cannot_work_are_refused() -> None:
    def nested(x: int) -> int:
        """Defined inside a test."""
        return x

    async def coro(x: int) -> int:
        """Async."""
        return x

    def with_ctx(x: int, ctx: ToolContext) -> int:
        """Wants a context."""
        return x

    with pytest.raises(ToolDefinitionError, match=r"module level .* inside a function"):
        tool(process=True)(nested)
    with pytest.raises(ToolDefinitionError, match=r"is for sync functions"):
        tool(process=True)(coro)
    with_ctx.__qualname__ = "with_ctx"  # pretend module level: the context is the problem
    with pytest.raises(ToolDefinitionError, match=r"cannot take a ToolContext \('ctx'\)"):
        tool(process=True)(with_ctx)
    with pytest.raises(ToolDefinitionError, match=r"module level .* lambda"):
        FunctionTool(lambda x: x, name="lam", description="d", process=True)


def test_a_function_from_an_interactive_session_is_refused() -> None:
    code = (
        "from ania_nb.tools import tool\n"
        "def f(x: int) -> int:\n"
        "    'Doc.'\n"
        "    return x\n"
        "tool(process=True)(f)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 1
    assert "defined in an interactive session (notebook or REPL)" in run.stderr


def test_a_program_read_from_stdin_is_refused() -> None:
    # Even for a function of an importable module: spawn would re-run "<stdin>" in the child.
    code = "import sys\nsys.path.insert(0, sys.argv[1])\nimport test_tools_process\n"
    run = subprocess.run(
        [sys.executable, "-", str(Path(__file__).parent)],
        input=code,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    assert "cannot start child processes from a program read from <stdin>" in run.stderr
