"""The bubblewrap sandbox `bash` runs commands in when ``bash.sandbox = "bwrap"``.

What a sandboxed command gets (`bwrap_argv` builds the command line, in this order because
later mounts cover earlier ones):

- the whole filesystem read-only (``--ro-bind / /``) and a private empty ``/tmp``;
- the working directory (``bash.workdir``, default: the current one) writable, bound after
  ``/tmp`` so a workdir under it stays visible;
- hidden, unreadable and unwritable, *whether or not they exist yet* (`Protected`, listed by
  `bash.sandbox_hidden`): the data directory, the skills folder, the hooks, MCP and commands
  files, ``./ania.toml`` and the config file actually loaded (``--config``), and
  ``security.secret_files``; hidden when they exist: the usual credentials in the home folder
  (`HOME_SECRETS`), the files ``PGPASSFILE``-style variables name (`SECRET_FILE_ENV`), the
  Jupyter runtime folder (kernel connection files: their key runs code in the kernel) and the
  sockets of daemons that run commands for whoever connects (`DAEMON_SOCKETS`: Docker,
  containerd, Podman, systemd, the system bus, ``/run/user`` and ``$XDG_RUNTIME_DIR``);
- a fresh ``/proc`` and ``/dev``, its own PID, IPC and UTS namespaces, no network (its own empty
  network namespace) unless ``bash.sandbox_network``;
- no capabilities (``--cap-drop ALL``: as root, a kept CAP_SYS_ADMIN could remount ``/``
  writable), a new session (no terminal injection), killed when ania-nb's side dies;
- a cleared environment (`ania_nb._env.child_env`: PATH, HOME, locale ..., ``security.pass_env``)
  plus the ``bash.env`` entries;
- resource limits set by ``prlimit`` inside the sandbox: CPU seconds (RLIMIT_CPU), memory
  (address space, RLIMIT_AS) and processes (RLIMIT_NPROC). The kernel does not apply
  RLIMIT_NPROC to root, so when ania-nb runs as root the process limit is not enforced (the
  timeout, which kills the whole PID namespace, still bounds a fork bomb); run as an ordinary
  user for it to hold. 0 turns a limit off.

How a protected path is hidden (`plan_mounts`, then `Covers` on the host): a file gets
``/dev/null`` bound read-only over it, a folder an empty read-only tmpfs. A mount needs a mount
point, so a protected path that is missing *inside the workdir* (where the command could create
it) first gets an empty stand-in (an empty file or folder), created by ania-nb and removed after
the command when it is still empty and no other sandboxed command uses it. Every loader treats an
empty hooks, MCP or commands file, and an empty ``ania.toml``, exactly like a missing one, so a
stand-in means nothing while it exists. A missing path outside the workdir needs nothing: the
command cannot create it there (read-only, or in its private ``/tmp``). A mount point cannot be
removed or renamed from inside, and every folder between the workdir and a protected path is
bound onto itself, so ``mv conf conf2; mkdir conf`` cannot make a fresh ``conf/hooks.json``
either. Paths are followed through symbolic links as the kernel would; a protected path that
passes through a symbolic link inside the workdir (which the command could replace), or whose
hiding would hide the workdir itself, makes the command refuse to run with an error naming the
setting and the fix.

The kernel uncovers a mount when the file under it is replaced on the host (renamed over or
deleted), so nothing may replace a covered file while a command runs: each command holds a shared
`flock` on the folder of every path it covers, and ania-nb's own atomic writes
(`ania_nb._atomic`) take an exclusive one on the folder first, i.e. they wait for running
commands (and a command starting meanwhile waits for the write). A stand-in is removed by the
last command covering it (each holds a shared lock on it too). Another program that replaces such a
file by renaming (some editors do) during a command uncovers it for that command; for a hard
guarantee keep what ania-nb obeys out of the workdir (``bash.workdir`` a subfolder).

What it does not do: files readable by this user outside the hidden places can be read (and sent
back to the model); with ``bash.sandbox_network`` on they can leave the machine. Scripts that
hooks or MCP servers run, and Python modules ania-nb may import from the working folder, are
not protected when they lie inside the workdir.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..._env import secret_file_paths
from ...errors import ToolError
from ._paths import jupyter_private_dirs

MISSING_BWRAP = (
    "bash.sandbox is 'bwrap' but bubblewrap is not installed: apt-get install bubblewrap"
)
# Credentials in the home folder, hidden in the sandbox (the rest of home stays readable: tools
# such as pyenv, nvm or ~/.local live there).
HOME_SECRETS = (
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".config/gh",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".pgpass",
    ".npmrc",
    ".pypirc",
    ".password-store",
    ".local/share/keyrings",
    ".ipython",
    ".jupyter",
)
# Sockets of daemons that run commands for whoever connects (container engines, systemd, the
# system bus) and the users' runtime folders (session bus, agents): a Unix socket on the
# read-only root can still be connected to, network namespace or not.
DAEMON_SOCKETS = (
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/run/podman/podman.sock",
    "/run/dbus/system_bus_socket",
    "/var/run/dbus/system_bus_socket",
    "/run/systemd/private",
    "/run/user",
)
_MAX_LINKS = 40  # symbolic links followed in one path, like the kernel


@dataclass(frozen=True)
class Protected:
    """A path the sandbox hides, and how.

    ``create``: what stands in for it while it is missing inside the workdir (None: hidden only
    when it exists). ``setting`` names it in errors.
    """

    path: Path
    setting: str
    create: Literal["file", "folder"] | None = "file"


@dataclass(frozen=True)
class Sandbox:
    """Settings of one sandboxed run (see the module docstring)."""

    workdir: Path
    protected: tuple[Protected, ...] = ()
    network: bool = False
    cpu_seconds: int = 0
    memory_mb: int = 0
    max_processes: int = 0
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Mount:
    """One mount of the plan.

    ``null``: ``/dev/null`` over a file; ``empty``: a read-only empty tmpfs over a folder;
    ``pin``: a folder bound onto itself, so it cannot be renamed away. ``create``: the stand-in
    to make first, when the path is missing inside the workdir.
    """

    path: Path
    kind: Literal["null", "empty", "pin"]
    setting: str
    create: Literal["file", "folder"] | None = None


def find_program(name: str, missing: str) -> str:
    """Absolute path of ``name`` on PATH, else a ToolError saying ``missing``."""
    found = shutil.which(name)
    if found is None:
        raise ToolError(missing)
    return found


def plan_mounts(box: Sandbox) -> list[Mount]:
    """The mounts hiding what ``box`` protects, parents first (blocking: it looks at the disk).

    Raises `ToolError` for a layout that cannot be protected.
    """
    workdir = box.workdir
    hidden: dict[Path, Mount] = {}
    for entry in [*box.protected, *_when_present(box)]:
        real = _trace(entry, workdir)
        if real is None:
            continue
        present = os.path.lexists(real)
        if not present and (entry.create is None or not _below(real, workdir)):
            continue  # nothing to hide, and the command cannot create it there
        if real == workdir or _below(workdir, real):
            raise ToolError(
                f"bash: bash.workdir ({workdir}) lies inside {entry.setting} ({real}), which the "
                "sandbox hides: choose a working directory outside it"
            )
        folder = real.is_dir() if present else entry.create == "folder"
        create = None if present else entry.create
        hidden.setdefault(real, Mount(real, "empty" if folder else "null", entry.setting, create))
    folders = [m.path for m in hidden.values() if m.kind == "empty"]
    kept = [m for m in hidden.values() if not any(_below(m.path, f) for f in folders)]
    pins: dict[Path, Mount] = {}
    for mount in kept:
        for parent in mount.path.parents:
            if _below(parent, workdir) and parent not in pins:
                stand_in: Literal["folder"] | None = None if parent.exists() else "folder"
                pins[parent] = Mount(parent, "pin", mount.setting, stand_in)
    return sorted([*pins.values(), *kept], key=lambda m: (len(m.path.parts), m.kind != "pin"))


def bwrap_argv(
    bwrap: str, prlimit: str | None, argv: list[str], box: Sandbox, mounts: Iterable[Mount]
) -> list[str]:
    """The full command line that runs ``argv`` inside the sandbox ``box``."""
    workdir = str(box.workdir)
    args = [bwrap, "--ro-bind", "/", "/"]
    args += ["--tmpfs", "/tmp", "--bind", workdir, workdir]
    for mount in mounts:
        where = str(mount.path)
        if mount.kind == "pin":
            args += ["--bind", where, where]
        elif mount.kind == "null":
            args += ["--ro-bind", "/dev/null", where]
        else:
            args += ["--tmpfs", where, "--remount-ro", where]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if not box.network:
        args.append("--unshare-net")
    args += ["--cap-drop", "ALL", "--die-with-parent", "--new-session", "--clearenv"]
    for key, value in box.env.items():
        args += ["--setenv", key, value]
    args += ["--chdir", workdir, "--"]
    limits = _limits(box)
    if limits:
        if prlimit is None:
            raise ToolError("bash.sandbox limits need prlimit (util-linux), which is missing")
        args += [prlimit, *limits]
    return args + argv


class Covers:
    """The host side of a plan while one command runs.

    Stand-ins for missing paths and a shared `flock` on every covered path (an atomic write
    waits for it; see the module docstring).
    """

    def __init__(self, mounts: Iterable[Mount]) -> None:
        self.mounts = list(mounts)
        self._held: list[tuple[Mount, int]] = []
        self._folders: dict[Path, int | None] = {}

    def hold(self) -> None:
        """Create the stand-ins and take the locks (blocking: call it in a worker thread).

        Shared locks on each covered path (the stand-in's last user removes it) and on its
        folder (where `ania_nb._atomic.exclusive` waits before replacing a file).
        """
        try:
            for mount in self.mounts:  # parents first: a folder exists before what is in it
                folder = mount.path.parent
                covered = {m.path for m, _fd in self._held}  # its lock serves the folder too
                if folder not in self._folders and folder not in covered:
                    self._folders[folder] = _shared_lock(folder)
                held = _hold(mount)
                if held is not None:
                    self._held.append((mount, held))
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Remove the stand-ins no other command uses any more, drop the locks (blocking)."""
        held, self._held = self._held, []
        folders, self._folders = self._folders, {}
        try:
            for mount, fd in reversed(held):  # deepest first: a stand-in file before its folder
                try:
                    _remove_stand_in(mount, fd)
                finally:
                    os.close(fd)
        finally:
            for locked in folders.values():
                if locked is not None:
                    os.close(locked)


# Stand-ins this process created, by (device, inode): whichever of its commands ends last
# removes them (a module-level set because they are files on disk, shared by every Agent here).
_stand_ins: set[tuple[int, int]] = set()
_stand_ins_lock = threading.Lock()


def _hold(mount: Mount) -> int | None:
    """Make the stand-in if needed, open the path and take a shared lock on it.

    Retries when the path was replaced between the open and the lock (a stand-in another
    command removed just then). None when the path cannot be opened for locking (not ours to
    read: nobody here can replace it either).
    """
    import fcntl  # POSIX only, like bubblewrap

    folder = mount.kind != "null"
    for _attempt in range(5):
        if mount.create is not None and not os.path.lexists(mount.path):
            _make_stand_in(mount, folder)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(mount.path, flags | (os.O_DIRECTORY if folder else 0))
        except FileNotFoundError:
            if mount.create is None:
                raise ToolError(
                    f"bash: {mount.path} ({mount.setting}) vanished while the sandbox was set up"
                ) from None
            continue
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise ToolError(
                    f"bash: the sandbox cannot protect {mount.setting}: {mount.path} changed "
                    "into a link or a file while the sandbox was set up"
                ) from None
            return None
        fcntl.flock(fd, fcntl.LOCK_SH)
        if _same(fd, mount.path):
            return fd
        os.close(fd)
    raise ToolError(f"bash: {mount.path} ({mount.setting}) keeps changing; try again")


def _shared_lock(folder: Path) -> int | None:
    """A shared `flock` on ``folder`` (None when it cannot be opened: not ours to write)."""
    import fcntl

    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def _make_stand_in(mount: Mount, folder: bool) -> None:
    try:
        if folder:
            os.mkdir(mount.path, 0o755)
        else:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
            os.close(os.open(mount.path, flags, 0o644))
    except FileExistsError:
        return  # another command made it just now: it is covered the same way
    except OSError as exc:
        raise ToolError(
            f"bash: the sandbox cannot protect {mount.setting}: cannot create an empty stand-in "
            f"at {mount.path}: {exc.strerror or exc}"
        ) from None
    info = os.stat(mount.path, follow_symlinks=False)
    with _stand_ins_lock:
        _stand_ins.add((info.st_dev, info.st_ino))


def _remove_stand_in(mount: Mount, fd: int) -> None:
    import fcntl

    info = os.fstat(fd)
    key = (info.st_dev, info.st_ino)
    with _stand_ins_lock:
        if key not in _stand_ins:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no other command covers it now
        except BlockingIOError:
            return  # the one that ends last removes it
        _stand_ins.discard(key)
        if not _same(fd, mount.path):
            return
        with contextlib.suppress(OSError):  # not empty any more: it is somebody's file now
            if stat.S_ISDIR(info.st_mode):
                os.rmdir(mount.path)
            elif os.fstat(fd).st_size == 0:  # looked at now: it may have been written to
                os.unlink(mount.path)


def _same(fd: int, path: Path) -> bool:
    try:
        now = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _when_present(box: Sandbox) -> list[Protected]:
    """Hidden when they exist: home-folder secrets, files variables name, Jupyter, sockets."""
    homes = {Path(os.path.expanduser("~")), Path(box.env.get("HOME") or "/")} - {Path("/")}
    found = [Protected(home / name, f"~/{name}", None) for home in homes for name in HOME_SECRETS]
    named = "a credential file an environment variable names"
    found += [Protected(p, named, None) for p in secret_file_paths()]
    found += [Protected(p, "a Jupyter or IPython folder", None) for p in jupyter_private_dirs()]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    sockets = [*DAEMON_SOCKETS, *([runtime] if runtime else [])]
    found += [Protected(Path(p), "a daemon's socket or runtime folder", None) for p in sockets]
    return found


def _trace(entry: Protected, workdir: Path) -> Path | None:
    """Where the kernel finds ``entry.path``: links followed, ``..`` applied.

    None when a part is missing outside the workdir (nobody here can create it). For a path
    protected while missing, a symbolic link inside the workdir (the command could replace it)
    or a missing folder followed by ``..`` there is a `ToolError`.
    """
    strict = entry.create is not None
    pending = deque((Path.cwd() / entry.path).parts[1:])
    current = Path("/")
    links = 0
    while pending:
        part = pending.popleft()
        if part == "..":
            current = current.parent
            continue
        step = current / part
        try:
            info = os.lstat(step)
        except (FileNotFoundError, NotADirectoryError):
            if not _below(step, workdir):
                return None
            if strict and ".." in pending:
                raise ToolError(
                    f"bash: the sandbox cannot protect {entry.setting} ({entry.path}): it passes "
                    f"through {step}, which does not exist, and then '..'; write it without '..'"
                ) from None
            return step.joinpath(*pending)
        if not stat.S_ISLNK(info.st_mode):
            current = step
            continue
        if strict and _below(step, workdir):
            raise ToolError(
                f"bash: the sandbox cannot protect {entry.setting} ({entry.path}): {step} is a "
                f"symbolic link inside bash.workdir ({workdir}), which a sandboxed command could "
                f"replace; set {entry.setting} to the real path "
                f"({entry.path.resolve()}) or keep it out of bash.workdir"
            )
        links += 1
        if links > _MAX_LINKS:
            raise ToolError(f"bash: {entry.setting} ({entry.path}): too many symbolic links")
        target = Path(os.readlink(step))
        if target.is_absolute():
            current = Path("/")
            pending.extendleft(reversed(target.parts[1:]))
        else:
            pending.extendleft(reversed(target.parts))
    return current


def _below(path: Path, folder: Path) -> bool:
    """Whether ``path`` lies strictly inside ``folder``."""
    return folder in path.parents


def _limits(box: Sandbox) -> list[str]:
    limits = []
    if box.cpu_seconds:
        limits.append(f"--cpu={box.cpu_seconds}")
    if box.memory_mb:
        limits.append(f"--as={box.memory_mb * 1024 * 1024}")
    if box.max_processes:
        limits.append(f"--nproc={box.max_processes}")
    return limits
