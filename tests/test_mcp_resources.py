"""MCP resources: the list/read tool pair, links and embedded resources in tool results,
``@server:uri`` mentions and subscriptions, against the demo server and server-everything.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from _waits import until
from mcp_servers.support import everything_entry, stdio_entry

from ania_nb import Callbacks
from ania_nb.mcp.mentions import MAX_MENTIONS, find_mentions
from ania_nb.testing import reply, tool_call


async def _agent_with(make_agent, tmp_path, *servers, **overrides):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"servers": list(servers)}))
    agent = make_agent(overrides={"mcp.config_file": str(config), **overrides})
    return await agent.start()


def user_text(request) -> str:
    content = [m for m in request.messages if m["role"] == "user"][-1]["content"]
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")


def test_mentions_are_found_only_for_known_servers_and_without_trailing_punctuation():
    text = "see @demo:memo://note, and @alice: hi, mail a@demo:x, (@demo:memo://notes/a)."
    assert find_mentions(text, {"demo"}) == [("demo", "memo://note")]
    assert find_mentions("@demo:memo://a @demo:memo://a @x:y", {"demo", "x"}) == [
        ("demo", "memo://a"),
        ("x", "y"),
    ]


async def test_the_model_lists_and_reads_resources_without_loading_anything(
    llm, make_agent, tmp_path
):
    agent = await _agent_with(make_agent, tmp_path, stdio_entry("demo", resources=True))
    llm.script(
        reply(tool_calls=[tool_call("mcp_resources_demo")]),
        reply(
            tool_calls=[
                tool_call("mcp_read_demo", {"uri": "memo://note"}, id="a"),
                tool_call("mcp_read_demo", {"uri": "memo://notes/alpha"}, id="b"),
                tool_call("mcp_read_demo", {"uri": "memo://data.bin"}, id="c"),
                tool_call("mcp_read_demo", {"uri": "memo://logo.png"}, id="d"),
                tool_call("mcp_read_demo", {"uri": "memo://nowhere"}, id="e"),
            ]
        ),
        reply("done"),
    )
    events = []
    result = await agent.chat("what is there?", callbacks=Callbacks(on_event=events.append))
    assert result.ok, result.error
    names = [t["function"]["name"] for t in llm.requests[0].tools]
    assert {"mcp_resources_demo", "mcp_read_demo"} <= set(names)  # lazy mode: offered at once
    listing = result.tool_calls[0].result
    assert listing.splitlines() == [
        "MCP server 'demo' has 3 resources and 1 templates; read one with mcp_read_demo(uri=...).",
        "memo://data.bin (data, application/octet-stream)",
        "memo://logo.png (logo, image/png)",
        "memo://note (note, text/plain): A note that changes.",
        "Templates (fill in each {placeholder}, then read the URI):",
        "memo://notes/{name} (named-note, text/plain): A note by name.",
    ]
    note, named, binary, image, missing = (c.result for c in result.tool_calls[1:])
    assert note == "note v0" and named == "note called alpha"
    assert binary == (
        "[binary resource memo://data.bin (application/octet-stream, 64 bytes) returned by the "
        "tool; it cannot be shown here]"
    )
    assert "image" in image and any(e.kind == "tool_images" for e in events)
    assert "refused resources/read 'memo://nowhere'" in missing
    assert not any(c.error for c in result.tool_calls[1:5])
    pair = [agent.tools.get("mcp_resources_demo"), agent.tools.get("mcp_read_demo")]
    assert not any(t.side_effects for t in pair)  # read-only: no approval, plan-safe


async def test_links_and_embedded_resources_in_tool_results_are_shown(llm, make_agent, tmp_path):
    agent = await _agent_with(
        make_agent, tmp_path, stdio_entry("demo", resources=True), **{"mcp.lazy_load": False}
    )
    llm.script(reply(tool_calls=[tool_call("linked")]), reply("ok"))
    result = await agent.chat("show me the link")
    assert result.tool_calls[0].result == (
        "[resource link: memo://note (note, text/plain); read it with mcp_read_demo(uri=...)]\n"
        "[resource memo://inline (text/plain)]\ninline"
    )


async def test_mentions_attach_the_resource_to_the_message(llm, make_agent, tmp_path):
    agent = await _agent_with(make_agent, tmp_path, stdio_entry("demo", resources=True))
    llm.script(reply("summed up"), reply("ok"), reply("many"))
    await agent.chat("summarise @demo:memo://note and @bob:x please")
    sent = user_text(llm.requests[0])
    assert "summarise @demo:memo://note" in sent and "@bob:x please" in sent
    assert "[attached resource @demo:memo://note]\nnote v0" in sent
    await agent.chat("look at @demo:memo://logo.png and @demo:memo://gone")
    second = llm.requests[1]
    parts = [m for m in second.messages if m["role"] == "user"][-1]["content"]
    assert any(p.get("type") == "image_url" for p in parts)  # the image is attached
    assert "[attached resource @demo:memo://gone: could not be read: MCP server 'demo'" in (
        user_text(second)
    )
    many = " ".join(f"@demo:memo://notes/n{i}" for i in range(MAX_MENTIONS + 1))
    await agent.chat(many)
    third = user_text(llm.requests[2])
    assert third.count("note called n") == MAX_MENTIONS
    assert f"not read, at most {MAX_MENTIONS} resources per message" in third


async def test_a_subscription_sees_the_servers_update(llm, make_agent, tmp_path):
    agent = await _agent_with(make_agent, tmp_path, stdio_entry("demo", resources=True))
    demo = agent.mcp.get("demo")
    assert demo.features.subscribe
    seen: list[str] = []
    later: list[str] = []

    async def watcher(uri: str) -> None:
        seen.append(uri)  # at once, before any await: ordering below relies on it
        assert (await demo.read_resource(uri)).contents[0].text == "note v1"

    stop = await demo.watch("memo://note", watcher)
    await demo.call("bump_note", {}, generation=demo.generation)
    await until(lambda: seen == ["memo://note"], "the update to be seen")
    await stop()

    async def second(uri: str) -> None:
        later.append(uri)

    stop_second = await demo.watch("memo://note", second)
    await demo.call("bump_note", {}, generation=demo.generation)
    await until(lambda: later == ["memo://note"], "the second watcher to see the update")
    assert seen == ["memo://note"]  # the stopped watcher (it would have run first) was not called
    await stop_second()


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
async def test_server_everything_resources(llm, make_agent, tmp_path, transport):
    with everything_entry(transport) as entry:
        agent = await _agent_with(make_agent, tmp_path, entry)
        llm.script(
            reply(tool_calls=[tool_call("mcp_resources_everything")]),
            reply(
                tool_calls=[
                    tool_call(
                        "mcp_read_everything",
                        {"uri": "demo://resource/dynamic/text/1"},
                        id="a",
                    ),
                    tool_call("mcp_load_everything", {"tool_names": ["get-resource-links"]}),
                ]
            ),
            reply(tool_calls=[tool_call("get-resource-links", {"count": 2})]),
            reply("ok"),
        )
        result = await agent.chat("explore")
        assert result.ok, result.error
        listing, text, _, links = (c.result for c in result.tool_calls)
        assert "demo://resource/static/document/architecture.md" in listing
        assert "demo://resource/dynamic/text/{resourceId}" in listing.split("Templates")[1]
        assert "Resource 1" in text
        assert (
            "[resource link: demo://resource/dynamic/text/2 (Text Resource 2, text/plain)" in links
        )
        assert "read it with mcp_read_everything(uri=...)" in links

        everything = agent.mcp.get("everything")
        updated = asyncio.Event()

        async def watcher(uri: str) -> None:
            updated.set()

        uri = "demo://resource/static/document/architecture.md"
        stop = await everything.watch(uri, watcher)
        await everything.call("toggle-subscriber-updates", {}, generation=everything.generation)
        await until(updated.is_set, "server-everything to send a resources/updated", limit=30)
        await stop()


async def test_mentions_together_stay_within_max_result_chars(llm, make_agent, tmp_path):
    agent = await _agent_with(
        make_agent, tmp_path, stdio_entry("demo", resources=True), **{"mcp.max_result_chars": 100}
    )
    llm.script(reply("ok"))
    many = " ".join(f"@demo:memo://notes/{'x' * 40}{i}" for i in range(4))
    await agent.chat(many)
    sent = user_text(llm.requests[0])
    assert f"note called {'x' * 40}0" in sent  # 53 characters, then the second is cut to 47
    assert sent.count("not read, the attachments reached 100 characters") == 2  # none left
