"""Config-center tools for the AI (``config_tool.enable``, off by default).

``config_get`` shows keys with sensitive values masked; ``config_set`` stores a validated value in
the store (KV namespace ``config``) which the next Agent start applies above ``ania.toml`` and the
environment (explicit constructor overrides still win); ``config_file_get`` / ``config_file_set``
read and replace the mcp, hooks and commands files (atomically; hooks and commands take effect
within seconds, mcp after a restart). The tool gate makes every ``config_set`` and
``config_file_set`` wait for an admin's approval.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, Field

from ..config import SAVED_CONFIG_NAMESPACE, UNSAVABLE_KEYS, Config
from ..errors import ConfigError, ToolError
from ..tools import BaseTool, Tool, ToolContext
from ._files import read_text, write_atomic
from ._secrets import mask_json_text, restore_masked

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store

log = logging.getLogger(__name__)

CONFIG_NAMESPACE = SAVED_CONFIG_NAMESPACE
NOT_SETTABLE = UNSAVABLE_KEYS  # the saved values live in the data directory: it cannot move
MAX_LISTING_CHARS = 12000
MAX_FILE_CHARS = 20000
MASKED_NOTE = "config_file_set keeps a stored secret that is sent back in its masked form"
RESTART = "It takes effect after a restart (a new Agent: restart the kernel or the runner)."


@dataclass(frozen=True)
class ConfigFile:
    """A JSON file the AI may read and replace."""

    name: str
    path: Path
    format: str
    effect: str
    validate: Callable[[str], object] | None = None  # raises ValueError on bad content
    changed: Callable[[], None] | None = None  # told after a write


class ConfigCenter:
    """What the config tools share: the running config, the store and the editable files."""

    def __init__(self, config: Config, files: list[ConfigFile]) -> None:
        self.config = config
        self.files = {f.name: f for f in files}
        self.store: Store | None = None  # bound when the store opens
        self.keys = {info.key: info for info in config.describe()}

    def opened_store(self) -> Store:
        """The open store (tools only run once it is open)."""
        if self.store is None:
            raise ToolError("the store is not open yet")
        return self.store

    def file(self, name: str) -> ConfigFile:
        """A file by name, or a `ToolError` listing the names."""
        found = self.files.get(name.strip().lower())
        if found is None:
            raise ToolError(f"unknown config file {name!r}; use one of: {', '.join(self.files)}")
        return found

    def tools(self) -> list[Tool]:
        """The four config tools."""
        return [ConfigGetTool(self), ConfigSetTool(self), FileGetTool(self), FileSetTool(self)]


_MISSING = object()


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _is_unset(value: Any) -> bool:
    return value is None or value == ""


class KeyParams(BaseModel):
    """config_get parameters."""

    key: Annotated[str, Field(description="A key such as agent.max_iterations; empty = all.")] = ""


class ConfigGetTool(BaseTool[KeyParams]):
    """Read configuration values (sensitive ones masked)."""

    name = "config_get"

    def __init__(self, center: ConfigCenter) -> None:
        self.center = center

    async def execute(self, params: KeyParams, ctx: ToolContext) -> str:
        """One key in detail, or every key on one line each."""
        key = params.key.strip().lower()
        if not key:
            return self._listing()
        info = self.center.keys.get(key)
        if info is None:
            raise ToolError(f"unknown config key {key!r}; call config_get without a key to list")
        saved = await self.center.opened_store().kv(CONFIG_NAMESPACE).get(key, _MISSING)
        value = "(not set)" if _is_unset(info.value) else _shown(info.value)
        if info.sensitive and not _is_unset(info.value):
            value += " (sensitive, masked)"
        lines = [
            f"{key} = {value}",
            f"meaning: {info.description} (default {_shown(info.default)})",
        ]
        if saved is not _MISSING:
            pending = "(masked)" if info.sensitive else _shown(saved)
            lines.append(f"saved by config_set: {pending}; {RESTART}")
        return "\n".join(lines)

    def _listing(self) -> str:
        lines: list[str] = []
        size = 0
        infos = sorted(self.center.keys.values(), key=lambda i: i.key)
        for n, info in enumerate(infos):
            value = "(not set)" if _is_unset(info.value) else _shown(info.value)
            line = f"{info.key} = {value}  # {info.description}"
            if size + len(line) + 1 > MAX_LISTING_CHARS:
                lines.append(f"…({len(infos) - n} more omitted)")
                break
            lines.append(line)
            size += len(line) + 1
        return "\n".join(lines)


class SetParams(BaseModel):
    """config_set parameters."""

    key: Annotated[str, Field(description="The key, e.g. agent.max_iterations.")]
    value: Annotated[
        str, Field(description='The new value as JSON (5, true, ["a"], "text") or plain text.')
    ]


class ConfigSetTool(BaseTool[SetParams]):
    """Change a configuration value (needs an admin's approval; applies after a restart)."""

    name = "config_set"
    side_effects = True

    def __init__(self, center: ConfigCenter) -> None:
        self.center = center

    async def execute(self, params: SetParams, ctx: ToolContext) -> str:
        """Validate against the config model, save, audit."""
        key = params.key.strip().lower()
        info = self.center.keys.get(key)
        if info is None:
            raise ToolError(f"unknown config key {key!r}; call config_get without a key to list")
        if key in NOT_SETTABLE:
            raise ToolError(f"{key} cannot be changed by config_set; edit ania.toml instead")
        try:
            value: Any = json.loads(params.value)
        except json.JSONDecodeError:
            value = params.value  # plain text is a string value
        try:
            self.center.config.with_overrides({key: value})
        except ConfigError as exc:
            raise ToolError(str(exc)) from None
        store = self.center.opened_store()
        await store.kv(CONFIG_NAMESPACE).set(key, value)
        new = "(masked)" if info.sensitive else _shown(value)
        detail = f"{key}: {'(masked)' if info.sensitive else _shown(info.value)} → {new}"
        await store.oplog.add(
            "ai", "config_set", actor=ctx.sender, session=ctx.session, detail=detail
        )
        return f"Saved {key} = {new}. {RESTART} Tell the user."


class FileParams(BaseModel):
    """config_file_get parameters."""

    name: Annotated[str, Field(description="mcp, hooks or commands; empty = list the files.")] = ""


class FileGetTool(BaseTool[FileParams]):
    """Read one of the agent's JSON config files (mcp, hooks, commands)."""

    name = "config_file_get"

    def __init__(self, center: ConfigCenter) -> None:
        self.center = center

    async def execute(self, params: FileParams, ctx: ToolContext) -> str:
        """The file's content, or the list of files with their formats."""
        if not params.name.strip():
            return "\n".join(
                f"{f.name}: {f.path} — {f.format}; {f.effect}" for f in self.center.files.values()
            )
        entry = self.center.file(params.name)
        text = await asyncio.to_thread(read_text, entry.path)
        if not text.strip():
            return f"The {entry.name} file ({entry.path}) is empty. Format: {entry.format}"
        text, masked = mask_json_text(text)
        if len(text) > MAX_FILE_CHARS:
            text = text[:MAX_FILE_CHARS] + "…(truncated)"
        if masked:
            return f"{entry.path} (secret values masked; {MASKED_NOTE}):\n{text}"
        return f"{entry.path}:\n{text}"


class FileSetParams(BaseModel):
    """config_file_set parameters."""

    name: Annotated[str, Field(description="mcp, hooks or commands.")]
    content: Annotated[str, Field(description="The complete new JSON content; empty clears it.")]


class FileSetTool(BaseTool[FileSetParams]):
    """Replace one of the agent's JSON config files (needs an admin's approval)."""

    name = "config_file_set"
    side_effects = True

    def __init__(self, center: ConfigCenter) -> None:
        self.center = center

    async def execute(self, params: FileSetParams, ctx: ToolContext) -> str:
        """Check the JSON, write atomically, audit."""
        entry = self.center.file(params.name)
        content = params.content
        if "***" in content:  # masked values read by config_file_get keep the stored secrets
            content = restore_masked(content, await asyncio.to_thread(read_text, entry.path))
        if content.strip():
            try:
                json.loads(content)
            except json.JSONDecodeError as exc:
                raise ToolError(f"the {entry.name} file must be valid JSON: {exc}") from None
            if entry.validate is not None:
                try:
                    entry.validate(content)
                except ValueError as exc:
                    raise ToolError(f"the {entry.name} file is not usable: {exc}") from None
        await write_atomic(entry.path, content)
        if entry.changed is not None:
            entry.changed()
        await self.center.opened_store().oplog.add(
            "ai",
            "config_file_set",
            actor=ctx.sender,
            session=ctx.session,
            detail=f"{entry.name} ({entry.path}): {len(content)} characters",
        )
        return f"Wrote the {entry.name} file ({len(content)} characters). {entry.effect}."
