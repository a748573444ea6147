"""The environment child processes start with.

Child processes are bash (sandboxed or not), shell hooks, stdio MCP servers and
``@tool(process=True)`` children. They get a cleared environment, not this process's: only
`BASE_ENV` (PATH, HOME, the user and shell, terminal, time zone, temporary folder, locale) plus
the variables ``security.pass_env`` names (names or glob patterns, case-insensitive; ``["*"]``
passes everything). A pattern never passes a variable ``security.secret_env`` matches (API keys,
tokens, passwords); a name written out exactly does. ania-nb's own ``ANIA_*`` settings never pass
(they hold the model API keys). Entries configured for one child on purpose (``bash.env``, an MCP
server's ``env``) are added afterwards, so they always reach it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .config import SecuritySettings

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# What every child gets when set here: enough to find programs, the home folder and the locale.
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "TZ", "TMPDIR", "LANG", "LC_*")
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
    """The cleared environment for a child (see the module docstring).

    `BASE_ENV` and ``pass_env`` of the current environment (or ``base``), never ``ANIA_*`` or a
    secret a pattern matched, plus ``extra``: a mapping or ``KEY=VALUE`` strings (entries
    without ``=`` are ignored); ``settings`` None means nothing passed beyond `BASE_ENV`, and
    the default secret patterns.
    """
    passed = () if settings is None else tuple(settings.pass_env)
    secrets = DEFAULT_SECRET_ENV if settings is None else tuple(settings.secret_env)
    exact = {p.upper() for p in passed if not any(c in p for c in "*?[")}
    source = os.environ if base is None else base
    env = {}
    for key, value in source.items():
        upper = key.upper()
        if _matches(upper, ALWAYS_REMOVED):  # never, not even by name
            continue
        if upper in exact or (
            _matches(upper, (*BASE_ENV, *passed)) and not _matches(upper, secrets)
        ):
            env[key] = value
    env.setdefault("PATH", DEFAULT_PATH)
    if isinstance(extra, Mapping):
        env.update({str(k): str(v) for k, v in extra.items()})
    elif extra is not None:
        for entry in extra:
            key, sep, value = entry.partition("=")
            if sep and key:
                env[key] = value
    return env


def _matches(upper_name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(upper_name, p.upper()) for p in patterns)


# Variables that name a credential file or folder (or the ssh agent's socket): what they point
# to is hidden in the bash sandbox and refused by the file tools, wherever it is.
SECRET_FILE_ENV = (
    "PGPASSFILE",
    "PGSERVICEFILE",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "CLOUDSDK_CONFIG",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AZURE_CONFIG_DIR",
    "KUBECONFIG",
    "DOCKER_CONFIG",
    "NETRC",
    "GNUPGHOME",
    "PASSWORD_STORE_DIR",
    "NPM_CONFIG_USERCONFIG",
    "SSH_AUTH_SOCK",
)


def secret_file_paths(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The files and folders `SECRET_FILE_ENV` variables name (KUBECONFIG may list several)."""
    source = os.environ if environ is None else environ
    found = []
    for name in SECRET_FILE_ENV:
        for item in source.get(name, "").split(os.pathsep if name == "KUBECONFIG" else "\0"):
            if item.strip():
                found.append(Path(item.strip()).expanduser())
    return found
