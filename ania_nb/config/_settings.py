"""`Config`: every setting, from defaults < `ania.toml` < `ANIA_…` environment < overrides.

Keys are grouped in sections (``llm``, ``fallback``, ``compressor``, ``retry``, ``agent``,
``store``, …); in the environment a section and its key are joined with ``__``, e.g.
``ANIA_LLM__API_KEY``. Sensitive keys are ``SecretStr`` and marked ``sensitive`` so every display
masks them. A renamed key (`RENAMED_KEYS`) is still accepted under its old name from every
source, with a warning logged once per process; listings show only the new names.
"""

from __future__ import annotations

import contextvars
import logging
import os
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import Field, PrivateAttr, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ..addresses import mask_url
from ..errors import ConfigError
from ._knowledge_sections import EmbeddingSettings, KbSettings, MemorySettings
from ._model_check import env_name
from ._quota_sections import PricingSettings, QuotaSettings
from ._runner_sections import RunnerSettings
from ._sections import (
    AdminSettings,
    AgentSettings,
    ApprovalSettings,
    BashSettings,
    ClockSettings,
    CommandsSettings,
    CompressorSettings,
    ConfigToolSettings,
    FallbackSettings,
    FileSettings,
    HooksSettings,
    LLMSettings,
    MCPSettings,
    MemeSettings,
    NotebookSettings,
    RetrySettings,
    RolesSettings,
    SecuritySettings,
    SkillSettings,
    StoreSettings,
    SubagentSettings,
    TeamSettings,
    TodoSettings,
    UISettings,
    VisionSettings,
    WebSettings,
)

log = logging.getLogger(__name__)

DEFAULT_CONFIG_FILE = "ania.toml"
RENAMED_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "bash.max_output": "bash.max_output_chars",
        "kb.chunk_overlap": "kb.chunk_overlap_chars",
        "kb.chunk_size": "kb.chunk_chars",
        "subagent.max_result_len": "subagent.max_result_chars",
        "team.max_result_len": "team.max_result_chars",
    }
)
"""Old key → new key. Old names still work from every source and log a warning once."""
FORMER_KEYS: Mapping[str, str] = MappingProxyType({new: old for old, new in RENAMED_KEYS.items()})
"""New key → its old name (the reverse of `RENAMED_KEYS`)."""
# Old names already warned about. Process-wide on purpose: a warning per Config built (every
# with_overrides, every Agent) would drown the log; `warnings`' own registry is global too.
_warned: set[str] = set()
_toml_path: contextvars.ContextVar[Path | None] = contextvars.ContextVar("ania_toml", default=None)


class Config(BaseSettings):
    """All settings of ania-nb; see `Config.describe()` for every key with its default."""

    model_config = SettingsConfigDict(
        env_prefix="ANIA_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_assignment=True,
    )

    llm: LLMSettings = Field(default_factory=LLMSettings, description="Main chat model.")
    fallback: FallbackSettings = Field(
        default_factory=FallbackSettings, description="Model tried once when the main one fails."
    )
    compressor: CompressorSettings = Field(
        default_factory=CompressorSettings, description="Model that summarises long histories."
    )
    retry: RetrySettings = Field(default_factory=RetrySettings, description="Retry policy.")
    agent: AgentSettings = Field(default_factory=AgentSettings, description="Run limits.")
    store: StoreSettings = Field(default_factory=StoreSettings, description="Embedded store.")
    vision: VisionSettings = Field(
        default_factory=VisionSettings, description="Image description for text-only models."
    )
    web: WebSettings = Field(default_factory=WebSettings, description="webSearch / webExplore.")
    meme: MemeSettings = Field(default_factory=MemeSettings, description="The meme tool.")
    bash: BashSettings = Field(default_factory=BashSettings, description="The bash tool.")
    file: FileSettings = Field(
        default_factory=FileSettings, description="The file and local_image tools."
    )
    approval: ApprovalSettings = Field(
        default_factory=ApprovalSettings, description="Human approval of tool calls."
    )
    mcp: MCPSettings = Field(default_factory=MCPSettings, description="MCP servers.")
    skills: SkillSettings = Field(default_factory=SkillSettings, description="SKILL.md skills.")
    notebook: NotebookSettings = Field(
        default_factory=NotebookSettings, description="The notebook face."
    )
    admin: AdminSettings = Field(default_factory=AdminSettings, description="Administrators.")
    roles: RolesSettings = Field(
        default_factory=RolesSettings, description="Roles per chat and the tools each may use."
    )
    hooks: HooksSettings = Field(default_factory=HooksSettings, description="Shell hooks.")
    todo: TodoSettings = Field(default_factory=TodoSettings, description="The todo_write tool.")
    commands: CommandsSettings = Field(
        default_factory=CommandsSettings, description="Custom slash commands."
    )
    config_tool: ConfigToolSettings = Field(
        default_factory=ConfigToolSettings, description="The AI's config-center tools."
    )
    security: SecuritySettings = Field(
        default_factory=SecuritySettings, description="Child environments and secret files."
    )
    clock: ClockSettings = Field(default_factory=ClockSettings, description="Scheduled tasks.")
    subagent: SubagentSettings = Field(
        default_factory=SubagentSettings, description="Subagents (and the one-shot runs' model)."
    )
    team: TeamSettings = Field(default_factory=TeamSettings, description="Agent teams.")
    kb: KbSettings = Field(default_factory=KbSettings, description="The knowledge base.")
    memory: MemorySettings = Field(default_factory=MemorySettings, description="Long-term memory.")
    embedding: EmbeddingSettings = Field(
        default_factory=EmbeddingSettings, description="Embedder of the kb and memory."
    )
    quota: QuotaSettings = Field(
        default_factory=QuotaSettings, description="Daily token quotas and usage counters."
    )
    pricing: PricingSettings = Field(
        default_factory=PricingSettings, description="Per-model token prices for costs."
    )
    runner: RunnerSettings = Field(
        default_factory=RunnerSettings, description="ania-nb serve: chat platform and flow."
    )
    ui: UISettings = Field(
        default_factory=UISettings, description="The language of what people read."
    )
    _source_file: Path | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """Take the old names of renamed keys (TOML, ``ANIA_…``, section dicts) as the new ones.

        Where a section has both, the new name wins: the sources are merged by now, and
        `with_overrides` passes every key under its new name while an ``ANIA_…`` variable may
        still use the old one.
        """
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for old, new in RENAMED_KEYS.items():
            section, _, old_key = old.partition(".")
            values = out.get(section)
            if not isinstance(values, Mapping) or old_key not in values:
                continue
            values = dict(values)
            values.setdefault(new.partition(".")[2], values.pop(old_key))
            out[section] = values
            current_key(old)  # the warning
        return out

    @property
    def source_file(self) -> Path | None:
        """The TOML file this config was loaded from (absolute), or None when there was none."""
        return self._source_file

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Priority: overrides > environment > TOML file > defaults."""
        path = _toml_path.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, **overrides: Any) -> Config:
        """Load from a TOML file (default ``./ania.toml`` if present), the environment, overrides.

        Overrides use section dicts (``llm={"model": "x"}``) or dotted keys via `with_overrides`.
        """
        toml = Path(path) if path is not None else Path(DEFAULT_CONFIG_FILE)
        if path is not None and not toml.is_file():
            raise ConfigError(f"config file {str(toml)!r} does not exist", key=None)
        if toml.is_file():
            _check_toml(toml)
        source = toml.absolute() if toml.is_file() else None
        _warn_stray_env()
        token = _toml_path.set(source)
        try:
            config = cls(**overrides)
        except ValidationError as exc:
            raise _config_error(exc, source=str(toml) if source else None) from None
        finally:
            _toml_path.reset(token)
        config._source_file = source  # the sandbox and the file tool keep it unreadable
        return config

    def with_overrides(self, overrides: Mapping[str, Any]) -> Config:
        """Return a copy with dotted keys replaced, e.g. ``{"llm.model": "gpt-4o"}``; validated."""
        data = self.model_dump()
        for dotted, value in current_keys(overrides).items():
            section, _, key = dotted.partition(".")
            if (
                section not in data
                or not isinstance(data[section], dict)
                or key not in data[section]
            ):
                raise ConfigError(
                    f"unknown config key {dotted!r}; known keys: {_known()}", key=dotted
                )
            data[section][key] = value
        try:
            changed = type(self).model_validate(data)
        except ValidationError as exc:
            raise _config_error(exc, source="overrides") from None
        changed._source_file = self._source_file
        return changed

    def get(self, dotted: str) -> Any:
        """Value of a dotted key (secrets stay `SecretStr`); an old name reads its new key."""
        section, _, key = current_key(dotted).partition(".")
        try:
            return getattr(getattr(self, section), key)
        except AttributeError:
            raise ConfigError(f"unknown config key {dotted!r}; known keys: {_known()}") from None

    def describe(self) -> list[KeyInfo]:
        """Every key with its current (masked) value, default, description and sensitivity."""
        return list(_iter_keys(self))

    def masked(self) -> dict[str, dict[str, Any]]:
        """Nested dict of the current values with sensitive ones masked (safe to print or log)."""
        out: dict[str, dict[str, Any]] = {}
        for info in _iter_keys(self):
            section, _, key = info.key.partition(".")
            out.setdefault(section, {})[key] = info.value
        return out

    def __repr_args__(self) -> Any:
        """Repr shows masked values only."""
        return list(self.masked().items())


@dataclass(frozen=True)
class KeyInfo:
    """One documented config key."""

    key: str
    value: Any
    default: Any
    description: str
    sensitive: bool


def mask(value: Any) -> str:
    """Mask a secret for display: last four characters at most, never the whole value."""
    if value is None:
        return ""
    raw = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
    if not raw:
        return ""
    return "***" + raw[-4:] if len(raw) >= 12 else "***"


def _iter_keys(config: Config) -> Iterator[KeyInfo]:
    for section_name, section_field in Config.model_fields.items():
        section = getattr(config, section_name)
        assert section_field.default_factory is not None
        default_section = section_field.default_factory()  # type: ignore[call-arg]
        for key, field in type(section).model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            sensitive = bool(extra.get("sensitive"))
            value = getattr(section, key)
            default = getattr(default_section, key)
            if extra.get("sensitive") == "values":  # KEY=VALUE entries: names stay readable
                value, default = _mask_entries(value), _mask_entries(default)
            elif extra.get("sensitive") == "url":  # the password only: where it points shows
                value, default = _mask_url_setting(value), _mask_url_setting(default)
            elif extra.get("sensitive") == "mapping":  # option names stay readable
                value, default = _mask_mapping(value), _mask_mapping(default)
            elif sensitive:
                value, default = mask(value), mask(default)
            elif isinstance(value, Path):
                value, default = str(value), str(default)
            dotted = f"{section_name}.{key}"
            description = field.description or ""
            if dotted in FORMER_KEYS:
                description += f" (was: {FORMER_KEYS[dotted]})"
            yield KeyInfo(
                key=dotted,
                value=value,
                default=default,
                description=description,
                sensitive=sensitive,
            )


def current_key(dotted: str) -> str:
    """``dotted`` under its current name; an old name logs a warning (once per process)."""
    new = RENAMED_KEYS.get(dotted)
    if new is None:
        return dotted
    if dotted not in _warned:
        _warned.add(dotted)
        log.warning(
            "config key %s was renamed to %s: the old name still works for now, but set %s "
            "instead (in ania.toml, %s, overrides or config_set)",
            dotted,
            new,
            new,
            env_name(new),
        )
    return new


def current_keys(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` keyed by current names; an old and a new name of one key must agree."""
    out: dict[str, Any] = {}
    for dotted, value in values.items():
        key = current_key(dotted)
        if key in out and out[key] != value:
            old = FORMER_KEYS[key]
            raise ConfigError(
                f"{old} and {key} are both set, to different values: {old} is the old name of "
                f"{key}; keep only {key}",
                key=key,
            )
        out[key] = value
    return out


def _mask_entries(entries: list[str]) -> list[str]:
    out = []
    for entry in entries:
        key, sep, value = entry.partition("=")
        out.append(f"{key}={mask(value)}" if sep else mask(entry))
    return out


def _mask_url_setting(value: SecretStr | None) -> str:
    return mask_url(value.get_secret_value()) if value is not None else ""


def _mask_mapping(values: Mapping[str, Any]) -> dict[str, str]:
    return {key: mask(value) for key, value in values.items()}


def _known() -> str:
    keys = [
        f"{name}.{key}"
        for name, field in Config.model_fields.items()
        for key in field.annotation.model_fields  # type: ignore[union-attr]
    ]
    return ", ".join(sorted(keys))


def _check_toml(path: Path) -> None:
    try:
        tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def _config_error(exc: ValidationError, *, source: str | None) -> ConfigError:
    lines = []
    first_key = None
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        first_key = first_key or key
        got = "" if err["type"] == "missing" else f" (got {err.get('input')!r})"
        if "api_key" in key or _sensitive_key(key):  # never echo a secret back
            got = ""
        variable = _env_variable(key)
        origin = f" — from the environment variable {variable}" if variable else ""
        message = err["msg"].removeprefix("Value error, ")  # pydantic's prefix says nothing
        lines.append(f"  {key}: {message}{got}{origin}")
    if source == "overrides":  # `with_overrides`: nothing else was read again
        where = " (in the overrides)"
    else:
        where = f" (overrides, ANIA_* environment or {source})" if source else ""
    return ConfigError(f"invalid configuration{where}:\n" + "\n".join(lines), key=first_key)


def _env_variable(dotted: str) -> str | None:
    """The set ``ANIA_…`` variable a dotted key's value came from (names match case-blind)."""
    wanted = env_name(dotted).upper()
    return next((name for name in os.environ if name.upper() == wanted), None)


def _warn_stray_env() -> None:
    """Warn once per ``ANIA_<SECTION>_…`` variable that names no setting (one ``_`` too few)."""
    sections = {name.upper(): name for name in Config.model_fields}
    for name in os.environ:
        upper = name.upper()
        if not upper.startswith("ANIA_") or name in _warned:
            continue
        section, sep, rest = upper[len("ANIA_") :].partition("_")
        if not sep or section not in sections:
            continue  # not meant as a setting (ANIA_TEST_…, ANIA_REQUIRE_POSTGRES)
        model = Config.model_fields[sections[section]].annotation
        keys = {k.upper() for k in getattr(model, "model_fields", {})}
        if rest.startswith("_") and rest[1:] in keys:
            continue  # ANIA_LLM__MODEL: a real key
        _warned.add(name)
        hint = f"; did you mean ANIA_{section}__{rest}?" if rest in keys else ""
        log.warning(
            "the environment variable %s names no setting (keys are ANIA_<SECTION>__<KEY>, "
            "two underscores after the section)%s",
            name,
            hint,
        )


def _sensitive_key(dotted: str) -> bool:
    section, _, rest = dotted.partition(".")
    field = Config.model_fields.get(section)
    model = getattr(field, "annotation", None)
    sub = getattr(model, "model_fields", {}).get(rest.partition(".")[0])
    extra = getattr(sub, "json_schema_extra", None)
    return isinstance(extra, dict) and bool(extra.get("sensitive"))
