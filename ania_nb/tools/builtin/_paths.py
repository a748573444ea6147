"""Which local files the file-reading tools may touch, and reading them safely off the loop.

A path is resolved (``~`` expanded, symlinks followed) and then refused when it lies under
``/proc``, ``/sys`` or ``/dev``, inside the agent's data directory, is (or lies in) a protected
path (the hooks, MCP and commands files, the config file loaded, ``security.secret_files``, the
files ``PGPASSFILE``-style variables name, the Jupyter runtime and IPython folders) or a copy of
one next to it (``mcp.json.bak``, ``hooks.json~``, ``.mcp.json.swp`` ...), carries the name of a
file ania-nb obeys (``protected_names``, with such copies, anywhere), looks like a secret (SSH and
TLS keys, ``.env*``, copies of ``ania.toml`` and ``ania.db``, Jupyter kernel and server files,
IPython's ``history.sqlite``, credential files and folders of common tools), or lies outside the
configured roots (default: the working directory). The file is opened without following a
swapped-in symlink, must be a regular file, must not share its inode with a file of the data
directory (a hardlink to ``ania.db``), must not be a SQLite database with the store's tables (a
copy of ``ania.db`` by another name), and is read up to ``max_bytes + 1`` bytes, so the limit
holds by bytes actually read, not by what ``stat`` claims.
"""

from __future__ import annotations

import asyncio
import os
import stat
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from ...errors import ToolError

SYSTEM_DIRS = (Path("/proc"), Path("/sys"), Path("/dev"))

# File names (lower case, glob) that hold secrets wherever they are.
SECRET_NAME_PATTERNS = (
    # SSH keys of every type, with their -cert/.old/... variants; host keys
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "id_xmss*",
    "identity",
    "ssh_host_*key*",
    # TLS / PKCS / other key stores
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.ppk",
    "*.jks",
    "*.keystore",
    "*.kdbx",
    # environment files and the agent's own config and store, with editor and backup copies
    ".env",
    ".env.*",
    "*.env",
    ".envrc",
    "*ania.toml*",
    "ania*.toml",
    "ania*.db",
    "ania*.db?*",
    "*[-_.]ania*.db*",
    # Jupyter's connection files (their key runs code in the kernel) and server files (tokens);
    # IPython's history (everything typed, keys included)
    "kernel-*.json",
    "jpserver-*.json",
    "jpserver-*-open.html",
    "nbserver-*.json",
    "nbserver-*-open.html",
    "history.sqlite*",
    # credential files of common tools
    ".git-credentials",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".my.cnf",
    ".npmrc",
    ".pypirc",
    ".htpasswd",
    "credentials",
    "credentials.json",
    "credentials.db",
    "access_tokens.db",
    "*_history",
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "master.key",
)

# Folders (lower case) whose whole content holds secrets: SSH, GnuPG, cloud, kube, docker.
SECRET_DIRS = frozenset(
    {".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".password-store", ".ipython"}
)
# A project folder merely named gcloud or runtime stays readable.
SECRET_SUBDIRS = ((".config", "gcloud"), ("jupyter", "runtime"))
SECRET_PATHS = (Path("/etc/shadow"), Path("/etc/gshadow"), Path("/etc/sudoers"))
# Copies people and editors leave next to a file: name.bak, name~, name.orig, .name.swp ...
COPY_PATTERNS = ("{name}?*", ".{name}*", "#{name}#")
# A SQLite file is a copy of the store when it has these tables (checked in its first MiB).
_SQLITE_HEADER = b"SQLite format 3\x00"
_STORE_TABLES = (b"chat_history", b"clock_tasks", b"usage_counters")


def jupyter_private_dirs() -> list[Path]:
    """Jupyter's runtime folders (kernel connection files) and IPython's profile folder.

    jupyter-core's locations, recomputed (it comes only with the notebook extra): the variable,
    the data folder's ``runtime`` (Linux, macOS) and the platform-dirs runtime folder.
    """
    env = os.environ
    found = [Path(env["JUPYTER_RUNTIME_DIR"])] if env.get("JUPYTER_RUNTIME_DIR") else []
    data = env.get("JUPYTER_DATA_DIR") or os.path.join(
        env.get("XDG_DATA_HOME") or "~/.local/share", "jupyter"
    )
    found += [Path(data) / "runtime", Path("~/Library/Jupyter/runtime")]
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    found.append(Path(runtime) / "jupyter")
    found.append(Path(env.get("IPYTHONDIR") or "~/.ipython"))
    return list(dict.fromkeys(p.expanduser() for p in found))


def copy_of(name: str, protected: Path) -> bool:
    """Whether the file name ``name`` is ``protected``'s name or a copy of it (``.bak`` ...)."""
    own = protected.name.lower()
    lowered = name.lower()
    return lowered == own or any(
        fnmatchcase(lowered, pattern.format(name=own)) for pattern in COPY_PATTERNS
    )


def secret_reason(path: Path) -> str | None:
    """Why ``path`` may hold secrets (the part that matched), or None."""
    name = path.name.lower()
    if any(path == p or p in path.parents for p in SECRET_PATHS):
        return str(path)
    for pattern in SECRET_NAME_PATTERNS:
        if fnmatchcase(name, pattern):
            return path.name
    folders = [part.lower() for part in path.parts[:-1]]
    for n, part in enumerate(folders):
        if part in SECRET_DIRS:
            return path.parts[n]
        if n and (folders[n - 1], part) in SECRET_SUBDIRS:
            return "/".join(path.parts[n - 1 : n + 1])
    return None


@dataclass(frozen=True)
class FileGuard:
    """Where the file tools may read: inside ``roots``, never protected or secret files.

    ``extra_protected``: files and folders refused with their contents and the copies next to
    them; ``protected_names``: file names refused anywhere, with their copies.
    """

    data_dir: Path
    max_bytes: int
    extra_protected: tuple[Path, ...] = field(default_factory=tuple)
    roots: tuple[Path, ...] = field(default_factory=tuple)  # empty = the working directory
    protected_names: tuple[str, ...] = field(default_factory=tuple)

    def check(self, raw: str) -> Path:
        """Resolve ``raw`` and refuse protected, secret, outside-roots or non-regular files."""
        if not raw or not raw.strip():
            raise ToolError("path must not be empty")
        given = Path(os.path.expanduser(raw.strip()))
        path = given.resolve()
        for system in SYSTEM_DIRS:
            if _within(path, system) or _within(given.absolute(), system):
                raise ToolError(
                    f"refused: {path} is a system file ({system} is never read by this tool)"
                )
        data_dir = self.data_dir.expanduser().resolve()
        if _within(path, data_dir):
            raise ToolError(f"refused: {path} is inside the agent's data directory ({data_dir})")
        for candidate in (given.absolute(), path):
            if self._protected(candidate):
                raise ToolError(f"refused: {candidate.name} may hold secrets")
        for candidate in (given, path):  # the name asked for and the file it leads to
            reason = secret_reason(candidate.absolute())
            if reason is not None:
                raise ToolError(f"refused: {reason} may hold secrets")
        roots = [r.expanduser().resolve() for r in self.roots] or [Path.cwd().resolve()]
        if not any(_within(path, root) for root in roots):
            shown = ", ".join(str(r) for r in roots)
            raise ToolError(
                f"refused: {path} is outside the folders this tool may read ({shown}; "
                "see file.roots)"
            )
        if not path.exists():
            raise ToolError(f"no such file: {path}")
        if path.is_dir():
            raise ToolError(f"{path} is a directory, not a file")
        if not path.is_file():
            raise ToolError(f"{path} is not a regular file")
        return path

    def read_sync(self, raw: str) -> tuple[Path, bytes]:
        """Check, open and read (blocking): the size limit holds by the bytes actually read."""
        path = self.check(raw)
        try:
            # O_NOFOLLOW: a symlink swapped in after the check is not followed; O_NONBLOCK: a
            # FIFO swapped in does not hang the open (it is refused below as not regular).
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise ToolError(f"cannot read {path}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ToolError(f"{path} is not a regular file")
            if info.st_dev in _system_devices():  # /proc or /sys mounted somewhere else
                raise ToolError(f"refused: {path} is a system file (on a /proc or /sys mount)")
            if info.st_nlink > 1 and (info.st_dev, info.st_ino) in self._data_inodes():
                raise ToolError(
                    f"refused: {path} is a hard link to a file in the agent's data directory"
                )
            if info.st_size > self.max_bytes:
                raise ToolError(
                    f"{path} is {info.st_size} bytes, above the limit of {self.max_bytes} "
                    "(file.max_bytes)"
                )
            try:
                data = handle.read(self.max_bytes + 1)
            except OSError as exc:
                raise ToolError(f"cannot read {path}: {exc.strerror or exc}") from None
        if len(data) > self.max_bytes:
            raise ToolError(
                f"{path} has more than {self.max_bytes} bytes, above the limit of "
                f"{self.max_bytes} (file.max_bytes)"
            )
        if data.startswith(_SQLITE_HEADER) and any(t in data[: 1 << 20] for t in _STORE_TABLES):
            raise ToolError(f"refused: {path} is a copy of the agent's store (ania.db)")
        return path, data

    def _protected(self, path: Path) -> bool:
        """Whether ``path`` is a protected path, inside one, or a copy next to one."""
        name = path.name
        if any(copy_of(name, Path(p)) for p in self.protected_names):
            return True
        for raw in (*self.extra_protected, *jupyter_private_dirs()):
            for protected in {raw.expanduser().absolute(), raw.expanduser().resolve()}:
                if _within(path, protected):
                    return True
                if path.parent == protected.parent and copy_of(name, protected):
                    return True
        return False

    async def read(self, raw: str) -> tuple[Path, bytes]:
        """Check and read a file in a worker thread."""
        return await asyncio.to_thread(self.read_sync, raw)

    def _data_inodes(self) -> set[tuple[int, int]]:
        """(device, inode) of every file in the data directory."""
        found: set[tuple[int, int]] = set()
        root = self.data_dir.expanduser()
        for folder, _dirs, files in os.walk(root):
            for name in files:
                try:
                    info = os.stat(os.path.join(folder, name), follow_symlinks=False)
                except OSError:
                    continue
                found.add((info.st_dev, info.st_ino))
        return found


def _system_devices() -> set[int]:
    found = set()
    for folder in SYSTEM_DIRS[:2]:
        try:
            found.add(os.stat(folder).st_dev)
        except OSError:
            continue
    return found


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents
