"""Config-center tools for the AI (``config_tool.enable``, off by default).

``config_get`` shows keys with sensitive values masked; ``config_set`` stores a validated value in
the store (KV namespace ``config``) which the next Agent start applies above ``ania.toml`` and the
environment (explicit constructor overrides still win); ``config_file_get`` / ``config_file_set``
read and replace the mcp, hooks and commands files (atomically; hooks and commands take effect
within seconds, mcp after a restart). The tool gate makes every ``config_set`` and
``config_file_set`` wait for an admin's approval. For keys naming a file the agent runs or obeys
(``FILE_KEYS``) the admin is shown the target's content (secrets masked), and a target inside the
skills folder, which the model can fill, is refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, Field

from .._preview import read_bounded, reveal, visible
from ..config import FORMER_KEYS, SAVED_CONFIG_NAMESPACE, UNSAVABLE_KEYS, Config, current_key
from ..errors import ConfigError, ToolError
from ..text import cut
from ..tools import BaseTool, Tool, ToolContext
from ._files import read_text, write_atomic
from .secrets import mask_json_text, restore_masked

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store

log = logging.getLogger(__name__)

CONFIG_NAMESPACE = SAVED_CONFIG_NAMESPACE
NOT_SETTABLE = UNSAVABLE_KEYS  # the saved values live in the data directory: it cannot move
MAX_LISTING_CHARS = 20000
MAX_FILE_CHARS = 20000
MASKED_NOTE = "config_file_set keeps a stored secret that is sent back in its masked form"
RESTART = "It takes effect after a restart (a new Agent: restart the kernel or the runner)."
# Keys naming what the agent runs or obeys: the admin sees the target's content, and a target in
# the skills folder (which the model fills with skill_install) is refused outright.
FILE_KEYS = {
    "hooks.file": "runs the shell commands of",
    "mcp.config_file": "starts the MCP servers of",
    "commands.file": "expands the slash commands of",
    "skills.dir": "loads (and the model runs) the skills in",
}
PREVIEW_CHARS = 4000  # of the target file, in the approval request
PREVIEW_READ_CHARS = 200_000  # read (and masked as a whole) before cutting to PREVIEW_CHARS
LISTED_SKILLS = 50


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
        key = current_key(params.key.strip().lower())
        if not key:
            return self._listing()
        info = self.center.keys.get(key)
        if info is None:
            raise ToolError(f"unknown config key {key!r}; call config_get without a key to list")
        saved = await _saved(self.center.opened_store(), key)
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
        """Every key on one line; descriptions are shortened, then dropped, before any key is."""
        infos = sorted(self.center.keys.values(), key=lambda i: i.key)
        for note_chars in (None, 60, 0):
            lines = []
            for info in infos:
                value = "(not set)" if _is_unset(info.value) else _shown(info.value)
                note = info.description if note_chars is None else cut(info.description, note_chars)
                lines.append(f"{info.key} = {value}" + (f"  # {note}" if note else ""))
            text = "\n".join(lines)
            if len(text) <= MAX_LISTING_CHARS:
                break
        if note_chars is not None:
            text += "\n(descriptions shortened: call config_get with a key for its meaning)"
        if len(text) > MAX_LISTING_CHARS:  # only with absurd values: never silently
            head = text[:MAX_LISTING_CHARS].rsplit("\n", 1)[0]
            text = head + f"\n…({len(infos) - head.count(chr(10)) - 1} more omitted)"
        return text


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

    def _parse(self, key: str, raw: str) -> tuple[Any, Config]:
        """The value and the config it makes (`ToolError` for unknown keys and bad values)."""
        if key not in self.center.keys:
            raise ToolError(f"unknown config key {key!r}; call config_get without a key to list")
        if key in NOT_SETTABLE:
            raise ToolError(f"{key} cannot be changed by config_set; edit ania.toml instead")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw  # plain text is a string value
        try:
            return value, self.center.config.with_overrides({key: value})
        except ConfigError as exc:
            raise ToolError(str(exc)) from None

    def needs_admin_approval(self, arguments: Mapping[str, Any]) -> bool:
        """Every change waits for an admin (the tool gate asks)."""
        return True

    def approval_summary(self, arguments: Mapping[str, Any]) -> str:
        """What the admin sees: the change, and for file keys what the target holds now."""
        key = current_key(str(arguments.get("key", "")).strip().lower())
        raw = str(arguments.get("value", ""))
        info = self.center.keys.get(key)
        shown = "(masked)" if info is not None and info.sensitive else visible(raw)
        head = f"config_set {visible(key)} = {shown} (applies after a restart)"
        if key not in FILE_KEYS:
            return head
        try:
            _value, config = self._parse(key, raw)
        except ToolError as exc:
            return f"{head}\nThis will be refused: {exc}"
        target = _resolved(_dotted(config, key))
        lines = [head, f"The agent then {FILE_KEYS[key]} {target}."]
        refusal = _inside_skills(key, target, [_resolved(Path(self.center.config.skills.dir))])
        if refusal is not None:
            lines.append(f"This will be refused: {refusal}")
        elif key == "skills.dir":
            lines.append(_skills_listing(target))
        else:
            lines.append(f"Its content now:\n{_file_preview(target)}")
        return "\n".join(lines)

    async def execute(self, params: SetParams, ctx: ToolContext) -> str:
        """Validate against the config model, save, audit."""
        key = current_key(params.key.strip().lower())
        value, config = self._parse(key, params.value)
        info = self.center.keys[key]
        store = self.center.opened_store()
        if key in FILE_KEYS:
            # The running skills folder and one saved for the next start are both the model's.
            saved = await store.kv(CONFIG_NAMESPACE).get("skills.dir", None)
            folders = [Path(self.center.config.skills.dir)]
            if isinstance(saved, str) and saved.strip():
                folders.append(Path(saved))
            target = _resolved(_dotted(config, key))
            refusal = _inside_skills(key, target, [_resolved(f) for f in folders])
            if refusal is not None:
                raise ToolError(f"{key} was not changed: {refusal}")
        await store.kv(CONFIG_NAMESPACE).set(key, value)
        if key in FORMER_KEYS:  # a value an older ania-nb saved under the old name is replaced
            await store.kv(CONFIG_NAMESPACE).delete(FORMER_KEYS[key])
        new = "(masked)" if info.sensitive else _shown(value)
        detail = f"{key}: {'(masked)' if info.sensitive else _shown(info.value)} → {new}"
        await store.oplog.add(
            "ai", "config_set", actor=ctx.sender, session=ctx.session, detail=detail
        )
        return f"Saved {key} = {new}. {RESTART} Tell the user."


async def _saved(store: Store, key: str) -> Any:
    """The value ``config_set`` saved for ``key`` (or under its old name), else ``_MISSING``."""
    kv = store.kv(CONFIG_NAMESPACE)
    saved = await kv.get(key, _MISSING)
    if saved is _MISSING and key in FORMER_KEYS:
        saved = await kv.get(FORMER_KEYS[key], _MISSING)
    return saved


def _dotted(config: Config, key: str) -> Path:
    section, _, name = key.partition(".")
    return Path(getattr(getattr(config, section), name))


def _resolved(path: Path) -> Path:
    """Absolute, links followed (as far as they exist), so a link cannot hide where it points."""
    return path.expanduser().resolve(strict=False)


def _inside_skills(key: str, target: Path, skills_dirs: list[Path]) -> str | None:
    """Why ``target`` is refused: it lies in a skills folder, whose files the model writes."""
    for skills in skills_dirs:
        inside = skills in target.parents or (target == skills and key != "skills.dir")
        if inside:
            return (
                f"{target} lies inside the skills folder {skills}, which the model can fill "
                "with skill_install; the agent never runs or obeys files from there. Put the "
                "file elsewhere (an admin reviews it there) and set the key to that path"
            )
    return None


def _file_preview(path: Path) -> str:
    """The target file's content for the admin: secrets masked, invisible characters shown."""
    try:
        text, size = read_bounded(path, PREVIEW_READ_CHARS)
    except FileNotFoundError:
        return f"(the file {path} does not exist yet)"
    except (OSError, ValueError) as exc:
        return f"(the file {path} cannot be shown: {exc})"
    if not text.strip():
        return f"(the file {path} is empty)"
    masked, _ = mask_json_text(text)
    shown = masked[:PREVIEW_CHARS]
    rest = len(masked) - len(shown)
    if size > len(text.encode("utf-8", errors="replace")):
        rest += size - len(text.encode("utf-8", errors="replace"))
    more = f"\n… ({rest} more characters not shown)" if rest else ""
    return reveal(shown) + more


def _skills_listing(folder: Path) -> str:
    """The skill folders an admin is about to trust (bounded)."""
    try:
        with os.scandir(folder) as entries:
            names = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    except FileNotFoundError:
        return f"(the folder {folder} does not exist yet)"
    except OSError as exc:
        return f"(the folder {folder} cannot be listed: {exc.strerror or exc})"
    if not names:
        return f"(the folder {folder} holds no skills)"
    listed = [visible(n) for n in names[:LISTED_SKILLS]]
    more = f", … and {len(names) - LISTED_SKILLS} more" if len(names) > LISTED_SKILLS else ""
    return f"Skill folders in it ({len(names)}): {', '.join(listed)}{more}"


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
        text = cut(text, MAX_FILE_CHARS, marker="…(truncated)")
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

    def needs_admin_approval(self, arguments: Mapping[str, Any]) -> bool:
        """Every change waits for an admin (the tool gate asks)."""
        return True

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
