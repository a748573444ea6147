"""Config sections of usage accounting: daily token quotas and per-model prices."""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from ._sections import Endpoint, Section, _secret


class QuotaSettings(Section):
    """Daily token limits per session and for all sessions, and the counters behind them."""

    enable: bool = Field(
        True,
        description="Count every run's tokens per session and day (needed by the limits and the "
        "usage view); the limits apply only when enabled.",
    )
    daily_tokens: int = Field(
        0, ge=0, description="Tokens one session may use per day; 0 = unlimited."
    )
    global_daily_tokens: int = Field(
        0, ge=0, description="Tokens all sessions together may use per day; 0 = unlimited."
    )
    timezone: str = Field(
        "",
        description="IANA time zone whose midnight starts a quota day, e.g. Asia/Shanghai; "
        "empty = the machine's local time.",
    )
    retention_days: int = Field(
        7,
        ge=1,
        le=3650,
        description="Days per-session counters are kept (pruned at start); daily totals stay.",
    )
    fallback_model: str = Field(
        "",
        description="Model that answers instead of refusing once a session's or everyone's "
        "daily tokens are used up (runs go on with it until the day resets); empty = refuse.",
    )
    fallback_base_url: str = Field(
        "", description="Endpoint of quota.fallback_model; empty = the main model's."
    )
    fallback_api_key: SecretStr | None = _secret(
        "API key of quota.fallback_base_url; empty = the main model's."
    )
    fallback_daily_tokens: int = Field(
        0,
        ge=0,
        description="Tokens one session may use per day on quota.fallback_model once its "
        "quota is used up; 0 = unlimited.",
    )
    fallback_global_daily_tokens: int = Field(
        0,
        ge=0,
        description="Tokens all sessions together may use per day on quota.fallback_model; "
        "0 = unlimited.",
    )
    fallback_notice: str | None = Field(
        None,
        max_length=500,
        description="Put before the first reply of a session each day that the fallback model "
        "answers; {model} and {resets} are filled in; unset = the built-in text in the chat's "
        "language (ui.language), empty = no notice.",
    )

    def fallback_endpoint(self) -> Endpoint:
        """quota.fallback_* as an endpoint (empty fields: the main model's, see `resolved`)."""
        return Endpoint(
            base_url=self.fallback_base_url,
            api_key=self.fallback_api_key,
            model=self.fallback_model,
        )

    @field_validator("fallback_model", "fallback_base_url")
    @classmethod
    def _stripped(cls, value: str) -> str:
        return value.strip()

    @field_validator("fallback_notice")
    @classmethod
    def _known_fields(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            value.format(model="m", resets="00:00")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"quota.fallback_notice may use only {{model}} and {{resets}} ({exc}); write "
                "{{ and }} for literal braces"
            ) from None
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        value = value.strip()
        if value:
            try:
                ZoneInfo(value)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(
                    f"unknown time zone {value!r}; use an IANA name like Asia/Shanghai or UTC"
                ) from None
        return value


class ModelPrice(BaseModel):
    """Prices of one model in money per million tokens."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0, description="Per million prompt tokens.")
    output: float = Field(ge=0, description="Per million completion tokens.")
    cached: float | None = Field(
        None, ge=0, description="Per million cached prompt tokens; unset = the input price."
    )


class PricingSettings(Section):
    """Per-model prices; a model without an entry has no cost shown (never a guess)."""

    models: dict[str, ModelPrice] = Field(
        default_factory=dict,
        description='Prices per million tokens by model name, e.g. {"gpt-4o": {"input": 2.5, '
        '"output": 10, "cached": 1.25}}; in ania.toml: [pricing.models."gpt-4o"].',
    )
    currency: str = Field("$", max_length=8, description="Symbol shown before costs.")
