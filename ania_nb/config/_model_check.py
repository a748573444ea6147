"""What the main model's settings lack: the part of the first-run checks every front end shares.

ania-nb has no default vendor: ``llm.base_url`` and ``llm.model`` start empty. The notebook's
first run, ``ania-nb serve`` before it connects, and every LLM client built from a config name
what is missing instead of failing a request later. Pure functions of the config (no I/O); each
front end words its own "where to set it" (a kernel has ``%ania config set``, serve has not).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..addresses import ip_of, is_loopback
from ..errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from ._sections import ResolvedEndpoint
    from ._settings import Config

MODEL_KEY_EXAMPLES = {
    "llm.base_url": "http://127.0.0.1:8080/v1",
    "llm.model": "your-model",
    "llm.api_key": "sk-…",
}
"""A value to show for each key in the messages (a local server: no vendor is suggested)."""


def env_name(key: str) -> str:
    """The environment variable of a dotted key: ``llm.base_url`` → ``ANIA_LLM__BASE_URL``."""
    return "ANIA_" + key.upper().replace(".", "__")


def join_keys(keys: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + " and " + keys[-1]


def is_local(host: str) -> bool:
    """Whether ``host`` is this machine or a private network (where servers need no key)."""
    if is_loopback(host) or host.lower().endswith((".localhost", ".local")):
        return True
    address = ip_of(host)
    return address is not None and (address.is_private or address.is_link_local)


def api_key_set(config: Config) -> bool:
    """Whether ``llm.api_key`` holds more than blanks."""
    key = config.llm.api_key
    return bool(key and key.get_secret_value().strip())


def missing_model_keys(config: Config) -> list[str]:
    """The ``llm.*`` keys a first run needs and lacks, in the order to set them.

    ``llm.api_key`` counts as missing unless it is set or ``llm.base_url`` names a server on
    this machine or a private network (an unset base URL may be hosted: the key is named too).
    """
    llm = config.llm
    base_url = llm.base_url.strip()
    wanted = (("llm.base_url", base_url), ("llm.model", llm.model))
    missing = [key for key, value in wanted if not value.strip()]
    if not api_key_set(config) and not (base_url and is_local(urlsplit(base_url).hostname or "")):
        missing.append("llm.api_key")
    return missing


def require_endpoint(endpoint: ResolvedEndpoint, role: str = "llm") -> None:
    """Raise `ConfigError` naming ``llm.base_url`` / ``llm.model`` when ``endpoint`` lacks them.

    ``endpoint`` is a role's, with the main model's values filled in (`Endpoint.resolved`).
    """
    missing = [
        key
        for key, value in (("llm.base_url", endpoint.base_url), ("llm.model", endpoint.model))
        if not value
    ]
    if not missing:
        return
    own = "" if role == "llm" else f" ({role} has none of its own either)"
    verb = "is" if len(missing) == 1 else "are"
    toml = "  ".join(f'{key.partition(".")[2]} = "{MODEL_KEY_EXAMPLES[key]}"' for key in missing)
    env = "  ".join(f"{env_name(key)}=…" for key in missing)
    code = ", ".join(f"{key.partition('.')[2]}=…" for key in missing)
    magic = " ".join(f"{key}=…" for key in missing)
    raise ConfigError(
        f"{join_keys(missing)} {verb} not set{own}: ania-nb has no default model. Point it at an "
        "OpenAI-compatible Chat Completions endpoint (with llm.api_key if it needs one) in one "
        "of three ways:\n"
        f"  • ania.toml:        [llm]  {toml}\n"
        f"  • the environment:  {env}\n"
        f"  • in code:          Agent({code}); in a notebook: %ania config set {magic}",
        key=missing[0],
    )
