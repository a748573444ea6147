"""Optional dependencies: check that an extra is installed without importing it."""

from __future__ import annotations

import importlib.util

from .errors import MissingExtraError

# What each extra provides that ania-nb imports (top-level module names).
EXTRAS: dict[str, tuple[str, ...]] = {
    "notebook": ("IPython", "ipykernel", "ipywidgets"),
    "postgres": ("psycopg", "psycopg_pool"),  # store.url = postgresql://…
}


def require_extra(extra: str, feature: str) -> None:
    """Raise `MissingExtraError` naming ``pip install "ania-nb[<extra>]"`` if a module is absent."""
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken install, or a module blocked in sys.modules
            found = False
        if not found:
            raise MissingExtraError(
                f"{feature} needs the {module!r} package, which is not installed. Install the "
                f'{extra} extra: pip install "ania-nb[{extra}]"',
                extra=extra,
                name=module,
            )
