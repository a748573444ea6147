"""The first run explains itself: `FirstRun` (missing key, unreachable endpoint), the ``%ania``
status panel, ``%ania mcp``/``skills`` with nothing configured, ``%ania tools`` with the tools
that are off and why, ``%ania config set``."""

from __future__ import annotations

import socket

import pytest

from ania_nb import Config
from ania_nb.errors import ConfigError
from ania_nb.notebook.firstrun import FirstRun, is_local, unreachable
from ania_nb.notebook.status import NOTEBOOK_CALLBACKS
from ania_nb.testing import reply

# ------------------------------------------------------------------ FirstRun


def listening() -> socket.socket:
    """A loopback socket that accepts connections (until closed)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    server = listening()
    port = server.getsockname()[1]
    server.close()
    return port


async def test_no_model_configured_names_base_url_and_model_and_where_to_set_them():
    config = Config()  # the default: no vendor, nothing set
    with pytest.raises(ConfigError) as caught:
        await FirstRun().check(config)
    message = str(caught.value)
    assert caught.value.key == "llm.base_url"
    assert message.startswith("llm.base_url and llm.model are not set: ania-nb has no default")
    assert "Set llm.api_key too if the endpoint needs one" in message
    assert "ania.toml next to this notebook:   [llm]" in message
    assert 'base_url = "http://127.0.0.1:8080/v1"' in message and 'model = "your-model"' in message
    assert "ANIA_LLM__BASE_URL=http://127.0.0.1:8080/v1 ANIA_LLM__MODEL=your-model" in message
    assert "%ania config set llm.base_url=http://127.0.0.1:8080/v1 llm.model=your-model" in message


async def test_a_missing_model_alone_is_named():
    config = Config(llm={"base_url": "http://127.0.0.1:1/v1"})  # local: no key needed
    with pytest.raises(ConfigError) as caught:
        await FirstRun().check(config)
    assert caught.value.key == "llm.model"
    assert str(caught.value).startswith("llm.model is not set: ania-nb has no default model.")
    assert "llm.api_key" not in str(caught.value)  # a local server needs none
    assert "%ania config set llm.model=your-model" in str(caught.value)


async def test_an_empty_key_on_a_hosted_endpoint_says_what_to_set_and_where():
    config = Config(llm={"base_url": "https://api.deepseek.com", "model": "deepseek-chat"})
    with pytest.raises(ConfigError) as caught:
        await FirstRun().check(config)
    message = str(caught.value)
    assert caught.value.key == "llm.api_key"
    assert message.startswith("llm.api_key is empty, and the endpoint https://api.deepseek.com")
    assert "ania.toml next to this notebook" in message and 'api_key = "sk-…"' in message
    assert "ANIA_LLM__API_KEY=sk-…" in message
    assert "%ania config set llm.api_key=sk-…" in message
    assert "%ania config set llm.base_url=http://127.0.0.1:8080/v1" in message  # local option


async def test_an_unreachable_local_endpoint_is_named_with_how_to_fix_it():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    config = Config(llm={"base_url": url, "model": "m"})  # local: no key, but nothing listens
    with pytest.raises(ConfigError) as caught:
        await FirstRun().check(config)
    message = str(caught.value)
    assert caught.value.key == "llm.base_url"
    assert message.startswith(f"cannot reach the model endpoint llm.base_url = {url}: ")
    assert "refused the connection" in message
    assert "ANIA_LLM__BASE_URL=" in message and "%ania config set llm.base_url=" in message


async def test_a_reachable_endpoint_passes_and_is_not_probed_again():
    server = listening()
    url = f"http://127.0.0.1:{server.getsockname()[1]}/v1"
    config = Config(llm={"base_url": url, "api_key": "sk-x", "model": "m"})
    check = FirstRun()
    await check.check(config)
    server.close()
    await check.check(config)  # remembered: no second connect
    with pytest.raises(ConfigError, match="refused the connection"):
        await FirstRun().check(config)  # a fresh check does connect


async def test_a_key_for_the_scripted_model_passes(llm):
    await FirstRun().check(
        Config(llm={"base_url": llm.base_url, "api_key": llm.api_key, "model": "scripted"})
    )


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("[::1]", True),
        ("192.168.1.20", True),
        ("10.0.0.5", True),
        ("gpu-box.local", True),
        ("api.deepseek.com", False),
        ("8.8.8.8", False),
    ],
)
def test_local_hosts_need_no_key(host, local):
    assert is_local(host) is local


async def test_a_proxy_decides_instead_of_a_direct_connect(monkeypatch):
    url = f"https://127.0.0.1:{closed_port()}/v1"
    assert await unreachable(url) is not None
    monkeypatch.setenv("https_proxy", "http://proxy.example:3128")
    monkeypatch.setenv("no_proxy", "")
    assert await unreachable(url) is None


async def test_a_bad_scheme_is_named():
    assert await unreachable("ftp://example.com/v1") == "it is not an http:// or https:// address"


# ------------------------------------------------------------------ %ania in a live shell


@pytest.fixture
def shell(tmp_path, monkeypatch):
    """IPython's shell with ania_nb loaded; the Agent's data and config files in tmp_path."""
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.chdir(tmp_path)  # no ania.toml here
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "ania_nb")
    state = ip.magics_manager.registry["AgentMagics"].state
    state.overrides.update(
        {
            "llm.stream": False,
            "retry.base_delay": 0.01,
            "store.data_dir": str(tmp_path / "data"),
            "skills.dir": str(tmp_path / "no-skills"),
            "mcp.config_file": str(tmp_path / "no-mcp.json"),
        }
    )
    yield ip
    if "AgentMagics" in ip.magics_manager.registry:
        ip.run_line_magic("unload_ext", "ania_nb")


def run(ip, code: str) -> str:
    """Run one cell; return its printed output; fail on an error in the cell."""
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        result = ip.run_cell(code)
    result.raise_error()
    return captured.stdout


def use_scripted(ip, llm) -> None:
    state = ip.magics_manager.registry["AgentMagics"].state
    state.overrides.update(
        {"llm.base_url": llm.base_url, "llm.api_key": llm.api_key, "llm.model": "scripted"}
    )


def test_bare_ania_shows_the_status_of_a_fresh_install(shell, tmp_path):
    out = run(shell, "%ania")
    lines = out.splitlines()
    assert lines[0] == "ania-nb status"
    assert "  endpoint  (not set, see below)" in lines  # no vendor by default
    assert "  model     (not set, see below)" in lines and "  API key   not set" in lines
    assert f"  data dir  {tmp_path / 'data'}  (not yet)" in lines
    assert f"  config    {tmp_path / 'ania.toml'} (not found), ANIA_*" in lines
    assert f"  MCP       none ({tmp_path / 'no-mcp.json'} does not exist;" in out
    assert f"  skills    none ({tmp_path / 'no-skills'} does not exist;" in out
    assert "llm.base_url and llm.model are not set" in out and "ANIA_LLM__BASE_URL" in out
    assert "clock [list|log|…]" in out  # the sub-commands follow
    assert not (tmp_path / "data").exists()  # looking does not create the store


def test_bare_ania_probes_a_configured_endpoint(shell, llm):
    use_scripted(shell, llm)
    out = run(shell, "%ania")
    assert f"  endpoint  {llm.base_url}  (reachable)" in out.splitlines()
    assert "  API key   set" in out and "llm.api_key is empty" not in out


def test_bare_ania_names_an_unreachable_endpoint(shell):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    shell.run_line_magic("ania", f"config set llm.base_url={url}")
    out = run(shell, "%ania")
    assert f"  endpoint  {url}  (NOT reachable: 127.0.0.1:" in out


def test_bare_ania_says_a_hosted_endpoint_needs_a_key(shell):
    run(shell, "%ania config set llm.base_url=https://api.deepseek.com llm.model=deepseek-chat")
    out = run(shell, "%ania")
    lines = out.splitlines()
    assert "  endpoint  https://api.deepseek.com  (no key (see below))" in lines  # not probed
    assert "  model     deepseek-chat" in lines and "  API key   not set" in lines
    assert "llm.api_key is empty, and the endpoint https://api.deepseek.com needs one" in out


def test_mcp_and_skills_with_nothing_configured_say_the_next_step(shell, llm, tmp_path):
    use_scripted(shell, llm)
    mcp = run(shell, "%ania mcp")  # raise_error in run: a normal message, not an error
    assert mcp.startswith(f"no MCP servers: {tmp_path / 'no-mcp.json'} does not exist")
    assert '{"mcpServers": {"time": {"command": "uvx"' in mcp
    assert f"%ania config set mcp.config_file={tmp_path / 'no-mcp.json'}" in mcp
    skills = run(shell, "%ania skills")
    assert skills.startswith(f"no skills: the folder {tmp_path / 'no-skills'} does not exist")
    assert "NAME/SKILL.md" in skills and "%ania config set skills.dir=" in skills


def test_tools_lists_what_is_off_and_why(shell, llm):
    use_scripted(shell, llm)
    run(shell, "%ania config set agent.builtin_tools=true")
    out = run(shell, "%ania tools")
    rows = {line.split()[0]: line for line in out.splitlines()}
    for name in ("webSearch", "webExplore"):
        assert rows[name].endswith("off: needs web.token")
    assert rows["meme"].endswith("off: needs meme.key")
    assert rows["get_msg_history"].endswith("off: the notebook has no chat message history to read")
    assert "off: the notebook has no private file URLs" in rows["get_private_file_url"]
    assert "off: the notebook has no images attached" in rows["load_images"]
    assert rows["time"].split()[1].isdigit()  # offered: its size
    lines = out.splitlines()
    total = lines.index(next(r for r in lines if " tools sent to the model: ≈" in r))
    assert all("off:" in line for line in lines[total + 1 :])  # offered ones first
    assert int(lines[total].split()[0]) == total  # one row per tool sent


def test_the_status_counts_the_tools_the_model_is_sent_with_their_tokens(shell, llm):
    from ania_nb.notebook.status import tool_tokens

    use_scripted(shell, llm)
    run(shell, "%ania config set agent.builtin_tools=true")
    before = next(line for line in run(shell, "%ania").splitlines() if "  tools " in line)
    assert "more join when the agent starts" in before  # honest about the partial count
    llm.script(reply("hi"))
    run(shell, "%%agent\nhello")
    sent = llm.requests[-1].tools
    row = next(line for line in run(shell, "%ania").splitlines() if "  tools " in line)
    tokens = tool_tokens(sent)
    assert row.startswith(f"  tools     {len(sent)} sent to the model (≈{tokens:,} tokens")
    assert "more join" not in row
    tools_out = run(shell, "%ania tools")
    assert f"{len(sent)} tools sent to the model: ≈{tool_tokens(sent):,} tokens" in tools_out


def test_tools_off_in_a_notebook_are_not_offered_to_the_model(shell, llm):
    use_scripted(shell, llm)
    run(shell, "%ania config set agent.builtin_tools=true")
    llm.script(reply("hi"))
    run(shell, "%%agent\nhello")  # through the run widget's callbacks
    offered = {t["function"]["name"] for t in llm.requests[0].tools}
    assert "time" in offered
    assert not offered & {"get_msg_history", "get_private_file_url", "load_images", "meme"}


def test_config_set_is_the_same_as_config(shell):
    out = run(shell, "%ania config set agent.max_iterations=7 llm.model=local-qwen")
    assert out.startswith("set agent.max_iterations, llm.model;")
    state = shell.magics_manager.registry["AgentMagics"].state
    assert state.agent().config.agent.max_iterations == 7
    assert state.agent().config.llm.model == "local-qwen"


def test_config_set_takes_an_old_key_name_and_the_last_setting_wins(shell):
    state = shell.magics_manager.registry["AgentMagics"].state
    run(shell, "%ania config set bash.max_output=300")
    assert state.agent().config.bash.max_output_chars == 300
    run(shell, "%ania config set bash.max_output_chars=400")
    assert state.agent().config.bash.max_output_chars == 400
    run(shell, "%ania config set bash.max_output=500")
    assert state.agent().config.bash.max_output_chars == 500
    assert "bash.max_output_chars = 500" in run(shell, "%ania config")


async def test_the_notebook_callbacks_are_the_run_views(make_agent):
    from ania_nb.notebook.widgets import RunView

    view = RunView(make_agent(), prompt="x")  # an Agent that is never started
    assert set(view.callbacks.provided()) == NOTEBOOK_CALLBACKS


def test_bare_ania_shows_the_context_warning_once_a_run_measured_it(shell, llm):
    use_scripted(shell, llm)
    run(shell, "%ania config set agent.max_context_tokens=300")
    assert "context" not in run(shell, "%ania")  # nothing measured yet
    llm.script(reply("hi"))
    run(shell, "%agent -q hello")
    state = shell.magics_manager.registry["AgentMagics"].state
    # What a run measures (the system prompt and tool definitions); far over 300 × 0.8 tokens.
    state.agent()._rt.window.fixed_part("a long system prompt " * 200, [])
    out = run(shell, "%ania")
    [line] = [x for x in out.splitlines() if x.startswith("  context")]
    assert "WARNING: the system prompt and tool definitions take about" in line
    assert "agent.max_context_tokens" in line


def test_run_ania_routes_history_to_manage_history(shell, llm):
    from IPython.core.error import UsageError
    from IPython.utils.capture import capture_output

    from ania_nb.notebook.manage import run_ania

    use_scripted(shell, llm)
    llm.script(reply("noted"))
    run(shell, "%agent -q remember A")
    state = shell.magics_manager.registry["AgentMagics"].state
    with capture_output() as captured:
        state.run_sync(run_ania(state, "history show"))
    assert "remember A" in captured.stdout and "noted" in captured.stdout
    with pytest.raises(UsageError, match=r"usage: %ania history \[list"):
        state.run_sync(run_ania(state, "history bogus"))


def test_opening_the_agent_without_a_model_is_one_line_naming_the_keys(shell):
    from IPython.core.error import UsageError
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        result = shell.run_cell("%ania mcp")  # opens the Agent: its client needs a model
    assert isinstance(result.error_in_exec, UsageError)
    assert str(result.error_in_exec).startswith("llm.base_url and llm.model are not set: ")
    assert "Traceback" not in captured.stdout + captured.stderr


def test_a_full_disk_is_one_line_in_ania_kb_and_a_failed_upkeep_a_status_line(
    small_disk, shell, llm, tmp_path
):
    use_scripted(shell, llm)
    state = shell.magics_manager.registry["AgentMagics"].state
    state.overrides.update(
        {"store.data_dir": str(small_disk.path / "data"), "embedding.provider": "none"}
    )
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(6):  # one commit each: fragments for the compaction to merge
        (docs / f"note{i}.md").write_text(f"# Note {i}\n\n" + f"ferret fact {i} " * 60)
        run(shell, f"%ania kb add {docs / f'note{i}.md'}")
    small_disk.fill()
    (docs / "late.md").write_text("# Late\n\n" + "word " * 3000)
    failed = shell.run_cell(f"%ania kb add {docs / 'late.md'}")
    error = failed.error_in_exec
    from IPython.core.error import UsageError

    assert isinstance(error, UsageError), error  # one line, no traceback
    assert str(error).startswith("no space left on device: "), error
    state.run_sync(state.agent().knowledge.upkeep())  # what the clock's leader does
    out = run(shell, "%ania")
    assert "  knowledge upkeep of kb_chunks FAILED: no space left on device: compacting" in out
    small_disk.free()
    state.run_sync(state.agent().knowledge.upkeep())
    assert "  knowledge " not in run(shell, "%ania")
