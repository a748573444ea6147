"""The MCP servers file: both forms, validation errors, filters and atomic saving."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

import ania_nb.mcp as mcp_pkg
from ania_nb.errors import ConfigError
from ania_nb.mcp import MCPServerConfig, ToolFilter, load_config_file, parse_config
from ania_nb.mcp.config import save_config_file


def test_public_names_are_sorted_and_exported():
    assert mcp_pkg.__all__ == sorted(mcp_pkg.__all__)
    assert all(hasattr(mcp_pkg, name) for name in mcp_pkg.__all__)


def test_importing_ania_nb_mcp_does_not_import_the_sdk():
    code = (
        "import sys, ania_nb.mcp; "
        "print([m for m in ('mcp', 'mcp_types', 'httpx2', 'anyio') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_servers_form_with_every_field():
    form, servers = parse_config(
        {
            "servers": [
                {
                    "name": "local",
                    "transport": "STDIO ",
                    "command": "uvx",
                    "args": ["mcp-server-time"],
                    "env": {"TZ": "UTC"},
                    "timeout": 12,
                    "description": "clock",
                    "filter": {"prefix": "get_"},
                },
                {"name": "web", "transport": "streamable", "endpoint": "http://127.0.0.1:1/mcp"},
                {"name": "web2", "transport": "streamable-http", "endpoint": "https://x.org/m"},
                {
                    "name": "events",
                    "transport": "sse",
                    "endpoint": "http://h/sse",
                    "headers": {"A": "b"},
                },
                {"name": "inferred", "endpoint": "http://h/mcp"},
            ]
        }
    )
    assert form == "servers"
    local, web, web2, events, inferred = servers
    assert (local.transport, local.command, local.args, local.env) == (
        "stdio",
        "uvx",
        ["mcp-server-time"],
        {"TZ": "UTC"},
    )
    assert local.timeout == 12 and local.label == "clock" and local.target == "uvx mcp-server-time"
    assert local.filter is not None and local.filter.matches("get_time", "")
    assert web.transport == web2.transport == inferred.transport == "streamable-http"
    assert events.transport == "sse" and events.headers == {"A": "b"}
    assert web.label == "web"  # no description: the name is used


def test_mcp_servers_form():
    form, servers = parse_config(
        {
            "mcpServers": {
                "time": {"command": "uvx", "args": ["mcp-server-time"], "env": {"K": "V"}},
                "docs": {"type": "http", "url": "https://example.org/mcp", "headers": {"H": "1"}},
                "legacy": {"url": "http://127.0.0.1:9/sse"},
                "modern": {"url": "http://127.0.0.1:9/mcp"},
                "events": {"type": "sse", "url": "http://127.0.0.1:9/events"},
                "off": {"command": "x", "disabled": True, "autoApprove": ["a"]},
            }
        }
    )
    assert form == "mcpServers"
    by_name = {s.name: s for s in servers}
    assert by_name["time"].transport == "stdio" and by_name["time"].env == {"K": "V"}
    assert by_name["docs"].transport == "streamable-http"
    assert by_name["docs"].endpoint == "https://example.org/mcp"
    assert by_name["docs"].headers == {"H": "1"}
    assert by_name["legacy"].transport == "sse"
    assert by_name["modern"].transport == "streamable-http"
    assert by_name["events"].transport == "sse"
    assert by_name["off"].disabled


def test_vs_code_servers_form():
    form, servers = parse_config(
        {
            "inputs": [{"id": "token", "type": "promptString"}],
            "servers": {
                "time": {"type": "stdio", "command": "uvx", "args": ["mcp-server-time"]},
                "docs": {"type": "http", "url": "https://example.org/mcp", "headers": {"H": "1"}},
                "events": {"type": "sse", "url": "http://127.0.0.1:9/events"},
                "local": {
                    "command": "node",
                    "args": ["s.js"],
                    "envFile": "${workspaceFolder}/.env",
                },
            },
        }
    )
    assert form == "vscode"
    by_name = {s.name: s for s in servers}
    assert by_name["time"].transport == "stdio" and by_name["time"].args == ["mcp-server-time"]
    assert by_name["docs"].transport == "streamable-http" and by_name["docs"].headers == {"H": "1"}
    assert by_name["events"].transport == "sse"
    assert by_name["local"].command == "node"  # envFile is VS Code's business


def test_env_references_expand_at_connect_time_and_name_what_is_missing():
    from ania_nb.mcp.config import expand_env

    [server] = parse_config(
        {
            "mcpServers": {
                "api": {
                    "url": "https://${HOST:-example.org}/mcp",
                    "headers": {"Authorization": "Bearer ${API_TOKEN}", "X-Plain": "$HOME"},
                }
            }
        }
    )[1]
    live = expand_env(server, {"API_TOKEN": "s3cret"})
    assert live.endpoint == "https://example.org/mcp"
    assert live.headers == {"Authorization": "Bearer s3cret", "X-Plain": "$HOME"}
    assert server.headers["Authorization"] == "Bearer ${API_TOKEN}"  # kept as written
    with pytest.raises(ConfigError, match=r"header 'Authorization' uses \$\{API_TOKEN\}, which"):
        expand_env(server, {})


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"servers": [{"name": "a", "transport": "http2", "command": "x"}]},
            "server 'a': field 'transport': unknown transport 'http2'",
        ),
        ({"servers": [{"name": "a", "transport": "stdio"}]}, "server 'a': field 'command'"),
        ({"servers": [{"name": "b", "transport": "sse"}]}, "server 'b': field 'endpoint'"),
        (
            {"servers": [{"name": "c", "endpoint": "ftp://x"}]},
            "server 'c': field 'endpoint': 'ftp://x' is not an http:// or https:// URL",
        ),
        ({"servers": [{"transport": "stdio"}]}, "server #1: field 'name' is required"),
        ({"servers": [{"name": "bad name", "command": "x"}]}, "field 'name': server name"),
        ({"servers": [{"name": "d", "command": "x", "comand": "y"}]}, "field 'comand': unknown"),
        (
            {"servers": [{"name": "e", "command": "x", "timeout": -1}]},
            "server 'e': field 'timeout'",
        ),
        ({"servers": [{"name": "f", "command": "x", "args": "a b"}]}, "server 'f': field 'args'"),
        ({"servers": [{"name": "g", "command": "x", "filter": {}}]}, "server 'g': field 'filter'"),
        (
            {"servers": [{"name": "h", "command": "x", "filter": {"prefx": "a"}}]},
            "field 'filter.prefx': unknown field",
        ),
        (
            {"servers": [{"name": "i", "command": "x"}, {"name": "i", "command": "y"}]},
            "server 'i' is defined twice",
        ),
        ({"mcpServers": {"j": {"type": "carrier-pigeon", "url": "http://x"}}}, "field 'type'"),
        ({"mcpServers": {"k": {"url": "nope"}}}, "server 'k': field 'url'"),
        ({"mcpServers": {"l": {"args": ["x"]}}}, "server 'l': field 'command'"),
        ({"mcpServers": []}, '"mcpServers" must be an object'),
        ({"servers": "all of them"}, '"servers" must be a list'),
        ({"servers": {"m": []}}, "server 'm' must be an object"),
        ({"servers": {"n": {"type": "stdio"}}}, "server 'n': field 'command'"),
        ({"servers": [], "mcpServers": {}}, "not both"),
        ({"tools": []}, 'either "mcpServers"'),
        (["servers"], 'either "mcpServers"'),
    ],
)
def test_validation_errors_name_the_server_and_the_field(data, expected):
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="mcp.json")
    assert "'mcp.json'" in str(caught.value)
    assert expected in str(caught.value)
    assert caught.value.key == "mcp.config_file"


def test_name_too_long_for_the_discover_tool_is_explained():
    with pytest.raises(ConfigError, match="at most 51 characters"):
        parse_config({"servers": [{"name": "n" * 52, "command": "x"}]})
    assert parse_config({"servers": [{"name": "n" * 51, "command": "x"}]})[1][0].name == "n" * 51


def test_files(tmp_path: Path):
    missing = load_config_file(tmp_path / "absent.json")
    assert missing.servers == [] and missing.form == "servers"
    blank = tmp_path / "blank.json"
    blank.write_text("  \n")
    assert load_config_file(blank).servers == []
    broken = tmp_path / "broken.json"
    broken.write_text('{"servers": [\n  {"name": "a",}\n]}')
    with pytest.raises(ConfigError, match=r"broken\.json.*not valid JSON.*line 2"):
        load_config_file(broken)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"mcpServers": {"x": {"command": "run-x"}}}))
    loaded = load_config_file(good)
    assert loaded.form == "mcpServers" and [s.name for s in loaded.servers] == ["x"]


def test_a_path_through_a_regular_file_means_no_file(tmp_path: Path):
    blocker = tmp_path / "blocker"
    blocker.write_text("I am a file, not a folder")
    assert load_config_file(blocker / "mcp.json").servers == []
    with pytest.raises(OSError):
        save_config_file(blocker / "mcp.json", {"servers": []})
    assert blocker.read_text() == "I am a file, not a folder"


@pytest.mark.parametrize("form", ["servers", "mcpServers", "vscode"])
def test_saving_keeps_the_form_and_the_other_entries(tmp_path: Path, form: str):
    path = tmp_path / "mcp.json"
    if form == "servers":
        original = {"servers": [{"name": "keep", "command": "k", "comment_free": None}]}
        original["servers"][0].pop("comment_free")
    elif form == "vscode":
        original = {"inputs": [], "servers": {"keep": {"type": "stdio", "command": "k"}}}
    else:
        original = {"mcpServers": {"keep": {"command": "k", "autoApprove": ["t"]}}}
    path.write_text(json.dumps(original))
    path.chmod(0o640)
    loaded = load_config_file(path)
    new = MCPServerConfig(
        name="web", transport="sse", endpoint="http://127.0.0.1:5/sse", headers={"A": "1"}
    )
    save_config_file(path, loaded.with_server(new))
    assert path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["mcp.json"]  # no temp file left behind
    saved = json.loads(path.read_text())
    reloaded = load_config_file(path)
    assert reloaded.form == form
    assert reloaded.names() == ["keep", "web"]
    assert next(s for s in reloaded.servers if s.name == "web") == new
    if form == "mcpServers":
        assert saved["mcpServers"]["keep"] == {"command": "k", "autoApprove": ["t"]}
        assert saved["mcpServers"]["web"] == {
            "type": "sse",
            "url": "http://127.0.0.1:5/sse",
            "headers": {"A": "1"},
        }
    elif form == "vscode":
        assert saved["inputs"] == [] and saved["servers"]["keep"] == original["servers"]["keep"]
        assert saved["servers"]["web"] == {
            "type": "sse",
            "url": "http://127.0.0.1:5/sse",
            "headers": {"A": "1"},
        }
    else:
        assert saved["servers"][0] == {"name": "keep", "command": "k"}
    save_config_file(path, reloaded.without_server("keep"))
    assert load_config_file(path).names() == ["web"]


def test_filters():
    get = ToolFilter.model_validate({"prefix": "get_"})
    assert get.matches("get_time", None) and not get.matches("set_time", None)
    many = ToolFilter.model_validate({"prefix": ["get_", "list_"]})
    assert many.matches("list_x", "") and not many.matches("put_x", "")
    names = ToolFilter.model_validate({"names": ["a", "b"]})
    assert names.matches("a", "") and not names.matches("ab", "")
    words = ToolFilter.model_validate({"keywords": ["Zone"]})
    assert words.matches("x", "converts a time zone") and not words.matches("zone", "no match")
    both = ToolFilter.model_validate({"prefix": "get_", "keywords": ["utc"]})
    assert both.matches("get_a", "in UTC") and not both.matches("get_b", "local")
    either = ToolFilter.model_validate({"any": [{"prefix": "get_"}, {"names": ["x"]}]})
    assert either.matches("x", "") and either.matches("get_y", "") and not either.matches("y", "")
    every = ToolFilter.model_validate({"all": [{"prefix": "get_"}, {"not": {"names": ["get_b"]}}]})
    assert every.matches("get_a", "") and not every.matches("get_b", "")
    assert every.to_json() == {"all": [{"prefix": ["get_"]}, {"not": {"names": ["get_b"]}}]}
    for bad in ({}, {"prefix": []}, {"names": [""]}, {"any": []}, {"regex": "x"}):
        with pytest.raises(ValidationError):
            ToolFilter.model_validate(bad)


def test_sampling_is_off_unless_an_entry_allows_it_and_is_written_back():
    form, (plain, sampled) = parse_config(
        {
            "mcpServers": {
                "plain": {"command": "x"},
                "sampled": {"url": "https://example.org/mcp", "sampling": True},
            }
        }
    )
    assert not plain.sampling and sampled.sampling
    assert "sampling" not in plain.to_entry(form)
    assert sampled.to_entry(form)["sampling"] is True
    with pytest.raises(ConfigError, match="field 'sampling'"):
        parse_config({"mcpServers": {"bad": {"command": "x", "sampling": "maybe"}}})
