"""Issue 12 item 3: a hostile model asks `file` and `local_image` for what it must never read.

Each attack runs through `Agent.chat` against the scripted LLM server: the model calls the tool,
the refusal comes back as the tool's error, and neither the file's bytes nor the secret reach
the model's next request (or the user through ``send_file``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from _media import PNG, Outbox

from ania_nb import Callbacks, ToolError
from ania_nb.config import Config
from ania_nb.testing import reply, tool_call
from ania_nb.tools.builtin import FileGuard

SECRET = "sk-very-secret-value-0042"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


@pytest.fixture
def attack(llm: Any, make_agent: Any, tmp_path: Path) -> Any:
    """Play one tool call by the model; returns (tool message the model saw next, outbox)."""

    async def play(tool: str, path: str, **overrides: Any) -> tuple[str, Outbox]:
        args = {"path": path} | ({"name": "loot.txt"} if tool == "file" else {})
        llm.script(reply(tool_calls=[tool_call(tool, args)]), reply("done"))
        agent = make_agent(
            overrides={
                "agent.builtin_tools": True,
                "file.enable": True,
                "file.local_image": True,
                "vision.multimodal": True,
                "file.roots": [str(tmp_path)],
                **overrides,
            }
        )
        outbox = Outbox()
        await agent.chat("fetch it", callbacks=Callbacks(send_file=outbox))
        second = llm.requests[-1]
        tool_messages = [m for m in second.messages if m.get("role") == "tool"]
        assert len(tool_messages) == 1
        return str(tool_messages[0]["content"]), outbox

    return play


def refused(message: str) -> str:
    return "Error executing tool: " + message


def assert_nothing_leaked(llm: Any, outbox: Outbox, *secrets: str) -> None:
    sent = json.dumps([r.messages for r in llm.requests])
    for secret in (SECRET, *secrets):
        assert secret not in sent
    assert outbox.files == []


@pytest.mark.parametrize("tool", ["file", "local_image"])
async def test_proc_self_environ_is_refused(attack, llm, monkeypatch, tool):
    monkeypatch.setenv("SOME_SERVICE_TOKEN", SECRET)
    seen, outbox = await attack(tool, "/proc/self/environ", **{"file.roots": ["/"]})
    assert seen == refused(
        f"refused: /proc/{os.getpid()}/environ is a system file (/proc is never read by this tool)"
    )
    assert_nothing_leaked(llm, outbox)


@pytest.mark.parametrize("path", ["/sys/kernel/notes", "/dev/zero"])
async def test_sys_and_dev_are_refused_even_with_root_as_a_root(attack, llm, path):
    seen, outbox = await attack("file", path, **{"file.roots": ["/"]})
    folder = "/" + path.split("/")[1]
    assert seen == refused(
        f"refused: {path} is a system file ({folder} is never read by this tool)"
    )
    assert_nothing_leaked(llm, outbox)


async def test_etc_shadow_is_refused(attack, llm):
    seen, outbox = await attack("file", "/etc/shadow", **{"file.roots": ["/"]})
    assert seen == refused("refused: /etc/shadow may hold secrets")
    assert_nothing_leaked(llm, outbox)


async def test_a_hardlink_to_the_database_is_refused(attack, llm, make_agent, work, tmp_path):
    # A first agent creates the store's database; the attacker's hardlink has an innocent name.
    llm.script(reply("hi"))
    first = make_agent()
    await first.chat("hello")
    database = first.data_dir / "ania.db"
    assert database.is_file()
    link = work / "notes.csv"
    os.link(database, link)
    seen, outbox = await attack("file", str(link))
    assert seen == refused(
        f"refused: {link} is a hard link to a file in the agent's data directory"
    )
    assert_nothing_leaked(llm, outbox, "SQLite format 3")


@pytest.mark.parametrize("tool", ["file", "local_image"])
async def test_a_symlink_into_the_data_dir_is_refused(attack, llm, make_agent, work, tool):
    llm.script(reply("hi"))
    first = make_agent()
    await first.chat("hello")
    link = work / "holiday.png"
    link.symlink_to(first.data_dir / "ania.db")
    seen, outbox = await attack(tool, str(link))
    data_dir = first.data_dir.resolve()
    assert seen == refused(
        f"refused: {data_dir / 'ania.db'} is inside the agent's data directory ({data_dir})"
    )
    assert_nothing_leaked(llm, outbox, "SQLite format 3")


@pytest.mark.parametrize(
    ("relative", "reason"),
    [
        (".ssh/id_ed25519", "id_ed25519"),
        (".ssh/id_ecdsa_sk", "id_ecdsa_sk"),
        (".ssh/id_rsa", "id_rsa"),
        (".ssh/deploy_access", ".ssh"),  # any file of ~/.ssh, whatever its name
        (".aws/credentials", "credentials"),
        (".config/gcloud/application_default_credentials.json", ".config/gcloud"),
        (".kube/config", ".kube"),
        (".docker/config.json", ".docker"),
        (".azure/msal_token_cache.json", ".azure"),
        (".git-credentials", ".git-credentials"),
        (".netrc", ".netrc"),
        (".pgpass", ".pgpass"),
        ("certs/server.key", "server.key"),
        ("certs/client.pem", "client.pem"),
    ],
)
async def test_credentials_in_home_are_refused(
    attack, llm, monkeypatch, tmp_path, relative, reason
):
    home = tmp_path / "home"
    target = home / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{SECRET}\n")
    monkeypatch.setenv("HOME", str(home))
    seen, outbox = await attack("file", "~/" + relative)
    assert seen == refused(f"refused: {reason} may hold secrets")
    assert_nothing_leaked(llm, outbox)


@pytest.mark.parametrize(
    "name", [".env", ".env.local", ".env.production", "ania.toml", "ania.toml.bak", "ania.toml~"]
)
async def test_env_files_and_config_copies_are_refused(attack, llm, work, name):
    (work / name).write_text(f'api_key = "{SECRET}"\n')
    seen, outbox = await attack("file", str(work / name))
    assert seen == refused(f"refused: {name} may hold secrets")
    assert_nothing_leaked(llm, outbox)


async def test_an_innocent_symlink_to_a_secret_file_is_refused(attack, llm, work):
    (work / "id_ed25519").write_text(SECRET)
    (work / "readme.txt").symlink_to(work / "id_ed25519")
    seen, outbox = await attack("file", str(work / "readme.txt"))
    assert seen == refused("refused: id_ed25519 may hold secrets")
    assert_nothing_leaked(llm, outbox)


async def test_a_text_file_renamed_png_is_not_an_image(attack, llm, work):
    fake = work / "chart.png"
    fake.write_text(f"token={SECRET}\n")
    seen, outbox = await attack("local_image", str(fake))
    assert seen == refused(
        "chart.png is not an image: its content is not PNG, JPEG, GIF, WEBP or BMP"
    )
    assert_nothing_leaked(llm, outbox)


async def test_a_real_png_with_another_name_is_an_image(attack, llm, work):
    (work / "pixel.dat").write_bytes(PNG)
    seen, _ = await attack("local_image", str(work / "pixel.dat"))
    assert seen.startswith(f"loaded local image {work / 'pixel.dat'}")
    assert (
        llm.requests[-1]
        .messages[-1]["content"][-1]["image_url"]["url"]
        .startswith("data:image/png;base64,")
    )


@pytest.mark.parametrize("tool", ["file", "local_image"])
async def test_a_file_outside_the_roots_is_refused(attack, llm, monkeypatch, tmp_path, tool):
    inside = tmp_path / "project"
    inside.mkdir()
    outside = tmp_path / "elsewhere" / "report.csv"
    outside.parent.mkdir()
    outside.write_text(SECRET)
    monkeypatch.chdir(inside)  # default root: the working directory
    seen, outbox = await attack(tool, str(outside), **{"file.roots": []})
    assert seen == refused(
        f"refused: {outside} is outside the folders this tool may read ({inside}; see file.roots)"
    )
    assert_nothing_leaked(llm, outbox)


async def test_a_file_inside_the_default_root_is_sent(attack, llm, monkeypatch, tmp_path):
    inside = tmp_path / "project"
    inside.mkdir()
    (inside / "report.csv").write_text("a,b\n")
    monkeypatch.chdir(inside)
    seen, outbox = await attack("file", "report.csv", **{"file.roots": []})
    assert seen == f"sent loot.txt (4 bytes from {inside / 'report.csv'}) to the user"
    assert len(outbox.files) == 1


def test_the_size_limit_holds_at_exactly_max_bytes(tmp_path):
    path = tmp_path / "exact.log"
    path.write_bytes(b"x" * 10)
    guard = FileGuard(data_dir=tmp_path / "data", max_bytes=10, roots=(tmp_path,))
    assert guard.read_sync(str(path)) == (path, b"x" * 10)
    bigger = tmp_path / "bigger.log"
    bigger.write_bytes(b"y" * 11)
    with pytest.raises(ToolError, match=r"is 11 bytes, above the limit of 10"):
        guard.read_sync(str(bigger))


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    guard = FileGuard(data_dir=tmp_path / "data", max_bytes=10, roots=(tmp_path,))
    with pytest.raises(ToolError, match="is not a regular file"):
        guard.read_sync(str(fifo))


# --------------------------------------------------------------------------- issue 27 item 11


@pytest.mark.parametrize(
    "relative",
    [
        "mcp.json.bak",
        "mcp.json~",
        ".mcp.json.swp",
        "hooks.json.orig",
        "commands.json.old",
        "backup/mcp.json",  # a copy by the same name in another folder
        "backup/hooks.json.2024-05-01",
    ],
)
async def test_copies_of_the_files_ania_nb_obeys_are_refused(attack, llm, work, relative):
    target = work / relative
    target.parent.mkdir(exist_ok=True)
    target.write_text(json.dumps({"headers": {"Authorization": f"Bearer {SECRET}"}}))
    overrides = {"mcp.config_file": str(work / "mcp.json"), "hooks.file": str(work / "hooks.json")}
    seen, outbox = await attack("file", str(target), **overrides)
    assert seen == refused(f"refused: {target.name} may hold secrets")
    assert_nothing_leaked(llm, outbox)


@pytest.mark.parametrize(
    "name",
    [
        "ania.db",
        "ania.db-wal",
        "ania.db-shm",
        "ania.db.bak",
        "old-ania.db",
        "kernel-4f2c.json",
        "jpserver-4242.json",
        "jpserver-4242-open.html",
        "nbserver-17.json",
        "history.sqlite",
        "history.sqlite-journal",
    ],
)
async def test_store_copies_jupyter_and_ipython_files_are_refused(attack, llm, work, name):
    (work / name).write_text(f'{{"key": "{SECRET}", "signature_scheme": "hmac-sha256"}}')
    seen, outbox = await attack("file", str(work / name))
    assert seen == refused(f"refused: {name} may hold secrets")
    assert_nothing_leaked(llm, outbox)


async def test_a_renamed_copy_of_the_store_is_refused(attack, llm, make_agent, work):
    llm.script(reply("hi"))
    first = make_agent()
    await first.chat("hello")
    await first.aclose()  # checkpointed: the copy holds the whole store
    copy = work / "notes.sqlite"
    shutil.copyfile(first.data_dir / "ania.db", copy)
    seen, outbox = await attack("file", str(copy))
    assert seen == refused(f"refused: {copy} is a copy of the agent's store (ania.db)")
    assert_nothing_leaked(llm, outbox, "SQLite format 3")


@pytest.mark.parametrize(
    ("variable", "relative"),
    [("JUPYTER_RUNTIME_DIR", "connection.json"), ("IPYTHONDIR", "profile_default/db.py")],
)
async def test_the_jupyter_runtime_and_ipython_folders_are_refused(
    attack, llm, work, monkeypatch, variable, relative
):
    folder = work / "private"
    monkeypatch.setenv(variable, str(folder))
    target = folder / relative
    target.parent.mkdir(parents=True)
    target.write_text(f'{{"key": "{SECRET}"}}')
    seen, outbox = await attack("file", str(target))
    assert seen == refused(f"refused: {target.name} may hold secrets")
    assert_nothing_leaked(llm, outbox)


async def test_the_loaded_config_and_named_secret_files_are_refused(
    llm, make_agent, work, monkeypatch
):
    loaded = work / "settings.toml"  # a name no pattern knows
    loaded.write_text(f'[llm]\napi_key = "{SECRET}"\n')
    (work / "db.conf").write_text(SECRET)
    (work / "db.conf.bak").write_text(SECRET)
    (work / "pg.service").write_text(SECRET)
    monkeypatch.setenv("PGSERVICEFILE", str(work / "pg.service"))
    overrides = {
        "agent.builtin_tools": True,
        "file.enable": True,
        "file.roots": [str(work)],
        "security.secret_files": [str(work / "db.conf")],
    }
    names = ["settings.toml", "db.conf", "db.conf.bak", "pg.service"]
    calls = [tool_call("file", {"path": str(work / n), "name": "x.txt"}) for n in names]
    llm.script(reply(tool_calls=calls), reply("done"))
    agent = make_agent(config=Config.load(loaded), overrides=overrides)
    outbox = Outbox()
    result = await agent.chat("fetch them", callbacks=Callbacks(send_file=outbox))
    assert [c.error for c in result.tool_calls] == [f"refused: {n} may hold secrets" for n in names]
    assert_nothing_leaked(llm, outbox)


@pytest.mark.parametrize("target", ["kb", "passfile"])
async def test_the_kb_folder_and_the_password_file_store_url_names_are_refused(
    attack, llm, work, tmp_path, pg_cluster, pg_url, target
):
    kb = tmp_path / "kb-elsewhere"  # kb.uri outside the data directory
    kb.mkdir()
    (kb / "notes.txt").write_text(SECRET)
    passfile = work / "store-login.txt"  # store.url's passfile: libpq reads the password there
    login = f"{pg_cluster.host}:{pg_cluster.port}:*:{pg_cluster.user}:{pg_cluster.password}"
    passfile.write_text(f"# {SECRET}\n{login}\n")
    passfile.chmod(0o600)
    url = (
        f"postgresql://{pg_cluster.user}@{pg_cluster.host}:{pg_cluster.port}/"
        f"{urlsplit(pg_url).path.lstrip('/')}?passfile={passfile}"  # a fresh database
    )
    path = kb / "notes.txt" if target == "kb" else passfile
    seen, outbox = await attack("file", str(path), **{"kb.uri": str(kb), "store.url": url})
    assert seen == refused(f"refused: {path.name} may hold secrets")
    assert_nothing_leaked(llm, outbox, pg_cluster.password)
