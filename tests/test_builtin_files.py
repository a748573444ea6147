"""`file` and `local_image` on real files: what is refused, what is sent, what the model sees."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from _media import PNG, Outbox

from ania_nb import Callbacks
from ania_nb.engine.loop import LOADED_IMAGES_TEXT
from ania_nb.engine.messages import image_marker
from ania_nb.testing import reply, tool_call

pytest_plugins = ["_http_fixtures"]


@pytest.fixture
def files_agent(make_agent: Any, tmp_path: Path) -> Any:
    def build(**overrides: Any) -> Any:
        return make_agent(
            overrides={
                "agent.builtin_tools": True,
                "file.enable": True,
                "file.local_image": True,
                "file.roots": [str(tmp_path)],  # the default root is the working directory
                **overrides,
            }
        )

    return build


@pytest.fixture
def work(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "report.csv").write_text("a,b\n1,2\n")
    (folder / "pic.png").write_bytes(PNG)
    (folder / "notes.txt").write_text("not an image")
    (folder / "ania.toml").write_text('[llm]\napi_key = "sk-secret"\n')
    (folder / ".env").write_text("ANIA_LLM__API_KEY=sk-secret\n")
    (folder / "sub").mkdir()
    return folder


# --------------------------------------------------------------------------- file


async def test_file_sends_name_and_exact_base64(files_agent, run_tool, work):
    outbox = Outbox()
    agent = files_agent()
    call = await run_tool(
        agent,
        "file",
        {"name": "Q3 report.csv", "path": str(work / "report.csv")},
        callbacks=outbox.callbacks,
    )
    assert call.error is None, call.error
    assert outbox.files == [("Q3 report.csv", base64.b64encode(b"a,b\n1,2\n").decode("ascii"))]
    assert "Q3 report.csv" in call.result and "8 bytes" in call.result


async def test_file_display_name_is_reduced_to_a_bare_name(files_agent, run_tool, work):
    outbox = Outbox()
    agent = files_agent()
    await run_tool(
        agent,
        "file",
        {"name": "../../etc\\evil/out.csv", "path": str(work / "report.csv")},
        callbacks=outbox.callbacks,
    )
    assert [name for name, _ in outbox.files] == ["out.csv"]


async def test_file_without_send_file_callback_is_not_offered_and_sends_nothing(
    files_agent, run_tool, call_tool, llm, work
):
    agent = files_agent()
    call = await run_tool(agent, "file", {"name": "r.csv", "path": str(work / "report.csv")})
    assert "file" not in [t["function"]["name"] for t in llm.requests[0].tools]
    assert call.error is not None and "tool 'file' not found" in call.error
    outcome = await call_tool(agent, "file", {"name": "r.csv", "path": str(work / "report.csv")})
    assert outcome.error == "this conversation cannot receive files, so nothing was sent"


def refusal_cases(work: Path, data_dir: Path) -> dict[str, tuple[Path, str]]:
    return {
        "database": (data_dir / "ania.db", "inside the agent's data directory"),
        "data dir itself": (data_dir, "inside the agent's data directory"),
        "ania.toml": (work / "ania.toml", "ania.toml may hold secrets"),
        ".env": (work / ".env", ".env may hold secrets"),
        "missing": (work / "nope.csv", "no such file"),
        "directory": (work / "sub", "is a directory, not a file"),
    }


@pytest.mark.parametrize(
    "case", ["database", "data dir itself", "ania.toml", ".env", "missing", "directory"]
)
@pytest.mark.parametrize("tool", ["file", "local_image"])
async def test_protected_missing_and_directory_paths_are_refused(
    files_agent, run_tool, work, tool, case
):
    outbox = Outbox()
    agent = files_agent()
    path, message = refusal_cases(work, agent.data_dir)[case]
    args = {"path": str(path)} | ({"name": "x.bin"} if tool == "file" else {})
    callbacks = Callbacks(send_file=outbox)
    call = await run_tool(agent, tool, args, callbacks=callbacks)
    assert call.error is not None and message in call.error, call.error
    assert outbox.files == []
    assert "sk-secret" not in call.result


async def test_a_symlink_into_the_data_dir_is_refused(files_agent, run_tool, work):
    agent = files_agent()
    outbox = Outbox()
    await run_tool(agent, "time")  # the first run creates the database file
    link = work / "innocent.csv"
    link.symlink_to(agent.data_dir / "ania.db")
    call = await run_tool(
        agent, "file", {"name": "x.csv", "path": str(link)}, callbacks=outbox.callbacks
    )
    assert call.error is not None and "data directory" in call.error
    assert outbox.files == []


async def test_the_mcp_config_file_is_refused(files_agent, run_tool, work):
    servers = work / "servers.json"
    servers.write_text('{"mcpServers": {}}')
    agent = files_agent(**{"mcp.config_file": str(servers)})
    outbox = Outbox()
    call = await run_tool(
        agent, "file", {"name": "s.json", "path": str(servers)}, callbacks=outbox.callbacks
    )
    assert call.error == "refused: servers.json may hold secrets"
    assert outbox.files == []


@pytest.mark.parametrize("tool", ["file", "local_image"])
async def test_files_above_max_bytes_are_refused(files_agent, run_tool, work, tool):
    big = work / "big.png"
    big.write_bytes(PNG * 4)
    agent = files_agent(**{"file.max_bytes": len(PNG) * 4 - 1})
    args = {"path": str(big)} | ({"name": "big.png"} if tool == "file" else {})
    outbox = Outbox()
    call = await run_tool(agent, tool, args, callbacks=outbox.callbacks)
    assert call.error is not None
    assert f"is {len(PNG) * 4} bytes, above the limit of {len(PNG) * 4 - 1}" in call.error
    assert outbox.files == []


async def test_file_refuses_an_empty_name_or_path(files_agent, run_tool, work):
    outbox = Outbox()
    agent = files_agent()
    no_name = await run_tool(
        agent, "file", {"name": " ", "path": str(work / "report.csv")}, callbacks=outbox.callbacks
    )
    no_path = await run_tool(
        agent, "file", {"name": "a.csv", "path": "  "}, callbacks=outbox.callbacks
    )
    assert no_name.error is not None and "name must be a file name" in no_name.error
    assert no_path.error == "path must not be empty"
    assert outbox.files == []


# --------------------------------------------------------------------------- local_image


async def test_local_image_refuses_a_non_image(files_agent, run_tool, work):
    agent = files_agent(**{"vision.multimodal": True})
    call = await run_tool(agent, "local_image", {"path": str(work / "notes.txt")})
    assert call.error == (
        "notes.txt is not an image: its content is not PNG, JPEG, GIF, WEBP or BMP"
    )


async def test_local_image_multimodal_queues_the_file_for_the_next_request(llm, files_agent, work):
    uri = "data:image/png;base64," + base64.b64encode(PNG).decode("ascii")
    llm.script(
        reply(tool_calls=[tool_call("local_image", {"path": str(work / "pic.png")})]),
        reply("a single pixel"),
    )
    agent = files_agent(**{"vision.multimodal": True})
    result = await agent.chat("look at pic.png")
    assert result.tool_calls[0].result == (
        f"loaded local image {work / 'pic.png'} ({image_marker(uri)}); "
        "you will see them in the next step"
    )
    last = llm.requests[1].messages[-1]
    assert last["content"] == [
        {"type": "text", "text": LOADED_IMAGES_TEXT},
        {"type": "text", "text": image_marker(uri)},
        {"type": "image_url", "image_url": {"url": uri}},
    ]
    stored = await agent.history()
    assert base64.b64encode(PNG).decode("ascii") not in str(stored)
    assert image_marker(uri) in str(stored)


async def test_local_image_without_a_way_to_view_says_so(files_agent, run_tool, work):
    agent = files_agent()
    call = await run_tool(agent, "local_image", {"path": str(work / "pic.png")})
    assert call.error is not None and "the main model cannot view images" in call.error
