"""The approval headline hides nothing: a right-to-left override (U+202E) or a zero-width space
(U+200B) in a call's arguments, its summary or a tool's name is shown escaped — ``\\u202e`` —
in the notebook card (HTML, plain text, static HTML) and in the chat approval message, as the
details already were. Played through real runs: the scripted model sends the characters raw.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from _waits import until
from runner_memory import MemoryAdapter

from ania_nb import tool
from ania_nb.engine.callbacks import ApprovalRequest
from ania_nb.notebook.widgets import RunView
from ania_nb.notebook.widgets.approval import ApprovalCard
from ania_nb.runner.chat import approval_text
from ania_nb.runner.router import Router
from ania_nb.testing import reply, tool_call

HIDDEN = ("\u202e", "\u200b")
# What a person would read as "rename report.txt": the override flips "txt.exe" around.
SNEAKY = "report\u200b\u202etxt.exe"
GATED = {"approval.enable": True, "approval.tools": ["rename"], "admin.ids": ["qq:9"]}


@tool(side_effects=True)
def rename(name: str) -> str:
    """Rename a file."""
    return f"renamed to {name}"


def assert_escaped(text: str) -> None:
    """No hidden character left raw; each one shown as its escape."""
    assert not any(ch in text for ch in HIDDEN), repr(text)
    assert "\\u202e" in text and "\\u200b" in text, text


def raw_arguments() -> str:
    """The call's arguments with the characters raw (not JSON-escaped), as a model may send."""
    return json.dumps({"name": SNEAKY}, ensure_ascii=False)


async def test_the_notebook_card_escapes_the_headline(make_agent, llm) -> None:
    agent = make_agent(tools=[rename], overrides=GATED)
    llm.script(reply(tool_calls=[tool_call("rename", raw_arguments())]), reply("done"))
    view = RunView(agent, session="nb:sneaky")
    task = asyncio.create_task(agent.chat("go", session=view.session, callbacks=view.callbacks))
    await until(lambda: view.cards, "the approval card")
    [card] = view.cards.values()
    assert any(ch in card.request.summary for ch in HIDDEN)  # the headline really had them
    shown = card.heading.value + card.summary.value + card.details.value
    for text in (shown, card.text(), card.html()):
        assert_escaped(text)
    card.deny_button.click()
    await task


def test_a_tool_name_with_hidden_characters_is_escaped_everywhere(make_agent) -> None:
    agent = make_agent()
    request = ApprovalRequest(
        "a1", "nb:x", "mo\u200bve\u202e", f"move {SNEAKY}", requester="qq:1\u202e"
    )
    card = ApprovalCard(agent, request)
    for shown in (card.heading.value, card.session_button.description, card.text(), card.html()):
        assert not any(ch in shown for ch in HIDDEN), shown
    assert_escaped(card.heading.value + card.summary.value)
    assert_escaped(approval_text(request, 500, 120, "qq"))


async def test_the_chat_approval_message_escapes_the_headline(make_agent, llm) -> None:
    agent = make_agent(tools=[rename], overrides=GATED)
    await agent.start()
    adapter = MemoryAdapter()
    router = Router(agent, adapter)
    await adapter.start(router.handle)
    try:
        llm.script(reply(tool_calls=[tool_call("rename", raw_arguments())]), reply("done"))
        await adapter.receive(adapter.private("5", "rename it"))
        asked: Any = await adapter.wait_sent(lambda m: m.text.startswith("【工具审批】"))
        [request] = agent.approvals.pending("f:5")
        assert any(ch in request.summary for ch in HIDDEN)
        assert_escaped(asked.text)
        assert_escaped(asked.text.split("\n")[1])  # the headline line itself
        await adapter.receive(adapter.private("5", f"show {request.id}"))
        full: Any = await adapter.wait_sent(lambda m: m.text == request.text())
        assert_escaped(full.text)
        await adapter.receive(adapter.private("5", "拒绝"))
        await adapter.wait_sent(lambda m: m.text == "done")
    finally:
        await router.close(0)
