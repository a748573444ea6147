"""bash attacks: whitelist chaining through `Agent.chat`, approval by default, and the bubblewrap
sandbox with real commands (writes outside the workdir, /tmp, network, data directory,
environment, resource limits)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _waits import until

from ania_nb import Callbacks
from ania_nb.config import BashSettings
from ania_nb.tools.builtin._shellwords import is_simple_command, simple_command_problem
from ania_nb.tools.builtin.bash import BashTool

pytest_plugins = ["_http_fixtures"]

# The interpreter itself, not a venv's link to it: a venv under /tmp (CI clones there) is
# hidden by the sandbox's private /tmp. These commands need only the standard library.
SANDBOX_PYTHON = os.path.realpath(sys.executable)


def _bwrap_problem() -> str | None:
    """Why bubblewrap cannot run here (None when it can)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    box = "--ro-bind / / --unshare-net --unshare-pid --cap-drop ALL --proc /proc --dev /dev"
    probe = subprocess.run(
        ["bwrap", *box.split(), "true"], capture_output=True, text=True, timeout=30
    )
    if probe.returncode != 0:
        return f"bwrap cannot create a sandbox in this environment: {probe.stderr.strip()}"
    return None


BWRAP_PROBLEM = _bwrap_problem()
needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=str(BWRAP_PROBLEM))


class Deny:
    """A request_approval callback that records each request and denies it."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.requests: list[Any] = []

    def __call__(self, request: Any) -> None:
        self.requests.append(request)
        answer = self.agent.answer_approval
        asyncio.get_running_loop().call_soon(lambda: answer(request.id, allow=False))

    @property
    def callbacks(self) -> Callbacks:
        return Callbacks(request_approval=self)


# --------------------------------------------------------------------------- the parser


@pytest.mark.parametrize(
    "command",
    [
        "ls",
        "ls -la /tmp",
        "  git status  ",
        "grep -r 'a; b && c | d $(e) `f` > g # h' src",
        'echo "a;b|c>d"',
        r"echo a\;b \$HOME \> x",
        "find . -name '*.py'",
        "echo {a,b}",
    ],
)
def test_simple_commands(command):
    assert simple_command_problem(command) is None


@pytest.mark.parametrize(
    "command",
    [
        "ls; touch m",
        "ls && touch m",
        "ls || touch m",
        "ls | sh",
        "ls & touch m",
        "ls\ntouch m",
        "ls\rtouch m",
        "ls $(touch m)",
        "ls `touch m`",
        'ls "$(touch m)"',
        'ls "`touch m`"',
        "ls $HOME",
        "ls ${x:=y}",
        "ls > f",
        "ls >> f",
        "ls 2> f",
        "ls < f",
        "ls <(touch m)",
        "ls >(touch m)",
        "(touch m)",
        "ls # comment",
        "ls 'unterminated",
        'ls "unterminated',
        "ls \\",
        "LD_PRELOAD=/tmp/x.so ls",
        "PATH=. ls",
        "ls \x00x",
        "",
    ],
)
def test_not_simple_commands(command):
    assert not is_simple_command(command)


def test_whitelist_rules_match_from_the_start_of_a_simple_command():
    tool = BashTool(BashSettings(whitelist=["status"]), approval_enabled=True)
    # An unanchored rule searched anywhere would let `sh -c '...status...'` run unasked.
    assert tool.verdict("sh -c 'git status; rm -rf ~'") == "ask"
    assert tool.verdict("status") == "allow"


# --------------------------------------------------------------------------- through the agent


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


CHAINS = [
    "ls; touch {m}",
    "ls && touch {m}",
    "ls || touch {m}; true",
    "ls $(touch {m})",
    "ls `touch {m}`",
    "ls\ntouch {m}",
    "ls > {m}",
    "ls & touch {m}",
]


@pytest.mark.parametrize("template", CHAINS)
async def test_whitelist_chaining_needs_approval_and_denied_nothing_runs(
    make_agent, run_tool, workdir, template
):
    marker = workdir / "marker"
    agent = make_agent(
        overrides={
            "agent.builtin_tools": True,
            "bash.enable": True,
            "bash.whitelist": [r"ls\b"],
            "bash.workdir": str(workdir),
        }
    )
    deny = Deny(agent)
    call = await run_tool(
        agent, "bash", {"command": template.format(m=marker)}, callbacks=deny.callbacks
    )
    assert len(deny.requests) == 1, "a chained command was let through unasked"
    assert call.error is not None and call.error.startswith("Tool call not approved")
    assert not marker.exists()


async def test_ls_piped_to_sh_needs_approval(make_agent, run_tool, workdir):
    # The folder's only entry is a file named like a command: `ls | sh` would run it.
    (workdir / "touch pwned").write_text("")
    agent = make_agent(
        overrides={
            "agent.builtin_tools": True,
            "bash.enable": True,
            "bash.whitelist": [r"ls\b"],
            "bash.workdir": str(workdir),
        }
    )
    deny = Deny(agent)
    call = await run_tool(agent, "bash", {"command": "ls | sh"}, callbacks=deny.callbacks)
    assert len(deny.requests) == 1
    assert call.error is not None
    assert not (workdir / "pwned").exists()
    # The whitelisted command itself still runs unasked (the check is not "always ask").
    listed = await run_tool(agent, "bash", {"command": "ls"}, callbacks=deny.callbacks)
    assert listed.result == "touch pwned"
    assert len(deny.requests) == 1


async def test_approval_is_on_by_default(make_agent, run_tool, workdir):
    marker = workdir / "marker"
    agent = make_agent(overrides={"agent.builtin_tools": True, "bash.enable": True})
    assert agent.config.approval.enable is False  # bash asks on its own
    deny = Deny(agent)
    call = await run_tool(agent, "bash", {"command": f"touch {marker}"}, callbacks=deny.callbacks)
    assert len(deny.requests) == 1
    assert not marker.exists()
    # Nobody who could approve (a script without a request_approval callback): refused.
    call = await run_tool(agent, "bash", {"command": f"touch {marker}"})
    assert call.error == (
        "Tool call not approved: nobody can approve tool calls in this conversation"
    )
    assert not marker.exists()


def test_the_blacklist_is_called_a_convenience():
    tool = BashTool(BashSettings(), approval_enabled=False)
    assert "needs a person's approval" in tool.description  # require_approval by default
    description = BashSettings.model_fields["blacklist"].description or ""
    assert "not a security boundary" in description


# --------------------------------------------------------------------------- the sandbox


@pytest.fixture
def sandboxed(make_agent, workdir):
    def build(**overrides: Any) -> Any:
        settings = {
            "agent.builtin_tools": True,
            "bash.enable": True,
            "bash.require_approval": False,  # the sandbox is what is tested here
            "bash.sandbox": "bwrap",
            "bash.workdir": str(workdir),
            "bash.timeout": 30,
        }
        return make_agent(overrides={**settings, **overrides})

    return build


@needs_bwrap
async def test_sandbox_writes_only_in_the_workdir(sandboxed, run_tool, workdir):
    outside = Path("/var/tmp") / f"ania-outside-{uuid.uuid4().hex}"
    try:
        call = await run_tool(
            sandboxed(), "bash", {"command": f"touch inside; touch {outside}; echo done"}
        )
        assert "Read-only file system" in call.result
        assert (workdir / "inside").exists()
        assert not outside.exists()
    finally:
        outside.unlink(missing_ok=True)


@needs_bwrap
async def test_sandbox_tmp_is_private(sandboxed, run_tool, tmp_path):
    host_file = tmp_path / f"ania-host-{uuid.uuid4().hex}"  # under /tmp, outside the workdir
    host_file.write_text("host secret")
    name = f"ania-inside-{uuid.uuid4().hex}"
    command = f"cat {host_file}; echo x > /tmp/{name}; cat /tmp/{name}"
    call = await run_tool(sandboxed(), "bash", {"command": command})
    assert "host secret" not in call.result
    assert call.result.startswith("x\nstderr: cat:")  # /tmp is writable, the host's is not there
    assert not (Path("/tmp") / name).exists()


@pytest.fixture
def tcp_server() -> Iterator[tuple[int, list[bytes]]]:
    """A 127.0.0.1 server that records what each connection sends."""
    server = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                received.append(conn.recv(100))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], received
    stop.set()
    thread.join(5)
    server.close()


def _connect_command(port: int) -> str:
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), 5).sendall(b'leak')\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('no network:', exc)\n"
    )
    return f'{SANDBOX_PYTHON} -c "{code}"'


@needs_bwrap
async def test_sandbox_has_no_network(sandboxed, run_tool, tcp_server):
    port, received = tcp_server
    call = await run_tool(sandboxed(), "bash", {"command": _connect_command(port)})
    assert call.result.startswith("no network:")
    assert received == []


@needs_bwrap
async def test_sandbox_network_when_allowed(sandboxed, run_tool, tcp_server):
    port, received = tcp_server
    call = await run_tool(
        sandboxed(**{"bash.sandbox_network": True}), "bash", {"command": _connect_command(port)}
    )
    assert call.result == "connected"
    assert received == [b"leak"]


@needs_bwrap
async def test_sandbox_hides_the_data_directory_and_config_files(run_tool, workdir, make_agent):
    data = workdir / ".ania"
    mcp_file = workdir / "mcp.json"
    mcp_file.write_text('{"servers": [], "token": "sk-secret"}')
    agent = make_agent(
        data_dir=data,
        overrides={
            "agent.builtin_tools": True,
            "bash.enable": True,
            "bash.require_approval": False,
            "bash.sandbox": "bwrap",
            "bash.workdir": str(workdir),
            "mcp.config_file": str(mcp_file),
        },
    )
    # Not spelled "ania.db": the blacklist is a convenience, the sandbox is the boundary.
    command = "ls -A .ania; cat .ania/ania.d''b; cat mcp.json; echo end"
    call = await run_tool(agent, "bash", {"command": command})
    assert (data / "ania.db").exists()  # on the host it is there
    stdout, _, stderr = call.result.partition("stderr: ")
    assert stdout.strip() == "end"  # an empty data directory, nothing read from the file
    assert "ania.db: No such file" in stderr
    assert "sk-secret" not in call.result
    assert mcp_file.read_text().startswith('{"servers"')  # untouched on the host


@needs_bwrap
async def test_sandbox_environment_is_cleared(sandboxed, run_tool, monkeypatch, workdir):
    monkeypatch.setenv("ANIA_LLM__API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("HARMLESS_SETTING", "also-not-inherited")
    agent = sandboxed(**{"bash.env": ["GREETING=hi"]})
    call = await run_tool(agent, "bash", {"command": "env | sort"})
    names = {line.partition("=")[0] for line in call.result.splitlines()}
    assert "GREETING=hi" in call.result.splitlines()
    assert not any(name.startswith("ANIA_") for name in names)
    assert "HARMLESS_SETTING" not in names
    assert {"PATH", "HOME", "LANG"} <= names


@needs_bwrap
async def test_sandbox_memory_limit_stops_a_memory_hog(sandboxed, run_tool):
    agent = sandboxed(**{"bash.sandbox_memory_mb": 200})
    hog = f"{SANDBOX_PYTHON} -c \"b = bytearray(400 * 1024 * 1024); print('allocated')\""
    call = await run_tool(agent, "bash", {"command": hog})
    assert "MemoryError" in call.result
    assert "allocated" not in call.result


@needs_bwrap
async def test_sandbox_cpu_limit_stops_a_busy_loop(sandboxed, run_tool):
    agent = sandboxed(**{"bash.sandbox_cpu_seconds": 1, "bash.timeout": 60})
    call = await run_tool(agent, "bash", {"command": "while :; do :; done"})
    assert "timed out" not in call.result  # the CPU limit, not the timeout, ended it
    assert "(exit code" in call.result


FORKS = "for i in $(seq 1 30); do sleep 2 & done; wait; echo finished"


@needs_bwrap
async def test_sandbox_process_limit_stops_a_fork_bomb(workdir, monkeypatch):
    """30 background processes against a limit of 10: forks fail. RLIMIT_NPROC does not bind
    root, so as root the sandbox command line is run as nobody (as an ordinary user runs it)."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root and setpriv (util-linux) is missing")
        prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        # pytest's own temporary folders are private to root: one nobody can enter.
        workdir = Path(tempfile.mkdtemp(prefix="ania-nproc-"))
        os.chmod(workdir, 0o755)
        os.chown(workdir, 65534, 65534)
        monkeypatch.setenv("HOME", str(workdir))  # root's home is closed to nobody
    settings = BashSettings(
        sandbox="bwrap", workdir=str(workdir), sandbox_max_processes=10, require_approval=False
    )
    argv, env, cwd = BashTool(settings, approval_enabled=False).argv(FORKS)
    argv = [*prefix, *argv]
    done = await asyncio.create_subprocess_exec(
        *argv,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(done.communicate(), 60)
    text = output.decode()
    if prefix:
        shutil.rmtree(workdir)
    if "Creating new namespace failed" in text or "No permissions" in text:
        pytest.skip(f"an unprivileged user cannot run bwrap here: {text.strip()}")
    assert "fork" in text.lower(), text  # "Cannot fork" / "Resource temporarily unavailable"


async def test_missing_bwrap_is_a_clear_error(sandboxed, run_tool, monkeypatch, tmp_path):
    agent = sandboxed()
    empty = tmp_path / "empty-path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    call = await run_tool(agent, "bash", {"command": "true"})
    assert call.error == (
        "bash.sandbox is 'bwrap' but bubblewrap is not installed: apt-get install bubblewrap"
    )


# --------------------------------------------------------------------------- escaped children


def _pipe_fds() -> set[str]:
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                fds.add(os.readlink(f"/proc/self/fd/{fd}"))
    return fds


async def test_a_setsid_child_cannot_hold_the_run_and_its_pipes_are_closed(
    make_agent, run_tool, tmp_path
):
    """A child that left the process group keeps our output pipes open: at the timeout the
    shell is killed and the pipes are closed by us, not left to the garbage collector."""
    pidfile = tmp_path / "escaped.pid"
    agent = make_agent(
        overrides={
            "agent.builtin_tools": True,
            "bash.enable": True,
            "bash.require_approval": False,
            "bash.timeout": 0.5,
        }
    )
    before = _pipe_fds()
    command = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 30' & wait"
    try:
        call = await run_tool(agent, "bash", {"command": command})
        assert call.result.endswith("command timed out after 0.5 s and was killed")
        gc.disable()  # the pipes must be closed now, not whenever a collection runs
        try:
            leaked = _pipe_fds() - before
            escaped = int(pidfile.read_text())
            # The escaped sleeper still holds its ends: ours must be closed.
            ours = {os.readlink(f"/proc/{escaped}/fd/{fd}") for fd in ("1", "2")} & leaked
            assert ours == set()
        finally:
            gc.enable()
    finally:
        with contextlib.suppress(Exception):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def _running(argument: str) -> list[int]:
    """Host pids of processes whose command line contains ``argument`` (not this process)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                if argument.encode() in cmdline:
                    found.append(int(entry))
    return found


@needs_bwrap
async def test_the_timeout_kills_everything_in_the_sandbox(sandboxed, run_tool):
    seconds = f"{30 + uuid.uuid4().int % 1000 / 1000:.3f}"  # a sleep no one else runs
    agent = sandboxed(**{"bash.timeout": 0.5})
    call = await run_tool(agent, "bash", {"command": f"sleep {seconds} & echo started; wait"})
    assert call.result == "started\ncommand timed out after 0.5 s and was killed"
    # The PID namespace ends with its first process.
    await until(lambda: _running(seconds) == [], "the sandbox's processes to be gone")


async def test_the_sandbox_refuses_a_root_workdir(sandboxed, run_tool):
    call = await run_tool(sandboxed(**{"bash.workdir": "/"}), "bash", {"command": "true"})
    assert call.error == "bash: bash.workdir must not be / with bash.sandbox (it is writable)"
