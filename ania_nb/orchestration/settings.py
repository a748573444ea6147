"""How an Agent's settings are assembled from their layers.

Lowest first: the given `Config` (else ``ania.toml`` + ``ANIA_…`` environment), the values the AI
saved with ``config_set`` (read from the data directory's store), then the keyword shortcuts
and ``overrides`` passed to `Agent`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import Config
from ..errors import UsageError
from ..governance.config_tools import apply_persisted, read_persisted_overrides

SHORTCUTS = {
    "base_url": "llm.base_url",
    "api_key": "llm.api_key",
    "model": "llm.model",
    "data_dir": "store.data_dir",
}


def resolve_config(
    config: Config | None, shortcuts: Mapping[str, Any], overrides: Mapping[str, Any] | None
) -> Config:
    """The Agent's effective config; unknown shortcut names raise `UsageError`."""
    unknown = sorted(set(shortcuts) - set(SHORTCUTS))
    if unknown:
        raise UsageError(
            f"unknown Agent argument(s) {unknown}; use one of {sorted(SHORTCUTS)} "
            "or overrides={'section.key': value}"
        )
    dotted = {SHORTCUTS[k]: v for k, v in shortcuts.items()}
    dotted.update(overrides or {})
    base = config if config is not None else Config.load()
    resolved = base.with_overrides(dotted) if dotted else base
    saved = read_persisted_overrides(resolved.store.data_dir)
    return apply_persisted(base, saved, dotted) if saved else resolved
