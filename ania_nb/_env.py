"""The environment child processes (bash, shell hooks, stdio MCP servers) start with.

They inherit this process's environment minus ania-nb's own ``ANIA_*`` settings (they hold the
model API keys) and every variable named by ``security.secret_env`` (names or glob patterns,
matched case-insensitively). Entries configured for one child on purpose (``bash.env``, an MCP
server's ``env``) are added afterwards, so they always reach it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .config import SecuritySettings

ALWAYS_REMOVED = ("ANIA_*",)

DEFAULT_SECRET_ENV: tuple[str, ...] = (
    "*_API_KEY",
    "*_APIKEY",
    "*_TOKEN",
    "*_TOKENS",
    "TOKEN",
    "*_SECRET*",
    "SECRET*",
    "*PASSWORD*",
    "*PASSWD*",
    "*_ACCESS_KEY*",
    "*_PRIVATE_KEY*",
    "*CREDENTIAL*",
    "*_AUTH",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "DEEPSEEK_API_KEY",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "HF_TOKEN",
    "NPM_TOKEN",
    "PGPASSWORD",
    "DATABASE_URL",
)


def is_secret_name(name: str, patterns: Iterable[str] = DEFAULT_SECRET_ENV) -> bool:
    """Whether an environment variable name matches ``ANIA_*`` or one of ``patterns``."""
    upper = name.upper()
    return any(fnmatchcase(upper, p.upper()) for p in (*ALWAYS_REMOVED, *patterns))


def child_env(
    settings: SecuritySettings | None = None,
    extra: Mapping[str, str] | Iterable[str] | None = None,
    *,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The current environment (or ``base``) without secrets, plus ``extra`` entries.

    ``extra`` is a mapping or ``KEY=VALUE`` strings (entries without ``=`` are ignored);
    ``settings`` None means the default secret patterns.
    """
    patterns = DEFAULT_SECRET_ENV if settings is None else tuple(settings.secret_env)
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not is_secret_name(k, patterns)}
    if isinstance(extra, Mapping):
        env.update({str(k): str(v) for k, v in extra.items()})
    elif extra is not None:
        for entry in extra:
            key, sep, value = entry.partition("=")
            if sep and key:
                env[key] = value
    return env
