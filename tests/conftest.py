"""Shared fixtures: the scripted LLM server, agents wired to it, a guard against real networks,
the PostgreSQL test cluster."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# CI sets it: without PostgreSQL the PG half of the store tests fails instead of being skipped.
# Read before the loop below clears every ANIA_* variable.
REQUIRE_POSTGRES = os.environ.get("ANIA_REQUIRE_POSTGRES", "") == "1"

for _key in [k for k in os.environ if k.startswith("ANIA_") and not k.startswith("ANIA_TEST_")]:
    del os.environ[_key]  # a developer's own settings must not leak into tests (ANIA_TEST_*
    # only opt into live tests such as tests/test_prompt_live.py)

_real_connect = socket.socket.connect


def _guarded_connect(self: socket.socket, address: Any) -> Any:
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0]
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            raise ConnectionRefusedError(f"tests may only reach loopback addresses, not {host!r}")
    return _real_connect(self, address)


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test: any connection to a non-loopback address fails (no real model is ever called)."""
    monkeypatch.setattr(socket.socket, "connect", _guarded_connect)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Any]:
    """A 16 MB tmpfs (`tests/_tmpfs.py`) to fill up; skipped where mounting is not allowed."""
    from _tmpfs import SmallDisk

    disk = SmallDisk(tmp_path / "disk", 16 << 20)
    disk.mount()
    try:
        yield disk
    finally:
        disk.unmount()


@pytest.fixture
def llm() -> Iterator[Any]:
    """A scripted OpenAI-compatible server on 127.0.0.1."""
    from ania_nb.testing import ScriptedLLM

    with ScriptedLLM() as server:
        yield server


@pytest.fixture
async def make_agent(llm: Any, tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Build Agents talking to the scripted server, with fast retries, closed after the test."""
    from ania_nb import Agent

    agents: list[Any] = []

    def factory(**kwargs: Any) -> Any:
        overrides = {
            "retry.base_delay": 0.01,
            "retry.max_delay": 0.05,
            "llm.stream": False,
            "agent.builtin_tools": False,  # engine tests see only their own tools
            "skills.dir": str(tmp_path / "no-skills"),
            "mcp.config_file": str(tmp_path / "no-mcp.json"),
        }
        overrides.update(kwargs.pop("overrides", {}))
        kwargs.setdefault("data_dir", tmp_path / "data")
        agent = Agent(
            base_url=llm.base_url,
            api_key=llm.api_key,
            model="scripted",
            overrides=overrides,
            **kwargs,
        )
        agents.append(agent)
        return agent

    yield factory
    for agent in agents:
        await closed(agent)


CLOSE_LIMIT = 120.0  # seconds an Agent may take to close before the test fails with the stacks


async def closed(agent: Any) -> None:
    """``agent.aclose()``, or a failure naming what still waits after `CLOSE_LIMIT` seconds.

    A close that never returns would hang the whole run (seen twice under heavy load, not
    reproduced): this turns it into one failing test with every pending task's stack.
    """
    import io

    closing = asyncio.ensure_future(agent.aclose())
    done, _ = await asyncio.wait([closing], timeout=CLOSE_LIMIT)
    if done:
        closing.result()
        return
    stacks = io.StringIO()
    for task in asyncio.all_tasks():
        if task is not asyncio.current_task():
            task.print_stack(file=stacks)
    closing.cancel()
    raise AssertionError(f"Agent.aclose() took over {CLOSE_LIMIT:g} s; tasks:\n{stacks.getvalue()}")


@pytest.fixture
async def agent(make_agent: Callable[..., Any]) -> AsyncIterator[Any]:
    """A default agent against the scripted server."""
    agent = make_agent()
    yield agent
    await closed(agent)


# ------------------------------------------------------------------ governance helpers


@pytest.fixture
def hook_script(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write an executable ``#!/bin/sh`` script (body dedented) and return its path."""
    import textwrap

    folder = tmp_path / "hook-scripts"
    folder.mkdir(exist_ok=True)

    def make(name: str, body: str) -> Path:
        path = folder / name
        path.write_text("#!/bin/sh\n" + textwrap.dedent(body).lstrip("\n"))
        path.chmod(0o755)
        return path

    return make


class ApprovalInbox:
    """A front end's ``request_approval``: records requests and lets a test wait for them."""

    def __init__(self) -> None:
        import asyncio

        self.requests: list[Any] = []
        self._arrived = asyncio.Condition()

    async def __call__(self, request: Any) -> None:
        async with self._arrived:
            self.requests.append(request)
            self._arrived.notify_all()

    async def wait_for(self, n: int = 1) -> Any:
        """The n-th request (1-based), once it has arrived."""
        import asyncio

        async with self._arrived:
            await asyncio.wait_for(self._arrived.wait_for(lambda: len(self.requests) >= n), 10)
        return self.requests[n - 1]


@pytest.fixture
def inbox() -> ApprovalInbox:
    """An approval inbox; pass ``Callbacks(request_approval=inbox)`` to chat()."""
    return ApprovalInbox()


# ------------------------------------------------------------------ PostgreSQL


@pytest.fixture
def s3_server() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (a thread), with an empty bucket; its endpoint URL."""
    import urllib.request

    from _s3 import BUCKET, s3_client
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        # moto keeps its buckets in this process across servers: start each test empty
        with urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", b"")):
            pass
        client = s3_client(endpoint)
        client.create_bucket(Bucket=BUCKET)
        client.close()
        yield endpoint
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_required() -> bool:
    """Whether a missing PostgreSQL fails the tests that need it (ANIA_REQUIRE_POSTGRES=1)."""
    return REQUIRE_POSTGRES


@pytest.fixture(scope="session")
def pg_cluster(session_server_processes: Callable[[str], Any], pg_required: bool) -> Iterator[Any]:
    """One throwaway PostgreSQL cluster for the whole run (`pg_cluster.PgCluster`).

    Skipped with how to install it when the binaries or psycopg are missing, failed instead
    when ANIA_REQUIRE_POSTGRES=1 (CI). Started once, so the tests using it are not slow (the
    root conftest.py's `SESSION_SERVERS`).
    """
    from pg_cluster import PgServer, find_bindir, skip_unless_available

    with session_server_processes("pg_cluster"):  # pg_config --bindir, initdb, pg_ctl
        skip_unless_available(pg_required)
        bindir = find_bindir()
        assert bindir is not None
        server = PgServer(bindir)
        server.start()
    try:
        yield server.cluster
    finally:
        with session_server_processes("pg_cluster"):
            server.stop()


@pytest.fixture
def pg_url(pg_cluster: Any) -> Iterator[str]:
    """A ``postgresql://`` URL (TCP, with the password) of a fresh empty database, dropped after."""
    import uuid

    name = f"t_{uuid.uuid4().hex[:16]}"
    pg_cluster.server.create_database(name)
    try:
        yield pg_cluster.url(name)
    finally:
        pg_cluster.server.drop_database(name)


# --- store backends (see tests/_backends.py) --------------------------------------------------


@pytest.fixture(scope="session")
def pg_admin_url(pg_cluster: Any) -> str:
    """A URL of the test cluster whose role may create databases (the race and bench tests)."""
    return str(pg_cluster.url(pg_cluster.database))


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test on each store backend (SQLite files; fresh PostgreSQL databases)."""
    if request.param == "sqlite":
        yield "sqlite"
        return
    if request.node.get_closest_marker("sqlite_only"):
        pytest.skip("about SQLite files")
    from _backends import use_postgres

    cluster = request.getfixturevalue("pg_cluster")

    def create(name: str) -> str:
        cluster.server.create_database(name)
        return str(cluster.url(name))

    yield from use_postgres(monkeypatch, create, cluster.server.drop_database)
