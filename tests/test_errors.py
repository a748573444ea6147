"""Failures of the MCP and skills tiers surface as the documented `ania_nb.errors` families."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from ania_nb.config import Config
from ania_nb.errors import (
    AniaError,
    MCPServerError,
    ResourceError,
    SkillInstallError,
    UsageError,
)
from ania_nb.mcp import MCPServerConfig, MCPToolManager
from ania_nb.skills import SkillInstaller, SkillManager


def _closed_port() -> int:
    """A loopback port nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def installer(tmp_path: Path) -> SkillInstaller:
    return SkillInstaller(SkillManager(tmp_path / "skills"), timeout=10)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/skill.zip",  # connection refused
        "http://127.0.0.1:{port}/SKILL.md",
        "http://[::1/skill.zip",  # urlsplit: invalid IPv6 URL
        "http://127.0.0.1:99999/skill.zip",  # port out of range
        "https://127.0.0.\x001/SKILL.md",  # httpx.InvalidURL, not an httpx.HTTPError
    ],
)
async def test_skill_download_failures_are_skill_install_errors(installer, url):
    url = url.format(port=_closed_port())
    with pytest.raises(SkillInstallError) as info:
        await installer.install(url=url, name="demo")
    error = info.value
    assert isinstance(error, ResourceError) and not isinstance(error, UsageError)
    assert (error.source, error.skill) == (url, "demo")
    assert url.split("/")[2][:9] in str(error)  # the message names the address
    assert not installer.manager.dir.exists() or not any(installer.manager.dir.iterdir())


async def test_a_failed_removal_names_the_skill(installer):
    with pytest.raises(SkillInstallError, match="no skill named 'ghost'") as info:
        await installer.remove("ghost")
    assert info.value.skill == "ghost"


async def test_mcp_connect_failure_is_a_resource_error_with_the_server(tmp_path):
    config = MCPServerConfig(
        name="gone", transport="stdio", command=sys.executable, args=[str(tmp_path / "nope.py")]
    )
    manager = MCPToolManager(config, Config().mcp)
    with pytest.raises(AniaError) as info:
        await manager.connect()
    assert isinstance(info.value, MCPServerError) and isinstance(info.value, ResourceError)
    assert info.value.server == "gone"
    await manager.aclose()
