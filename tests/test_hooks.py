"""Hooks: real shell scripts (exit codes, timeouts, matchers), both file forms, hot reload,
Python hooks, and the events an Agent fires during a run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
from pathlib import Path

import pytest
from _waits import until

from ania_nb import UsageError, tool
from ania_nb.config import HooksSettings
from ania_nb.governance import HookResult, HookRunner, ShellHook, parse_hooks, payload_for
from ania_nb.testing import delay, error, reply, tool_call


def write_hooks(path: Path, hooks: dict) -> Path:
    path.write_text(json.dumps({"hooks": hooks}))
    return path


def runner_for(path: Path, *, enable: bool = True, timeout: float = 10) -> HookRunner:
    return HookRunner(HooksSettings(enable=enable, file=path, timeout=timeout))


def pre_tool(tool_name: str = "bash", args: str = '{"command": "ls"}') -> dict:
    return payload_for("PreToolUse", "g:1", tool_name=tool_name, tool_input=args)


async def test_exit_0_passes_with_stdout_as_output_and_gets_the_payload(tmp_path, hook_script):
    """At PreToolUse plain stdout is transcript output, not context (as in Claude Code);
    ``tool_input`` is the arguments' JSON object."""
    seen = tmp_path / "payload.json"
    script = hook_script("ok.sh", f'cat > {seen}\necho "  remember the style guide  "\n')
    runner = runner_for(
        write_hooks(tmp_path / "h.json", {"PreToolUse": [{"command": str(script)}]})
    )
    outcome = await runner.run("PreToolUse", pre_tool())
    assert (outcome.blocked, outcome.context, outcome.output, outcome.errors) == (
        False,
        "",
        "remember the style guide",
        [],
    )
    assert json.loads(seen.read_text()) == {
        "hook_event_name": "PreToolUse",
        "session_id": "g:1",
        "agent_kind": "main",
        "tool_name": "bash",
        "tool_input": {"command": "ls"},
    }


async def test_exit_2_blocks_with_stderr_and_the_first_block_short_circuits(tmp_path, hook_script):
    later = tmp_path / "later-ran"
    block = hook_script("block.sh", 'echo "out text"\necho "rm is not allowed here" >&2\nexit 2\n')
    after = hook_script("after.sh", f"touch {later}\n")
    hooks = {"PreToolUse": [{"command": str(block)}, {"command": str(after)}]}
    runner = runner_for(write_hooks(tmp_path / "h.json", hooks))
    outcome = await runner.run("PreToolUse", pre_tool())
    assert outcome.blocked and outcome.reason == "rm is not allowed here"
    assert not later.exists()


async def test_exit_2_without_stderr_uses_stdout_then_a_default(tmp_path, hook_script):
    only_out = hook_script("out.sh", "echo 'from stdout'\nexit 2\n")
    silent = hook_script("silent.sh", "exit 2\n")
    runner = runner_for(write_hooks(tmp_path / "h.json", {"Stop": [{"command": str(only_out)}]}))
    assert (await runner.run("Stop", payload_for("Stop", "s"))).reason == "from stdout"
    runner = runner_for(write_hooks(tmp_path / "h2.json", {"Stop": [{"command": str(silent)}]}))
    assert (await runner.run("Stop", payload_for("Stop", "s"))).reason == "a hook blocked this"


async def test_other_exit_codes_are_logged_errors_that_do_not_block(tmp_path, hook_script, caplog):
    fail = hook_script("fail.sh", "echo 'disk on fire' >&2\nexit 1\n")
    ok = hook_script("ok.sh", "echo second\n")
    hooks = {"PreToolUse": [{"command": str(fail)}, {"command": str(ok)}]}
    runner = runner_for(write_hooks(tmp_path / "h.json", hooks))
    with caplog.at_level(logging.WARNING, logger="ania_nb.governance.hooks"):
        outcome = await runner.run("PreToolUse", pre_tool())
    assert not outcome.blocked and outcome.output == "second"
    assert len(outcome.errors) == 1 and "exit code 1: disk on fire" in outcome.errors[0]
    assert any("disk on fire" in r.getMessage() for r in caplog.records)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


async def test_a_hook_past_its_timeout_is_killed_with_its_children(tmp_path, hook_script):
    pids = tmp_path / "pids"
    hang = hook_script("hang.sh", f"sleep 30 &\necho $! > {pids}\nwait\n")
    hooks = {"SessionStart": [{"command": str(hang), "timeout_sec": 0.5}]}
    runner = runner_for(write_hooks(tmp_path / "h.json", hooks))
    outcome = await runner.run("SessionStart", payload_for("SessionStart", "s"))
    assert not outcome.blocked
    assert "timed out after 0.5 s" in outcome.errors[0]
    child = int(pids.read_text())
    # The orphaned child is reaped by init shortly after the kill.
    await until(lambda: not _alive(child), "the hook's child to be gone")


async def test_garbage_and_long_output_is_decoded_and_cut(tmp_path, hook_script):
    garbage = hook_script("garbage.sh", r"printf '\377\376abc\000def'" + "\n")
    long = hook_script("long.sh", "head -c 3000 /dev/zero | tr '\\0' x\n")
    hooks = {"Stop": [{"command": str(garbage)}, {"command": str(long)}]}
    runner = runner_for(write_hooks(tmp_path / "h.json", hooks))
    outcome = await runner.run("Stop", payload_for("Stop", "s"))
    first, second = outcome.output.split("\n")
    assert first.startswith("\ufffd\ufffdabc") and first.endswith("def")
    assert second == "x" * 1999 + "…"  # at most 2000 characters, the "…" included


async def test_matcher_is_a_regex_on_the_tool_name(tmp_path, hook_script):
    log_file = tmp_path / "fired"
    hooks = {
        "PreToolUse": [
            {"matcher": "^bash$", "command": f"echo exact-bash >> {log_file}"},
            {"matcher": "web|file", "command": f"echo web-or-file >> {log_file}"},
            {"command": f"echo everything >> {log_file}"},
        ],
        "Stop": [
            {"matcher": "bash", "command": f"echo stop-bash >> {log_file}"},
            {"matcher": ".*", "command": f"echo stop-any >> {log_file}"},
        ],
    }
    runner = runner_for(write_hooks(tmp_path / "h.json", hooks))
    for name in ("bash", "webSearch", "bash2"):
        await runner.run("PreToolUse", pre_tool(name))
    await runner.run("Stop", payload_for("Stop", "s"))
    assert log_file.read_text().split() == [
        "exact-bash",
        "everything",
        "web-or-file",
        "everything",
        "everything",
        "stop-any",  # events without a tool match against '' only
    ]


async def test_claude_code_settings_form_is_accepted(tmp_path, hook_script):
    script = hook_script("claude.sh", "echo claude-style\n")
    hooks = {
        "PreToolUse": [
            {
                "matcher": "bash",
                "hooks": [{"type": "command", "command": str(script), "timeout": 5}],
            }
        ],
        "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "echo from-prompt-hook"}]}],
    }
    runner = runner_for(write_hooks(tmp_path / "h.json", hooks))
    assert (await runner.run("PreToolUse", pre_tool("bash"))).output == "claude-style"
    assert (await runner.run("PreToolUse", pre_tool("time"))).output == ""
    submitted = await runner.run("UserPromptSubmit", payload_for("UserPromptSubmit", "s"))
    assert submitted.context == "from-prompt-hook"
    table = parse_hooks(json.loads((tmp_path / "h.json").read_text()))
    assert table["PreToolUse"][0].timeout == 5


def test_timeouts_default_from_config_and_are_capped_at_60():
    table = parse_hooks(
        {
            "hooks": {
                "Stop": [{"command": "a"}, {"command": "b", "timeout_sec": 600}, {"command": " "}]
            }
        }
    )
    first, second = table["Stop"]  # the blank command is skipped
    assert first.effective_timeout(10) == 10 and first.effective_timeout(3) == 3
    assert second.effective_timeout(10) == 60
    assert ShellHook("Stop", "x", timeout=0.5).effective_timeout(10) == 0.5


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ({"hooks": {"BeforeTool": []}}, "unknown event 'BeforeTool'"),
        ({"hooks": {"PreToolUse": [{"matcher": "(", "command": "x"}]}}, "not a valid regex"),
        ({"hooks": {"Stop": [{"command": "x", "timeout_sec": "long"}]}}, "number of seconds"),
        ({"hooks": {"Stop": [{"hooks": [{"type": "prompt", "prompt": "x"}]}]}}, "only type"),
        ({"hooks": []}, "expected an object"),
    ],
)
def test_bad_hook_files_are_rejected_with_the_reason(data, problem):
    with pytest.raises(ValueError, match=problem):
        parse_hooks(data)


async def test_hot_reload_within_the_ttl_and_bad_edits_keep_the_last_good_set(tmp_path, caplog):
    now = [0.0]
    path = write_hooks(tmp_path / "h.json", {"Stop": [{"command": "echo one"}]})
    runner = runner_for(path)
    runner.file.clock = lambda: now[0]
    assert (await runner.run("Stop", payload_for("Stop", "s"))).output == "one"
    first_table = await runner.file.get()
    write_hooks(path, {"Stop": [{"command": "echo two"}]})
    now[0] = 4.0  # within 5 s of the last read: not re-read yet
    assert (await runner.run("Stop", payload_for("Stop", "s"))).output == "one"
    now[0] = 5.5
    assert (await runner.run("Stop", payload_for("Stop", "s"))).output == "two"
    second_table = await runner.file.get()
    assert second_table is not first_table
    now[0] = 20.0  # re-read, unchanged text: not recompiled
    assert await runner.file.get() is second_table

    path.write_text('{"hooks": {"Stop": [{"command": "echo three", "matcher": "("}]}}')
    with caplog.at_level(logging.WARNING, logger="ania_nb.governance._files"):
        for step in (30.0, 40.0, 50.0):  # read three times, reported once
            now[0] = step
            assert (await runner.run("Stop", payload_for("Stop", "s"))).output == "two"
    warnings = [r.getMessage() for r in caplog.records if "hooks file" in r.getMessage()]
    assert len(warnings) == 1 and "not a valid regex" in warnings[0]
    assert "keeping the last good one" in runner.file.error


async def test_python_hooks_run_first_and_their_exceptions_are_isolated(tmp_path, caplog):
    order: list[str] = []

    def broken(event, payload):
        order.append("broken")
        raise RuntimeError("bug in hook")

    async def context(event, payload):
        order.append(f"async:{payload['tool_name']}")
        return "python context"

    path = write_hooks(tmp_path / "h.json", {"PreToolUse": [{"command": "echo shell context"}]})
    runner = runner_for(path)
    runner.add("PreToolUse", broken)
    runner.add("PreToolUse", context)
    with caplog.at_level(logging.ERROR, logger="ania_nb.governance.hooks"):
        outcome = await runner.run("PreToolUse", pre_tool("time"))
    assert order == ["broken", "async:time"]
    assert outcome.context == "python context"  # a Python hook's string is context
    assert outcome.output == "shell context"  # plain PreToolUse stdout is transcript only
    assert "bug in hook" in outcome.errors[0]
    assert any("failed" in r.getMessage() for r in caplog.records)


async def test_a_python_block_stops_the_shell_hooks(tmp_path):
    marker = tmp_path / "shell-ran"
    runner = runner_for(
        write_hooks(tmp_path / "h.json", {"Stop": [{"command": f"touch {marker}"}]})
    )
    runner.add("Stop", lambda event, payload: HookResult(block=True, reason="python says no"))
    outcome = await runner.run("Stop", payload_for("Stop", "s"))
    assert outcome.blocked and outcome.reason == "python says no"
    assert not marker.exists()
    with pytest.raises(UsageError, match="unknown hook event 'Stopp'"):
        runner.add("Stopp", lambda e, p: None)


async def test_shell_hooks_are_off_unless_enabled_but_python_hooks_run(tmp_path):
    marker = tmp_path / "shell-ran"
    path = write_hooks(tmp_path / "h.json", {"Stop": [{"command": f"touch {marker}"}]})
    runner = runner_for(path, enable=False)
    runner.add("Stop", lambda event, payload: "py")
    assert (await runner.run("Stop", payload_for("Stop", "s"))).context == "py"
    assert not marker.exists()


# ------------------------------------------------------------------ wired into an Agent


def hooked_agent(make_agent, tmp_path: Path, hooks: dict, **overrides):
    path = write_hooks(tmp_path / "hooks.json", hooks)
    return make_agent(overrides={"hooks.enable": True, "hooks.file": str(path), **overrides})


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


async def test_prompt_order_and_history_without_injections(llm, make_agent, tmp_path):
    """UserPromptSubmit ctx, plan note, todo reminder, SessionStart ctx, then the user's text."""
    hooks = {
        "SessionStart": [{"command": "echo SESSION-CONTEXT"}],
        "UserPromptSubmit": [{"command": "echo PROMPT-CONTEXT"}],
    }
    overrides = {"agent.builtin_tools": True, "hooks.enable": False}
    todos = [{"content": "write the report", "status": "in_progress"}]
    llm.script(reply(tool_calls=[tool_call("todo_write", {"todos": todos})]), reply("noted"))
    first = make_agent(overrides=overrides)
    await first.chat("plan the report", session="nb:r")
    await first.aclose()

    llm.script(reply("ok"), reply("again"))
    agent = hooked_agent(make_agent, tmp_path, hooks, **{"agent.builtin_tools": True})
    agent.set_plan_mode("nb:r", True)
    await agent.chat("go on", session="nb:r")
    sent = llm.requests[2].messages[-1]["content"]
    body = sent.split("] ", 1)[1]  # after the timestamp
    parts = body.split("\n\n")
    assert parts[0] == "PROMPT-CONTEXT"
    assert parts[1].startswith("[Plan mode]")
    assert (
        parts[2].startswith("<todo_reminder>") and "1. [in progress] write the report" in parts[2]
    )
    assert parts[3:] == ["SESSION-CONTEXT", "go on"]

    await agent.chat("and now?", session="nb:r")  # SessionStart context is used once
    second = llm.requests[3].messages[-1]["content"].split("] ", 1)[1]
    assert second.split("\n\n")[0] == "PROMPT-CONTEXT"
    assert "SESSION-CONTEXT" not in second and "<todo_reminder>" not in second

    stored = [m["content"] for m in await agent.history("nb:r") if m["role"] == "user"]
    assert [s.split("] ", 1)[1] for s in stored] == ["plan the report", "go on", "and now?"]


async def test_user_prompt_submit_block_ends_the_run_without_the_model(
    llm, make_agent, tmp_path, hook_script
):
    script = hook_script(
        "guard.sh", 'grep -q password && { echo "no secrets, please" >&2; exit 2; }\nexit 0\n'
    )
    agent = hooked_agent(make_agent, tmp_path, {"UserPromptSubmit": [{"command": str(script)}]})
    llm.script(reply("fine"))
    result = await agent.chat("my password is hunter2", session="s", sender="alice")
    assert result.status == "error" and result.text == ""
    assert result.error == "blocked by a UserPromptSubmit hook: no secrets, please"
    assert llm.requests == []
    [record] = await agent.runs(session="s")
    assert (record.status, record.sender, record.error) == ("error", "alice", result.error)
    assert await agent.history("s") == []
    assert (await agent.chat("hello", session="s")).text == "fine"


async def test_post_tool_use_stop_and_session_start_payloads(llm, make_agent, tmp_path):
    out = tmp_path / "events.jsonl"
    record = f"cat >> {out}; echo >> {out}"
    hooks = {event: [{"command": record}] for event in ("SessionStart", "PostToolUse", "Stop")}
    agent = hooked_agent(make_agent, tmp_path, hooks)
    agent.add_tool(lookup)
    llm.script(reply(tool_calls=[tool_call("lookup", {"key": "k"})]), reply("the value"))
    assert (await agent.chat("look k up", session="nb:e")).ok
    events = [json.loads(line) for line in out.read_text().splitlines() if line]
    assert [e["hook_event_name"] for e in events] == ["SessionStart", "PostToolUse", "Stop"]
    post, stop = events[1], events[2]
    assert (post["tool_name"], post["tool_input"], post["tool_result"]) == (
        "lookup",
        {"key": "k"},
        "value of k",
    )
    assert stop == {
        "hook_event_name": "Stop",
        "session_id": "nb:e",
        "agent_kind": "main",
        "prompt": "the value",
    }


async def test_pre_compact_fires_before_compaction(llm, make_agent, tmp_path):
    out = tmp_path / "compact.json"
    agent = hooked_agent(
        make_agent,
        tmp_path,
        {"PreCompact": [{"command": f"cat > {out}"}]},
        **{"agent.max_context_tokens": 40},
    )
    llm.script(reply("first answer " * 10), reply("a summary"), reply("second answer"))
    await agent.chat("hello " * 20, session="nb:c")
    assert not out.exists()
    await agent.chat("more", session="nb:c")
    assert json.loads(out.read_text()) == {
        "hook_event_name": "PreCompact",
        "session_id": "nb:c",
        "agent_kind": "main",
    }


async def test_agent_add_hook_sees_events(llm, make_agent):
    seen: list[tuple[str, str]] = []
    agent = make_agent()
    agent.add_hook("UserPromptSubmit", lambda e, p: seen.append((e, p["prompt"])) or "py-context")
    llm.script(reply("ok"))
    await agent.chat("hi there")
    assert seen == [("UserPromptSubmit", "hi there")]
    assert llm.requests[0].messages[-1]["content"].split("] ", 1)[1] == "py-context\n\nhi there"


# ------------------------------------------------------------------ guards (issue 10 item 9)


async def test_timeout_bounds_a_hook_whose_child_left_its_process_group(tmp_path, hook_script):
    """A child started with ``setsid`` escapes the group kill and keeps stdout open; the hook
    must still end at its timeout (the pipes are closed, not read to their end)."""
    pids = tmp_path / "escaped"
    exits = hook_script("exits.sh", f"setsid sleep 100 &\necho $! >> {pids}\necho early\n")
    stays = hook_script("stays.sh", f"setsid sleep 100 &\necho $! >> {pids}\nsleep 100\n")
    hooks = {
        "SessionStart": [
            {"command": str(exits), "timeout_sec": 0.5},
            {"command": str(stays), "timeout_sec": 0.5},
            {"command": "echo still-ran"},
        ]
    }
    runner = runner_for(write_hooks(tmp_path / "h.json", hooks))
    try:
        # The bound only turns a hang (the escaped child sleeps 100 s) into a failure.
        outcome = await asyncio.wait_for(
            runner.run("SessionStart", payload_for("SessionStart", "s")), 30
        )
    finally:
        for pid in pids.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    assert len(outcome.errors) == 2
    assert all("timed out after 0.5 s and was killed" in e for e in outcome.errors)
    assert outcome.context == "still-ran"


async def test_hooks_timeout_from_the_config_bounds_hooks_without_their_own(tmp_path, hook_script):
    slow = hook_script("slow.sh", "sleep 5\necho LATE-CONTEXT\n")
    runner = runner_for(
        write_hooks(tmp_path / "h.json", {"Stop": [{"command": str(slow)}]}), timeout=0.3
    )
    outcome = await asyncio.wait_for(runner.run("Stop", payload_for("Stop", "s")), 30)
    assert outcome.context == ""
    assert outcome.errors and "timed out after 0.3 s" in outcome.errors[0]


async def test_agent_passes_hooks_timeout_to_its_hooks(llm, make_agent, tmp_path, hook_script):
    slow = hook_script("slow.sh", "sleep 5\necho LATE-CONTEXT\n")
    hooks = {"UserPromptSubmit": [{"command": str(slow)}]}
    agent = hooked_agent(make_agent, tmp_path, hooks, **{"hooks.timeout": 0.3})
    llm.script(reply("fine"))
    result = await asyncio.wait_for(agent.chat("hello", session="nb:t"), 30)
    assert result.ok
    assert "LATE-CONTEXT" not in llm.requests[0].messages[-1]["content"]


async def test_stop_fires_after_successful_runs_only(llm, make_agent, tmp_path):
    fired = tmp_path / "stop-fired"
    agent = hooked_agent(make_agent, tmp_path, {"Stop": [{"command": f"cat >> {fired}"}]})
    llm.script(error(400, "bad request"))
    failed = await agent.chat("first", session="nb:s")
    assert failed.status == "error"
    assert not fired.exists()
    llm.script(delay(30, reply("too late")))
    running = asyncio.create_task(agent.chat("second", session="nb:s"))
    await asyncio.to_thread(llm.wait_for_requests, 2)  # the run is waiting for the model
    assert agent.stop("nb:s")
    assert (await running).status == "stopped"
    assert not fired.exists()
    llm.script(reply("done"))
    assert (await agent.chat("third", session="nb:s")).ok
    assert json.loads(fired.read_text())["prompt"] == "done"  # the hook is wired: it fires now


async def test_post_tool_use_does_not_fire_for_blocked_calls(
    llm, make_agent, tmp_path, hook_script
):
    posts = tmp_path / "post"
    posts.mkdir()
    guard = hook_script("guard.sh", 'echo "lookup is off limits" >&2\nexit 2\n')
    hooks = {
        "PreToolUse": [{"matcher": "^lookup$", "command": str(guard)}],
        "PostToolUse": [{"command": f'cat > "$(mktemp {posts}/XXXXXX)"'}],  # one file a call
    }
    agent = hooked_agent(make_agent, tmp_path, hooks)

    @tool(side_effects=True)
    def write_note(text: str) -> str:
        """Write a note (a side effect)."""
        return "written"

    @tool
    def peek(key: str) -> str:
        """Read a value."""
        return f"peeked {key}"

    for t in (lookup, write_note, peek):
        agent.add_tool(t)
    agent.set_plan_mode("nb:p", True)  # blocks write_note
    calls = [
        tool_call("lookup", {"key": "a"}),
        tool_call("write_note", {"text": "x"}),
        tool_call("peek", {"key": "b"}),
    ]
    llm.script(reply(tool_calls=calls), reply("ok"))
    result = await agent.chat("go", session="nb:p")
    by_name = {c.name: c for c in result.tool_calls}
    assert "off limits" in by_name["lookup"].result
    assert "[Plan mode]" in by_name["write_note"].result
    events = [json.loads(p.read_text()) for p in posts.iterdir()]
    assert [e["tool_name"] for e in events] == ["peek"]


# ------------------------------------------------------- Claude Code semantics (issue 12)


def test_matchers_take_claude_code_tool_names_where_they_map():
    table = parse_hooks(
        {
            "hooks": {
                "PreToolUse": [
                    {"matcher": "Bash", "hooks": [{"command": "bash-hook"}]},
                    {"matcher": "Read", "hooks": [{"command": "read-hook"}]},
                    {"matcher": "Write|Edit", "hooks": [{"command": "write-hook"}]},
                    {"matcher": "Web.*", "hooks": [{"command": "web-hook"}]},
                    {"matcher": "*", "hooks": [{"command": "all-hook"}]},
                    {"matcher": "Write", "command": "original-form"},  # regex search there
                ]
            }
        }
    )

    def fired(tool_name: str) -> list[str]:
        return [h.command for h in table["PreToolUse"] if h.matches(tool_name)]

    assert fired("bash") == ["bash-hook", "all-hook"]
    assert fired("file") == fired("local_image") == ["read-hook", "all-hook"]
    # Claude form: simple names are exact, so "Write" is not "TodoWrite" ...
    assert fired("todo_write") == ["all-hook", "original-form"]  # ... but a regex searches
    assert fired("webSearch") == fired("webExplore") == ["web-hook", "all-hook"]
    assert fired("python") == ["all-hook"]  # no Claude Code equivalent
    assert fired("") == ["all-hook"]  # events without a tool


def test_tool_input_is_the_arguments_object_or_the_raw_text():
    def tool_input(arguments: str):
        return payload_for("PreToolUse", "s", tool_name="t", tool_input=arguments)["tool_input"]

    assert tool_input('{"a": [1, 2]}') == {"a": [1, 2]}
    assert tool_input("") == {}
    assert tool_input("{not json") == "{not json"
    assert tool_input("[1, 2]") == "[1, 2]"  # not an object: kept as sent


@pytest.mark.parametrize(
    ("event", "stdout", "expected"),
    [
        ("UserPromptSubmit", "not json, {just braces}", {"context": "not json, {just braces}"}),
        ("PreToolUse", '{"decision": "approve"}', {"allow": True}),
        ("PreToolUse", '{"suppressOutput": true, "systemMessage": "hi"}', {"messages": ["hi"]}),
        ("Stop", '{"decision": "block", "reason": "keep going"}', {"blocked": True}),
        ("SessionStart", '{"continue": false}', {"stopped": True}),
        (  # the call would run unchanged: refused instead
            "PreToolUse",
            '{"hookSpecificOutput": {"permissionDecision": "allow", "updatedInput": {"a": 1}}}',
            {"blocked": True, "allow": False},
        ),
    ],
)
async def test_json_answers_fold_into_the_outcome(tmp_path, hook_script, event, stdout, expected):
    script = hook_script("answer.sh", f"cat <<'OUT'\n{stdout}\nOUT\n")
    runner = runner_for(write_hooks(tmp_path / "h.json", {event: [{"command": str(script)}]}))
    outcome = await runner.run(event, payload_for(event, "s"))
    assert outcome.errors == []
    for name, value in expected.items():
        assert getattr(outcome, name) == value, name


UNREADABLE = [
    (
        '{"hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": "x"}}',
        "hookEventName is 'PostToolUse'",
    ),
    ('{"continue": "no"}', "continue must be a bool"),
    ('{"decision": "maybe"}', "decision must be 'block'"),
    ("{not json, just braces", "not valid JSON"),
]


@pytest.mark.parametrize(("stdout", "problem"), UNREADABLE)
async def test_unreadable_json_answers_block_where_hooks_can_block(
    tmp_path, hook_script, stdout, problem
):
    script = hook_script("answer.sh", f"cat <<'OUT'\n{stdout}\nOUT\n")
    hooks = {"UserPromptSubmit": [{"command": str(script)}]}
    runner = runner_for(write_hooks(tmp_path / "h.json", hooks))
    outcome = await runner.run("UserPromptSubmit", payload_for("UserPromptSubmit", "s"))
    assert outcome.blocked and problem in outcome.reason and outcome.context == ""
    assert outcome.reason.startswith("the hook's answer cannot be read")
    assert len(outcome.errors) == 1 and "unreadable JSON output" in outcome.errors[0]


@pytest.mark.parametrize(("stdout", "problem"), UNREADABLE)
async def test_unreadable_json_answers_are_non_blocking_errors_elsewhere(
    tmp_path, hook_script, stdout, problem
):
    script = hook_script("answer.sh", f"cat <<'OUT'\n{stdout}\nOUT\n")
    hooks = {"SessionStart": [{"command": str(script)}]}
    runner = runner_for(write_hooks(tmp_path / "h.json", hooks))
    outcome = await runner.run("SessionStart", payload_for("SessionStart", "s"))
    assert not outcome.blocked and not outcome.stopped and outcome.context == ""
    assert len(outcome.errors) == 1 and problem in outcome.errors[0]


async def test_a_python_hook_can_ask_allow_and_stop(tmp_path):
    runner = runner_for(tmp_path / "none.json", enable=False)
    runner.add("PreToolUse", lambda e, p: HookResult(decision="allow"))
    runner.add("PreToolUse", lambda e, p: HookResult(decision="ask", context="why"))
    outcome = await runner.run("PreToolUse", pre_tool())
    assert (outcome.ask, outcome.allow, outcome.context) == (True, False, "why")
    runner.add("PreToolUse", lambda e, p: HookResult(stop=True))
    outcome = await runner.run("PreToolUse", pre_tool())
    assert outcome.stopped and outcome.stop_reason == "a hook stopped this"
