"""webSearch, webExplore and meme against real loopback servers standing in for Jina and GIPHY."""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import quote

import pytest

from ania_nb import Callbacks
from ania_nb.testing import reply as reply_text
from ania_nb.tools import ToolContext, ToolExecutor
from ania_nb.tools.builtin import HttpSource, MemeTool, keys_missing

pytest_plugins = ["_http_fixtures"]


def web_agent(make_agent: Any, jina: Any, **overrides: Any) -> Any:
    return make_agent(
        overrides={
            "agent.builtin_tools": True,
            "web.search_url": jina.url("/search"),
            "web.reader_url": jina.url("/read/"),
            **overrides,
        }
    )


# --------------------------------------------------------------------------- webSearch


async def test_search_sends_the_query_without_page_or_token(make_agent, run_tool, jina):
    agent = web_agent(make_agent, jina)
    call = await run_tool(agent, "webSearch", {"query": "café & tea/?"})
    assert call.error is None
    assert call.result == "1. Result title\nhttps://example.com/result\nsnippet"
    [seen] = jina.requests
    assert seen.method == "GET" and seen.path == "/search"
    assert seen.query == {"q": ["café & tea/?"]}  # no page, no gl
    assert "authorization" not in seen.headers
    assert seen.headers["x-respond-with"] == "no-content"


async def test_search_sends_page_and_bearer_token_when_given(make_agent, run_tool, jina):
    agent = web_agent(make_agent, jina, **{"web.token": "jina-secret"})
    await run_tool(agent, "webSearch", {"query": "llm agents", "page": 2})
    [seen] = jina.requests
    assert seen.query == {"q": ["llm agents"], "page": ["2"]}
    assert seen.headers["authorization"] == "Bearer jina-secret"


async def test_explore_appends_the_url_raw_and_sends_reader_headers(make_agent, run_tool, jina):
    agent = web_agent(make_agent, jina, **{"web.token": "tok"})
    call = await run_tool(agent, "webExplore", {"url": "https://example.com/a/b?x=1&y=2"})
    assert call.result == "# Page title\n\nPage text."
    [seen] = jina.requests
    assert seen.raw_path == "/read/https://example.com/a/b?x=1&y=2"
    assert seen.headers["authorization"] == "Bearer tok"
    assert seen.headers["x-retain-images"] == "none"
    assert seen.headers["x-with-links-summary"] == "true"
    assert seen.headers["x-engine"] == "cf-browser-rendering"
    assert seen.headers["x-referer"] == "https://www.google.com/"
    assert seen.headers["x-user-agent"].startswith("Mozilla/5.0")
    assert "x-respond-with" not in seen.headers


async def test_explore_without_token_sends_no_authorization(make_agent, run_tool, jina):
    agent = web_agent(make_agent, jina)
    await run_tool(agent, "webExplore", {"url": "http://example.org/"})
    assert "authorization" not in jina.requests[0].headers


@pytest.mark.parametrize(
    ("tool", "args", "path"),
    [("webSearch", {"query": "q"}, "/search"), ("webExplore", {"url": "https://e.com"}, "/read/")],
)
async def test_results_are_truncated_at_max_chars_with_a_marker(
    make_agent, run_tool, jina, tool, args, path
):
    jina.route(path, "x" * 150 + "TAIL", prefix=path.endswith("/"))
    agent = web_agent(make_agent, jina, **{"web.max_chars": 100})
    call = await run_tool(agent, tool, args)
    assert call.result == "x" * 97 + "..."  # 100 characters, the marker included


async def test_result_at_exactly_max_chars_is_not_marked(make_agent, run_tool, jina):
    jina.route("/search", "y" * 100)
    agent = web_agent(make_agent, jina, **{"web.max_chars": 100})
    call = await run_tool(agent, "webSearch", {"query": "q"})
    assert call.result == "y" * 100


@pytest.mark.parametrize(
    ("tool", "args", "path", "status"),
    [
        ("webSearch", {"query": "q"}, "/search", 503),
        ("webExplore", {"url": "https://e.com/x"}, "/read/", 451),
    ],
)
async def test_non_200_is_an_error_naming_the_status(
    make_agent, run_tool, jina, tool, args, path, status
):
    jina.route(path, "secret body text", status=status, prefix=path.endswith("/"))
    agent = web_agent(make_agent, jina)
    call = await run_tool(agent, tool, args)
    assert call.error is not None and f"HTTP {status}" in call.error
    assert "secret body text" not in call.result  # the body is not fed to the model
    assert call.result.startswith("Error executing tool: ")


async def test_a_server_slower_than_web_timeout_gives_a_timeout_error(make_agent, run_tool, jina):
    jina.route("/search", "too late", delay=5)
    agent = web_agent(make_agent, jina, **{"web.timeout": 0.3})
    call = await run_tool(agent, "webSearch", {"query": "slow"})
    assert call.error == "web search timed out after 0.3 s"
    assert len(jina.requests) == 1  # it did reach the server


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    [
        ("webSearch", {"query": "   "}, "query must not be empty"),
        ("webSearch", {"query": "q", "page": 0}, "page starts at 1"),
        (
            "webExplore",
            {"url": "ftp://example.com/file"},
            "url must start with http:// or https://",
        ),
        ("webExplore", {"url": "example.com"}, "url must start with http:// or https://"),
    ],
)
async def test_bad_arguments_are_refused_before_any_request(
    make_agent, run_tool, jina, tool, args, message
):
    agent = web_agent(make_agent, jina)
    call = await run_tool(agent, tool, args)
    assert call.error is not None and message in call.error
    assert jina.requests == []


async def test_unreachable_service_is_a_clear_error(make_agent, run_tool, local_http):
    url = local_http.url("/search")
    local_http.close()  # nothing listens on that port any more
    agent = make_agent(overrides={"agent.builtin_tools": True, "web.search_url": url})
    call = await run_tool(agent, "webSearch", {"query": "q"})
    assert call.error is not None and call.error.startswith("web search failed: ConnectError")


# --------------------------------------------------------------------------- meme


class Sent:
    """A send_image callback that records what it was given."""

    def __init__(self) -> None:
        self.images: list[str] = []

    def __call__(self, b64: str) -> None:
        self.images.append(b64)

    @property
    def callbacks(self) -> Callbacks:
        return Callbacks(send_image=self)


def meme_agent(make_agent: Any, server: Any, **overrides: Any) -> Any:
    settings = {
        "agent.builtin_tools": True,
        "meme.url": server.url("/v1/stickers/search") + "?api_key=${key}&q=${msg}&limit=${num}",
        "meme.key": "k&y=1/2",
        "meme.num": 7,
    }
    settings.update(overrides)
    return make_agent(overrides=settings)


async def test_meme_fills_the_template_escaping_text_and_key(make_agent, run_tool, giphy):
    sent = Sent()
    agent = meme_agent(make_agent, giphy)
    text = "happy cat & dog/猫?"
    call = await run_tool(agent, "meme", {"text": text}, callbacks=sent.callbacks)
    assert call.error is None, call.error
    search = giphy.requests_to("/v1/stickers/search")[0]
    assert search.raw_path == (
        f"/v1/stickers/search?api_key={quote('k&y=1/2', safe='')}&q={quote(text, safe='')}&limit=7"
    )
    assert search.query == {"api_key": ["k&y=1/2"], "q": [text], "limit": ["7"]}


async def test_meme_sends_exactly_the_downloaded_image(make_agent, run_tool, giphy):
    sent = Sent()
    agent = meme_agent(make_agent, giphy)
    call = await run_tool(agent, "meme", {"text": "yay"}, callbacks=sent.callbacks)
    assert call.result == "sent a sticker about 'yay' to the user"
    [download] = giphy.requests_to("/img/")
    assert download.path in {"/img/a.gif", "/img/b.png", "/img/c.bin"}
    assert sent.images == [base64.b64encode(giphy.body(download.path)).decode("ascii")]


async def test_meme_skips_results_without_an_image_url(make_agent, run_tool, local_http):
    local_http.route("/img/only.gif", b"GIF89a-only", content_type="image/gif")
    payload = {
        "data": [
            {"images": {}},
            {"images": {"fixed_width": {"url": ""}}},
            {"images": {"fixed_width": {"url": local_http.url("/img/only.gif")}}},
            {"images": {"fixed_width": {"url": None}}},
        ]
    }
    local_http.route("/v1/stickers/search", payload)
    sent = Sent()
    agent = meme_agent(make_agent, local_http)
    for _ in range(3):  # whatever the random pick, only the one real URL is a candidate
        await run_tool(agent, "meme", {"text": "x"}, callbacks=sent.callbacks)
    assert sent.images == [base64.b64encode(b"GIF89a-only").decode()] * 3


async def test_meme_with_a_custom_template_and_paths_for_another_api(
    make_agent, run_tool, local_http
):
    local_http.route("/pics/7.png", b"\x89PNG-seven", content_type="image/png")
    local_http.route(
        "/api/find",
        {"result": {"items": [{"media": [{"src": local_http.url("/pics/7.png")}, {"src": "x"}]}]}},
    )
    sent = Sent()
    agent = make_agent(
        overrides={
            "agent.builtin_tools": True,
            "meme.url": local_http.url("/api/find") + "?term=${msg}&n=${num}",
            "meme.list_path": "result.items",
            "meme.img_field": "media[0].src",
            "meme.num": 3,
        }
    )  # no key configured: the template does not need one
    call = await run_tool(agent, "meme", {"text": "good night"}, callbacks=sent.callbacks)
    assert call.error is None, call.error
    assert local_http.requests[0].query == {"term": ["good night"], "n": ["3"]}
    assert sent.images == [base64.b64encode(b"\x89PNG-seven").decode()]


async def test_meme_api_non_200_is_an_error_with_the_status(make_agent, run_tool, local_http):
    local_http.route("/v1/stickers/search", {"message": "Invalid key"}, status=403)
    sent = Sent()
    agent = meme_agent(make_agent, local_http)
    call = await run_tool(agent, "meme", {"text": "x"}, callbacks=sent.callbacks)
    assert call.error is not None and "meme API failed: HTTP 403" in call.error
    assert sent.images == []


async def test_meme_download_non_200_is_an_error_with_the_status(make_agent, run_tool, local_http):
    local_http.route(
        "/v1/stickers/search",
        {"data": [{"images": {"fixed_width": {"url": local_http.url("/img/gone.gif")}}}]},
    )
    sent = Sent()
    agent = meme_agent(make_agent, local_http)
    call = await run_tool(agent, "meme", {"text": "x"}, callbacks=sent.callbacks)
    assert call.error is not None and "HTTP 404" in call.error
    assert sent.images == []


@pytest.mark.parametrize(
    "payload",
    [{"data": []}, {"meta": {}}, {"data": {"not": "a list"}}],
    ids=["empty", "absent", "object"],
)
async def test_meme_with_no_results_says_no_sticker_found(
    make_agent, run_tool, local_http, payload
):
    local_http.route("/v1/stickers/search", payload)
    sent = Sent()
    agent = meme_agent(make_agent, local_http)
    call = await run_tool(agent, "meme", {"text": "nothing"}, callbacks=sent.callbacks)
    assert call.error == "no sticker found for 'nothing'"
    assert sent.images == []


async def test_meme_answer_that_is_not_json_is_an_error(make_agent, run_tool, local_http):
    local_http.route("/v1/stickers/search", "<html>maintenance</html>")
    agent = meme_agent(make_agent, local_http)
    call = await run_tool(agent, "meme", {"text": "x"}, callbacks=Sent().callbacks)
    assert call.error is not None and "not JSON" in call.error


async def test_meme_template_needing_a_key_without_one_is_not_offered(
    make_agent, run_tool, giphy, llm
):
    sent = Sent()
    agent = meme_agent(make_agent, giphy, **{"meme.key": None})
    assert keys_missing(agent.config)["meme"] == "meme.key"
    call = await run_tool(agent, "meme", {"text": "x"}, callbacks=sent.callbacks)
    assert "meme" not in [t["function"]["name"] for t in llm.requests[0].tools]
    assert call.error is not None and "tool 'meme' not found" in call.error
    # The tool itself, built anyway (a front end assembling its own set), guides the admin.
    executor = ToolExecutor()
    executor.add(MemeTool(agent.config.meme, HttpSource()))
    ctx = ToolContext(session="s", callbacks=sent.callbacks)
    outcome = await executor.execute("meme", '{"text": "x"}', ctx)
    assert outcome.error is not None
    assert "meme.key" in outcome.error and "GIPHY" in outcome.error
    assert giphy.requests == []  # no request reached the server
    assert sent.images == []


async def test_meme_without_send_image_is_an_error_and_sends_no_request(
    make_agent, call_tool, giphy
):
    agent = meme_agent(make_agent, giphy)
    outcome = await call_tool(agent, "meme", {"text": "x"})
    assert outcome.error == "this conversation cannot show images, so no sticker was sent"
    assert giphy.requests == []


async def test_meme_with_an_invalid_path_expression_names_the_settings(make_agent, run_tool, giphy):
    agent = meme_agent(make_agent, giphy, **{"meme.list_path": "data[?"})
    call = await run_tool(agent, "meme", {"text": "x"}, callbacks=Sent().callbacks)
    assert call.error is not None and "meme.list_path/img_field" in call.error


# --------------------------------------------------------------------------- keys


@pytest.mark.parametrize(
    ("overrides", "offered"),
    [
        ({}, set()),  # Jina's public hosts, no token: both are off
        ({"web.token": "t"}, {"webSearch", "webExplore"}),
        ({"web.token": "  "}, set()),  # a blank token is no token
        ({"web.search_url": "http://127.0.0.1:9/search"}, {"webSearch"}),  # self-hosted search
        ({"web.reader_url": "http://127.0.0.1:9/read/"}, {"webExplore"}),
    ],
)
async def test_web_tools_are_offered_only_when_they_can_work(llm, make_agent, overrides, offered):
    agent = make_agent(overrides={"agent.builtin_tools": True, **overrides})
    llm.script(reply_text("hi"))
    await agent.chat("hello")
    sent = {t["function"]["name"] for t in llm.requests[0].tools}
    assert sent & {"webSearch", "webExplore"} == offered
    expected_off = {"webSearch", "webExplore"} - offered
    assert {k for k, v in keys_missing(agent.config).items() if v == "web.token"} == expected_off
