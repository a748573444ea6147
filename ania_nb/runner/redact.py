"""Secrets stay out of ``ania-nb serve``'s log, at every log level.

Two layers. Third-party loggers that print request lines, headers or whole frames at DEBUG
(websockets' handshake with the OneBot token, the HTTP and model clients, MCP) are capped at
INFO by `serve.configure_logging`, so those lines are never made. And `SecretRedactor`, the
formatter of the log handler, blanks every known secret in every formatted record, message and
traceback alike, whatever logger made it:

- every ``SecretStr`` setting of the config (the model, fallback, vision, one-shot and
  embedding API keys, the web token, the meme key, ``runner.access_token``, ``store.url``, the
  values of ``kb.storage_options``), and the password and secret-looking query values
  (``access_token=…``, ``api_key=…``, ``password=…``) of any URL setting, secret or not;
- the MCP servers' header and env values, as written and as expanded from the environment, the
  credential of an ``Authorization``-style value alone, and the secrets of their URLs.

Each is blanked in the forms it travels in: raw, URL-quoted (``quote``/``quote_plus``), base64
(standard and URL-safe, padded or not) and JSON-escaped. Values shorter than `MIN_SECRET`
characters are not blanked (they are not credentials, and blanking ``"1"`` would blank every
digit of the log).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlsplit

from pydantic import BaseModel, SecretStr

from ..governance.secrets import secret_key

if TYPE_CHECKING:
    from ..agent import Agent
    from ..mcp.config import MCPServerConfig

MIN_SECRET = 6
MASK = "***"
SecretSource = Callable[[], Iterable[str]]


def secret_forms(secret: str) -> set[str]:
    """The spellings of ``secret`` a log line may carry (see the module docstring)."""
    if len(secret) < MIN_SECRET:
        return set()
    raw = secret.encode("utf-8")
    forms = {
        secret,
        quote(secret, safe=""),
        quote(secret),
        quote_plus(secret),
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
    }
    for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        text = encoded.decode("ascii")
        forms |= {text, text.rstrip("=")}
    return {form for form in forms if len(form) >= MIN_SECRET}


def url_secrets(url: str) -> list[str]:
    """The password and the secret-looking query values of a URL (none for other text)."""
    if "://" not in url:
        return []
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return []
    found = [password, unquote(password)] if password else []  # as written and as decoded
    found += [value for name, value in parse_qsl(parts.query) if value and secret_key(name)]
    return found


def shown_url(url: str) -> str:
    """``url`` for a log line or an error: its password and secret query values as ``***``."""
    shown = url
    for secret in url_secrets(url):
        for form in sorted({quote(secret, safe=""), quote_plus(secret), secret}, key=len)[::-1]:
            shown = shown.replace(form, MASK)
    return shown


def config_secrets(node: Any) -> Iterator[str]:
    """Every ``SecretStr`` value of a settings tree, and the secrets of its URL values."""
    if isinstance(node, SecretStr):
        yield node.get_secret_value()
        yield from url_secrets(node.get_secret_value())  # store.url's password on its own
    elif isinstance(node, BaseModel):
        for name in type(node).model_fields:
            yield from config_secrets(getattr(node, name, None))
    elif isinstance(node, dict):
        for value in node.values():
            yield from config_secrets(value)
    elif isinstance(node, list | tuple):
        for value in node:
            yield from config_secrets(value)
    elif isinstance(node, str):
        yield from url_secrets(node)


def header_secrets(values: Iterable[str]) -> Iterator[str]:
    """Header or env values, and the credential of a ``Bearer xyz``-style value on its own."""
    for value in values:
        yield value
        scheme, _, credential = value.strip().partition(" ")
        if credential and scheme.isalpha():
            yield credential.strip()


class MCPSecrets:
    """The header, env and URL secrets of an Agent's MCP servers, as they are now.

    Called for every log record: the servers' configs are re-read only when one was added,
    removed or replaced since the last call.
    """

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._seen: tuple[int, ...] = ()
        self._values: list[str] = []

    def __call__(self) -> list[str]:
        """The secrets of the servers the Agent knows now."""
        registry = self.agent.mcp
        if registry is None:
            return []
        managers = [registry.get(status.name) for status in registry.servers()]
        configs = [m.config for m in managers if m is not None]
        seen = tuple(id(config) for config in configs)
        if seen != self._seen:
            self._values = [value for config in configs for value in server_secrets(config)]
            self._seen = seen
        return self._values


def server_secrets(server: MCPServerConfig) -> Iterator[str]:
    """One MCP server's header and env values and URL secrets, written and expanded."""
    from ..errors import ConfigError
    from ..mcp.config import expand_env

    try:
        forms = [server, expand_env(server)]
    except ConfigError:  # an unset ${VAR}: only the written values exist
        forms = [server]
    for form in forms:
        yield from header_secrets([*form.headers.values(), *form.env.values()])
        yield from url_secrets(form.endpoint or "")


class SecretRedactor(logging.Formatter):
    """A formatter that blanks every secret its sources name (see the module docstring).

    Fixed secrets (the config's) are given once with `add_secrets`; sources (the MCP servers')
    are asked on every record, so a secret that appears later (a server added at run time) is
    blanked from then on. The spellings are rebuilt only when the set of secrets changes.
    """

    def __init__(self, fmt: str | None = None, datefmt: str | None = None) -> None:
        super().__init__(fmt, datefmt)
        self._fixed: set[str] = set()
        self._sources: list[SecretSource] = []
        self._known: frozenset[str] = frozenset()
        self._forms: list[str] = []

    def add_secrets(self, values: Iterable[str]) -> None:
        """Blank these values from now on."""
        self._fixed.update(values)

    def add_source(self, source: SecretSource) -> None:
        """Blank the values ``source()`` returns (asked again for every record) from now on."""
        self._sources.append(source)

    def format(self, record: logging.LogRecord) -> str:
        """The formatted record (message, traceback, stack) with every secret blanked."""
        return self.redact(super().format(record))

    def redact(self, text: str) -> str:
        """``text`` with every spelling of every known secret replaced by ``***``."""
        for form in self._current_forms():
            if form in text:
                text = text.replace(form, MASK)
        return text

    def _current_forms(self) -> list[str]:
        values = set(self._fixed)
        for source in self._sources:
            try:
                values.update(v for v in source() if isinstance(v, str))
            except Exception:  # a source read mid-change (another thread): the last known set
                return self._forms
        known = frozenset(values)
        if known != self._known:
            forms = set().union(*(secret_forms(value) for value in known)) if known else set()
            self._forms = sorted(forms, key=len, reverse=True)  # longest first: no half-blanks
            self._known = known
        return self._forms
