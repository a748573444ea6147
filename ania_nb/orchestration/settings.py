"""How an Agent's arguments become its config layers (the precedence lives in `ConfigLayers`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import Config, ConfigLayers
from ..errors import UsageError

SHORTCUTS = {
    "base_url": "llm.base_url",
    "api_key": "llm.api_key",
    "model": "llm.model",
    "data_dir": "store.data_dir",
}


def resolve_config(
    config: Config | None, shortcuts: Mapping[str, Any], overrides: Mapping[str, Any] | None
) -> ConfigLayers:
    """The Agent's config layers; unknown shortcut names or keys raise `UsageError`."""
    unknown = sorted(set(shortcuts) - set(SHORTCUTS))
    if unknown:
        raise UsageError(
            f"unknown Agent argument(s) {unknown}; use one of {sorted(SHORTCUTS)} "
            "or overrides={'section.key': value}"
        )
    dotted = {SHORTCUTS[k]: v for k, v in shortcuts.items()}
    dotted.update(overrides or {})
    layers = ConfigLayers(config if config is not None else Config.load(), dotted)
    layers.resolve()  # bad explicit keys or values fail here, at construction
    return layers
