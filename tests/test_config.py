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
        "quota.fallback_api_key",
        "web.token",
        "meme.key",
        "bash.env",  # KEY=VALUE entries: the values are masked, the names stay readable
        "runner.access_token",
        "store.url",  # the password masked, the rest readable
        "kb.storage_options",  # the option names readable, their values masked
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


# ------------------------------------------------------------------ renamed keys

OLD_TOML = """\
[subagent]
max_result_len = 1234
[team]
max_result_len = 2345
[bash]
max_output = 3456
[kb]
chunk_size = 300
chunk_overlap = 30
"""


@pytest.fixture
def renames_unwarned(monkeypatch, caplog):
    """A process that has not yet warned about any old key name; captures the warnings."""
    from ania_nb.config import _settings

    monkeypatch.setattr(_settings, "_warned", set())
    caplog.set_level("WARNING", logger="ania_nb.config")
    return caplog


def renamed_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "was renamed to" in r.getMessage()]


def test_every_renamed_key_is_a_character_limit_now_named_chars():
    from ania_nb.config import RENAMED_KEYS

    keys = {info.key: info for info in Config().describe()}
    for old, new in RENAMED_KEYS.items():
        assert new.endswith("_chars") and new in keys and old not in keys
        assert "haracter" in keys[new].description  # counts characters, not tokens or bytes
        assert keys[new].description.endswith(f" (was: {old})")


def test_old_key_names_work_from_toml_and_warn_once(tmp_path, renames_unwarned):
    toml = tmp_path / "ania.toml"
    toml.write_text(OLD_TOML)
    c = Config.load(toml)
    assert (c.subagent.max_result_chars, c.team.max_result_chars) == (1234, 2345)
    assert (c.bash.max_output_chars, c.kb.chunk_chars, c.kb.chunk_overlap_chars) == (3456, 300, 30)
    warned = renamed_warnings(renames_unwarned)
    assert len(warned) == 5
    assert (
        "config key bash.max_output was renamed to bash.max_output_chars: the old name still "
        "works for now, but set bash.max_output_chars instead (in ania.toml, "
        "ANIA_BASH__MAX_OUTPUT_CHARS, overrides or config_set)" in warned
    )
    renames_unwarned.clear()
    Config.load(toml).with_overrides({"bash.max_output": 500})
    Agent(overrides={"subagent.max_result_len": 150})
    assert renamed_warnings(renames_unwarned) == []  # once per process


def test_old_key_names_work_from_env_overrides_and_get(monkeypatch, renames_unwarned):
    monkeypatch.setenv("ANIA_TEAM__MAX_RESULT_LEN", "777")
    c = Config.load()
    assert c.team.max_result_chars == 777
    changed = c.with_overrides({"bash.max_output": 999, "kb.chunk_size": 250})
    assert (changed.bash.max_output_chars, changed.kb.chunk_chars) == (999, 250)
    assert changed.get("bash.max_output") == 999  # reading by the old name too
    agent = Agent(overrides={"subagent.max_result_len": 150})
    assert agent.config.subagent.max_result_chars == 150
    assert Config.load(subagent={"max_result_len": 160}).subagent.max_result_chars == 160
    assert len(renamed_warnings(renames_unwarned)) == 4  # team, bash, kb.chunk_size, subagent
    with pytest.raises(ConfigError, match="greater than or equal to 256"):
        c.with_overrides({"bash.max_output": 10})  # validated like the new name


def test_an_old_and_a_new_name_together(tmp_path, monkeypatch):
    toml = tmp_path / "ania.toml"
    toml.write_text("[bash]\nmax_output = 1000\nmax_output_chars = 2000\n")
    assert Config.load(toml).bash.max_output_chars == 2000  # in one source: the new name wins
    monkeypatch.setenv("ANIA_BASH__MAX_OUTPUT", "3000")
    from_env = Config.load()
    assert from_env.bash.max_output_chars == 3000
    # An override under either name beats the environment's old name.
    assert from_env.with_overrides({"bash.max_output_chars": 400}).bash.max_output_chars == 400
    assert from_env.with_overrides({"bash.max_output": 500}).bash.max_output_chars == 500
    message = "bash.max_output and bash.max_output_chars are both set, to different values"
    with pytest.raises(ConfigError, match=message) as info:  # one mapping: which one is meant?
        Config().with_overrides({"bash.max_output": 1000, "bash.max_output_chars": 2000})
    assert info.value.key == "bash.max_output_chars"
    same = Config().with_overrides({"bash.max_output": 1000, "bash.max_output_chars": 1000})
    assert same.bash.max_output_chars == 1000


# ------------------------------------------------------------------ model endpoints

ROLES = {"llm", "fallback", "compressor", "vision", "subagent", "embedding"}


def test_the_six_model_roles_share_one_endpoint_model_with_flat_keys():
    from ania_nb.config import Endpoint

    with_endpoint = {
        name for name, f in Config.model_fields.items() if issubclass(f.annotation, Endpoint)
    }
    assert with_endpoint == ROLES
    keys = {info.key for info in Config().describe()}
    assert all({f"{r}.base_url", f"{r}.api_key", f"{r}.model"} <= keys for r in ROLES)
    descriptions = {info.key: info.description for info in Config().describe()}
    assert descriptions["fallback.model"] == "Model name; empty = no fallback."
    assert descriptions["compressor.model"] == "Model name; empty = the main model summarises."
    assert descriptions["vision.model"] == "Model that describes images; empty = none."


def test_an_empty_endpoint_field_is_the_main_models():
    c = Config(
        llm={"base_url": "http://main/v1", "api_key": "sk-main", "model": "main-model"},
        vision={"base_url": "http://vision/v1", "model": "eyes"},
        subagent={"api_key": "sk-sub"},
        fallback={"model": "backup", "api_key": "   "},  # blank is empty
    )
    resolved = {role: getattr(c, role).resolved(c.llm) for role in ROLES}
    assert {role: (e.base_url, e.api_key, e.model) for role, e in resolved.items()} == {
        "llm": ("http://main/v1", "sk-main", "main-model"),
        "vision": ("http://vision/v1", "sk-main", "eyes"),
        "subagent": ("http://main/v1", "sk-sub", "main-model"),
        "fallback": ("http://main/v1", "sk-main", "backup"),
        "compressor": ("http://main/v1", "sk-main", "main-model"),
        "embedding": ("http://main/v1", "sk-main", "jina-embeddings-v3"),
    }
    main = resolved["llm"]
    assert "sk-main" not in repr(main)  # the key in the clear is never shown


def test_the_clients_use_the_one_resolution():
    from ania_nb.engine.llm import LLMClient

    c = Config(
        llm={"base_url": "http://main/v1", "api_key": "sk-main", "model": "main-model"},
        vision={"base_url": "http://vision/v1", "model": "eyes"},
        subagent={"api_key": "sk-sub", "base_url": "  "},  # blank is empty
        compressor={"model": "short"},
        fallback={"model": "backup"},
    )
    vision = LLMClient.from_config(c, role="vision")
    assert (vision.base_url, vision._api_key) == ("http://vision/v1", "sk-main")
    assert vision.model == "eyes"
    sub = LLMClient.from_config(c, role="subagent")
    assert (sub.base_url, sub._api_key, sub.model) == ("http://main/v1", "sk-sub", "main-model")
    compressor = LLMClient.from_config(c, role="compressor")
    assert (compressor.base_url, compressor.model) == ("http://main/v1", "short")
    assert compressor.fallback is not None and compressor.fallback.model == "backup"


def test_no_default_vendor_and_a_client_names_what_to_set():
    from ania_nb.engine.llm import LLMClient

    c = Config()
    assert (c.llm.base_url, c.llm.model) == ("", "")
    with pytest.raises(ConfigError) as info:
        LLMClient.from_config(c)
    message = str(info.value)
    assert info.value.key == "llm.base_url"
    assert message.startswith("llm.base_url and llm.model are not set: ania-nb has no default")
    assert '[llm]  base_url = "http://127.0.0.1:8080/v1"  model = "your-model"' in message
    assert "ANIA_LLM__BASE_URL=…  ANIA_LLM__MODEL=…" in message
    assert "Agent(base_url=…, model=…)" in message
    assert "%ania config set llm.base_url=… llm.model=…" in message
    only_model = Config(llm={"base_url": "http://127.0.0.1:1/v1"})
    with pytest.raises(ConfigError, match=r"^llm\.model is not set: ") as info:
        LLMClient.from_config(only_model)
    assert info.value.key == "llm.model"
    vision = Config(llm={"model": "m"}, vision={"model": "eyes"})
    with pytest.raises(ConfigError, match=r"llm\.base_url is not set \(vision has none of its own"):
        LLMClient.from_config(vision, role="vision")


async def test_an_agent_without_a_model_says_so_on_its_first_chat(tmp_path):
    agent = Agent(data_dir=tmp_path / "data", overrides={"skills.dir": str(tmp_path / "none")})
    try:
        with pytest.raises(ConfigError, match=r"llm\.base_url and llm\.model are not set"):
            await agent.chat("hello")
    finally:
        await agent.aclose()


def test_the_missing_model_keys_are_decided_in_one_place():
    from ania_nb.config import missing_model_keys

    assert missing_model_keys(Config()) == ["llm.base_url", "llm.model", "llm.api_key"]
    hosted = Config(llm={"base_url": "https://api.example.com/v1", "model": "m"})
    assert missing_model_keys(hosted) == ["llm.api_key"]
    local = Config(llm={"base_url": "http://[::1]:8080/v1", "model": "m"})
    assert missing_model_keys(local) == []
    blank = Config(llm={"base_url": "https://api.example.com/v1", "model": "m", "api_key": " "})
    assert missing_model_keys(blank) == ["llm.api_key"]


# ------------------------------------------------------------------ newcomer papercuts (issue 33)


def test_an_invalid_environment_value_names_its_variable(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ANIA_AGENT__QUEUE_SIZE", "lots")
    with pytest.raises(ConfigError) as caught:
        Config.load()
    assert "agent.queue_size" in str(caught.value)
    assert "from the environment variable ANIA_AGENT__QUEUE_SIZE" in str(caught.value)


def test_a_variable_with_one_underscore_too_few_is_warned_once(renames_unwarned, monkeypatch):
    monkeypatch.setenv("ANIA_LLM_API_KEY", "sk-test")
    monkeypatch.setenv("ANIA_TEST_SOMETHING", "1")  # no section: not meant as a setting
    monkeypatch.setenv("ANIA_LLM__MODEL", "m")  # a real key
    Config.load()
    Config.load()
    warned = [
        r.getMessage() for r in renames_unwarned.records if "names no setting" in r.getMessage()
    ]
    assert warned == [
        "the environment variable ANIA_LLM_API_KEY names no setting (keys are "
        "ANIA_<SECTION>__<KEY>, two underscores after the section); did you mean "
        "ANIA_LLM__API_KEY?"
    ]
    assert "sk-test" not in warned[0]


@pytest.mark.parametrize(
    "key", ["llm.base_url", "fallback.base_url", "vision.base_url", "embedding.base_url"]
)
def test_a_base_url_that_is_no_http_address_is_refused_when_set(key):
    with pytest.raises(ConfigError) as caught:
        Config.load().with_overrides({key: "not-a-url"})
    text = str(caught.value)
    assert f"{key}: must be an http:// or https:// address" in text
    assert "Value error" not in text
    assert text.startswith("invalid configuration (in the overrides):")  # said once
    assert Config.load().with_overrides({key: " http://127.0.0.1:9/v1 "}).get(key) == (
        "http://127.0.0.1:9/v1"
    )
    assert Config.load().with_overrides({key: ""}).get(key) == ""
