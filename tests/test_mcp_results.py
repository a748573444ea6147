"""MCP results that are not text: images to the model and the front end, audio and blobs
described, progress notifications as events, task-only tools not offered.

The agent tests run the demo server over stdio with ``--media`` (real MCP content blocks).
"""

from __future__ import annotations

import base64
import json

from mcp_servers.demo_server import PNG
from mcp_servers.support import stdio_entry
from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)

from ania_nb import Callbacks
from ania_nb.engine.messages import image_hash
from ania_nb.mcp.results import MAX_IMAGES, convert_result
from ania_nb.testing import reply, tool_call

PNG_URI = f"data:image/png;base64,{PNG}"


def result(*blocks, structured=None) -> CallToolResult:
    return CallToolResult(content=list(blocks), structured_content=structured)


def image(data: str = PNG, mime: str = "image/png") -> ImageContent:
    return ImageContent(type="image", data=data, mime_type=mime)


def test_images_become_data_uris_and_text_stays_text() -> None:
    out = convert_result(result(TextContent(type="text", text="a chart"), image()), 1000)
    assert out.text == "a chart"
    assert out.images == [PNG_URI]


def test_audio_and_binary_resources_are_described_not_dropped() -> None:
    audio = AudioContent(
        type="audio", data=base64.b64encode(bytes(2048)).decode(), mime_type="audio/wav"
    )
    pdf = BlobResourceContents(
        uri="file:///r.pdf", mime_type="application/pdf", blob=base64.b64encode(b"x" * 10).decode()
    )
    text = TextResourceContents(uri="file:///a.txt", mime_type="text/plain", text="plain text")
    out = convert_result(
        result(
            audio,
            EmbeddedResource(type="resource", resource=pdf),
            EmbeddedResource(type="resource", resource=text),
        ),
        1000,
    )
    assert out.images == []
    assert out.text.splitlines() == [
        "[audio (audio/wav, 2.0 KB) returned by the tool; it cannot be shown here]",
        "[binary resource file:///r.pdf (application/pdf, 10 bytes) returned by the tool; "
        "it cannot be shown here]",
        "[resource file:///a.txt (text/plain)]",  # an embedded text resource says what it is
        "plain text",
    ]


def test_image_blob_resources_are_images_too() -> None:
    png = BlobResourceContents(uri="file:///c.png", mime_type="image/png", blob=PNG)
    out = convert_result(result(EmbeddedResource(type="resource", resource=png)), 1000)
    assert out.images == [PNG_URI] and out.text == ""


def test_bad_base64_too_many_and_unknown_image_types_are_said_plainly() -> None:
    blocks = [image() for _ in range(MAX_IMAGES + 1)]
    blocks += [image("not base64!!"), image(PNG, "image/svg+xml")]
    out = convert_result(result(*blocks), 1000)
    assert out.images == [PNG_URI] * MAX_IMAGES
    lines = out.text.splitlines()
    assert lines[0].startswith(f"[image (image/png, 69 bytes) not shown: at most {MAX_IMAGES}")
    assert lines[1] == "[image (image/png): the server sent data that is not valid base64]"
    assert lines[2].startswith("[binary image (image/svg+xml, 69 bytes) returned by the tool")


def test_structured_content_only_when_nothing_else_and_text_is_capped() -> None:
    out = convert_result(result(structured={"b": 1, "a": "ü"}), 1000)
    assert out.text == '{"a": "ü", "b": 1}'
    shown = convert_result(result(image(), structured={"a": 1}), 1000)
    assert shown.text == "" and shown.images == [PNG_URI]
    long = convert_result(result(TextContent(type="text", text="x" * 150)), 100)
    marker = "\n...(MCP tool result truncated: 150 characters in total)"
    assert long.text == "x" * (100 - len(marker)) + marker  # 100 characters, the note included


def media_config(tmp_path) -> str:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps({"servers": [stdio_entry("media", media=True)]}))
    return str(path)


async def test_an_mcp_image_reaches_the_next_request_and_the_front_end(llm, make_agent, tmp_path):
    events = []
    llm.script(
        reply(tool_calls=[tool_call("picture", {"caption": "a red dot"})]),
        reply("I see a red pixel"),
    )
    agent = make_agent(
        overrides={
            "mcp.config_file": media_config(tmp_path),
            "mcp.lazy_load": False,
            "vision.multimodal": True,
        }
    )
    await agent.start()
    result = await agent.chat("show me", callbacks=Callbacks(on_event=events.append))
    assert result.ok, result.error
    text = result.tool_calls[0].result
    assert text.startswith("a red dot\nloaded 1 image(s) it returned ([image ")
    last = llm.requests[1].messages[-1]
    assert last["role"] == "user"
    assert {"type": "image_url", "image_url": {"url": PNG_URI}} in last["content"]
    assert {"type": "text", "text": f"[image {image_hash(PNG_URI)}]"} in last["content"]
    shown = [e.data for e in events if e.kind == "tool_images"]
    assert shown == [{"id": result.tool_calls[0].id, "name": "picture", "images": [PNG_URI]}]
    assert PNG not in json.dumps(await agent.history())  # stored as a marker, not the bytes


async def test_a_text_only_model_gets_the_vision_models_description(llm, make_agent, tmp_path):
    llm.script(
        reply(tool_calls=[tool_call("picture")]),
        reply("one red pixel"),  # the vision model's description
        reply("it is a red pixel"),
    )
    agent = make_agent(
        overrides={
            "mcp.config_file": media_config(tmp_path),
            "mcp.lazy_load": False,
            "vision.model": "vision-test",
        }
    )
    await agent.start()
    result = await agent.chat("what does the picture show?")
    assert result.ok, result.error
    assert "descriptions follow" in result.tool_calls[0].result
    assert "one red pixel" in result.tool_calls[0].result
    vision = llm.requests[1]
    assert vision.model == "vision-test"
    assert {"type": "image_url", "image_url": {"url": PNG_URI}} in vision.messages[0]["content"]
    assert all(isinstance(m.get("content"), str | None) for m in llm.requests[2].messages)


async def test_audio_and_blobs_are_described_to_the_model(llm, make_agent, tmp_path):
    llm.script(
        reply(tool_calls=[tool_call("sound"), tool_call("document")]),
        reply("described"),
    )
    agent = make_agent(
        overrides={"mcp.config_file": media_config(tmp_path), "mcp.lazy_load": False}
    )
    await agent.start()
    result = await agent.chat("play it")
    sound, document = (c.result for c in result.tool_calls)
    assert sound == "[audio (audio/wav, 44 bytes) returned by the tool; it cannot be shown here]"
    assert "[binary resource file:///report.pdf (application/pdf, 2.0 KB)" in document
    assert "the main model cannot view images" in document  # the PNG blob, no viewer set up


async def test_progress_notifications_become_tool_progress_events(llm, make_agent, tmp_path):
    events = []
    llm.script(reply(tool_calls=[tool_call("steps", {"count": 3})]), reply("done"))
    agent = make_agent(
        overrides={"mcp.config_file": media_config(tmp_path), "mcp.lazy_load": False}
    )
    await agent.start()
    result = await agent.chat("work", callbacks=Callbacks(on_event=events.append))
    assert result.tool_calls[0].result == "done in 3 steps"
    progress = [e.data for e in events if e.kind == "tool_progress"]
    call_id = result.tool_calls[0].id
    assert [(p["progress"], p["total"], p["message"]) for p in progress] == [
        (1, 3, "step 1 of 3"),
        (2, 3, "step 2 of 3"),
        (3, 3, "step 3 of 3"),
    ]
    assert all(p["id"] == call_id and p["name"] == "steps" for p in progress)
    kinds = [e.kind for e in events]
    assert kinds.index("tool_start") < kinds.index("tool_progress") < kinds.index("tool_end")


async def test_task_only_tools_are_not_offered_and_discover_says_why(llm, make_agent, tmp_path):
    llm.script(
        reply(tool_calls=[tool_call("mcp_discover_media")]),
        reply(tool_calls=[tool_call("mcp_load_media", {"tool_names": ["batch_job"]})]),
        reply("cannot"),
    )
    config = media_config(tmp_path)
    eager = make_agent(overrides={"mcp.config_file": config, "mcp.lazy_load": False})
    await eager.start()
    assert "batch_job" not in eager.tools.names() and "picture" in eager.tools.names()
    lazy = make_agent(overrides={"mcp.config_file": config})
    await lazy.start()
    result = await lazy.chat("run the batch job")
    discover, load = (c.result for c in result.tool_calls)
    assert "batch_job: not offered: it requires MCP task augmentation" in discover
    load_description = next(
        t["function"]["description"]
        for t in llm.requests[0].tools
        if t["function"]["name"] == "mcp_load_media"
    )
    assert "picture" in load_description and "batch_job" not in load_description
    assert "execution.taskSupport = required" in load and "nothing was loaded" in load
