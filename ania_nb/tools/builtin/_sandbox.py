"""The bubblewrap sandbox `bash` runs commands in when ``bash.sandbox = "bwrap"``.

What a sandboxed command gets (`bwrap_argv` builds the command line, in this order because
later mounts cover earlier ones):

- the whole filesystem read-only (``--ro-bind / /``) and a private empty ``/tmp``;
- the working directory (``bash.workdir``, default: the current one) writable, bound after
  ``/tmp`` so a workdir under it stays visible;
- hidden (an empty tmpfs over a folder, ``/dev/null`` over a file), even inside the workdir: the
  data directory, the config/hooks/MCP/commands files and the usual credentials in the home
  folder (`HOME_SECRETS`: SSH and GnuPG keys, cloud, kube, docker, git and package-index
  credentials);
- a fresh ``/proc`` and ``/dev``, its own PID, IPC and UTS namespaces, no network (its own empty
  network namespace) unless ``bash.sandbox_network``;
- no capabilities (``--cap-drop ALL``: as root, a kept CAP_SYS_ADMIN could remount ``/``
  writable), a new session (no terminal injection), killed when ania-nb's side dies;
- a cleared environment: PATH, HOME, LANG (and LC_ALL if set) plus the ``bash.env`` entries;
- resource limits set by ``prlimit`` inside the sandbox: CPU seconds (RLIMIT_CPU), memory
  (address space, RLIMIT_AS) and processes (RLIMIT_NPROC). The kernel does not apply
  RLIMIT_NPROC to root, so when ania-nb runs as root the process limit is not enforced (the
  timeout, which kills the whole PID namespace, still bounds a fork bomb); run as an ordinary
  user for it to hold. 0 turns a limit off.

What it does not do: files readable by this user outside the hidden places can be read (and sent
back to the model); with ``bash.sandbox_network`` on they can leave the machine.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ToolError

MISSING_BWRAP = (
    "bash.sandbox is 'bwrap' but bubblewrap is not installed: apt-get install bubblewrap"
)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
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
)


@dataclass(frozen=True)
class Sandbox:
    """Settings of one sandboxed run (see the module docstring)."""

    workdir: Path
    hidden: tuple[Path, ...] = ()
    network: bool = False
    cpu_seconds: int = 0
    memory_mb: int = 0
    max_processes: int = 0
    env: Mapping[str, str] = field(default_factory=dict)


def find_program(name: str, missing: str) -> str:
    """Absolute path of ``name`` on PATH, else a ToolError saying ``missing``."""
    found = shutil.which(name)
    if found is None:
        raise ToolError(missing)
    return found


def sandbox_env(extra: Iterable[str], home: str) -> dict[str, str]:
    """The cleared environment: PATH, HOME, LANG (LC_ALL if set) and ``KEY=VALUE`` extras."""
    env = {
        "PATH": os.environ.get("PATH") or DEFAULT_PATH,
        "HOME": home,
        "LANG": os.environ.get("LANG") or "C.UTF-8",
    }
    if os.environ.get("LC_ALL"):
        env["LC_ALL"] = os.environ["LC_ALL"]
    for entry in extra:
        key, sep, value = entry.partition("=")
        if sep and key:
            env[key] = value
    return env


def bwrap_argv(bwrap: str, prlimit: str | None, argv: list[str], box: Sandbox) -> list[str]:
    """The full command line that runs ``argv`` inside the sandbox ``box``."""
    workdir = box.workdir.resolve()
    args = [bwrap, "--ro-bind", "/", "/"]
    args += ["--tmpfs", "/tmp", "--bind", str(workdir), str(workdir)]
    homes = {Path(os.path.expanduser("~")), Path(box.env.get("HOME") or "/")} - {Path("/")}
    secrets = [home / name for home in homes for name in HOME_SECRETS]
    for path in [*box.hidden, *secrets]:
        real = path.expanduser().resolve()
        if real.is_dir():
            args += ["--tmpfs", str(real)]
        elif real.exists():
            args += ["--ro-bind", "/dev/null", str(real)]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    if not box.network:
        args.append("--unshare-net")
    args += ["--cap-drop", "ALL", "--die-with-parent", "--new-session", "--clearenv"]
    for key, value in box.env.items():
        args += ["--setenv", key, value]
    args += ["--chdir", str(workdir), "--"]
    limits = _limits(box)
    if limits:
        if prlimit is None:
            raise ToolError("bash.sandbox limits need prlimit (util-linux), which is missing")
        args += [prlimit, *limits]
    return args + argv


def _limits(box: Sandbox) -> list[str]:
    limits = []
    if box.cpu_seconds:
        limits.append(f"--cpu={box.cpu_seconds}")
    if box.memory_mb:
        limits.append(f"--as={box.memory_mb * 1024 * 1024}")
    if box.max_processes:
        limits.append(f"--nproc={box.max_processes}")
    return limits
