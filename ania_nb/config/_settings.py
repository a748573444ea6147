"""`Config`: every setting, from defaults < `ania.toml` < `ANIA_…` environment < overrides.

Keys are grouped in sections (``llm``, ``fallback``, ``compressor``, ``retry``, ``agent``,
``store``); in the environment a section and its key are joined with ``__``, e.g.
``ANIA_LLM__API_KEY``. Sensitive keys are ``SecretStr`` and marked ``sensitive`` so every display
masks them.
"""

from __future__ import annotations

import contextvars
import os
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ..errors import ConfigError

DEFAULT_CONFIG_FILE = "ania.toml"
_toml_path: contextvars.ContextVar[Path | None] = contextvars.ContextVar("ania_toml", default=None)


def _secret(description: str) -> Any:
    """A sensitive field: masked whenever shown."""
    return Field(default=None, description=description, json_schema_extra={"sensitive": True})


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LLMSettings(_Section):
    """The main chat model (any OpenAI-compatible Chat Completions endpoint)."""

    base_url: str = Field("https://api.deepseek.com", description="Endpoint base URL.")
    api_key: SecretStr | None = _secret("API key sent as a Bearer token.")
    model: str = Field("deepseek-chat", description="Model name.")
    temperature: float | None = Field(
        1.2, description="Sampling temperature; unset = provider default."
    )
    top_p: float | None = Field(0.9, description="Nucleus sampling; unset = provider default.")
    max_tokens: int | None = Field(8192, gt=0, description="Completion token cap per call.")
    timeout: float = Field(120.0, gt=0, description="Seconds one HTTP request may take.")
    stream: bool = Field(True, description="Stream replies so front ends can show text live.")


class EndpointSettings(_Section):
    """A secondary model; empty fields inherit the main model's values."""

    base_url: str = Field("", description="Endpoint base URL; empty = the main model's.")
    api_key: SecretStr | None = _secret("API key; empty = the main model's.")
    model: str = Field("", description="Model name; empty disables this role.")


class RetrySettings(_Section):
    """Retries on 429, 5xx and network errors, with base·2ⁿ backoff (capped) plus jitter."""

    max_attempts: int = Field(
        3, ge=1, le=10, description="Attempts per model call, first included."
    )
    base_delay: float = Field(2.0, ge=0, description="Seconds before the first retry.")
    max_delay: float = Field(30.0, ge=0, description="Cap on one backoff delay, before jitter.")


class AgentSettings(_Section):
    """Limits of one agent run."""

    max_iterations: int = Field(20, ge=1, le=200, description="LLM rounds before the final answer.")
    max_context_tokens: int = Field(
        128000, ge=0, description="Context budget; 0 disables compression."
    )
    compress_ratio: float = Field(
        0.8, gt=0, lt=1, description="Compress history above this share of the budget."
    )
    run_timeout: float = Field(300.0, gt=0, description="Seconds one chat request may take.")
    queue_size: int = Field(
        20, ge=0, le=1000, description="Messages a busy session queues before refusing."
    )
    system_prompt: str = Field("", description="System prompt; empty = the built-in prompt.")


class StoreSettings(_Section):
    """The embedded store."""

    data_dir: Path = Field(Path(".ania"), description="Folder for the database and vectors.")
    run_log_max_entries: int = Field(200, ge=1, description="Run records kept (oldest evicted).")


class Config(BaseSettings):
    """All settings of ania-nb; see `Config.describe()` for every key with its default."""

    model_config = SettingsConfigDict(
        env_prefix="ANIA_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_assignment=True,
    )

    llm: LLMSettings = Field(default_factory=LLMSettings, description="Main chat model.")
    fallback: EndpointSettings = Field(
        default_factory=EndpointSettings, description="Model tried once when the main one fails."
    )
    compressor: EndpointSettings = Field(
        default_factory=EndpointSettings, description="Model that summarises long histories."
    )
    retry: RetrySettings = Field(default_factory=RetrySettings, description="Retry policy.")
    agent: AgentSettings = Field(default_factory=AgentSettings, description="Run limits.")
    store: StoreSettings = Field(default_factory=StoreSettings, description="Embedded store.")

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
        token = _toml_path.set(toml if toml.is_file() else None)
        try:
            return cls(**overrides)
        except ValidationError as exc:
            raise _config_error(exc, source=str(toml) if toml.is_file() else None) from None
        finally:
            _toml_path.reset(token)

    def with_overrides(self, overrides: Mapping[str, Any]) -> Config:
        """Return a copy with dotted keys replaced, e.g. ``{"llm.model": "gpt-4o"}``; validated."""
        data = self.model_dump()
        for dotted, value in overrides.items():
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
            return type(self).model_validate(data)
        except ValidationError as exc:
            raise _config_error(exc, source="overrides") from None

    def get(self, dotted: str) -> Any:
        """Value of a dotted key (secrets stay `SecretStr`)."""
        section, _, key = dotted.partition(".")
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
            if sensitive:
                value, default = mask(value), mask(default)
            elif isinstance(value, Path):
                value, default = str(value), str(default)
            yield KeyInfo(
                key=f"{section_name}.{key}",
                value=value,
                default=default,
                description=field.description or "",
                sensitive=sensitive,
            )


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
        if "api_key" in key:  # never echo a secret back
            got = ""
        lines.append(f"  {key}: {err['msg']}{got}")
    where = f" (overrides, ANIA_* environment or {source})" if source else ""
    return ConfigError(f"invalid configuration{where}:\n" + "\n".join(lines), key=first_key)
