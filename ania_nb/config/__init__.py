"""Configuration: `Config` and its sections."""

from ._settings import (
    DEFAULT_CONFIG_FILE,
    AgentSettings,
    Config,
    EndpointSettings,
    KeyInfo,
    LLMSettings,
    RetrySettings,
    StoreSettings,
    mask,
)

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "AgentSettings",
    "Config",
    "EndpointSettings",
    "KeyInfo",
    "LLMSettings",
    "RetrySettings",
    "StoreSettings",
    "mask",
]
