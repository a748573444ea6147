"""``store.url``'s password never reaches the model, a log, an error or a child process.

It is set the way the README says (``ANIA_STORE__URL``), then looked for everywhere the
configuration is shown: ``ania-nb config``, ``config_get``, the config's repr and masked dump,
validation errors, the runner's log redactor, child environments, and the bash sandbox's list of
hidden paths (its passfile and socket folders). `mask_url` is what messages use.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from urllib.parse import quote

import pytest

from ania_nb._env import child_env
from ania_nb.config import Config, SecuritySettings, mask_url, store_backend
from ania_nb.errors import ConfigError

PASSWORD = "pg-Pa55/word+0042"  # a / and a + : the URL carries it percent-encoded
QUOTED = quote(PASSWORD, safe="")
URL = f"postgresql://bob:{QUOTED}@db.internal:5432/ania?sslmode=require"


@pytest.fixture
def from_env(monkeypatch: pytest.MonkeyPatch) -> Config:
    monkeypatch.setenv("ANIA_STORE__URL", URL)
    return Config.load()


def visible_forms() -> tuple[str, ...]:
    return (PASSWORD, QUOTED)


def test_the_environment_sets_store_url_and_selects_postgresql(from_env: Config) -> None:
    assert from_env.store.url is not None and from_env.store.url.get_secret_value() == URL
    assert from_env.store.backend == "postgresql"


def test_an_empty_store_url_is_sqlite_and_postgres_is_an_alias() -> None:
    assert Config().store.backend == "sqlite" and Config().store.url is None
    assert Config().with_overrides({"store.url": "  "}).store.url is None  # blank = SQLite
    postgres = Config().with_overrides({"store.url": "postgres://bob@h/db"})
    assert postgres.store.backend == "postgresql"
    assert store_backend("") == "sqlite"


def test_config_show_config_repr_and_masked_dump_hide_the_password(
    from_env: Config, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ania_nb.cli import main

    [info] = [i for i in from_env.describe() if i.key == "store.url"]
    assert info.sensitive
    assert info.value == "postgresql://bob:***@db.internal:5432/ania?sslmode=require"
    assert main(["config"]) == 0
    shown = capsys.readouterr().out + repr(from_env) + str(from_env.masked())
    assert "postgresql://bob:***@db.internal:5432/ania" in shown
    for form in visible_forms():
        assert form not in shown


def test_a_wrong_scheme_is_refused_naming_the_scheme_and_never_the_password() -> None:
    for bad, got in [
        (f"mysql://bob:{QUOTED}@db/ania", "not a mysql:// URL"),
        (f"bob:{QUOTED}@db/ania", "not text that is not a URL"),
        (f"sqlite:///{PASSWORD}", "not a sqlite:// URL"),
    ]:
        with pytest.raises(ConfigError, match=r"store\.url must be empty") as caught:
            Config().with_overrides({"store.url": bad})
        message = str(caught.value)
        assert got in message
        for form in visible_forms():
            assert form not in message


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://bob:s3cret@host:5432/db", "postgresql://bob:***@host:5432/db"),
        ("postgresql://bob@host/db", "postgresql://bob@host/db"),
        ("postgres://bob:p%40ss@h1:1,h2:2/db#x", "postgres://bob:***@h1:1,h2:2/db#x"),
        ("postgresql://bob:a:b@host/db", "postgresql://bob:***@host/db"),  # a ':' in it
        ("postgresql://b:x@y@host/db", "postgresql://b:***@host/db"),  # an '@' in it
        (
            "postgresql:///db?host=/run/pg&password=s3cret&sslpassword=k3y&user=bob",
            "postgresql:///db?host=/run/pg&password=***&sslpassword=***&user=bob",
        ),
        ("postgresql://h/db?PassWord=s3cret", "postgresql://h/db?PassWord=***"),
        ("not a url but maybe a secret", "***"),
        ("", ""),
    ],
)
def test_mask_url_hides_every_password_spelling(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_the_log_redactor_blanks_the_password_alone_and_in_the_url(from_env: Config) -> None:
    from ania_nb.runner.redact import SecretRedactor, config_secrets

    redactor = SecretRedactor("%(message)s")
    redactor.add_secrets(config_secrets(from_env))
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(redactor)
    logger = logging.getLogger("some.driver")
    logger.addHandler(handler)
    try:
        logger.warning("connecting to %s", URL)
        logger.warning("auth with %s failed", PASSWORD)  # a driver may print it decoded
        logger.warning("retrying %s", QUOTED)
    finally:
        logger.removeHandler(handler)
    logged = stream.getvalue()
    assert logged.count("***") >= 3
    for form in visible_forms():
        assert form not in logged


def test_no_child_process_inherits_the_store_url(from_env: Config) -> None:
    everything = SecuritySettings(pass_env=["*", "ANIA_STORE__URL"])  # even asked for by name
    assert "ANIA_STORE__URL" not in child_env(everything)


async def test_config_get_masks_it_and_config_set_cannot_move_the_store(
    make_agent, pg_cluster, pg_url: str
) -> None:
    import json

    from ania_nb import ToolContext

    agent = make_agent(
        overrides={"config_tool.enable": True, "admin.ids": ["root"], "store.url": pg_url}
    )
    await agent.start()
    ctx = ToolContext(session="nb:cfg", sender="root")
    shown = await agent.tools.execute("config_get", json.dumps({"key": "store.url"}), ctx)
    user, where = pg_cluster.user, f"{pg_cluster.host}:{pg_cluster.port}"
    assert shown.text.startswith(f'store.url = "postgresql://{user}:***@{where}/')
    assert "(sensitive, masked)" in shown.text
    listing = (await agent.tools.execute("config_get", "{}", ctx)).text
    moved = await agent.tools.execute(
        "config_set", json.dumps({"key": "store.url", "value": "postgresql://eve@evil/x"}), ctx
    )
    assert "store.url cannot be changed by config_set" in moved.error  # the store holds it
    assert pg_cluster.password not in shown.text + listing + moved.error


def test_the_sandbox_hides_the_files_and_sockets_store_url_names(tmp_path: Path) -> None:
    from ania_nb.tools.builtin.bash import sandbox_hidden

    passfile, key = tmp_path / "store.pgpass", tmp_path / "client.key"
    over_tcp = f"postgresql://bob@db:5432/ania?passfile={passfile}&sslkey={key}"
    hidden = {p.path: p for p in sandbox_hidden(Config().with_overrides({"store.url": over_tcp}))}
    assert hidden[passfile].create == "file" and hidden[key].create == "file"
    assert Path("/run/postgresql") not in hidden  # TCP only: no socket to hide
    default_socket = Config().with_overrides({"store.url": "postgresql:///ania"})
    hidden = {p.path for p in sandbox_hidden(default_socket)}
    assert {Path("/run/postgresql"), Path("/var/run/postgresql")} <= hidden
    socket_dir = tmp_path / "pg-socket"
    named = Config().with_overrides({"store.url": f"postgresql://bob@/ania?host={socket_dir}"})
    assert socket_dir in {p.path for p in sandbox_hidden(named)}
    kb = tmp_path / "kb"
    assert kb in {p.path for p in sandbox_hidden(Config().with_overrides({"kb.uri": str(kb)}))}
    assert not any(p.setting == "kb.uri" for p in sandbox_hidden(Config()))  # in data_dir
