"""The PostgreSQL test cluster itself: who may connect how, a fresh database per test, clean stops.

The cluster (`tests/pg_cluster.py`) is started once per run by the ``pg_cluster`` fixture; the
tests that start clusters of their own are slow (conftest.py ``SLOW_TESTS``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _waits import until
from pg_cluster import PgServer, find_bindir, running, skip_unless_available

HERE = Path(__file__).parent


def connect(conninfo: str, **kwargs: Any) -> Any:
    import psycopg

    return psycopg.connect(conninfo, connect_timeout=10, **kwargs)


@pytest.fixture
def no_stored_passwords(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """libpq finds no password but the one in the URL (no PGPASSWORD, an empty pgpass file)."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    empty = tmp_path / "pgpass"
    empty.write_text("")
    empty.chmod(0o600)
    monkeypatch.setenv("PGPASSFILE", str(empty))


def test_the_role_connects_over_tcp_with_its_password(pg_cluster: Any, pg_url: str) -> None:
    with connect(pg_url) as conn:
        user, address, database = conn.execute(
            "SELECT current_user, inet_server_addr(), current_database()"
        ).fetchone()
    assert user == pg_cluster.user
    assert str(address) == "127.0.0.1"  # TCP, not the socket
    assert database == pg_url.rsplit("/", 1)[1]


def test_the_role_connects_over_the_socket_without_a_password(
    pg_cluster: Any, no_stored_passwords: None
) -> None:
    with connect(pg_cluster.socket_url()) as conn:
        user, address = conn.execute("SELECT current_user, inet_server_addr()").fetchone()
    assert user == pg_cluster.user
    assert address is None  # a Unix socket has no server address


def test_a_wrong_or_missing_password_is_refused_over_tcp(
    pg_cluster: Any, no_stored_passwords: None
) -> None:
    import psycopg

    wrong = pg_cluster.url().replace(pg_cluster.password, "not-the-password")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        connect(wrong)
    without = f"postgresql://{pg_cluster.user}@{pg_cluster.host}:{pg_cluster.port}/ania"
    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        connect(without)


_seen_databases: list[str] = []


@pytest.mark.parametrize("turn", [1, 2])
def test_every_test_gets_a_fresh_empty_database(pg_cluster: Any, pg_url: str, turn: int) -> None:
    name = pg_url.rsplit("/", 1)[1]
    with connect(pg_url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
        assert tables == []  # the other turn's table is not here
        conn.execute("CREATE TABLE marker (turn int)")
        conn.execute("INSERT INTO marker VALUES (%s)", (turn,))
    assert name not in _seen_databases
    assert not set(_seen_databases) & pg_cluster.server.databases()  # the earlier one dropped
    _seen_databases.append(name)


def test_the_cluster_trades_durability_for_speed_and_allows_the_race_tests(pg_url: str) -> None:
    with connect(pg_url) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('fsync', 'synchronous_commit', 'full_page_writes', 'max_connections')"
            ).fetchall()
        )
        ordered = [
            row[0]
            for row in conn.execute(
                "SELECT x FROM (VALUES ('B'), ('a')) v(x) ORDER BY x"
            ).fetchall()
        ]
    assert settings["fsync"] == settings["synchronous_commit"] == "off"
    assert settings["full_page_writes"] == "off"
    assert int(settings["max_connections"]) >= 200
    assert ordered == ["a", "B"]  # ICU's order, not "C"'s: collation-dependent code shows up


def test_without_postgresql_the_tests_skip_with_the_install_command_unless_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import pg_cluster

    monkeypatch.setattr(pg_cluster, "find_bindir", lambda: None)
    with pytest.raises(pytest.skip.Exception, match=r"apt-get install postgresql-15"):
        skip_unless_available(require=False)
    with pytest.raises(pytest.fail.Exception, match=r"ANIA_REQUIRE_POSTGRES=1 but .*postgresql-15"):
        skip_unless_available(require=True)


def test_the_binaries_are_found_in_a_folder_holding_initdb_and_pg_ctl(tmp_path: Path) -> None:
    assert find_bindir([tmp_path]) is None
    (tmp_path / "initdb").write_text("")
    assert find_bindir([tmp_path]) is None  # pg_ctl too
    (tmp_path / "pg_ctl").write_text("")
    assert find_bindir([tmp_path / "missing", tmp_path]) == tmp_path


# ------------------------------------------------------------------ clusters of their own (slow)


@pytest.fixture
def bindir(pg_required: bool) -> Path:
    skip_unless_available(pg_required)
    found = find_bindir()
    assert found is not None
    return found


def test_stop_ends_the_postmaster_and_removes_the_folder(bindir: Path) -> None:
    server = PgServer(bindir)
    cluster = server.start()
    folder, pid = server.folder, server.postmaster_pid()
    assert folder is not None and pid is not None and running(pid)
    with connect(cluster.url()) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    server.stop()
    assert not running(pid)
    assert not folder.exists()


async def test_a_killed_test_process_leaves_no_postmaster_behind(bindir: Path) -> None:
    started = await asyncio.to_thread(start_a_cluster_in_a_child_and_kill_it)
    await until(lambda: not running(started["pid"]), "the postmaster to stop", limit=30)
    await until(lambda: not Path(started["folder"]).exists(), "the folder's removal", limit=60)


def start_a_cluster_in_a_child_and_kill_it() -> dict[str, Any]:
    """A child process starts a cluster and is killed with SIGKILL: its postmaster and folder."""
    with subprocess.Popen(
        [sys.executable, "-c", _STARTS_AND_WAITS, str(HERE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdout is not None
        started: dict[str, Any] = json.loads(child.stdout.readline())
        assert running(started["pid"])
        child.send_signal(signal.SIGKILL)  # no finaliser, no atexit: only the watchdog is left
        child.wait(timeout=30)
    return started


_STARTS_AND_WAITS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pg_cluster import PgServer, find_bindir
server = PgServer(find_bindir())
server.start()
print(json.dumps({"pid": server.postmaster_pid(), "folder": str(server.folder)}), flush=True)
sys.stdin.read()  # until killed
"""


def test_a_durable_cluster_keeps_committed_rows_through_a_crash(bindir: Path) -> None:
    server = PgServer(bindir, durable=True)
    cluster = server.start()
    try:
        with connect(cluster.url(), autocommit=True) as conn:
            assert conn.execute("SHOW fsync").fetchone() == ("on",)
            conn.execute("CREATE TABLE kept (n int)")
            conn.execute("INSERT INTO kept VALUES (7)")
        server.crash()
        server.restart()
        with connect(cluster.url()) as conn:
            assert conn.execute("SELECT n FROM kept").fetchall() == [(7,)]
    finally:
        server.stop()
