"""A throwaway PostgreSQL cluster for the tests, started from the machine's server binaries.

`PgServer` runs ``initdb`` into a fresh folder under the system temp dir (through
``runuser -u postgres --`` when the tests run as root: initdb refuses root), listens on a free
port of 127.0.0.1 and on a Unix socket in that folder, and is stopped and removed by `stop`. A
watchdog process started with it does the same when this process dies in any way (an exception,
Ctrl-C, ``kill -9``): it waits on a pipe only this process holds, so a postmaster never outlives
the test run.

Authentication: ``trust`` on the socket (the superuser ``postgres`` creates roles and databases
there) and ``scram-sha-256`` on TCP, so the role the tests use (`PgCluster.user`) needs its
password there and a wrong one is refused. The default collation is ICU's root locale, not "C":
text ordering that depends on the collation shows up in the tests.

Durability is off (``fsync``, ``synchronous_commit``, ``full_page_writes``) unless
``durable=True``, for the crash tests (`PgServer.crash` then `PgServer.restart`).

The fixtures (``pg_cluster``, ``pg_url``) are in ``tests/conftest.py``.
"""

from __future__ import annotations

import functools
import glob
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

INSTALL_HINT = (
    "PostgreSQL's server binaries (initdb, pg_ctl) were not found under `pg_config --bindir` "
    "or /usr/lib/postgresql/*/bin: install them with `apt-get install postgresql-15` to run "
    "the PostgreSQL half of the store tests (ANIA_REQUIRE_POSTGRES=1 makes this an error)"
)
PSYCOPG_HINT = (
    "psycopg is not installed: pip install -e '.[test]' (the postgres extra) to run the "
    "PostgreSQL half of the store tests (ANIA_REQUIRE_POSTGRES=1 makes this an error)"
)
SUPERUSER = "postgres"
ROLE = "ania"
DATABASE = "ania"
MAX_CONNECTIONS = 250  # the multi-process race tests open a pool per process
COMMAND_TIMEOUT = 120.0
_SAFE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@dataclass(frozen=True)
class PgCluster:
    """Where a running test cluster listens and who may log in (the ``pg_cluster`` fixture)."""

    host: str
    port: int
    socket_dir: Path
    user: str
    password: str
    database: str
    server: PgServer = field(repr=False, compare=False)  # databases, crash and restart

    def url(self, dbname: str | None = None) -> str:
        """A ``postgresql://`` URL over TCP with the role's password, for ``dbname``."""
        auth = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}"
        return f"postgresql://{auth}@{self.host}:{self.port}/{dbname or self.database}"

    def socket_url(self, dbname: str | None = None) -> str:
        """A ``postgresql://`` URL over the Unix socket (trusted: no password)."""
        folder = quote(str(self.socket_dir), safe="")
        name = dbname or self.database
        return f"postgresql://{quote(self.user, safe='')}@/{name}?host={folder}&port={self.port}"

    def admin_conninfo(self, dbname: str = "postgres") -> str:
        """A libpq conninfo of the superuser over the socket (creates and drops databases)."""
        return f"host={self.socket_dir} port={self.port} user={SUPERUSER} dbname={dbname}"


def find_bindir(candidates: list[Path] | None = None) -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: `pg_config --bindir`, else the newest
    ``/usr/lib/postgresql/<version>/bin``, else wherever PATH finds ``initdb``."""
    for folder in _default_candidates() if candidates is None else candidates:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder
    return None


@functools.cache
def _default_candidates() -> list[Path]:
    """Where to look for the binaries (worked out once per process: pg_config is a process)."""
    candidates = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=30
            )
            candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    versions = [Path(p) for p in glob.glob("/usr/lib/postgresql/*/bin")]
    candidates += sorted(versions, key=lambda p: _version(p.parent.name), reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    return candidates


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", name)) or (0,)


def unavailable_reason() -> str | None:
    """Why no test cluster can start here (binaries, psycopg, a postgres user), or None."""
    if find_bindir() is None:
        return INSTALL_HINT
    try:
        import psycopg  # noqa: F401  (the fixtures talk to the cluster with it)
    except ImportError:
        return PSYCOPG_HINT
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SUPERUSER)
        except KeyError:
            return (
                "the tests run as root and initdb refuses root, but there is no 'postgres' "
                "user to run it as (Debian's postgresql package creates it)"
            )
    return None


def skip_unless_available(require: bool) -> None:
    """Skip the test (or fail it when ``require``: CI) if no test cluster can start here."""
    import pytest

    reason = unavailable_reason()
    if reason is None:
        return
    if require:
        pytest.fail(f"ANIA_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def running(pid: int) -> bool:
    """Whether process ``pid`` still runs (an exited one not yet reaped, a zombie, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PgServer:
    """One test cluster: `start` it, hand out `cluster`, `stop` it (removes everything)."""

    def __init__(
        self,
        bindir: Path,
        *,
        durable: bool = False,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.bindir = bindir
        self.durable = durable
        self.max_connections = max_connections
        self.folder: Path | None = None
        self.cluster: PgCluster | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watchdog_pipe: int | None = None
        self._admin: Any = None  # psycopg.Connection of the superuser, autocommit

    # ------------------------------------------------------------ life cycle

    def start(self) -> PgCluster:
        """initdb, configure, start the server, create the test role and database."""
        self.folder = Path(tempfile.mkdtemp(prefix="ania-pg-"))
        try:
            if os.geteuid() == 0:
                owner = pwd.getpwnam(SUPERUSER)
                os.chown(self.folder, owner.pw_uid, owner.pw_gid)
            self._start_watchdog()  # from here on, this process dying removes the cluster
            self._initdb()
            port = self._start_on_a_free_port()
            password = secrets.token_urlsafe(18)
            self.cluster = PgCluster(
                host="127.0.0.1",
                port=port,
                socket_dir=self.folder,
                user=ROLE,
                password=password,
                database=DATABASE,
                server=self,
            )
            self._create_role_and_database()
        except BaseException:
            self.stop()
            raise
        return self.cluster

    def stop(self) -> None:
        """Stop the server (immediately: the data is thrown away) and remove its folder."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self._watchdog is not None and self._watchdog_pipe is not None:
            os.close(self._watchdog_pipe)  # the watchdog stops the server and removes the folder
            self._watchdog_pipe = None
            self._watchdog.wait(timeout=COMMAND_TIMEOUT)
            self._watchdog = None
        elif self.folder is not None:  # the watchdog never started: nothing runs yet
            shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def crash(self) -> None:
        """Stop the server the way a power cut would (``-m immediate``: no checkpoint)."""
        self._close_admin()
        self._pg_ctl("stop", "-m", "immediate", "-w")

    def restart(self) -> None:
        """Start the server again on the same folder and port (after `crash`)."""
        self._pg_ctl("start", "-w", "-t", "60", "-l", str(self._folder() / "server.log"))

    # ------------------------------------------------------------ databases

    def create_database(self, name: str) -> None:
        """An empty database owned by the test role (template0: nothing copied, fast)."""
        _check_name(name)
        self._admin_connection().execute(
            f'CREATE DATABASE "{name}" OWNER "{ROLE}" TEMPLATE template0'
        )

    def drop_database(self, name: str) -> None:
        """Drop a database, ending the connections a test left open to it."""
        _check_name(name)
        self._admin_connection().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def databases(self) -> set[str]:
        """The names of the databases of the cluster (templates left out)."""
        rows = self._admin_connection().execute(
            "SELECT datname FROM pg_database WHERE NOT datistemplate"
        )
        return {row[0] for row in rows}

    def postmaster_pid(self) -> int | None:
        """The running postmaster's process id (from ``postmaster.pid``), or None."""
        try:
            first = (self._folder() / "data" / "postmaster.pid").read_text().split("\n", 1)[0]
        except (OSError, RuntimeError):
            return None
        return int(first) if first.strip().isdigit() else None

    # ------------------------------------------------------------ internals

    def _folder(self) -> Path:
        if self.folder is None:
            raise RuntimeError("the test cluster is not started")
        return self.folder

    def _as_owner(self, command: list[str]) -> list[str]:
        """``command`` run as the cluster's owner: ``postgres`` when we are root."""
        return ["runuser", "-u", SUPERUSER, "--", *command] if os.geteuid() == 0 else command

    def _run(self, command: list[str]) -> None:
        done = subprocess.run(
            self._as_owner(command), capture_output=True, text=True, timeout=COMMAND_TIMEOUT
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{Path(command[0]).name} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )

    def _pg_ctl(self, *args: str) -> None:
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self._folder() / "data"), *args])

    def _start_watchdog(self) -> None:
        """A process that stops the server and removes the folder once our pipe end closes."""
        read_end, write_end = os.pipe()
        data = str(self._folder() / "data")
        stop = self._as_owner(
            [str(self.bindir / "pg_ctl"), "-D", data, "stop", "-m", "immediate", "-w", "-t", "60"]
        )
        script = 'dir=$1; shift; read _ignored; "$@" >/dev/null 2>&1; rm -rf "$dir"'
        try:
            self._watchdog = subprocess.Popen(
                ["sh", "-c", script, "pg-watchdog", str(self._folder()), *stop],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in the terminal must not kill it first
            )
        finally:
            os.close(read_end)
        self._watchdog_pipe = write_end

    def _initdb(self) -> None:
        self._run(
            [
                str(self.bindir / "initdb"),
                *("-D", str(self._folder() / "data"), "-U", SUPERUSER),
                *("-E", "UTF8", "--locale=C.UTF-8"),
                *("--locale-provider=icu", "--icu-locale=und"),  # ordering differs from "C"
                *("--auth-local=trust", "--auth-host=scram-sha-256"),
                *("--no-sync", "--no-instructions"),
            ]
        )

    def _settings(self, port: int) -> str:
        durability = "on" if self.durable else "off"
        return "\n".join(
            [
                "",
                "# ania-nb test cluster",
                "listen_addresses = '127.0.0.1'",
                f"port = {port}",
                f"unix_socket_directories = '{self._folder()}'",
                f"max_connections = {self.max_connections}",
                "shared_buffers = '64MB'",
                f"fsync = {durability}",
                f"synchronous_commit = {durability}",
                f"full_page_writes = {durability}",
                "password_encryption = 'scram-sha-256'",
                "log_min_messages = warning",
                "",
            ]
        )

    def _start_on_a_free_port(self) -> int:
        config = self._folder() / "data" / "postgresql.conf"
        original = config.read_text()
        last_error: RuntimeError | None = None
        for _ in range(3):  # another process may take the port between the probe and the bind
            port = free_port()
            config.write_text(original + self._settings(port))
            try:
                self.restart()
            except RuntimeError as exc:
                last_error = exc
                log = self._folder() / "server.log"
                if "could not bind" not in (log.read_text() if log.exists() else ""):
                    raise RuntimeError(f"{exc}\n{_tail(log)}") from None
                continue
            return port
        assert last_error is not None
        raise last_error

    def _admin_connection(self) -> Any:
        if self._admin is None:
            import psycopg

            assert self.cluster is not None
            self._admin = psycopg.connect(self.cluster.admin_conninfo(), autocommit=True)
        return self._admin

    def _close_admin(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def _create_role_and_database(self) -> None:
        from psycopg import sql

        assert self.cluster is not None
        admin = self._admin_connection()
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN CREATEDB PASSWORD {}").format(
                sql.Identifier(ROLE), sql.Literal(self.cluster.password)
            )
        )
        self.create_database(DATABASE)


def _check_name(name: str) -> None:
    if not _SAFE_NAME.fullmatch(name):
        raise ValueError(f"not a test database name: {name!r}")


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""
