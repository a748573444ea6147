"""Run a test module on both store backends: ``pytestmark = pytest.mark.usefixtures("backend")``.

On ``postgres`` every data directory a test opens without a URL (``Store.open(tmp_path)``, an
Agent's ``store.data_dir``) gets a fresh PostgreSQL database of its own for the test, so
reopening a directory finds its data and two directories never share rows — as on SQLite.
Tests about SQLite files themselves carry ``@pytest.mark.sqlite_only``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterator
from os import PathLike
from pathlib import Path

import pytest

import ania_nb.store as store_pkg


class FreshDatabases:
    """One fresh database per data directory, created on first open, dropped at the end."""

    def __init__(self, create: Callable[[str], str], drop: Callable[[str], None]) -> None:
        self._create, self._drop = create, drop
        self.urls: dict[Path, str] = {}
        self._names: list[str] = []

    async def url_for(self, data_dir: str | PathLike[str]) -> str:
        """The database of ``data_dir`` (created the first time it is asked for)."""
        key = Path(data_dir).expanduser().absolute()  # noqa: ASYNC240 (no I/O: cwd only)
        if key not in self.urls:
            name = f"t_{secrets.token_hex(6)}"
            self.urls[key] = await asyncio.to_thread(self._create, name)
            self._names.append(name)
        return self.urls[key]

    def drop_all(self) -> None:
        """Drop every database made for the test."""
        for name in self._names:
            self._drop(name)


def use_postgres(
    monkeypatch: pytest.MonkeyPatch, create: Callable[[str], str], drop: Callable[[str], None]
) -> Iterator[FreshDatabases]:
    """Make every URL-less store open in this test go to a fresh PostgreSQL database."""
    fresh = FreshDatabases(create, drop)
    real_open = store_pkg.open_database

    async def open_database(data_dir: str | PathLike[str], url: str = ""):  # type: ignore[no-untyped-def]
        return await real_open(data_dir, url or await fresh.url_for(data_dir))

    monkeypatch.setattr(store_pkg, "open_database", open_database)
    try:
        yield fresh
    finally:
        fresh.drop_all()
