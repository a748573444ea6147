"""`bash` with real subprocesses: verdicts, approvals through the Agent, kills, output shaping.

Also the issue's concurrency check: tool calls of one round run together.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ania_nb import ApprovalRequest, Callbacks
from ania_nb.testing import reply, tool_call

pytest_plugins = ["_http_fixtures"]

SESSION = "nb:tools"


@pytest.fixture
def bash_agent(make_agent: Any) -> Any:
    def build(**overrides: Any) -> Any:
        # bash asks by default (bash.require_approval); these tests run commands unattended.
        settings = {"agent.builtin_tools": True, "bash.enable": True}
        settings["bash.require_approval"] = False
        return make_agent(overrides={**settings, **overrides})

    return build


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def poll(predicate: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


async def eventually(predicate: Callable[[], bool], within: float = 10.0) -> bool:
    """Wait (bounded, off the loop) for ``predicate``; returns whether it became true."""
    return await asyncio.to_thread(poll, predicate, within)


async def gone(pid: int) -> bool:
    """SIGKILL is delivered at once, but the exit takes a moment."""
    return await eventually(lambda: not alive(pid))


def written_pid(path: Path) -> int | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return int(text) if text.endswith("\n") else None


async def read_pid(path: Path) -> int:
    assert await eventually(lambda: written_pid(path) is not None), f"{path} never written"
    pid = written_pid(path)
    assert pid is not None
    return pid


class Approver:
    """A request_approval callback that answers through `Agent.answer_approval` (or not)."""

    def __init__(self, agent: Any, answer: bool | str | None, *, by_session: bool = False):
        self.agent = agent
        self.answer = answer
        self.by_session = by_session
        self.requests: list[ApprovalRequest] = []
        self.asked = asyncio.Event()

    def __call__(self, request: ApprovalRequest) -> None:
        self.requests.append(request)
        self.asked.set()
        if self.answer is None:
            return  # nobody answers
        if self.by_session:
            answer = functools.partial(
                self.agent.answer_approval, session=request.session, allow=self.answer
            )
        else:
            answer = functools.partial(
                self.agent.answer_approval, request.id, allow=self.answer, approver="alice"
            )
        asyncio.get_running_loop().call_soon(answer)

    @property
    def callbacks(self) -> Callbacks:
        return Callbacks(request_approval=self)


# --------------------------------------------------------------------------- running


async def test_echo(bash_agent, run_tool):
    call = await run_tool(bash_agent(), "bash", {"command": "echo hello world"})
    assert call.error is None
    assert call.result == "hello world"


async def test_stderr_is_appended_after_stdout(bash_agent, run_tool):
    call = await run_tool(bash_agent(), "bash", {"command": "echo out; echo err >&2"})
    assert call.result == "out\nstderr: err"


async def test_only_stderr(bash_agent, run_tool):
    call = await run_tool(bash_agent(), "bash", {"command": "echo oops >&2"})
    assert call.result == "stderr: oops"


async def test_no_output(bash_agent, run_tool):
    call = await run_tool(bash_agent(), "bash", {"command": "true"})
    assert call.result == "(no output)"


async def test_non_zero_exit_code_is_reported_as_a_result(bash_agent, run_tool):
    call = await run_tool(bash_agent(), "bash", {"command": "echo partial; exit 3"})
    assert call.error is None
    assert call.result == "partial\n(exit code 3)"


async def test_exit_127_gets_a_hint(bash_agent, run_tool):
    call = await run_tool(bash_agent(), "bash", {"command": "no-such-command-ania-xyz --flag"})
    assert call.error is None
    assert "stderr: " in call.result and "not found" in call.result
    assert call.result.endswith(
        "(exit code 127: command not found — check the name and stderr above, and verify it "
        "exists with `command -v <name>`)"
    )


async def test_huge_output_is_truncated_with_the_marker(bash_agent, run_tool):
    agent = bash_agent(**{"bash.max_output_chars": 1000})
    call = await run_tool(agent, "bash", {"command": "head -c 3000000 /dev/zero | tr '\\0' a"})
    marker = "\n...(output truncated)"
    assert call.result == "a" * (1000 - len(marker)) + marker  # 1000 characters, marker included


async def test_truncation_counts_characters_not_bytes(bash_agent, run_tool):
    agent = bash_agent(**{"bash.max_output_chars": 300})
    command = "i=0; while [ $i -lt 400 ]; do printf '猫'; i=$((i+1)); done"
    call = await run_tool(agent, "bash", {"command": command})
    marker = "\n...(output truncated)"
    assert call.result == "猫" * (300 - len(marker)) + marker


async def test_bash_env_entries_are_added_to_the_inherited_environment(bash_agent, run_tool):
    agent = bash_agent(**{"bash.env": ["GREETING=hi there", "EQUATION=a=b", "BROKEN"]})
    call = await run_tool(agent, "bash", {"command": 'echo "$GREETING|$EQUATION|${HOME:+home}"'})
    assert call.result == "hi there|a=b|home"


async def test_empty_command_is_refused(bash_agent, run_tool):
    call = await run_tool(bash_agent(), "bash", {"command": "   "})
    assert call.error == "command must not be empty"


# --------------------------------------------------------------------------- verdicts


@pytest.mark.parametrize(
    ("command", "rule"),
    [
        ("mkfs.ext4 /dev/sdz9", r"\bmkfs"),
        ("echo ok; mkfs -t ext4 /dev/sdz9", r"\bmkfs"),
        ("sudo mkfs /dev/sdz9", r"\bmkfs"),
        ("shutdown now", r"\b(shutdown|reboot|halt|poweroff)\b"),
        ("true && reboot", r"\b(shutdown|reboot|halt|poweroff)\b"),
        ("sudo shutdown -h now", r"\b(shutdown|reboot|halt|poweroff)\b"),
        ("echo $(reboot)", r"\b(shutdown|reboot|halt|poweroff)\b"),
        ("cat .ania/ania.db", r"ania\.(db|toml)"),
        ("cat ania.toml", r"ania\.(db|toml)"),
    ],
)
async def test_default_blacklist_refuses_naming_the_rule(bash_agent, run_tool, command, rule):
    # `echo` as the shell: even if a refusal regressed, nothing dangerous could run.
    agent = bash_agent(**{"bash.shell": "echo", "approval.enable": True})
    call = await run_tool(agent, "bash", {"command": command})
    assert call.error == f'bash: command refused by rule "{rule}"'


async def test_blacklist_wins_over_whitelist(bash_agent, run_tool, tmp_path):
    marker = tmp_path / "ran"
    agent = bash_agent(**{"bash.whitelist": ["^touch"], "bash.blacklist": ["ran$"]})
    call = await run_tool(agent, "bash", {"command": f"touch {marker}"})
    assert call.error == 'bash: command refused by rule "ran$"'
    assert not marker.exists()


async def test_whitelisted_command_runs_without_asking(bash_agent, run_tool):
    agent = bash_agent(**{"approval.enable": True, "bash.whitelist": [r"^echo\b"]})
    approver = Approver(agent, False)
    call = await run_tool(agent, "bash", {"command": "echo listed"}, callbacks=approver.callbacks)
    assert call.result == "listed"
    assert approver.requests == []


async def test_approval_disabled_runs_without_asking(bash_agent, run_tool):
    agent = bash_agent()
    approver = Approver(agent, False)
    call = await run_tool(agent, "bash", {"command": "echo free"}, callbacks=approver.callbacks)
    assert call.result == "free"
    assert approver.requests == []


async def test_approved_command_runs(bash_agent, run_tool):
    agent = bash_agent(**{"approval.enable": True})
    approver = Approver(agent, True)
    call = await run_tool(
        agent, "bash", {"command": "echo   approved\n  echo  ran"}, callbacks=approver.callbacks
    )
    assert call.result == "approved\nran"
    [request] = approver.requests
    assert request.tool == "bash" and request.session == SESSION
    assert request.summary == "run command: echo approved echo ran"
    assert request.id


async def test_denied_command_does_not_run(bash_agent, run_tool, tmp_path):
    marker = tmp_path / "ran"
    agent = bash_agent(**{"approval.enable": True})
    approver = Approver(agent, False)
    call = await run_tool(
        agent, "bash", {"command": f"touch {marker}"}, callbacks=approver.callbacks
    )
    assert call.error == "Tool call not approved: denied by alice"
    assert (call.outcome, call.stage) == ("denied", "human")
    assert not marker.exists()
    assert len(approver.requests) == 1


@pytest.mark.parametrize(
    ("word", "runs"),
    [("允许", True), ("同意", True), ("deny", False), ("拒绝", False), ("YES", True)],
)
async def test_answer_words_through_the_agent(bash_agent, run_tool, tmp_path, word, runs):
    marker = tmp_path / "ran"
    agent = bash_agent(**{"approval.enable": True})
    approver = Approver(agent, word, by_session=True)
    call = await run_tool(
        agent, "bash", {"command": f"touch {marker} && echo made"}, callbacks=approver.callbacks
    )
    assert marker.exists() is runs
    if runs:
        assert call.result == "made"
    else:
        assert call.error == "Tool call not approved: denied"


async def test_approval_enabled_without_a_request_callback_refuses(bash_agent, run_tool, tmp_path):
    marker = tmp_path / "ran"
    agent = bash_agent(**{"approval.enable": True})
    call = await run_tool(agent, "bash", {"command": f"touch {marker}"})
    assert call.error == (
        "Tool call not approved: nobody can approve tool calls in this conversation"
    )
    assert not marker.exists()


async def test_unanswered_approval_times_out_as_denied(bash_agent, run_tool, tmp_path):
    marker = tmp_path / "ran"
    agent = bash_agent(**{"approval.enable": True})
    agent.approvals.timeout = 0.3
    approver = Approver(agent, None)
    call = await run_tool(
        agent, "bash", {"command": f"touch {marker}"}, callbacks=approver.callbacks
    )
    assert call.error == "Tool call not approved: no answer within 0.3 s, denied automatically"
    assert (call.outcome, call.stage) == ("timeout", "human")
    assert not marker.exists()
    assert agent.approvals.pending() == []


async def test_stop_while_waiting_for_approval(bash_agent, llm, tmp_path):
    marker = tmp_path / "ran"
    agent = bash_agent(**{"approval.enable": True})
    approver = Approver(agent, None)
    llm.script(reply(tool_calls=[tool_call("bash", {"command": f"touch {marker}"})]))
    task = asyncio.create_task(agent.chat("go", session=SESSION, callbacks=approver.callbacks))
    await asyncio.wait_for(approver.asked.wait(), 10)
    assert [r.tool for r in agent.approvals.pending(SESSION)] == ["bash"]
    assert agent.stop(SESSION) is True
    result = await task
    assert result.status == "stopped"
    assert agent.approvals.pending() == []
    assert not marker.exists()


# --------------------------------------------------------------------------- kills


async def test_timeout_kills_the_whole_process_group_and_keeps_output(
    bash_agent, run_tool, tmp_path
):
    pidfile = tmp_path / "bg.pid"
    agent = bash_agent(**{"bash.timeout": 0.5})
    command = f"sleep 30 & echo $! > {pidfile}; echo started; wait"
    call = await run_tool(agent, "bash", {"command": command})
    assert call.error is None
    assert call.result == "started\ncommand timed out after 0.5 s and was killed"
    assert await gone(await read_pid(pidfile))


async def test_a_background_child_holding_the_output_open_is_killed_at_the_timeout(
    bash_agent, run_tool, tmp_path
):
    pidfile = tmp_path / "bg.pid"
    agent = bash_agent(**{"bash.timeout": 0.5})
    call = await run_tool(agent, "bash", {"command": f"sleep 30 & echo $! > {pidfile}"})
    assert call.result.endswith("command timed out after 0.5 s and was killed")
    assert await gone(await read_pid(pidfile))


async def test_stop_during_a_long_command_kills_it(bash_agent, llm, tmp_path):
    pidfile = tmp_path / "bg.pid"
    agent = bash_agent()
    command = f"sleep 30 & echo $! > {pidfile}; wait"
    llm.script(reply(tool_calls=[tool_call("bash", {"command": command})]))
    task = asyncio.create_task(agent.chat("run it", session=SESSION))
    pid = await read_pid(pidfile)
    assert alive(pid)
    assert agent.stop(SESSION) is True
    result = await task
    assert result.status == "stopped"
    assert await gone(pid)
    [run] = await agent.runs(session=SESSION)
    assert run.status == "stopped"


# --------------------------------------------------------------------------- concurrency


async def test_calls_of_one_round_run_concurrently(bash_agent, llm, jina, tmp_path):
    """One round: bash, a web fetch and `time`. bash and the web server meet at a barrier: each
    says it started, then waits for the other, so run one after the other neither could end
    well (bash would give up, or the server would answer 504)."""
    from _http_fixtures import as_answer  # the plugin module, loaded (and rewritten) by now

    bash_started, web_started = tmp_path / "bash-started", tmp_path / "web-started"

    def read(seen):
        web_started.touch()
        for _ in range(2000):  # up to ~20 s: only a failure waits that long
            if bash_started.exists():
                return as_answer("# Met bash\n\nboth calls were running")
            time.sleep(0.01)
        return as_answer("bash never started", status=504)

    jina.route("/read/", read, prefix=True)
    agent = bash_agent(**{"web.reader_url": jina.url("/read/")})
    meet = (
        f"touch {bash_started}; i=0; "
        f"while [ ! -e {web_started} ]; do "
        "i=$((i+1)); [ $i -gt 2000 ] && { echo 'the web call never started' >&2; exit 1; }; "
        "sleep 0.01; done; echo met the web call"
    )
    llm.script(
        reply(
            tool_calls=[
                tool_call("bash", {"command": meet}),
                tool_call("webExplore", {"url": "https://example.com/slow"}),
                tool_call("time"),
            ]
        ),
        reply("all done"),
    )
    result = await agent.chat("do three things")
    assert result.status == "success"
    bash, web, clock = result.tool_calls
    assert [c.error for c in result.tool_calls] == [None, None, None]
    assert bash.result == "met the web call"
    assert "both calls were running" in web.result
    assert clock.name == "time"
