"""Which local files the file-reading tools may touch, and reading them safely off the loop.

A path is resolved (``~`` expanded, symlinks followed) and then refused when it lies under
``/proc``, ``/sys`` or ``/dev``, inside the agent's data directory, looks like a secret (SSH and
TLS keys, ``.env*``, copies of ``ania.toml``, credential files and folders of common tools), or
lies outside the configured roots (default: the working directory). The file is opened without
following a swapped-in symlink, must be a regular file, must not share its inode with a file of
the data directory (a hardlink to ``ania.db``), and is read up to ``max_bytes + 1`` bytes, so
the limit holds by bytes actually read, not by what ``stat`` claims.
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
    # environment files and the agent's own config, with editor and backup copies
    ".env",
    ".env.*",
    "*.env",
    ".envrc",
    "*ania.toml*",
    "ania*.toml",
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
SECRET_DIRS = frozenset({".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".password-store"})
SECRET_SUBDIRS = ((".config", "gcloud"),)  # a project folder merely named gcloud stays readable
SECRET_PATHS = (Path("/etc/shadow"), Path("/etc/gshadow"), Path("/etc/sudoers"))


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
    """Where the file tools may read: inside ``roots``, never protected or secret files."""

    data_dir: Path
    max_bytes: int
    extra_protected: tuple[Path, ...] = field(default_factory=tuple)
    roots: tuple[Path, ...] = field(default_factory=tuple)  # empty = the working directory

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
        if any(path == p.expanduser().resolve() for p in self.extra_protected):
            raise ToolError(f"refused: {path.name} may hold secrets")
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
        return path, data

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
