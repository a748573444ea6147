"""No log level prints a secret: ``ania-nb serve --log-level DEBUG`` through a whole session.

A real ``ania-nb serve`` subprocess, in both connection modes, with a secret in every place a
secret can be configured (the OneBot token — with characters URL-quoting changes — the model,
fallback, vision, one-shot and embedding API keys, the web token, the meme key, MCP header and
env values, a key in an MCP URL) goes through connect, a refused connect with the token in the
URL, a message, an approval, an MCP call whose server checks a secret header, an MCP server
that dies printing its secret, a reconnect and a shutdown. Its stdout and stderr must not hold
any of the secrets, raw, URL-quoted or base64; and the libraries that print handshake headers
at DEBUG (websockets, the HTTP and model clients, MCP) print no DEBUG line at all.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
import pytest_asyncio
from mcp_servers.support import http_server
from test_runner_serve import ANIA_NB, LISTEN_RE, Serve, to_user, uid, write_config

from ania_nb.testing import ScriptedLLM, reply, tool_call
from ania_nb.testing.onebot import HandshakeRejected, OneBotImpl

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "ob-Tok/en+42=&x%y"  # quote, quote_plus and base64 all spell it differently
SECRETS = {
    "runner.access_token": TOKEN,
    "llm.api_key": "sk-llm-5ecret-abcdef",
    "fallback.api_key": "sk-fallback-5ecret-321",
    "vision.api_key": "sk-vision-5ecret-123",
    "subagent.api_key": "sk-oneshot-5ecret-654",
    "embedding.api_key": "sk-embed-5ecret-456",
    "web.token": "jina-5ecret-token-xyz",
    "meme.key": "meme-5ecret-key-987",
    "mcp header": "mcp-hdr-5ecret-777",
    "mcp bearer": "mcp-bearer-5ecret-888",
    "mcp env": "mcp-env-5ecret-999",
    "mcp url key": "mcp-url-5ecret-000",
}
_LEAKY_DEBUG = re.compile(r" DEBUG (websockets|httpx2?|httpcore2?|openai|mcp)[.:]")


def spellings(secret: str) -> dict[str, str]:
    """The forms a secret could be logged in."""
    raw = secret.encode()
    return {
        "raw": secret,
        "quoted": quote(secret, safe=""),
        "quote_plus": quote_plus(secret),
        "base64": base64.b64encode(raw).decode().rstrip("="),
        "urlsafe base64": base64.urlsafe_b64encode(raw).decode().rstrip("="),
    }


class DebugServe(Serve):
    """``ania-nb serve --log-level DEBUG`` with stdout kept too (`Serve` keeps stderr)."""

    def __init__(self, config: Path) -> None:
        super().__init__(config)
        self.stdout = config.with_suffix(".stdout")

    async def start(self) -> DebugServe:
        with self.stdout.open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                ANIA_NB,
                "serve",
                "--config",
                str(self.config),
                "--log-level",
                "DEBUG",
                cwd=self.config.parent,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.PIPE,
            )
        self._reader = asyncio.ensure_future(self._read())
        return self


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    """A streamable-HTTP demo MCP server (its ``header`` tool returns a request header)."""
    with http_server("http") as url:
        yield url


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    """The scripted model (any API key is accepted; the one sent is recorded)."""
    with ScriptedLLM() as server:
        yield server


@pytest_asyncio.fixture(loop_scope="module")
async def impl() -> Any:
    """A OneBot implementation requiring the secret token."""
    onebot = OneBotImpl(self_id="10000", access_token=TOKEN)
    yield onebot
    await onebot.aclose()


def _mcp_config(path: Path, mcp_url: str) -> Path:
    crash = (
        "import os, sys; "
        "sys.stderr.write('refusing to start with key ' + os.environ['CRASHY_TOKEN'] + '\\n'); "
        "sys.exit(3)"
    )
    servers = {
        "demo": {
            "type": "http",
            "url": mcp_url,
            "headers": {
                "X-Api-Key": SECRETS["mcp header"],
                "Authorization": f"Bearer {SECRETS['mcp bearer']}",
            },
        },
        "crashy": {
            "command": sys.executable,
            "args": ["-c", crash],
            "env": {"CRASHY_TOKEN": SECRETS["mcp env"]},
        },
        "gone": {"type": "http", "url": f"http://127.0.0.1:9/mcp?api_key={SECRETS['mcp url key']}"},
    }
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("mode", ["forward", "reverse"])
async def test_a_debug_session_logs_no_secret(
    impl: OneBotImpl, llm: ScriptedLLM, mcp_url: str, tmp_path: Path, mode: str
) -> None:
    runner: dict[str, Any] = {"access_token": TOKEN, "reconnect_max": 1}
    if mode == "forward":  # nothing listens yet: the first attempts fail, token in the URL
        port = _free_port()
        runner |= {"mode": "forward", "url": f"ws://127.0.0.1:{port}/?access_token={quote(TOKEN)}"}
    else:
        runner |= {"mode": "reverse", "port": 0}
    config = write_config(
        tmp_path / "ania.toml",
        llm,
        tmp_path / "data",
        fallback={"api_key": SECRETS["fallback.api_key"]},
        vision={"api_key": SECRETS["vision.api_key"]},
        subagent={"api_key": SECRETS["subagent.api_key"]},
        embedding={"api_key": SECRETS["embedding.api_key"]},
        web={"token": SECRETS["web.token"]},
        meme={"key": SECRETS["meme.key"]},
        mcp={"config_file": str(_mcp_config(tmp_path / "mcp.json", mcp_url)), "lazy_load": False},
        approval={"enable": True, "tools": ["time"]},
        runner=runner,
    )
    scripted_key = f"api_key = {json.dumps(llm.api_key)}"
    assert scripted_key in config.read_text()
    config.write_text(
        config.read_text().replace(scripted_key, f"api_key = {json.dumps(SECRETS['llm.api_key'])}")
    )
    user = uid()
    llm.script(
        reply("hello back"),
        reply(tool_calls=[tool_call("time", {})]),
        reply("it is time"),
        reply(tool_calls=[tool_call("header", {"key": "x-api-key"})]),
        reply("header read"),
        reply("back again"),
    )
    proc = await DebugServe(config).start()
    try:
        if mode == "forward":
            await proc.wait_log(r"WARNING .*cannot connect to ws://127\.0\.0\.1")
            await impl.serve(port=port)
        else:
            url = (await proc.wait_log(LISTEN_RE.pattern)).group(0)
            with pytest.raises(HandshakeRejected):  # a wrong path, the token in the query
                await impl.connect(url.replace("/onebot/v11/ws", "/elsewhere"), auth="query")
            await impl.connect(url, deadline=20, auth="Token")  # go-cqhttp's scheme
        await impl.wait_connected(20)
        await proc.ready()

        await impl.private_message(user, "hi")
        await impl.wait_for_action("send_private_msg", to_user(user, "hello back"), 20)
        await impl.private_message(user, "what time is it?")
        await impl.wait_for_action("send_private_msg", to_user(user, "time"), 20)
        await impl.private_message(user, "允许")
        await impl.wait_for_action("send_private_msg", to_user(user, "it is time"), 20)
        await impl.private_message(user, "read the header")
        await impl.wait_for_action("send_private_msg", to_user(user, "header read"), 20)
        connections = impl.connections
        await impl.drop()
        await impl.wait_connected(20, connections=connections + 1)
        await impl.private_message(user, "still there?")
        await impl.wait_for_action("send_private_msg", to_user(user, "back again"), 20)
        assert await proc.stop(signal.SIGTERM) == 0
    finally:
        await proc.kill()

    # The secrets were really in play: sent to the model, to the MCP server and back.
    assert llm.requests[0].headers["authorization"] == f"Bearer {SECRETS['llm.api_key']}"
    assert SECRETS["mcp header"] in json.dumps(llm.requests[4].messages)
    assert "current time is" in json.dumps(llm.requests[2].messages)
    log = proc.log + "\n" + proc.stdout.read_text(errors="replace")
    assert " DEBUG ania_nb" in log  # DEBUG was really on
    assert "'crashy'" in log and "'gone'" in log  # the failing MCP servers were reported
    leaks = [
        f"{name} ({form})"
        for name, secret in SECRETS.items()
        for form, text in spellings(secret).items()
        if text in log
    ]
    assert not leaks, f"secrets in the log: {leaks}"
    chatty = [line for line in log.splitlines() if _LEAKY_DEBUG.search(line)]
    assert not chatty, f"library DEBUG lines (handshakes, headers) were printed: {chatty[:3]}"
