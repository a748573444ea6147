"""Hooks keep their meaning: Claude Code's JSON answers are obeyed through `Agent.chat`
(deny/ask/allow, continue:false, additionalContext, legacy decisions), and a daemonising or
flooding hook cannot hold or swell the run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

import pytest

from ania_nb import Callbacks, tool
from ania_nb.testing import reply, tool_call


@pytest.fixture
def hooked(make_agent, tmp_path):
    """An Agent whose hooks file holds ``hooks`` (Claude Code's settings form is used as is)."""

    def build(hooks: dict, tools=(), **overrides):
        path = tmp_path / "hooks.json"
        path.write_text(json.dumps({"hooks": hooks}))
        settings = {"hooks.enable": True, "hooks.file": str(path), **overrides}
        return make_agent(tools=list(tools), overrides=settings)

    return build


@pytest.fixture
def answering(hook_script, tmp_path):
    """A Claude-form hook entry whose script saves its stdin and prints ``answer`` as JSON."""

    def make(name: str, answer: dict, matcher: str = "") -> dict:
        seen = tmp_path / f"{name}.stdin"
        body = f"cat > {seen}\ncat <<'JSON'\n{json.dumps(answer)}\nJSON\n"
        script = hook_script(f"{name}.sh", body)
        return {"matcher": matcher, "hooks": [{"type": "command", "command": str(script)}]}

    return make


def pre_tool_answer(decision: str, reason: str = "", **extra) -> dict:
    specific = {"hookEventName": "PreToolUse", "permissionDecision": decision}
    if reason:
        specific["permissionDecisionReason"] = reason
    return {"hookSpecificOutput": specific, **extra}


def tool_messages(request) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "tool"]


def make_marker_tool(marker: Path):
    @tool(side_effects=True)
    def write_marker(text: str) -> str:
        """Write a marker file."""
        marker.write_text(text)
        return "written"

    return write_marker


# ------------------------------------------------------------------ PreToolUse decisions


async def test_deny_blocks_a_bash_call_named_the_claude_code_way(hooked, answering, llm, tmp_path):
    marker = tmp_path / "pwned"
    entry = answering("deny", pre_tool_answer("deny", "no touching here"), matcher="Bash")
    agent = hooked(
        {"PreToolUse": [entry]},
        **{"agent.builtin_tools": True, "bash.enable": True, "bash.whitelist": ["touch "]},
    )
    llm.script(reply(tool_calls=[tool_call("bash", {"command": f"touch {marker}"})]), reply("ok"))
    result = await agent.chat("touch it")
    [call] = result.tool_calls
    assert not marker.exists()
    assert (call.outcome, call.stage) == ("blocked", "hook")
    assert call.result == "Tool call blocked by a hook: no touching here"
    assert tool_messages(llm.requests[1]) == [call.result]
    payload = json.loads((tmp_path / "deny.stdin").read_text())
    assert payload["tool_name"] == "bash"
    assert payload["tool_input"] == {"command": f"touch {marker}"}  # an object, not a string


async def test_legacy_decision_block_and_an_unknown_decision_both_stop_the_call(
    hooked, answering, llm, tmp_path
):
    marker = tmp_path / "marker"
    legacy = answering("legacy", {"decision": "block", "reason": "legacy says no"}, "^a$")
    unknown = answering("unknown", pre_tool_answer("maybe"), "^b$")

    @tool(name="a", side_effects=True)
    def tool_a(text: str) -> str:
        """A."""
        marker.write_text("a ran")
        return "a"

    @tool(name="b", side_effects=True)
    def tool_b(text: str) -> str:
        """B."""
        marker.write_text("b ran")
        return "b"

    agent = hooked({"PreToolUse": [legacy, unknown]}, tools=[tool_a, tool_b])
    calls = [tool_call("a", {"text": "x"}), tool_call("b", {"text": "y"})]
    llm.script(reply(tool_calls=calls), reply("ok"))
    result = await agent.chat("go")
    a, b = result.tool_calls
    assert not marker.exists()
    assert a.result == "Tool call blocked by a hook: legacy says no"
    assert b.outcome == "blocked" and "unknown permissionDecision 'maybe'" in b.result


async def test_ask_makes_a_person_approve_a_tool_that_needs_no_approval(
    hooked, answering, llm, inbox, tmp_path
):
    marker = tmp_path / "marker"
    entry = answering("ask", pre_tool_answer("ask", "double-check this one"))
    agent = hooked({"PreToolUse": [entry]}, tools=[make_marker_tool(marker)])
    llm.script(reply(tool_calls=[tool_call("write_marker", {"text": "x"})]), reply("ok"))
    task = asyncio.create_task(agent.chat("go", callbacks=Callbacks(request_approval=inbox)))
    request = await inbox.wait_for(1)
    assert request.tool == "write_marker"
    agent.answer_approval(request.id, allow=False)
    result = await task
    assert not marker.exists()
    assert (result.tool_calls[0].outcome, result.tool_calls[0].stage) == ("denied", "human")


async def test_ask_wins_over_allow_from_another_hook(hooked, answering, llm, inbox, tmp_path):
    marker = tmp_path / "marker"
    allow = answering("allow", pre_tool_answer("allow"))
    ask = answering("ask", pre_tool_answer("ask"))
    agent = hooked({"PreToolUse": [allow, ask]}, tools=[make_marker_tool(marker)])
    llm.script(reply(tool_calls=[tool_call("write_marker", {"text": "x"})]), reply("ok"))
    task = asyncio.create_task(agent.chat("go", callbacks=Callbacks(request_approval=inbox)))
    request = await inbox.wait_for(1)
    agent.answer_approval(request.id, allow=False)
    await task
    assert not marker.exists()


async def test_allow_skips_the_persons_approval_for_bash(hooked, answering, llm, inbox, tmp_path):
    marker = tmp_path / "made"
    entry = answering("allow", pre_tool_answer("allow", "checked by policy"), matcher="Bash")
    agent = hooked(
        {"PreToolUse": [entry]},
        **{"agent.builtin_tools": True, "bash.enable": True, "approval.enable": True},
    )
    llm.script(reply(tool_calls=[tool_call("bash", {"command": f"touch {marker}"})]), reply("ok"))
    result = await agent.chat("go", callbacks=Callbacks(request_approval=inbox))
    assert result.tool_calls[0].outcome == "ok"
    assert marker.exists() and inbox.requests == []


async def test_allow_never_replaces_an_admins_approval(hooked, answering, llm, inbox):
    entry = answering("allow", pre_tool_answer("allow", "hooks approve everything"))
    agent = hooked(
        {"PreToolUse": [entry]},
        **{"config_tool.enable": True, "admin.ids": ["root"], "roles.admin_tools": []},
    )
    arguments = {"key": "agent.max_iterations", "value": "3"}
    llm.script(reply(tool_calls=[tool_call("config_set", arguments)]), reply("ok"))
    task = asyncio.create_task(
        agent.chat("go", sender="mallory", callbacks=Callbacks(request_approval=inbox))
    )
    request = await inbox.wait_for(1)
    assert request.tool == "config_set" and request.admin_only
    agent.answer_approval(request.id, allow=False, approver="root")
    result = await task
    assert (result.tool_calls[0].outcome, result.tool_calls[0].stage) == ("denied", "admin")
    assert agent.config.agent.max_iterations != 3


# ------------------------------------------------------------------ continue: false


async def test_continue_false_at_pre_tool_use_ends_the_run_and_cancels_its_siblings(
    hooked, hook_script, llm, tmp_path
):
    started, cancelled, marker = tmp_path / "started", tmp_path / "cancelled", tmp_path / "marker"
    # The stop waits until the sibling is running, so the sibling is cancelled, not refused.
    stopper = hook_script(
        "stop.sh",
        f"""
        cat > /dev/null
        while [ ! -f {started} ]; do sleep 0.02; done
        echo '{{"continue": false, "stopReason": "policy: stop now"}}'
        """,
    )
    entry = {"matcher": "write_marker", "hooks": [{"type": "command", "command": str(stopper)}]}

    @tool
    async def slow(key: str) -> str:
        """Waits forever."""
        started.touch()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.touch()
        return "never"

    agent = hooked({"PreToolUse": [entry]}, tools=[make_marker_tool(marker), slow])
    calls = [tool_call("slow", {"key": "k"}), tool_call("write_marker", {"text": "x"})]
    llm.script(reply(tool_calls=calls), reply("should not be asked"))
    result = await asyncio.wait_for(agent.chat("go", session="nb:stop"), 30)
    assert result.status == "error"
    assert result.error == "stopped by a PreToolUse hook: policy: stop now"
    assert not marker.exists() and cancelled.exists()
    assert len(llm.requests) == 1  # the model was not asked again
    [record] = await agent.runs(session="nb:stop")
    assert record.status == "error" and "policy: stop now" in record.error


async def test_continue_false_at_post_tool_use_ends_the_run(hooked, answering, llm, tmp_path):
    marker = tmp_path / "marker"
    entry = answering("post", {"continue": False, "stopReason": "audit failed"})
    agent = hooked({"PostToolUse": [entry]}, tools=[make_marker_tool(marker)])
    llm.script(reply(tool_calls=[tool_call("write_marker", {"text": "x"})]), reply("no"))
    result = await agent.chat("go")
    assert marker.exists()  # PostToolUse comes after the call
    assert (
        result.status == "error" and result.error == "stopped by a PostToolUse hook: audit failed"
    )
    assert len(llm.requests) == 1


async def test_user_prompt_submit_json_block_and_stop_refuse_the_turn(hooked, answering, llm):
    block = answering("block", {"decision": "block", "reason": "no secrets"})
    agent = hooked({"UserPromptSubmit": [block]})
    result = await agent.chat("my password is hunter2", session="s1")
    assert result.error == "blocked by a UserPromptSubmit hook: no secrets"
    stop = answering("stop", {"continue": False, "stopReason": "closed for today"})
    agent = hooked({"UserPromptSubmit": [stop]})
    result = await agent.chat("hello", session="s2")
    assert result.error == "blocked by a UserPromptSubmit hook: closed for today"
    assert llm.requests == []


# ------------------------------------------------------------------ context and messages


async def test_additional_context_reaches_the_model_and_plain_pre_tool_stdout_does_not(
    hooked, answering, hook_script, llm, caplog
):
    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    def context(event: str, text: str, **extra) -> dict:
        specific = {"hookEventName": event, "additionalContext": text}
        return {"hookSpecificOutput": specific, **extra}

    plain = hook_script("plain.sh", "echo PLAIN-PRE-TOOL-OUTPUT\n")
    hooks = {
        "SessionStart": [answering("start", context("SessionStart", "START-CONTEXT"))],
        "UserPromptSubmit": [
            answering(
                "prompt",
                context("UserPromptSubmit", "PROMPT-CONTEXT", systemMessage="USER-ONLY-NOTE"),
            )
        ],
        "PreToolUse": [
            {"hooks": [{"type": "command", "command": str(plain)}]},
            answering("pre", context("PreToolUse", "PRE-CONTEXT")),
        ],
        "PostToolUse": [
            answering(
                "post",
                {"decision": "block", "reason": "POST-FEEDBACK", **context("PostToolUse", "POST")},
            )
        ],
    }
    agent = hooked(hooks, tools=[lookup])
    llm.script(reply(tool_calls=[tool_call("lookup", {"key": "k"})]), reply("done"))
    with caplog.at_level(logging.WARNING, logger="ania_nb.governance.hooks"):
        result = await agent.chat("hi", session="nb:ctx")
    assert result.ok
    prompt = llm.requests[0].messages[-1]["content"]
    assert "PROMPT-CONTEXT" in prompt and "START-CONTEXT" in prompt
    [tool_text] = tool_messages(llm.requests[1])
    assert tool_text.startswith("value of k")
    assert "PRE-CONTEXT" in tool_text and "POST" in tool_text and "POST-FEEDBACK" in tool_text
    everything = json.dumps([r.messages for r in llm.requests])
    assert "PLAIN-PRE-TOOL-OUTPUT" not in everything  # transcript only, as in Claude Code
    assert "USER-ONLY-NOTE" not in everything  # systemMessage is for the user
    assert any("USER-ONLY-NOTE" in r.getMessage() for r in caplog.records)
    stored = [m["content"] for m in await agent.history("nb:ctx") if m["role"] == "user"]
    assert all("PROMPT-CONTEXT" not in s for s in stored)


async def test_json_with_wrong_types_blocks_the_call(hooked, answering, llm, tmp_path):
    marker = tmp_path / "marker"
    entry = answering("bad", {"continue": "no", "hookSpecificOutput": {"additionalContext": 5}})
    agent = hooked({"PreToolUse": [entry]}, tools=[make_marker_tool(marker)])
    llm.script(reply(tool_calls=[tool_call("write_marker", {"text": "x"})]), reply("ok"))
    result = await agent.chat("go")
    [call] = result.tool_calls
    assert result.ok and not marker.exists()  # a guard we cannot read does not let it through
    assert (call.outcome, call.stage) == ("blocked", "hook")
    assert "continue must be a bool, got 'no'" in call.result


# ------------------------------------------------------------------ deny decisions fail closed


@pytest.fixture
def printing(hook_script, tmp_path):
    """A Claude-form hook entry whose script prints exactly ``output`` (bytes or text)."""

    def make(name: str, output: bytes | str, matcher: str = "") -> dict:
        answer = tmp_path / f"{name}.out"
        answer.write_bytes(output if isinstance(output, bytes) else output.encode())
        script = hook_script(f"{name}.sh", f"cat > /dev/null\ncat {answer}\n")
        return {"matcher": matcher, "hooks": [{"type": "command", "command": str(script)}]}

    return make


def _deny(**specific) -> dict:
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", **specific}}


DENY = json.dumps(_deny(permissionDecision="deny", permissionDecisionReason="not this one"))
MALFORMED_DENIES = [
    ("a UTF-8 byte-order mark", "\ufeff" + DENY, "not this one"),
    ("UTF-16 with its byte-order mark", DENY.encode("utf-16"), "not this one"),
    ("whitespace before the brace", "\n\t  " + DENY, "not this one"),
    (
        "a wrongly cased hookEventName",
        json.dumps(
            {"hookSpecificOutput": {"hookEventName": "pretooluse", "permissionDecision": "deny"}}
        ),
        "hookEventName is 'pretooluse', not 'PreToolUse'",
    ),
    (
        "hookEventName of the wrong type",
        json.dumps({"hookSpecificOutput": {"hookEventName": 1, "permissionDecision": "deny"}}),
        "hookEventName must be a str",
    ),
    (
        "a decision that is a list",
        json.dumps(_deny(permissionDecision=["deny"])),
        "permissionDecision must be a str, got ['deny']",
    ),
    ("an upper-case decision", json.dumps(_deny(permissionDecision="DENY")), "'DENY'"),
    ("a decision with spaces", json.dumps(_deny(permissionDecision=" deny")), "' deny'"),
    (
        "a reason of the wrong type",
        json.dumps(_deny(permissionDecision="deny", permissionDecisionReason=5)),
        "permissionDecisionReason must be a str",
    ),
    ("a truncated answer", DENY[:-2], "not valid JSON"),
    ("trailing text", DENY + " and more", "not valid JSON: Extra data"),
    ("a second object", DENY + DENY, "not valid JSON: Extra data"),
    ("hookSpecificOutput as text", '{"hookSpecificOutput": "deny"}', "must be a dict"),
    ("a legacy decision of the wrong type", '{"decision": ["block"]}', "decision must be a str"),
    (
        "a wrongly cased allow",
        json.dumps(_deny(permissionDecision="Allow")),
        "unknown permissionDecision 'Allow'",
    ),
    ("an unclosed nest", '{"a":' * 10_000, "not valid JSON: nested too deeply"),
]


@pytest.mark.parametrize(
    ("output", "reason"),
    [pytest.param(out, why, id=what) for what, out, why in MALFORMED_DENIES],
)
async def test_a_malformed_or_odd_deny_blocks_the_call(
    hooked, printing, llm, tmp_path, output, reason
):
    marker = tmp_path / "marker"
    agent = hooked({"PreToolUse": [printing("guard", output)]}, tools=[make_marker_tool(marker)])
    llm.script(reply(tool_calls=[tool_call("write_marker", {"text": "x"})]), reply("ok"))
    result = await agent.chat("go")
    [call] = result.tool_calls
    assert not marker.exists(), f"the call ran: {call.result}"
    assert (call.outcome, call.stage) == ("blocked", "hook")
    assert reason in call.result
    assert tool_messages(llm.requests[1]) == [call.result]


async def test_a_deny_cut_at_the_pipe_cap_blocks_the_call_and_says_why(
    hooked, hook_script, llm, tmp_path
):
    """The attack: a deny whose reason echoes a 70,000-character input outgrows 64 KiB."""
    marker = tmp_path / "marker"
    echo = (
        "import json, sys; call = json.load(sys.stdin); "
        "print(json.dumps({'hookSpecificOutput': {'hookEventName': 'PreToolUse', "
        "'permissionDecision': 'deny', "
        "'permissionDecisionReason': 'refused: ' + call['tool_input']['text']}}))"
    )
    script = hook_script("echo-deny.sh", f'exec {sys.executable} -c "{echo}"\n')
    entry = {"hooks": [{"type": "command", "command": str(script)}]}
    agent = hooked({"PreToolUse": [entry]}, tools=[make_marker_tool(marker)])
    llm.script(reply(tool_calls=[tool_call("write_marker", {"text": "y" * 70_000})]), reply("ok"))
    result = await agent.chat("go")
    [call] = result.tool_calls
    assert not marker.exists()
    assert (call.outcome, call.stage) == ("blocked", "hook")
    assert "hook output was cut at 64 KiB" in call.result


@pytest.mark.parametrize(
    "output",
    [
        json.dumps(_deny(permissionDecision="allow")),
        json.dumps({"hookSpecificOutput": {"permissionDecision": "allow"}}),  # event implied
        "\ufeff" + json.dumps(_deny(permissionDecision="allow")),
        '{"suppressOutput": false}',
        "looks fine to me {really}",  # plain text: transcript output at PreToolUse, as today
        "",
    ],
)
async def test_well_formed_answers_and_plain_text_still_let_the_call_run(
    hooked, printing, llm, tmp_path, output
):
    marker = tmp_path / "marker"
    agent = hooked({"PreToolUse": [printing("guard", output)]}, tools=[make_marker_tool(marker)])
    llm.script(reply(tool_calls=[tool_call("write_marker", {"text": "ran"})]), reply("ok"))
    result = await agent.chat("go")
    [call] = result.tool_calls
    assert marker.read_text() == "ran" and call.result == "written"
    assert "looks fine" not in json.dumps(llm.requests[1].messages)  # not context either


async def test_unreadable_answers_fail_closed_at_user_prompt_submit_and_post_tool_use(
    hooked, printing, llm, tmp_path
):
    marker = tmp_path / "marker"
    broken = '{"decision": "block", "reason": "cut off'
    prompt = hooked({"UserPromptSubmit": [printing("prompt", broken)]})
    llm.script(reply("never asked"))
    refused = await prompt.chat("hello", session="nb:prompt")
    assert refused.status == "error" and not llm.requests  # the model never saw it
    assert "not valid JSON" in (refused.error or "")
    llm.reset()
    post = hooked({"PostToolUse": [printing("post", broken)]}, tools=[make_marker_tool(marker)])
    llm.script(reply(tool_calls=[tool_call("write_marker", {"text": "x"})]), reply("ok"))
    await post.chat("go", session="nb:post")
    [tool_text] = tool_messages(llm.requests[1])
    assert tool_text.startswith("written") and "[PostToolUse hook feedback]" in tool_text
    assert "the hook's answer cannot be read" in tool_text


# ------------------------------------------------------------------ hooks that misbehave


def _kill_all(pid_file: Path) -> None:
    if pid_file.exists():
        for pid in pid_file.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


async def test_a_daemonising_hook_cannot_hold_the_run(hooked, hook_script, llm, tmp_path):
    """Hooks leave a ``setsid`` daemon holding their stdout; the run ends at the hooks'
    timeout, not at the run's, and the calls still run."""
    pids = tmp_path / "daemons"
    daemon = hook_script("daemon.sh", f"setsid sleep 300 &\necho $! >> {pids}\necho hi\n")
    entry = {"hooks": [{"type": "command", "command": str(daemon)}]}

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    agent = hooked(
        {"UserPromptSubmit": [entry], "PreToolUse": [entry], "PostToolUse": [entry]},
        tools=[lookup],
        **{"hooks.timeout": 0.5, "agent.run_timeout": 300},
    )
    llm.script(reply(tool_calls=[tool_call("lookup", {"key": "k"})]), reply("done"))
    try:
        # The bound only turns a hang (the daemons sleep 300 s) into a failure.
        result = await asyncio.wait_for(agent.chat("hi"), 60)
    finally:
        _kill_all(pids)
    assert result.ok and result.text == "done"
    assert result.tool_calls[0].result.startswith("value of k")
    assert len(pids.read_text().split()) == 3


def _peak_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/self/status")


async def test_a_flooding_hook_is_read_with_a_bound(hooked, hook_script, llm):
    """1 GB on stdout (and on stderr from a blocking hook): memory stays flat, the context
    and the block reason are cut at 2000 characters."""
    flood_out = hook_script("flood.sh", "yes | head -c 1000000000\n")
    flood_err = hook_script("flood_err.sh", "yes no | head -c 1000000000 >&2\nexit 2\n")

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key}"

    hooks = {
        "UserPromptSubmit": [{"command": str(flood_out), "timeout_sec": 60}],
        "PreToolUse": [{"command": str(flood_err), "timeout_sec": 60}],
    }
    agent = hooked(hooks, tools=[lookup])
    llm.script(reply(tool_calls=[tool_call("lookup", {"key": "k"})]), reply("done"))
    before = _peak_rss_kib()
    result = await agent.chat("hi")
    grown_mib = (_peak_rss_kib() - before) / 1024
    assert result.ok
    assert grown_mib < 200  # reading it all would have kept ~1000 MiB (and doubled it to decode)
    prompt = llm.requests[0].messages[-1]["content"]
    context = prompt.split("] ", 1)[1].split("\n\nhi")[0]
    assert len(context) == 2000 and context.endswith("…")  # 2000 characters, the mark included
    [call] = result.tool_calls
    assert call.outcome == "blocked"
    reason = call.result.removeprefix("Tool call blocked by a hook: ")
    assert len(reason) == 2000 and reason.startswith("no\nno\n")
