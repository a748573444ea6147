"""Where the store and the knowledge base live: ``store.url`` and ``kb.uri``, checked and masked.

Pure string work: no database driver or LanceDB is imported here. A ``store.url`` is a libpq
URL (``postgresql://user:password@host:5432/db?sslmode=…``); its password may sit in the
userinfo or in a ``password``/``sslpassword`` query parameter, and `ania_nb.addresses.mask_url`
hides both. libpq
also reads a password from ``PGPASSFILE`` (or ``~/.pgpass``, or the URL's ``passfile``), so the
URL needs none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, unquote

from ..addresses import url_scheme

STORE_URL_SCHEMES = ("postgresql", "postgres")
KB_URI_SCHEMES = ("s3", "s3+ddb", "gs", "az", "file")
# Query parameters of a libpq URL naming a secret file.
SECRET_FILE_QUERY_KEYS = frozenset({"passfile", "sslkey"})
DEFAULT_SOCKET_DIRS = (Path("/run/postgresql"), Path("/var/run/postgresql"))  # Debian's libpq


def check_store_url(text: str) -> str:
    """``text`` stripped if empty or a PostgreSQL URL; a ValueError naming only the scheme."""
    text = text.strip()
    if not text:
        return ""
    scheme = url_scheme(text)
    if scheme not in STORE_URL_SCHEMES:
        got = f"a {scheme}:// URL" if scheme else "text that is not a URL"
        raise ValueError(
            "store.url must be empty (SQLite in store.data_dir) or a postgresql:// (or "
            f"postgres://) URL such as postgresql://user@host:5432/dbname, not {got}"
        )
    return text


def store_backend(url: str) -> Literal["sqlite", "postgresql"]:
    """Which store ``url`` (a checked ``store.url``) selects: empty is SQLite."""
    return "postgresql" if url.strip() else "sqlite"


def url_parameters(url: str) -> dict[str, str]:
    """The query parameters of a libpq URL (decoded; the last of a repeated one wins)."""
    _, _, query = url.partition("?")
    return {name.strip().lower(): value for name, value in parse_qsl(query.partition("#")[0])}


def store_url_secret_files(url: str) -> list[Path]:
    """Files a ``store.url`` names that hold secrets: its ``passfile`` and ``sslkey``."""
    found = url_parameters(url)
    return [
        Path(found[key]).expanduser() for key in sorted(SECRET_FILE_QUERY_KEYS) if found.get(key)
    ]


def store_url_socket_dirs(url: str) -> list[Path]:
    """Folders holding the Unix socket a ``store.url`` connects through (none over TCP only).

    A host that is a path (``?host=/run/postgresql`` or ``postgresql://%2Frun%2Fpostgresql/db``)
    is a socket folder; no host at all means libpq's default socket folder.
    """
    if not url.strip():
        return []
    rest = url.split("://", 1)[1] if "://" in url else url
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    hosts = [unquote(host) for host in rest[:cut].rpartition("@")[2].split(",") if host]
    hosts += [host for host in url_parameters(url).get("host", "").split(",") if host]
    if not hosts:
        return list(DEFAULT_SOCKET_DIRS)
    return [Path(host) for host in hosts if host.startswith("/")]


def check_kb_uri(text: str) -> str:
    """``text`` stripped if empty, a folder or an object-store URI LanceDB opens; else an error."""
    text = text.strip()
    scheme = url_scheme(text)
    if scheme and scheme not in KB_URI_SCHEMES:
        raise ValueError(
            "kb.uri must be empty (the knowledge folder in store.data_dir), a folder, or an "
            f"object-store URI (s3://bucket/prefix, gs://bucket/prefix, az://container/prefix), "
            f"not a {scheme}:// URI"
        )
    return text


def kb_folder(uri: str, data_dir: Path) -> Path | None:
    """The local folder of the knowledge tables for ``kb.uri``, or None for an object store."""
    scheme = url_scheme(uri)
    if not uri.strip():
        return data_dir / "knowledge"
    if scheme == "file":
        return Path(unquote(uri.strip().split("://", 1)[1])).expanduser()
    if scheme:
        return None
    return Path(uri.strip()).expanduser()
