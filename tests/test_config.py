"""`Config`: defaults, TOML file, environment, overrides, masking and error messages."""

from __future__ import annotations

import pytest

from ania_nb import Agent, Config, ConfigError
from ania_nb.config import mask

SECRET = "sk-live-0123456789abcdef"


def test_defaults_follow_the_reference():
    c = Config.load()
    assert c.agent.max_iterations == 20
    assert c.agent.max_context_tokens == 128000
    assert c.agent.compress_ratio == 0.8
    assert c.agent.queue_size == 20
    assert (c.retry.max_attempts, c.retry.base_delay, c.retry.max_delay) == (3, 2.0, 30.0)
    assert c.fallback.model == "" and c.compressor.model == ""


def test_every_key_is_documented_and_secrets_are_marked():
    infos = Config().describe()
    assert len(infos) >= 20
    assert all(info.description for info in infos)
    sensitive = {i.key for i in infos if i.sensitive}
    assert sensitive == {
        "llm.api_key",
        "fallback.api_key",
        "compressor.api_key",
        "subagent.api_key",
        "embedding.api_key",
        "vision.api_key",
        "web.token",
        "meme.key",
        "bash.env",  # KEY=VALUE entries: the values are masked, the names stay readable
        "runner.access_token",
    }


def test_priority_overrides_over_env_over_toml_over_defaults(tmp_path, monkeypatch):
    toml = tmp_path / "ania.toml"
    toml.write_text(
        '[llm]\nmodel = "toml-model"\nbase_url = "http://toml"\n[agent]\nmax_iterations = 7\n'
    )
    monkeypatch.setenv("ANIA_LLM__MODEL", "env-model")
    monkeypatch.setenv("ANIA_AGENT__QUEUE_SIZE", "5")
    c = Config.load(toml)
    assert (c.llm.model, c.llm.base_url, c.agent.max_iterations, c.agent.queue_size) == (
        "env-model",
        "http://toml",
        7,
        5,
    )
    c2 = Config.load(toml, llm={"model": "override"})
    assert c2.llm.model == "override" and c2.llm.base_url == "http://toml"
    assert c.with_overrides({"agent.max_iterations": 3}).agent.max_iterations == 3
    assert c.agent.max_iterations == 7  # with_overrides returns a copy


def test_ania_toml_in_the_working_directory_is_read(tmp_path, monkeypatch):
    (tmp_path / "ania.toml").write_text('[llm]\nmodel = "from-cwd"\n')
    monkeypatch.chdir(tmp_path)
    assert Config.load().llm.model == "from-cwd"
    assert Agent().config.llm.model == "from-cwd"


def test_secrets_are_masked_everywhere(monkeypatch):
    monkeypatch.setenv("ANIA_LLM__API_KEY", SECRET)
    c = Config.load()
    assert c.llm.api_key.get_secret_value() == SECRET
    shown = [repr(c), str(c), str(c.masked()), str(c.describe())]
    assert all(SECRET not in text for text in shown)
    assert c.masked()["llm"]["api_key"] == "***cdef"
    assert mask("short") == "***" and mask(None) == "" and mask("") == ""
    with pytest.raises(ConfigError) as info:
        c.with_overrides({"llm.api_key": 12})
    assert SECRET not in str(info.value)


def test_errors_name_the_key_and_the_source(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[llm]\nmodle = "x"\n')
    with pytest.raises(ConfigError, match=r"llm\.modle: Extra inputs are not permitted") as info:
        Config.load(bad)
    assert str(bad) in str(info.value)
    broken = tmp_path / "broken.toml"
    broken.write_text("[llm\nmodel=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.load(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        Config.load(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=r"unknown config key 'agent\.nope'"):
        Config().with_overrides({"agent.nope": 1})
    with pytest.raises(ConfigError, match=r"agent\.max_iterations.*got 'many'"):
        Config().with_overrides({"agent.max_iterations": "many"})
    with pytest.raises(ConfigError, match="greater than or equal to 1"):
        Config().with_overrides({"agent.max_iterations": 0})


def test_agent_shortcuts_map_to_config_keys(tmp_path):
    agent = Agent(base_url="http://127.0.0.1:1/v1", api_key=SECRET, model="m", data_dir=tmp_path)
    assert agent.config.llm.base_url == "http://127.0.0.1:1/v1"
    assert agent.config.llm.model == "m"
    assert agent.data_dir == tmp_path
    assert agent.config.get("llm.api_key").get_secret_value() == SECRET
