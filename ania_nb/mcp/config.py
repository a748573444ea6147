"""The MCP servers file (``MCPSettings.config_file``): parsing, validation and atomic saving.

Three JSON forms are accepted (the original's list, Claude Code's ``mcpServers`` and the VS
Code ``servers`` object many server READMEs print), and a file keeps its form when ania-nb
writes it back::

    {"servers": [{"name": "time", "transport": "stdio", "command": "uvx",
                  "args": ["mcp-server-time"], "env": {"K": "V"}, "timeout": 30,
                  "description": "clock and time zones", "filter": {"prefix": "get_"}},
                 {"name": "docs", "transport": "streamable-http",
                  "endpoint": "https://example.org/mcp", "headers": {"Authorization": "Bearer x"}}]}

    {"mcpServers": {"time": {"command": "uvx", "args": ["mcp-server-time"], "env": {}},
                    "docs": {"type": "http", "url": "https://example.org/mcp", "headers": {}}}}

    {"servers": {"time": {"type": "stdio", "command": "uvx", "args": ["mcp-server-time"]},
                 "docs": {"type": "http", "url": "https://example.org/mcp"}}}

``${VAR}`` and ``${VAR:-default}`` in a URL, a header value or an env value are expanded from
the environment when the server connects (never written back expanded); an unset variable
without a default is an error naming it.

Transports: ``stdio``; ``streamable-http`` (also written ``streamable``, ``http``,
``streamable_http``); ``sse``. Without a transport, a ``command`` means stdio and an endpoint
means streamable HTTP (in the ``mcpServers`` form, a ``url`` ending in ``/sse`` means SSE). Any
other transport is an error. ``timeout`` is in seconds (0 or absent:
``MCPSettings.connect_timeout``); ``"disabled": true`` keeps an entry in the file without starting
it. A missing file means no servers; every other problem raises `ConfigError` naming the file, the
server and the field.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ania_nb._atomic import write_text_atomic
from ania_nb.errors import ConfigError
from ania_nb.mcp.filters import ToolFilter

__all__ = [
    "FORM_NAMES",
    "MCPConfigFile",
    "MCPServerConfig",
    "Transport",
    "check_server_name",
    "expand_env",
    "load_config_file",
    "parse_config",
    "save_config_file",
    "validate_server",
]

Transport = Literal["stdio", "streamable-http", "sse"]
Form = Literal["servers", "mcpServers", "vscode"]
FORM_NAMES: dict[str, str] = {
    "servers": 'the "servers" list form',
    "mcpServers": 'the Claude Code "mcpServers" form',
    "vscode": 'the VS Code "servers" object form',
}

_TRANSPORTS: dict[str, Transport] = {
    "stdio": "stdio",
    "streamable-http": "streamable-http",
    "streamable_http": "streamable-http",
    "streamable": "streamable-http",
    "http": "streamable-http",
    "sse": "sse",
}
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# "mcp_discover_" + name must fit the 64-character limit of a function name.
MAX_NAME_LENGTH = 64 - len("mcp_discover_")
_KEY = "mcp.config_file"
# Keys other MCP clients write into mcpServers entries that mean nothing here.
_FOREIGN_KEYS = frozenset({"autoApprove", "alwaysAllow", "envFile", "dev"})
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# mcpServers spellings of our field names (both are accepted in that form).
_MAP_FIELDS = {"endpoint": "url", "transport": "type"}


def check_server_name(name: object) -> str:
    """Return a valid server name or raise ValueError saying what is wrong with it."""
    if not isinstance(name, str) or not _NAME_RE.match(name.strip()):
        raise ValueError(
            f"server name {name!r} is invalid: use 1-{MAX_NAME_LENGTH} characters from "
            "A-Z, a-z, 0-9, '_' and '-'"
        )
    name = name.strip()
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"server name {name!r} is too long: at most {MAX_NAME_LENGTH} characters, so that "
            f"'mcp_discover_{name[:4]}...' stays within the 64-character limit of tool names"
        )
    return name


class MCPServerConfig(BaseModel):
    """One MCP server entry (the ``servers`` form; the ``mcpServers`` form is translated)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Server name; tools are called mcp_discover_<name> etc.")
    transport: Transport = Field(description="stdio, streamable-http or sse.")
    command: str | None = Field(None, description="stdio: the program to start.")
    args: list[str] = Field(default_factory=list, description="stdio: its arguments.")
    env: dict[str, str] = Field(default_factory=dict, description="stdio: extra environment.")
    cwd: str | None = Field(None, description="stdio: working directory.")
    endpoint: str | None = Field(None, description="HTTP/SSE: the server URL.")
    headers: dict[str, str] = Field(default_factory=dict, description="HTTP/SSE: headers.")
    timeout: float | None = Field(None, gt=0, description="Connect + list tools, seconds.")
    description: str = Field("", description="What the server offers (shown to the model).")
    filter: ToolFilter | None = Field(None, description="Which tools to expose.")
    disabled: bool = Field(False, description="Keep the entry but do not start it.")
    sampling: bool = Field(
        False,
        description="Let the server ask ania-nb's model for completions (sampling/createMessage),"
        " each request approved by a person.",
    )

    @model_validator(mode="before")
    @classmethod
    def _infer_transport(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("transport") in (None, ""):
            data = dict(data)
            data["transport"] = "streamable-http" if data.get("endpoint") else "stdio"
        return data

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> str:
        return check_server_name(value)

    @field_validator("transport", mode="before")
    @classmethod
    def _transport(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        found = _TRANSPORTS.get(value.strip().lower())
        if found is None:
            raise ValueError(
                f"unknown transport {value!r}; use stdio, streamable-http (or http) or sse"
            )
        return found

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout(cls, value: Any) -> Any:
        return None if value == 0 else value  # 0 means "the default", as in the original

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value.strip()):
            raise ValueError(f"{value!r} is not an http:// or https:// URL")
        return value.strip() if value is not None else None

    @model_validator(mode="after")
    def _needs_target(self) -> MCPServerConfig:
        if self.transport == "stdio" and not (self.command or "").strip():
            raise ValueError("field 'command': a stdio server needs the command to start")
        if self.transport != "stdio" and not self.endpoint:
            raise ValueError(f"field 'endpoint': a {self.transport} server needs its URL")
        return self

    @property
    def label(self) -> str:
        """How the server is introduced to the model: its description, else its name."""
        return self.description.strip() or self.name

    @property
    def target(self) -> str:
        """The command line or URL, for listings (never headers or env: they hold secrets)."""
        if self.transport == "stdio":
            return " ".join([self.command or "", *self.args]).strip()
        return self.endpoint or ""

    def to_entry(self, form: Form) -> dict[str, Any]:
        """Return the server as a JSON entry of the given file form (only what is set)."""
        if form == "servers":
            entry: dict[str, Any] = {"name": self.name, "transport": self.transport}
            if self.transport == "stdio":
                entry.update(command=self.command, args=self.args, env=self.env, cwd=self.cwd)
            else:
                entry.update(endpoint=self.endpoint, headers=self.headers)
        elif self.transport == "stdio":
            entry = {"command": self.command, "args": self.args, "env": self.env, "cwd": self.cwd}
            if form == "vscode":  # VS Code requires the type
                entry = {"type": "stdio", **entry}
        else:
            kind = "sse" if self.transport == "sse" else "http"
            entry = {"type": kind, "url": self.endpoint, "headers": self.headers}
        entry.update(timeout=self.timeout, description=self.description)
        if self.sampling:
            entry["sampling"] = True
        entry["filter"] = self.filter.to_json() if self.filter is not None else None
        return {k: v for k, v in entry.items() if v not in (None, "", [], {})}


@dataclass
class MCPConfigFile:
    """A parsed servers file; ``data`` is the JSON as read, so saving keeps other entries."""

    path: Path
    form: Form = "servers"
    data: dict[str, Any] = field(default_factory=dict)
    servers: list[MCPServerConfig] = field(default_factory=list)  # file order, disabled too

    @property
    def _map_key(self) -> str | None:
        """The key of the name -> server object (None in the list form)."""
        return {"mcpServers": "mcpServers", "vscode": "servers"}.get(self.form)

    def names(self) -> list[str]:
        """Every server name in the file (disabled ones too), sorted."""
        if self._map_key is not None:
            return sorted(str(k) for k in self.data.get(self._map_key, {}))
        return sorted(
            str(e.get("name")) for e in self.data.get("servers", []) if isinstance(e, dict)
        )

    def with_server(self, server: MCPServerConfig) -> dict[str, Any]:
        """The file's JSON with ``server`` appended, in the file's form."""
        data = dict(self.data)
        if self._map_key is not None:
            data[self._map_key] = {
                **data.get(self._map_key, {}),
                server.name: server.to_entry(self.form),
            }
        else:
            data["servers"] = [*data.get("servers", []), server.to_entry(self.form)]
        return data

    def without_server(self, name: str) -> dict[str, Any]:
        """The file's JSON with the entry called ``name`` left out."""
        data = dict(self.data)
        if self._map_key is not None:
            data[self._map_key] = {
                k: v for k, v in data.get(self._map_key, {}).items() if k != name
            }
        else:
            data["servers"] = [
                e
                for e in data.get("servers", [])
                if not (isinstance(e, dict) and str(e.get("name", "")).strip() == name)
            ]
        return data


def load_config_file(path: str | os.PathLike[str]) -> MCPConfigFile:
    """Read and validate the servers file (blocking: call it in a worker thread)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):  # no such file (a parent is not a folder)
        return MCPConfigFile(path=file)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"MCP config file {str(file)!r} cannot be read: {exc}", key=_KEY) from exc
    if not text.strip():
        return MCPConfigFile(path=file)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"MCP config file {str(file)!r} is not valid JSON: {exc.msg} at line {exc.lineno} "
            f"column {exc.colno}",
            key=_KEY,
        ) from None
    form, servers = parse_config(data, source=str(file))
    return MCPConfigFile(path=file, form=form, data=data, servers=servers)


def parse_config(data: Any, *, source: str = "MCP config") -> tuple[Form, list[MCPServerConfig]]:
    """Validate the JSON of a servers file; returns its form and its servers (file order)."""
    where = f"MCP config file {source!r}"
    if not isinstance(data, dict) or ("servers" in data) == ("mcpServers" in data):
        raise ConfigError(
            f'{where}: expected an object with either "mcpServers" (an object of name -> '
            'server) or "servers" (a list of servers, or an object of name -> server as VS '
            "Code writes it), not both",
            key=_KEY,
        )
    if "mcpServers" in data:
        return "mcpServers", _parse_map(data["mcpServers"], where, '"mcpServers"')
    if isinstance(data["servers"], dict):
        return "vscode", _parse_map(data["servers"], where, '"servers"')
    return "servers", _parse_list(data["servers"], where)


def _parse_list(entries: Any, where: str) -> list[MCPServerConfig]:
    if not isinstance(entries, list):
        raise ConfigError(f'{where}: "servers" must be a list of server objects', key=_KEY)
    servers: list[MCPServerConfig] = []
    for index, entry in enumerate(entries):
        label = f"server #{index + 1}"
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            label = f"server {entry['name'].strip()!r}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: {label} must be an object", key=_KEY)
        if "name" not in entry:
            raise ConfigError(f"{where}: {label}: field 'name' is required", key=_KEY)
        servers.append(validate_server(entry, where, label, {}))
    return _unique(servers, where)


def _parse_map(entries: Any, where: str, key: str) -> list[MCPServerConfig]:
    if not isinstance(entries, dict):
        raise ConfigError(f"{where}: {key} must be an object of name -> server", key=_KEY)
    servers: list[MCPServerConfig] = []
    for name, entry in entries.items():
        label = f"server {name!r}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: {label} must be an object", key=_KEY)
        fields = {k: v for k, v in entry.items() if k not in _FOREIGN_KEYS}
        spelled: dict[str, str] = {}  # our field -> the key the user wrote, for error messages
        for ours, theirs in _MAP_FIELDS.items():
            if theirs in fields and ours not in fields:
                fields[ours] = fields.pop(theirs)
                spelled[ours] = theirs
        url = fields.get("endpoint")
        if fields.get("transport") in (None, "") and isinstance(url, str):
            fields["transport"] = "sse" if url.rstrip("/").endswith("/sse") else "streamable-http"
        servers.append(validate_server({"name": name, **fields}, where, label, spelled))
    return _unique(servers, where)


def validate_server(
    entry: dict[str, Any], where: str, label: str, names: dict[str, str] | None = None
) -> MCPServerConfig:
    """Validate one entry; `ConfigError` names ``where``, ``label`` and each bad field."""
    names = names or {}
    try:
        return MCPServerConfig.model_validate(entry)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            loc = ".".join(str(p) for p in err["loc"])
            head = loc.split(".", 1)[0]
            if head in names:
                loc = names[head] + loc[len(head) :]
            msg = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            problems.append(f"field '{loc}': {msg}" if loc else msg)
        raise ConfigError(f"{where}: {label}: " + "; ".join(problems), key=_KEY) from None


def _unique(servers: list[MCPServerConfig], where: str) -> list[MCPServerConfig]:
    seen: set[str] = set()
    for server in servers:
        if server.name in seen:
            raise ConfigError(
                f"{where}: server {server.name!r} is defined twice; names must be unique",
                key=_KEY,
            )
        seen.add(server.name)
    return servers


def expand_env(
    server: MCPServerConfig, environ: Mapping[str, str] | None = None
) -> MCPServerConfig:
    """``server`` with ``${VAR}`` / ``${VAR:-default}`` expanded in its URL, headers and env.

    Raises `ConfigError` naming the server, the field and the variable when one is unset.
    """
    environ = os.environ if environ is None else environ

    def expand(text: str, field_name: str) -> str:
        def value(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in environ:
                return environ[name]
            if default is not None:
                return default
            raise ConfigError(
                f"MCP server {server.name!r}: {field_name} uses ${{{name}}}, which is not set "
                "in the environment (set it, or write ${" + name + ":-default})",
                key=_KEY,
            )

        return _ENV_REF.sub(value, text)

    changes: dict[str, Any] = {
        "headers": {k: expand(v, f"header {k!r}") for k, v in server.headers.items()},
        "env": {k: expand(v, f"env {k!r}") for k, v in server.env.items()},
    }
    if server.endpoint is not None:
        changes["endpoint"] = expand(server.endpoint, "the URL")
    return server.model_copy(update=changes)


def save_config_file(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """Write the servers file atomically (temp file + ``os.replace``; blocking: use a thread)."""
    write_text_atomic(path, json.dumps(data, ensure_ascii=False, indent=2) + "\n")
