"""Approvals show the whole truth: a padded or disguised call is visible in full before anyone
clicks Allow, late answers are ignored loudly, every sender of a batch may answer."""

from __future__ import annotations

import asyncio

import pytest
from _waits import until

from ania_nb import Callbacks, UsageError, tool
from ania_nb.governance.approval_text import approval_text, split_commands, visible
from ania_nb.testing import reply, tool_call


@pytest.fixture
def bash_agent(make_agent, tmp_path):
    def build(**overrides):
        return make_agent(
            overrides={
                "agent.builtin_tools": True,
                "bash.enable": True,
                "approval.enable": True,
                **overrides,
            }
        )

    return build


async def test_a_padded_bash_command_is_shown_whole_and_split(bash_agent, llm, inbox, tmp_path):
    marker = tmp_path / "pwned"
    padded = "echo hello" + " " * 400 + "\n" * 30 + f"touch {marker}"
    agent = bash_agent()
    llm.script(reply(tool_calls=[tool_call("bash", {"command": padded})]), reply("ok"))
    task = asyncio.create_task(agent.chat("hi", callbacks=Callbacks(request_approval=inbox)))
    request = await inbox.wait_for(1)
    assert f"touch {marker}" in request.details  # the dangerous part is in what is shown
    assert "it runs 2 commands:" in request.details
    assert f"2. touch {marker}" in request.details
    assert request.details.count("↵") == 30  # every newline is visible
    assert len(request.details) > len(padded)  # nothing was cut
    agent.answer_approval(request.id, allow=False)
    result = await task
    assert not marker.exists() and result.tool_calls[0].outcome == "denied"


async def test_hidden_characters_and_argument_order(make_agent, llm, inbox):
    ran = []

    @tool
    def move(source: str, target: str) -> str:
        """Moves a file."""
        ran.append((source, target))
        return "moved"

    agent = make_agent(
        tools=[move], overrides={"approval.enable": True, "approval.tools": ["move"]}
    )
    # The model sends target first and hides a right-to-left override in the path.
    arguments = '{"target": "/etc/\\u202epasswd", "source": "notes.txt"}'
    llm.script(reply(tool_calls=[tool_call("move", arguments)]), reply("ok"))
    task = asyncio.create_task(agent.chat("hi", callbacks=Callbacks(request_approval=inbox)))
    request = await inbox.wait_for(1)
    assert request.details.index("source") < request.details.index("target")  # schema order
    assert "\\u202e" in request.details and "\u202e" not in request.details
    agent.answer_approval(request.id, allow=False)
    await task
    assert ran == []


async def test_the_python_tool_shows_all_the_code(make_agent, llm, inbox):
    from ania_nb.notebook.tools import PythonTool

    namespace: dict = {}
    agent = make_agent(tools=[PythonTool(namespace)])
    code = "x = 1\n" + "# padding\n" * 100 + "import os; os.system('touch /tmp/x')"
    llm.script(reply(tool_calls=[tool_call("python", {"code": code})]), reply("ok"))
    task = asyncio.create_task(agent.chat("hi", callbacks=Callbacks(request_approval=inbox)))
    request = await inbox.wait_for(1)
    assert "os.system('touch /tmp/x')" in request.details
    agent.answer_approval(request.id, allow=False)
    await task
    assert "x" not in namespace


async def test_bash_listed_in_approval_tools_asks_once(bash_agent, llm, inbox):
    agent = bash_agent(**{"approval.tools": ["bash"]})
    llm.script(reply(tool_calls=[tool_call("bash", {"command": "echo hi"})]), reply("ok"))

    async def allow(request):
        await inbox(request)
        agent.answer_approval(request.id, allow=True)

    result = await agent.chat("hi", callbacks=Callbacks(request_approval=allow))
    assert result.tool_calls[0].result == "hi"
    assert len(inbox.requests) == 1


async def test_a_second_contradictory_answer_is_reported_as_ignored(make_agent, llm, inbox):
    @tool
    def risky() -> str:
        """Needs approval."""
        return "ran"

    agent = make_agent(
        tools=[risky], overrides={"approval.enable": True, "approval.tools": ["risky"]}
    )
    llm.script(reply(tool_calls=[tool_call("risky")]), reply("ok"))
    task = asyncio.create_task(agent.chat("hi", callbacks=Callbacks(request_approval=inbox)))
    request = await inbox.wait_for(1)
    agent.answer_approval(request.id, allow=True)
    with pytest.raises(UsageError, match=r"already allowed .* this answer was ignored"):
        agent.answer_approval(request.id, allow=False)
    result = await task
    assert result.tool_calls[0].result == "ran"
    with pytest.raises(UsageError, match="already allowed"):  # and after it ended, too
        agent.answer_approval(request.id, allow=False)


async def test_every_sender_of_a_batch_may_answer(make_agent, llm, inbox):
    gate, busy = asyncio.Event(), asyncio.Event()

    @tool
    async def hold() -> str:
        """Keeps the session busy."""
        busy.set()
        await gate.wait()
        return "held"

    @tool
    def risky() -> str:
        """Needs approval."""
        return "ran"

    agent = make_agent(
        tools=[hold, risky], overrides={"approval.enable": True, "approval.tools": ["risky"]}
    )
    llm.script(
        reply(tool_calls=[tool_call("hold")]),
        reply("first"),
        reply(tool_calls=[tool_call("risky")]),
        reply("batch answered"),
    )
    cb = Callbacks(request_approval=inbox)
    first = asyncio.create_task(agent.chat("one", session="g:1", sender="alice", callbacks=cb))
    await asyncio.wait_for(busy.wait(), 10)
    second = asyncio.create_task(agent.chat("two", session="g:1", sender="bob", callbacks=cb))
    third = asyncio.create_task(agent.chat("three", session="g:1", sender="carol", callbacks=cb))
    await until(lambda: len(agent.session("g:1").queue) == 2, "two and three to wait")
    gate.set()
    assert (await first).text == "first"
    request = await inbox.wait_for(1)
    assert set(request.requesters) == {"bob", "carol"}
    with pytest.raises(UsageError, match="may not answer"):
        agent.answer_approval(request.id, allow=True, approver="mallory")
    agent.answer_approval(request.id, allow=True, approver="bob")  # not the last sender
    assert (await third).text == "batch answered" and (await second).text == "batch answered"


def test_chat_text_is_bounded_with_a_way_to_see_the_rest():
    from ania_nb.engine.callbacks import ApprovalRequest

    details = approval_text("bash", {"command": "x" * 5000}, shell_keys=["command"])
    request = ApprovalRequest("ab12", "g:1", "bash", "run command", details=details)
    short = request.text(500)
    assert len(short) == 500  # the note counts against the limit
    kept, _, note = short.rpartition("\n… ")
    assert request.text().startswith(kept)
    assert (
        note
        == f"{len(request.text()) - len(kept)} more characters: reply `show ab12` to see them all"
    )
    assert request.text() == "run command\n" + details


def test_visible_and_split():
    assert visible("a\tb\x07\u200bc\n") == "a→\tb\\u0007\\u200bc↵\n"
    assert split_commands("ls; rm -rf / && echo 'a;b' | sh") == [
        "ls",
        "rm -rf /",
        "echo 'a;b'",
        "sh",
    ]
    assert split_commands("echo 'open") is None
    assert "not a JSON object" in approval_text("t", "{broken")


def test_env_and_header_values_are_masked_in_the_details():
    from ania_nb.engine.loop import ToolCall
    from ania_nb.governance.gate import _details

    call = ToolCall(
        "c1",
        "mcp_add",
        '{"name": "x", "command": "srv", "env": {"API_TOKEN": "s3cret-value"},'
        ' "headers": {"Authorization": "Bearer abc"}}',
    )
    shown = _details(call, None)
    assert "API_TOKEN" in shown and "Authorization" in shown and "srv" in shown
    assert "s3cret-value" not in shown and "Bearer abc" not in shown
