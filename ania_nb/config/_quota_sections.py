"""Config sections of usage accounting: daily token quotas and per-model prices."""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ._sections import Section


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
