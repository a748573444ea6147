"""Built-in tiers, `time`, chat-history tools and `load_images`, through real Agent runs."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime
from typing import Any

import pytest

from ania_nb import Callbacks, Config, tool
from ania_nb.engine.loop import LOADED_IMAGES_TEXT
from ania_nb.engine.messages import image_hash, image_marker
from ania_nb.testing import ScriptedLLM, reply, tool_call, usage
from ania_nb.tools.builtin import HttpSource, default_tools, gated_tools, image_viewer

pytest_plugins = ["_http_fixtures"]

DEFAULT_TIER = [
    "get_msg_history",
    "get_private_file_url",
    "load_images",
    "meme",
    "time",
    "webExplore",
    "webSearch",
]
GATED = ["bash", "file", "local_image"]
BUILTINS = {"agent.builtin_tools": True}
KEYS = {"web.token": "jina-test", "meme.key": "giphy-test"}  # the key-gated built-ins are on
KEY_GATED = {"meme", "webExplore", "webSearch"}
# A front end that serves every built-in (each callback is only checked for presence here).
EVERY_FRONT_END = Callbacks(
    send_image=lambda b64: None,
    send_file=lambda name, b64: None,
    get_msg_history=lambda count, seq: "",
    get_private_file_url=lambda file_id: "",
    load_images=lambda: [],
)


def sent_tool_names(request: Any) -> list[str]:
    return [t["function"]["name"] for t in request.tools or []]


# --------------------------------------------------------------------------- tiers


def test_default_tier_functions_build_exactly_the_configured_tools(tmp_path):
    config = Config(store={"data_dir": tmp_path})
    viewer = image_viewer(config)
    keyless = sorted(t.name for t in default_tools(config, HttpSource(), viewer))
    assert keyless == sorted(set(DEFAULT_TIER) - KEY_GATED)  # no key, no dead tools
    keyed = config.with_overrides(KEYS)
    assert sorted(t.name for t in default_tools(keyed, HttpSource(), viewer)) == DEFAULT_TIER
    assert gated_tools(config, viewer) == []
    enabled = config.with_overrides(
        {"bash.enable": True, "file.enable": True, "file.local_image": True}
    )
    assert sorted(t.name for t in gated_tools(enabled, image_viewer(enabled))) == GATED


async def test_agent_sends_the_default_tier_and_no_gated_tool(llm, make_agent):
    llm.script(reply("hi"))
    agent = make_agent(overrides={**BUILTINS, **KEYS})
    await agent.chat("hello", callbacks=EVERY_FRONT_END)
    names = sent_tool_names(llm.requests[0])
    assert set(DEFAULT_TIER) <= set(names)
    assert not set(GATED) & set(names)
    assert names == sorted(names)


@pytest.mark.parametrize(
    ("key", "name"),
    [("bash.enable", "bash"), ("file.enable", "file"), ("file.local_image", "local_image")],
)
async def test_each_gated_tool_appears_only_when_its_key_is_on(llm, make_agent, key, name):
    llm.script(reply("hi"))
    agent = make_agent(overrides={**BUILTINS, key: True})
    await agent.chat("hello", callbacks=EVERY_FRONT_END)
    names = sent_tool_names(llm.requests[0])
    assert name in names
    assert [g for g in GATED if g in names] == [name]


async def test_builtin_tools_off_registers_none(llm, make_agent):
    agent = make_agent(overrides={"agent.builtin_tools": False, "bash.enable": True})
    assert not (set(DEFAULT_TIER) | set(GATED)) & set(agent.tools.names())


async def test_a_user_tool_named_like_a_builtin_replaces_it(make_agent, run_tool, llm):
    @tool(name="time")
    def my_time() -> str:
        """The user's own clock."""
        return "tea time"

    agent = make_agent(overrides=BUILTINS, tools=[my_time])
    call = await run_tool(agent, "time")
    assert call.result == "tea time"
    time_defs = [t for t in llm.requests[0].tools if t["function"]["name"] == "time"]
    assert [d["function"]["description"] for d in time_defs] == ["The user's own clock."]


# --------------------------------------------------------------------------- time


async def test_time_is_iso_8601_with_the_local_offset(make_agent, run_tool):
    agent = make_agent(overrides=BUILTINS)
    before = datetime.now().astimezone().replace(microsecond=0)
    call = await run_tool(agent, "time")
    after = datetime.now().astimezone()
    match = re.fullmatch(r"current time is: (\S+) \((\w+)\)", call.result)
    assert match, call.result
    stamp = datetime.fromisoformat(match[1])
    assert re.search(r"[+-]\d\d:\d\d$", match[1])  # explicit offset, never naive
    assert stamp.utcoffset() == after.utcoffset()
    assert before <= stamp <= after
    assert match[2] == stamp.strftime("%A")


# --------------------------------------------------------------------------- chat history


class History:
    def __init__(self, answer: str = "[message_seq:7]\n[nickname:amy id:qq:1]: hi\n") -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer

    async def __call__(self, count: int, seq: int) -> str:
        self.calls.append((count, seq))
        return self.answer


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({}, (10, 0)),
        ({"count": 5}, (5, 0)),
        ({"count": 30}, (30, 0)),
        ({"count": 31}, (30, 0)),
        ({"count": 500}, (30, 0)),
        ({"count": 0}, (10, 0)),
        ({"count": -4}, (10, 0)),
        ({"message_seq": 42}, (10, 42)),
        ({"count": 3, "message_seq": -9}, (3, 0)),
    ],
)
async def test_get_msg_history_defaults_caps_and_clamps(make_agent, run_tool, args, expected):
    history = History()
    agent = make_agent(overrides=BUILTINS)
    call = await run_tool(
        agent, "get_msg_history", args, callbacks=Callbacks(get_msg_history=history)
    )
    assert history.calls == [expected]
    assert call.result == history.answer and call.error is None


async def test_get_msg_history_with_nothing_found(make_agent, run_tool):
    agent = make_agent(overrides=BUILTINS)
    call = await run_tool(
        agent, "get_msg_history", callbacks=Callbacks(get_msg_history=History(answer=""))
    )
    assert call.result == "no messages found"


async def test_get_msg_history_without_callback_is_an_error(make_agent, call_tool):
    agent = make_agent(overrides=BUILTINS)
    outcome = await call_tool(agent, "get_msg_history", {"count": 3})
    assert outcome.error == "message history is not available in this conversation"


async def test_private_file_url_passes_the_id_and_returns_the_url(make_agent, run_tool):
    asked: list[str] = []

    def file_url(file_id: str) -> str:
        asked.append(file_id)
        return f"https://files.example/{file_id}?sig=1"

    agent = make_agent(overrides=BUILTINS)
    call = await run_tool(
        agent,
        "get_private_file_url",
        {"file_id": " abc/123 "},
        callbacks=Callbacks(get_private_file_url=file_url),
    )
    assert asked == ["abc/123"]
    assert call.result == "https://files.example/abc/123?sig=1"


async def test_private_file_url_without_callback_is_an_error(make_agent, call_tool):
    agent = make_agent(overrides=BUILTINS)
    outcome = await call_tool(agent, "get_private_file_url", {"file_id": "abc"})
    assert outcome.error == "this conversation's platform cannot give file URLs"


async def test_private_file_url_refuses_an_empty_id(make_agent, run_tool):
    asked: list[str] = []
    agent = make_agent(overrides=BUILTINS)
    call = await run_tool(
        agent,
        "get_private_file_url",
        {"file_id": "  "},
        callbacks=Callbacks(get_private_file_url=asked.append),
    )
    assert call.error == "file_id must not be empty"
    assert asked == []


async def test_private_file_url_with_no_url_is_an_error(make_agent, run_tool):
    agent = make_agent(overrides=BUILTINS)
    call = await run_tool(
        agent,
        "get_private_file_url",
        {"file_id": "gone"},
        callbacks=Callbacks(get_private_file_url=lambda file_id: None),
    )
    assert call.error == "no URL for file 'gone'"


# --------------------------------------------------------------------------- load_images

IMG_A = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgAAIAAAUAAeIh"
    "vDMAAAAASUVORK5CYII="
)
IMG_B = "https://cdn.example/photo-b.jpg"


class Loader:
    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.calls = 0

    async def __call__(self) -> list[str]:
        self.calls += 1
        await asyncio.sleep(0.01)  # a front end fetching the message: other calls may run
        return list(self.urls)


async def test_multimodal_load_images_shows_them_in_the_next_request(llm, make_agent):
    loader = Loader([IMG_A, IMG_B, IMG_A])  # duplicates are shown once
    llm.script(reply(tool_calls=[tool_call("load_images")]), reply("a chart and a photo"))
    agent = make_agent(overrides={**BUILTINS, "vision.multimodal": True})
    result = await agent.chat("what's in my pictures?", callbacks=Callbacks(load_images=loader))
    labels = f"{image_marker(IMG_A)}, {image_marker(IMG_B)}"
    assert result.tool_calls[0].result == (
        f"loaded 2 image(s) ({labels}); you will see them in the next step"
    )
    assert result.text == "a chart and a photo"
    last = llm.requests[1].messages[-1]
    assert last["role"] == "user"
    assert last["content"] == [
        {"type": "text", "text": LOADED_IMAGES_TEXT},
        {"type": "text", "text": f"[image {image_hash(IMG_A)}]"},
        {"type": "image_url", "image_url": {"url": IMG_A}},
        {"type": "text", "text": f"[image {image_hash(IMG_B)}]"},
        {"type": "image_url", "image_url": {"url": IMG_B}},
    ]
    stored = await agent.history()
    images_turn = [m for m in stored if m["role"] == "user"][-1]
    assert images_turn["content"] == "\n".join(
        [LOADED_IMAGES_TEXT, image_marker(IMG_A), image_marker(IMG_B)]
    )
    assert "base64" not in str(stored) and IMG_B not in str(stored)


async def test_second_load_images_in_one_run_is_already_loaded(llm, make_agent):
    loader = Loader([IMG_B])
    llm.script(
        reply(tool_calls=[tool_call("load_images")]),
        reply(tool_calls=[tool_call("load_images")]),
        reply("seen"),
    )
    agent = make_agent(overrides={**BUILTINS, "vision.multimodal": True})
    result = await agent.chat("look", callbacks=Callbacks(load_images=loader))
    second = result.tool_calls[1].result
    assert second == "the images are already loaded in this request; no need to call again"
    assert loader.calls == 1
    image_turns = [m for m in llm.requests[2].messages if isinstance(m["content"], list)]
    assert len(image_turns) == 1  # the images were queued once


async def test_parallel_load_images_in_one_round_load_once(llm, make_agent):
    loader = Loader([IMG_B])
    llm.script(
        reply(tool_calls=[tool_call("load_images"), tool_call("load_images")]), reply("seen")
    )
    agent = make_agent(overrides={**BUILTINS, "vision.multimodal": True})
    result = await agent.chat("look", callbacks=Callbacks(load_images=loader))
    assert loader.calls == 1
    texts = sorted(c.result for c in result.tool_calls)
    assert texts[1] == "the images are already loaded in this request; no need to call again"
    last = llm.requests[1].messages[-1]
    assert [p["type"] for p in last["content"]] == ["text", "text", "image_url"]


async def test_load_images_in_a_new_run_loads_again(llm, make_agent):
    loader = Loader([IMG_B])
    agent = make_agent(overrides={**BUILTINS, "vision.multimodal": True})
    for _ in range(2):
        llm.script(reply(tool_calls=[tool_call("load_images")]), reply("seen"))
        result = await agent.chat("look", callbacks=Callbacks(load_images=loader))
        assert result.tool_calls[0].result.startswith("loaded 1 image(s)")
    assert loader.calls == 2


async def test_load_images_without_callback_or_images(make_agent, run_tool, call_tool):
    agent = make_agent(overrides={**BUILTINS, "vision.multimodal": True})
    absent = await call_tool(agent, "load_images")
    assert absent.error == "this conversation cannot provide the user's images"
    empty = await run_tool(agent, "load_images", callbacks=Callbacks(load_images=Loader([])))
    assert empty.result == "no loadable images in the current or quoted message"
    assert empty.error is None  # nothing to load is an answer, not a failure


async def test_no_images_found_does_not_block_a_later_call_in_the_run(llm, make_agent):
    loader = Loader([])
    llm.script(
        reply(tool_calls=[tool_call("load_images")]),
        reply(tool_calls=[tool_call("load_images")]),
        reply("ok"),
    )
    agent = make_agent(overrides={**BUILTINS, "vision.multimodal": True})
    result = await agent.chat("look", callbacks=Callbacks(load_images=loader))
    assert [c.result for c in result.tool_calls] == [
        "no loadable images in the current or quoted message"
    ] * 2
    assert loader.calls == 2


async def test_text_only_model_gets_descriptions_from_the_vision_model(llm, make_agent):
    def describe(request: Any) -> Any:
        parts = request.messages[-1]["content"]
        url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
        return reply(f"a picture at {url[:22]}", usage=usage(50, 5))

    with ScriptedLLM(responder=describe) as vision:
        llm.script(
            reply(tool_calls=[tool_call("load_images")], usage=usage(100, 10)),
            reply("described", usage=usage(100, 10)),
        )
        agent = make_agent(
            overrides={
                **BUILTINS,
                "vision.model": "describer",
                "vision.base_url": vision.base_url,
                "vision.prompt": "Say what you see.",
            }
        )
        loader = Loader([IMG_A, IMG_B])
        result = await agent.chat("what is it?", callbacks=Callbacks(load_images=loader))
        seen = vision.requests
    assert len(seen) == 2
    for request in seen:
        assert request.model == "describer"
        [message] = request.messages
        assert message["role"] == "user"
        assert message["content"][0] == {"type": "text", "text": "Say what you see."}
        assert message["content"][1]["type"] == "image_url"
    assert {r.messages[0]["content"][1]["image_url"]["url"] for r in seen} == {IMG_A, IMG_B}
    text = result.tool_calls[0].result
    assert text.startswith("the main model cannot view images; descriptions follow:")
    for url in (IMG_A, IMG_B):
        tag = f"image {image_hash(url)}"
        assert f"\n<{tag}>\na picture at {url[:22]}\n</{tag}>" in text
    # the main model never received an image part
    assert all(not isinstance(m["content"], list) for r in llm.requests for m in r.messages)
    # the vision model's tokens (2 × 55) count in the run's usage, but not as loop iterations
    assert result.usage.total_tokens == 2 * 110 + 2 * 55
    assert result.usage.iterations == 2


async def test_without_multimodal_or_vision_model_images_cannot_be_viewed(make_agent, run_tool):
    loader = Loader([IMG_B])
    agent = make_agent(overrides=BUILTINS)
    call = await run_tool(agent, "load_images", callbacks=Callbacks(load_images=loader))
    assert call.error is not None  # a tool that cannot work here fails, it does not "answer"
    assert "the main model cannot view images and no vision model" in call.error
    assert "vision.multimodal" in call.error and "vision.model" in call.error
    assert loader.calls == 0


# --------------------------------------------------------------------------- front ends


async def test_a_run_offers_only_the_tools_its_front_end_can_serve(llm, make_agent):
    needs_front_end = {"get_msg_history", "get_private_file_url", "load_images", "meme", "file"}
    llm.script(reply("hi"), reply(tool_calls=[tool_call("get_msg_history")]), reply("no luck"))
    agent = make_agent(overrides={**BUILTINS, **KEYS, "file.enable": True})
    notebook_like = Callbacks(send_image=lambda b64: None, send_file=lambda name, b64: None)
    await agent.chat("hello", callbacks=notebook_like)
    offered = set(sent_tool_names(llm.requests[0]))
    assert needs_front_end & offered == {"meme", "file"}
    result = await agent.chat("show me the chat history")  # a front end with no callbacks
    assert not needs_front_end & set(sent_tool_names(llm.requests[1]))
    [call] = result.tool_calls  # a model that calls it anyway gets an error, not an answer
    assert call.error is not None and "tool 'get_msg_history' not found" in call.error


async def test_sampling_is_left_to_the_provider_by_default(llm, make_agent):
    llm.script(reply("hi"))
    await make_agent().chat("hello")
    body = llm.requests[0].body
    assert "temperature" not in body and "top_p" not in body


async def test_a_one_shot_run_offers_only_what_its_front_end_can_serve(llm, make_agent):
    from ania_nb.orchestration import OneShotJob

    agent = make_agent(overrides={**BUILTINS, **KEYS})
    llm.script(reply("done"), reply("done"))
    for callbacks in (Callbacks(), Callbacks(send_image=lambda b64: None)):
        await agent.host.run_one_shot(
            OneShotJob(
                kind="clock",
                session="nb:clock",
                text="task",
                system_prompt="p",
                timeout=30,
                callbacks=callbacks,
            )
        )
    headless, with_images = (set(sent_tool_names(r)) for r in llm.requests)
    assert "time" in headless and "meme" not in headless and "load_images" not in headless
    assert "meme" in with_images and "get_msg_history" not in with_images
