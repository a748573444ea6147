"""The one place that decides which setting wins.

Lowest first:

1. the defaults of each key;
2. ``ania.toml`` (or the file given to `Config.load`);
3. the environment (``ANIA_<SECTION>__<KEY>``);
4. values saved by the ``config_set`` tool, kept in the data directory's store;
5. keyword overrides passed to `Agent` (``model=``, ``overrides={"agent.max_iterations": 5}``).

Layers 1–3 make the *base* `Config`; layer 5 is *explicit*. The saved values (layer 4) are read
from the store when the Agent opens it, asynchronously, and applied by `ConfigLayers.resolve`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ._settings import RENAMED_KEYS, Config, current_key, current_keys

log = logging.getLogger(__name__)

SAVED_CONFIG_NAMESPACE = "config"
"""The store's KV namespace where ``config_set`` keeps its values."""
UNSAVABLE_KEYS = frozenset({"store.data_dir", "store.url"})
"""Keys ``config_set`` may not save: the saved values live in the store itself."""


@dataclass(frozen=True)
class ConfigLayers:
    """An Agent's settings before the saved values are known: the base and the explicit layer."""

    base: Config
    explicit: Mapping[str, Any] = field(default_factory=dict)

    def resolve(self, saved: Mapping[str, Any] | None = None) -> Config:
        """The effective config: base < ``saved`` < explicit.

        Each saved value is validated on its own; a bad one is skipped with a warning.
        """
        config = self.base
        explicit = current_keys(self.explicit)
        for key, value in sorted(_saved_by_current_name(saved or {}).items()):
            if key in explicit or key in UNSAVABLE_KEYS:
                continue
            try:
                config = config.with_overrides({key: value})
            except ConfigError as exc:
                log.warning("ignoring the saved config value of %s: %s", key, exc)
        return config.with_overrides(explicit) if explicit else config


def _saved_by_current_name(saved: Mapping[str, Any]) -> dict[str, Any]:
    """Saved values keyed by current names; one saved under a key's new name wins over its old.

    An older ania-nb saved under the old names; `config_set` now saves under the new one and
    drops the old, so both exist only when that drop failed.
    """
    out = {current_key(k): v for k, v in saved.items() if k in RENAMED_KEYS}
    out.update({k: v for k, v in saved.items() if k not in RENAMED_KEYS})
    return out
