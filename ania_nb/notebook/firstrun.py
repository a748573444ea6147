"""The first run explains itself: before ``%%agent`` talks to the model, check that it can.

Three things stop a new user's first run: no model configured (ania-nb has no default vendor:
``llm.base_url`` and ``llm.model`` start empty), no API key for a hosted endpoint, and an
endpoint that cannot be reached (a machine without internet, a local server that is not
started). Found out by the LLM client, each costs a run of retries and ends in a generic
connection error; `FirstRun.check` finds them in well under a second (a TCP connect, no request)
and says what is missing and where to set it. Which keys are missing is decided below the front
ends (`ania_nb.config.missing_model_keys`, also used by ``ania-nb serve``). A check that passed
is not repeated for the same endpoint and key.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

from ..config import (
    MODEL_KEY_EXAMPLES,
    api_key_set,
    env_name,
    is_local,
    join_keys,
    missing_model_keys,
)
from ..errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config

__all__ = ["FirstRun", "api_key_set", "is_local", "missing_settings", "unreachable"]

CONNECT_TIMEOUT = 3.0  # seconds: a reachable endpoint answers a TCP connect far sooner


def where_to_set(keys: list[str], examples: dict[str, str] | None = None) -> str:
    """The three places a notebook user can set ``keys`` (``llm.*``), with example values."""
    shown = {key: (examples or {}).get(key, MODEL_KEY_EXAMPLES[key]) for key in keys}
    pad = " " * 39
    toml = f"\n{pad}".join(f'{key.partition(".")[2]} = "{value}"' for key, value in shown.items())
    env = " ".join(f"{env_name(key)}={value}" for key, value in shown.items())
    magic = " ".join(f"{key}={value}" for key, value in shown.items())
    return (
        f"Set {'it' if len(keys) == 1 else 'them'} in one of these:\n"
        f"  • ania.toml next to this notebook:   [llm]\n{pad}{toml}\n"
        f"  • the environment, before starting Jupyter:   {env}\n"
        f"  • this kernel only:   %ania config set {magic}"
    )


def missing_settings(config: Config) -> str | None:
    """What the model settings lack (base URL, model, a hosted key) and where to set it, or None."""
    missing = missing_model_keys(config)
    unset = [key for key in missing if key != "llm.api_key"]
    if unset:
        verb = "is" if len(unset) == 1 else "are"
        key_note = (
            " Set llm.api_key too if the endpoint needs one (hosted ones do; a server on this "
            "machine or a private network usually does not)."
            if "llm.api_key" in missing
            else ""
        )
        return (
            f"{join_keys(unset)} {verb} not set: ania-nb has no default model. Point it at any "
            f"OpenAI-compatible Chat Completions endpoint.{key_note}\n" + where_to_set(unset)
        )
    if missing:  # only the key: a hosted endpoint
        return (
            f"llm.api_key is empty, and the endpoint {config.llm.base_url} needs one.\n"
            + where_to_set(["llm.api_key"])
            + "\nFor a local model (llama.cpp, Ollama) set llm.base_url instead, e.g. "
            "%ania config set llm.base_url=http://127.0.0.1:8080/v1"
        )
    return None


async def unreachable(base_url: str, within: float = CONNECT_TIMEOUT) -> str | None:
    """Why ``base_url`` cannot be connected to (one TCP connect), or None when it can.

    Skipped (None) when a proxy would carry the request: the proxy, not a direct connect,
    decides then, and the client reports its errors.
    """
    parts = urlsplit(base_url)
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        return "it is not an http:// or https:// address"
    if parts.scheme in getproxies() and not proxy_bypass(host):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), within)
    except TimeoutError:
        return f"no answer from {host}:{port} within {within:g} s"
    except socket.gaierror:
        return f"the host name {host!r} cannot be resolved (no network, or a typo)"
    except OSError as exc:
        return f"{host}:{port} refused the connection ({exc.strerror or exc})"
    writer.close()
    with contextlib.suppress(OSError):  # the peer may have gone: the connect is what mattered
        await writer.wait_closed()
    return None


class FirstRun:
    """Checks a notebook's model settings before a run; remembers the ones that passed."""

    def __init__(self, timeout: float = CONNECT_TIMEOUT) -> None:
        self.timeout = timeout
        self._passed: set[tuple[str, str, bool]] = set()

    async def problem(self, config: Config) -> tuple[str, str] | None:
        """The key at fault and what stops a run with ``config`` (how to fix it), or None."""
        message = missing_settings(config)
        if message is not None:
            return missing_model_keys(config)[0], message
        why = await unreachable(config.llm.base_url, self.timeout)
        if why is None:
            return None
        return "llm.base_url", (
            f"cannot reach the model endpoint llm.base_url = {config.llm.base_url}: {why}.\n"
            "Start the server (e.g. llama-server --jinja --port 8080), or point llm.base_url "
            "at a reachable one.\n" + where_to_set(["llm.base_url"])
        )

    async def check(self, config: Config) -> None:
        """Raise `ConfigError` when the model cannot be reached as ``config`` says.

        Its ``key`` is the first of llm.base_url, llm.model, llm.api_key at fault; the message
        says what to set and where.
        """
        seen = (config.llm.base_url, config.llm.model, api_key_set(config))
        if seen in self._passed:
            return
        problem = await self.problem(config)
        if problem is not None:
            key, message = problem
            raise ConfigError(message, key=key)
        self._passed.add(seen)
