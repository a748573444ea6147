"""Pytest fixtures for the MCP tests (a plugin: ``pytest_plugins = ["mcp_servers.fixtures"]``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mcp_servers.support import http_server


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """A streamable-HTTP demo server for the whole module."""
    with http_server("http") as url:
        yield url


@pytest.fixture(scope="module")
def sse_url() -> Iterator[str]:
    """An SSE demo server for the whole module."""
    with http_server("sse") as url:
        yield url
