"""Configuration: `Config` and its sections."""

from ._sections import (
    AgentSettings,
    ApprovalSettings,
    BashSettings,
    EndpointSettings,
    FileSettings,
    LLMSettings,
    MCPSettings,
    MemeSettings,
    RetrySettings,
    Section,
    SkillSettings,
    StoreSettings,
    VisionSettings,
    WebSettings,
)
from ._settings import DEFAULT_CONFIG_FILE, Config, KeyInfo, mask

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "AgentSettings",
    "ApprovalSettings",
    "BashSettings",
    "Config",
    "EndpointSettings",
    "FileSettings",
    "KeyInfo",
    "LLMSettings",
    "MCPSettings",
    "MemeSettings",
    "RetrySettings",
    "Section",
    "SkillSettings",
    "StoreSettings",
    "VisionSettings",
    "WebSettings",
    "mask",
]
