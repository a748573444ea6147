"""The first run explains itself: before ``%%agent`` talks to the model, check that it can.

Two things stop a new user's first run: no API key for a hosted endpoint, and an endpoint that
cannot be reached (the default one from a machine without internet, a local server that is not
started). Found out by the LLM client, each costs a run of retries and ends in a generic
connection error; `FirstRun.check` finds them in well under a second (a TCP connect, no request)
and says what is missing and where to set it. A check that passed is not repeated for the same
endpoint and key.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

from ..addresses import ip_of, is_loopback
from ..errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config

CONNECT_TIMEOUT = 3.0  # seconds: a reachable endpoint answers a TCP connect far sooner

WHERE_TO_SET = """\
Set it in one of these:
  • ania.toml next to this notebook:   [llm]
                                       {key} = "{example}"
  • the environment, before starting Jupyter:   {env}={example}
  • this kernel only:   %ania config set llm.{key}={example}"""


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


def missing_key(config: Config) -> str | None:
    """The message for an empty ``llm.api_key`` on an endpoint that needs one, else None."""
    host = urlsplit(config.llm.base_url).hostname or ""
    if api_key_set(config) or is_local(host):
        return None
    return (
        f"llm.api_key is empty, and the endpoint {config.llm.base_url} needs one.\n"
        + WHERE_TO_SET.format(key="api_key", example="sk-…", env="ANIA_LLM__API_KEY")
        + "\nFor a local model (llama.cpp, Ollama) set llm.base_url instead, e.g. "
        "%ania config set llm.base_url=http://127.0.0.1:8080/v1"
    )


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
        self._passed: set[tuple[str, bool]] = set()

    async def problem(self, config: Config) -> str | None:
        """What stops a run with ``config`` and how to fix it, or None (not remembered)."""
        message = missing_key(config)
        if message is not None:
            return message
        why = await unreachable(config.llm.base_url, self.timeout)
        if why is None:
            return None
        return (
            f"cannot reach the model endpoint llm.base_url = {config.llm.base_url}: {why}.\n"
            "Start the server (e.g. llama-server --jinja --port 8080), or point llm.base_url "
            "at a reachable one.\n"
            + WHERE_TO_SET.format(
                key="base_url", example="http://127.0.0.1:8080/v1", env="ANIA_LLM__BASE_URL"
            )
        )

    async def check(self, config: Config) -> None:
        """Raise `ConfigError` when the model cannot be reached as ``config`` says.

        Its ``key`` is llm.api_key or llm.base_url; the message says what to set and where.
        """
        seen = (config.llm.base_url, api_key_set(config))
        if seen in self._passed:
            return
        message = await self.problem(config)
        if message is not None:
            key = "llm.api_key" if message.startswith("llm.api_key") else "llm.base_url"
            raise ConfigError(message, key=key)
        self._passed.add(seen)
