"""Issue 12 item 4 and issue 27 item 11: child processes start with a cleared environment, not
ania-nb's; secrets in config values and config files are masked wherever the model or a listing
shows them.

The children are real: the bash tool running ``env`` (directly and in the bubblewrap sandbox), a
shell hook dumping its environment, the stdio demo MCP server reporting its variables and a
``@tool(process=True)`` child returning its ``os.environ``, each driven through `Agent.chat`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from mcp_servers.support import stdio_entry

from ania_nb import tool
from ania_nb._env import child_env, is_secret_name
from ania_nb.cli import main as cli_main
from ania_nb.config import Config, SecuritySettings
from ania_nb.testing import reply, tool_call

from .test_bash import needs_bwrap

# Variables a developer's shell typically holds; none may reach a child.
SECRETS = {
    "ANIA_LLM__API_KEY": "sk-ania-main-key-000111",
    "ANIA_WEB__TOKEN": "jina-token-000222",
    "OPENAI_API_KEY": "sk-openai-000333",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-000444",
    "GITHUB_TOKEN": "ghp-000555",
    "DB_PASSWORD": "hunter2-000666",
    "CORP_VAULT_LEASE": "vault-lease-000777",  # secret only by the configured pattern below
}
# Not secret, but not listed either: a cleared environment does not have it.
UNLISTED = {"HARMLESS_SETTING": "not-listed-000999", "VIRTUAL_ENV": "/opt/some-venv"}
# Listed in security.pass_env: by a pattern, and by its exact (secret-looking) name.
LISTED = {"HARMLESS_MARKER": "visible-to-children", "DEPLOY_HOOK_TOKEN": "passed-by-name-0001"}
POLICY = {
    "security.secret_env": [*SecuritySettings().secret_env, "CORP_VAULT_*"],
    # Patterns never let a secret through; an exact name does; ANIA_* never passes.
    "security.pass_env": [
        "HARMLESS_M*",
        "CORP_*",
        "*_KEY",
        "DEPLOY_HOOK_TOKEN",
        "ANIA_LLM__API_KEY",
    ],
}


@pytest.fixture
def secret_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {**SECRETS, **UNLISTED, **LISTED}.items():
        monkeypatch.setenv(key, value)


def assert_no_secret_in(text: str) -> None:
    for key, value in {**SECRETS, **UNLISTED}.items():
        assert value not in text, key
        assert key not in text, key


def assert_cleared(seen: dict[str, str]) -> None:
    """The policy held: listed variables and the basics passed, nothing else."""
    for key in [*SECRETS, *UNLISTED]:
        assert key not in seen, key
    for key, value in LISTED.items():
        assert seen.get(key) == value, key
    assert seen.get("PATH") == os.environ["PATH"]
    assert seen.get("HOME") == os.environ["HOME"]


def parse_env(dump: str) -> dict[str, str]:
    return dict(line.partition("=")[::2] for line in dump.splitlines() if "=" in line)


@pytest.mark.parametrize("sandbox", ["none", pytest.param("bwrap", marks=needs_bwrap)])
async def test_bash_child_gets_a_cleared_environment(
    llm, make_agent, secret_environment, tmp_path, sandbox
):
    llm.script(reply(tool_calls=[tool_call("bash", {"command": "env"})]), reply("done"))
    agent = make_agent(
        overrides={
            "agent.builtin_tools": True,
            "bash.enable": True,
            "bash.whitelist": ["env$"],
            "bash.env": ["GIVEN_ON_PURPOSE_TOKEN=configured-000888"],
            "bash.sandbox": sandbox,
            "bash.workdir": str(tmp_path),
            **POLICY,
        }
    )
    result = await agent.chat("show the environment")
    assert result.ok, result.error
    seen = parse_env(result.tool_calls[0].result)
    assert_cleared(seen)
    assert seen["GIVEN_ON_PURPOSE_TOKEN"] == "configured-000888"  # bash.env is set on purpose
    assert_no_secret_in(json.dumps([r.messages for r in llm.requests]))


async def test_shell_hook_gets_a_cleared_environment(
    llm, make_agent, tmp_path, hook_script, secret_environment
):
    dump = tmp_path / "hook-env.txt"
    script = hook_script("dump.sh", f"env > {dump}\n")
    hooks = tmp_path / "hooks.json"
    hooks.write_text(json.dumps({"hooks": {"UserPromptSubmit": [{"command": str(script)}]}}))
    llm.script(reply("ok"))
    agent = make_agent(overrides={"hooks.enable": True, "hooks.file": str(hooks), **POLICY})
    result = await agent.chat("hello")
    assert result.ok, result.error
    assert_cleared(parse_env(dump.read_text()))


async def test_stdio_mcp_server_gets_a_cleared_environment(
    llm, make_agent, tmp_path, secret_environment
):
    config = tmp_path / "mcp.json"
    entry = stdio_entry("demo", env={"GIVEN_TOKEN": "by-config-000999"})
    config.write_text(json.dumps({"servers": [entry]}))
    asked = [*SECRETS, *UNLISTED, *LISTED, "PATH", "HOME", "GIVEN_TOKEN"]
    llm.script(
        reply(tool_calls=[tool_call("get_env", {"key": key}) for key in asked]),
        reply("done"),
    )
    agent = make_agent(overrides={"mcp.config_file": str(config), "mcp.lazy_load": False, **POLICY})
    await agent.start()  # eager MCP tools are there once started
    result = await agent.chat("what do you see?")
    assert result.ok, result.error
    got = {json.loads(call.arguments)["key"]: call.result.strip() for call in result.tool_calls}
    assert_cleared({k: v for k, v in got.items() if v != "<unset>"})
    assert got["GIVEN_TOKEN"] == "by-config-000999"  # the entry's own env is passed on purpose


@tool(process=True)
def child_environment() -> str:
    """Report this process's environment."""
    return json.dumps(dict(os.environ))


async def test_process_tool_child_gets_a_cleared_environment(llm, make_agent, secret_environment):
    llm.script(reply(tool_calls=[tool_call("child_environment", {})]), reply("done"))
    agent = make_agent(tools=[child_environment], overrides=POLICY)
    result = await agent.chat("what does a child see?")
    assert result.ok, result.error
    assert_cleared(json.loads(result.tool_calls[0].result))


async def test_process_tool_child_without_an_agent_gets_the_default_policy(
    secret_environment,
):
    from ania_nb.tools import ToolContext

    seen = json.loads(await child_environment.invoke({}, ToolContext()))
    for key in [*SECRETS, *UNLISTED, *LISTED]:  # nothing listed: not even the markers
        assert key not in seen, key
    assert seen["PATH"] == os.environ["PATH"]


def test_child_env_patterns_are_case_insensitive_and_ania_is_always_removed():
    base = {"ANIA_X": "1", "my_api_key": "2", "PATH": "/bin", "Session_Token": "3", "lc_all": "C"}
    everything = SecuritySettings(pass_env=["*"], secret_env=[])
    assert child_env(everything, base=base) == {
        "my_api_key": "2",
        "PATH": "/bin",
        "Session_Token": "3",
        "lc_all": "C",
    }
    assert child_env(SecuritySettings(pass_env=["*"]), base=base) == {"PATH": "/bin", "lc_all": "C"}
    assert child_env(SecuritySettings(pass_env=["MY_API_KEY", "ania_x"]), base=base) == {
        "my_api_key": "2",  # named exactly: passes although it looks secret
        "PATH": "/bin",
        "lc_all": "C",
    }
    assert child_env(None, ["A=1", "broken"], base=base) == {
        "PATH": "/bin",
        "lc_all": "C",
        "A": "1",
    }
    assert child_env(None, base={})["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert is_secret_name("openai_api_key") and not is_secret_name("HOME")


# --- masking ------------------------------------------------------------------------------


def test_bash_env_values_are_masked_in_listings(capsys, tmp_path):
    toml = tmp_path / "ania.toml"
    toml.write_text('[bash]\nenv = ["DEPLOY_KEY=abcdefghijkl-secret-9876", "MODE=fast"]\n')
    config = Config.load(toml)
    assert config.masked()["bash"]["env"] == ["DEPLOY_KEY=***9876", "MODE=***"]
    assert "abcdefghijkl" not in repr(config)
    assert cli_main(["config", "--file", str(toml)]) == 0
    out = capsys.readouterr().out
    assert "bash.env = ['DEPLOY_KEY=***9876', 'MODE=***'] (sensitive)" in out
    assert "abcdefghijkl" not in out
    assert "security.secret_env = [" in out


MCP_FILE = {
    "mcpServers": {
        "github": {
            "command": "/nonexistent/mcp-github",
            "args": ["-y", "server-github", "--api-key", "sk-arg-value-0000111", "--verbose"],
            "env": {"GITHUB_TOKEN": "ghp_env_value_0000222", "PLAIN": "plain-value-0000333"},
        },
        "remote": {
            "url": "http://user:url-password-0000444@127.0.0.1:9/sse?token=tok-value-0000555",
            "headers": {"Authorization": "Bearer header-value-0000666", "X-Team": "team-0000777"},
        },
    }
}
MCP_SECRETS = [
    "sk-arg-value-0000111",
    "ghp_env_value_0000222",
    "plain-value-0000333",
    "url-password-0000444",
    "tok-value-0000555",
    "header-value-0000666",
    "team-0000777",
]


async def test_config_file_get_masks_secrets_and_set_keeps_them(llm, make_agent, tmp_path):
    mcp = tmp_path / "mcp.json"
    mcp.write_text(json.dumps(MCP_FILE))
    hooks = tmp_path / "hooks.json"
    hooks.write_text(
        json.dumps(
            {
                "hooks": {
                    "Stop": [
                        {"command": 'curl -H "Authorization: Bearer hook-bearer-0000888" x'},
                        {"command": "API_TOKEN=hook-assign-0000999 ./notify.sh"},
                    ]
                }
            }
        )
    )
    llm.script(
        reply(tool_calls=[tool_call("config_file_get", {"name": "mcp"})]),
        reply(tool_calls=[tool_call("config_file_get", {"name": "hooks"})]),
        reply("seen"),
    )
    agent = make_agent(
        overrides={
            "config_tool.enable": True,
            "mcp.config_file": str(mcp),
            "hooks.file": str(hooks),
        }
    )
    result = await agent.chat("show me the config files")
    assert result.ok, result.error
    shown_mcp, shown_hooks = (call.result for call in result.tool_calls)
    sent = json.dumps([r.messages for r in llm.requests])
    for secret in [*MCP_SECRETS, "hook-bearer-0000888", "hook-assign-0000999"]:
        assert secret not in sent
    assert "secret values masked" in shown_mcp
    masked = json.loads(shown_mcp.split(":\n", 1)[1])
    github = masked["mcpServers"]["github"]
    assert github["args"] == ["-y", "server-github", "--api-key", "***0111", "--verbose"]
    assert github["env"] == {"GITHUB_TOKEN": "***0222", "PLAIN": "***0333"}
    remote = masked["mcpServers"]["remote"]
    assert remote["url"] == "http://user:***0444@127.0.0.1:9/sse?token=***0555"
    assert remote["headers"] == {"Authorization": "***0666", "X-Team": "***0777"}
    assert "Bearer ***0888" in shown_hooks and "API_TOKEN=***0999" in shown_hooks

    # Written back as read (with one real change), the stored secrets survive.
    masked["mcpServers"]["github"]["args"][-1] = "--quiet"
    from ania_nb.governance.secrets import restore_masked

    restored = json.loads(restore_masked(json.dumps(masked), mcp.read_text()))
    expected: dict[str, Any] = json.loads(json.dumps(MCP_FILE))
    expected["mcpServers"]["github"]["args"][-1] = "--quiet"
    assert restored == expected


def test_a_sensitive_value_is_not_echoed_in_a_config_error(tmp_path: Path):
    from ania_nb import ConfigError

    with pytest.raises(ConfigError) as caught:
        Config.load(None, bash={"env": "DEPLOY_KEY=abcdefghijkl-secret-9876"})
    assert "abcdefghijkl" not in str(caught.value)
