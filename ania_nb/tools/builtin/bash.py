"""`bash`: run a shell command, with a three-tier verdict.

1. a blacklist regex matches anywhere in the command → refused (the rule is named). This is a
   convenience against mistakes, not a security boundary: a shell can spell any command in
   ways no regex foresees (``r''eboot``, ``$(printf ...)``, a script file);
2. the command is a single simple command (no ``;``, ``&&``, ``|``, ``&``, newlines, ``$``,
   backticks, redirections, parentheses or comments — see `_shellwords`) and a whitelist regex
   matches it from its start → runs without asking;
3. otherwise → a person is asked (by the tool gate, see `needs_approval`) when
   ``bash.require_approval`` (the default) or ``approval.enable`` is on; when both are off it
   runs. Without a front end that can ask (no ``request_approval`` callback) it is refused.

The command runs in ``bash.workdir`` (default: the current directory) in its own process group,
so a timeout or a stop kills everything it started, with a cleared environment (`child_env`).
With ``bash.sandbox = "bwrap"`` it runs inside bubblewrap (see `_sandbox`): read-only system,
writable workdir, no network, the files ania-nb obeys or reads keys from hidden (`sandbox_hidden`)
whether or not they exist yet, resource limits.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, Field

from ..._env import child_env
from ..._subprocess import run_capped
from ...config import (
    BashSettings,
    SecuritySettings,
    kb_folder,
    store_url_secret_files,
    store_url_socket_dirs,
)
from ...errors import ConfigError, ToolError
from ...text import cut, flatten
from ..base import BaseTool, ToolContext
from ._sandbox import (
    MISSING_BWRAP,
    Covers,
    Mount,
    Protected,
    Sandbox,
    bwrap_argv,
    find_program,
    plan_mounts,
)
from ._shellwords import is_simple_command

if TYPE_CHECKING:  # pragma: no cover
    from ...config import Config

TRUNCATED = "\n...(output truncated)"
SUMMARY_LIMIT = 300


def sandbox_hidden(config: Config) -> tuple[Protected, ...]:
    """What the sandbox hides whether or not it exists yet.

    The data directory, the skills folder, the files ania-nb obeys or reads keys from,
    ``security.secret_files``, the knowledge folder (`kb.uri`) and the files and sockets of the
    store's PostgreSQL server (`store.url`).
    """
    from ...config import DEFAULT_CONFIG_FILE

    found = [
        Protected(Path(config.store.data_dir), "store.data_dir", "folder"),
        Protected(Path(config.skills.dir), "skills.dir", "folder"),
        Protected(Path(config.hooks.file), "hooks.file"),
        Protected(Path(config.mcp.config_file), "mcp.config_file"),
        Protected(Path(config.commands.file), "commands.file"),
        Protected(Path(DEFAULT_CONFIG_FILE), f"the default config file {DEFAULT_CONFIG_FILE}"),
    ]
    if config.source_file is not None:
        found.append(Protected(config.source_file, "the config file loaded"))
    found += [Protected(p, "security.secret_files") for p in config.security.secret_files]
    found += [Protected(path, setting, create) for path, setting, create in store_paths(config)]
    # The store expands ~, the other loaders open a path as written: hide both.
    found += [
        Protected(p.path.expanduser(), p.setting, p.create) for p in found if "~" in str(p.path)
    ]
    return tuple(found)


def store_paths(config: Config) -> list[tuple[Path, str, Literal["file", "folder"] | None]]:
    """Where the model must not reach the stored data outside the data directory.

    The knowledge folder of ``kb.uri``; the password and key files ``store.url`` names; and the
    Unix socket folders it connects through (a trusted or peer-authenticated socket would let
    a command read the whole store, credentials or not).
    """
    found: list[tuple[Path, str, Literal["file", "folder"] | None]] = []
    folder = kb_folder(config.kb.uri, Path(config.store.data_dir))
    if config.kb.uri.strip() and folder is not None:
        found.append((folder, "kb.uri", "folder"))
    url = config.store.url.get_secret_value() if config.store.url is not None else ""
    found += [(path, "a file store.url names", "file") for path in store_url_secret_files(url)]
    found += [(path, "store.url's socket folder", None) for path in store_url_socket_dirs(url)]
    return found


class BashParams(BaseModel):
    """bash parameters."""

    command: Annotated[str, Field(description="The shell command to run.")]


def compile_rules(patterns: list[str], key: str) -> list[re.Pattern[str]]:
    """Compile config regexes, naming the bad one."""
    rules = []
    for pattern in patterns:
        try:
            rules.append(re.compile(pattern))
        except re.error as exc:
            raise ConfigError(f"{key}: {pattern!r} is not a valid regex: {exc}", key=key) from None
    return rules


class BashTool(BaseTool[BashParams]):
    """Run a shell command."""

    name = "bash"
    side_effects = True
    shell_arguments = ("command",)  # approvals show each command of the line separately

    def __init__(
        self,
        settings: BashSettings,
        *,
        approval_enabled: bool,
        security: SecuritySettings | None = None,
        hidden: tuple[Protected, ...] = (),
    ) -> None:
        self.settings = settings
        self.security = security  # which inherited variables the command sees
        self.hidden = hidden  # data directory and config files: invisible in the sandbox
        # Approval when either switch is on: bash runs arbitrary code, so it asks by default.
        self.approval_enabled = approval_enabled or settings.require_approval
        self.blacklist = compile_rules(settings.blacklist, "bash.blacklist")
        self.whitelist = compile_rules(settings.whitelist, "bash.whitelist")
        self.shell = settings.shell or "sh"
        ask = (
            "every other command needs a person's approval"
            if self.approval_enabled
            else "other commands run directly"
        )
        where = (
            "in a sandbox (read-only system except the working directory, private /tmp, "
            + ("network allowed" if settings.sandbox_network else "no network")
            + ", limited CPU, memory and processes)"
            if settings.sandbox == "bwrap"
            else "on this machine"
        )
        self.description = (
            f"Run a command with `{self.shell} -c` {where} and get stdout and stderr. "
            f"Commands time out after {settings.timeout:g} s (the whole process tree is killed); "
            f"output is truncated to {settings.max_output_chars} characters. Some commands are "
            "refused; a single simple command matching the whitelist runs without asking, "
            f"{ask}. Prefer `sh script.sh` for scripts and check a program exists with "
            "`command -v name` first."
        )

    def verdict(self, command: str) -> str:
        """``deny:<rule>``, ``allow`` or ``ask`` for a command."""
        for rule in self.blacklist:
            if rule.search(command):
                return f"deny:{rule.pattern}"
        if is_simple_command(command) and any(
            rule.match(command.strip()) for rule in self.whitelist
        ):
            return "allow"
        return "ask"

    async def execute(self, params: BashParams, ctx: ToolContext) -> str:
        """Check the command against the rules, ask if needed, run it."""
        command = params.command
        if not command.strip():
            raise ToolError("command must not be empty")
        verdict = self.verdict(command)
        if verdict.startswith("deny:"):
            raise ToolError(f'bash: command refused by rule "{verdict[5:]}"')
        if verdict == "ask" and self.approval_enabled and not ctx.approved:
            # The tool gate asks (once, with the admin-only rule of the run); reaching here
            # unapproved means the call bypassed the gate, so it must not run.
            raise ToolError(
                "bash: this command needs a person's approval, and this call was not approved"
            )
        return await self._run(command)

    def needs_approval(self, arguments: Mapping[str, Any]) -> bool:
        """Whether the gate must ask a person before this call runs (neither listed nor refused)."""
        command = arguments.get("command")
        return self.approval_enabled and isinstance(command, str) and self.verdict(command) == "ask"

    def approval_summary(self, arguments: Mapping[str, Any]) -> str:
        """What the approval request shows."""
        return "run command: " + flatten(str(arguments.get("command", "")), SUMMARY_LIMIT)

    def argv(
        self, command: str, mounts: list[Mount] | None = None
    ) -> tuple[list[str], dict[str, str], Path]:
        """The program line, environment and working directory ``command`` runs with.

        ``mounts``: the sandbox's hiding plan (`plan_mounts` of `sandbox`) when already made.
        """
        workdir = self.workdir()
        env = child_env(self.security, self.settings.env)  # cleared; bash.env kept
        if self.settings.sandbox != "bwrap":
            return [self.shell, "-c", command], env, workdir
        box = self.sandbox(workdir, env)
        bwrap = find_program("bwrap", MISSING_BWRAP)
        limited = any((box.cpu_seconds, box.memory_mb, box.max_processes))
        prlimit = find_program("prlimit", "bash.sandbox limits need prlimit (util-linux)")
        if mounts is None:
            mounts = plan_mounts(box)
        argv = bwrap_argv(
            bwrap, prlimit if limited else None, [self.shell, "-c", command], box, mounts
        )
        # bwrap needs a minimal environment of its own; the command's is set inside.
        return argv, {"PATH": box.env["PATH"]}, workdir

    def workdir(self) -> Path:
        """The folder commands run in (links resolved); a `ToolError` when it cannot be used."""
        workdir = Path(self.settings.workdir or os.getcwd()).expanduser().resolve()
        if not workdir.is_dir():
            raise ToolError(f"bash: the working directory {str(workdir)!r} does not exist")
        if self.settings.sandbox == "bwrap" and workdir == Path("/"):
            raise ToolError("bash: bash.workdir must not be / with bash.sandbox (it is writable)")
        return workdir

    def sandbox(self, workdir: Path, env: dict[str, str]) -> Sandbox:
        """The sandbox settings of a command running in ``workdir`` with ``env``."""
        env.setdefault("HOME", os.path.expanduser("~"))
        env.setdefault("LANG", "C.UTF-8")
        return Sandbox(
            workdir=workdir,
            protected=self.hidden,
            network=self.settings.sandbox_network,
            cpu_seconds=self.settings.sandbox_cpu_seconds,
            memory_mb=self.settings.sandbox_memory_mb,
            max_processes=self.settings.sandbox_max_processes,
            env=env,
        )

    async def _run(self, command: str) -> str:
        if self.settings.sandbox != "bwrap":
            return await self._execute(command, None)
        box = self.sandbox(self.workdir(), child_env(self.security, self.settings.env))
        covers = Covers(await asyncio.to_thread(plan_mounts, box))
        try:
            await _finished_off_loop(covers.hold)
            return await self._execute(command, covers.mounts)
        finally:
            await _finished_off_loop(covers.release)  # also after a stop: no stand-in is left

    async def _execute(self, command: str, mounts: list[Mount] | None) -> str:
        argv, env, workdir = self.argv(command, mounts)
        try:
            done = await run_capped(
                argv,
                time_limit=self.settings.timeout,
                keep=self.settings.max_output_chars * 4 + 4,  # bytes enough for that many chars
                env=env,
                cwd=workdir,
            )
        except OSError as exc:
            raise ToolError(f"bash: cannot start {argv[0]!r}: {exc.strerror or exc}") from None
        return self._format(done.stdout, done.stderr, done.returncode, done.timed_out)

    def _format(self, stdout: bytes, stderr: bytes, code: int | None, timed_out: bool) -> str:
        out = stdout.decode("utf-8", "replace")
        err = stderr.decode("utf-8", "replace")
        text = out
        if err:
            text += ("\n" if text and not text.endswith("\n") else "") + "stderr: " + err
        limit = self.settings.max_output_chars
        text = cut(text, limit, marker=TRUNCATED)
        text = text.rstrip("\n") or "(no output)"
        if timed_out:
            return text + f"\ncommand timed out after {self.settings.timeout:g} s and was killed"
        if code == 127:
            return text + (
                "\n(exit code 127: command not found — check the name and stderr above, and "
                "verify it exists with `command -v <name>`)"
            )
        if code:
            return text + f"\n(exit code {code})"
        return text


async def _finished_off_loop(work: Callable[[], None]) -> None:
    """Run ``work`` in a worker thread to its end, even when the caller is cancelled meanwhile."""
    job = asyncio.ensure_future(asyncio.to_thread(work))
    try:
        await asyncio.shield(job)
    except asyncio.CancelledError:
        await asyncio.wait({job})
        job.exception()  # retrieved: the cancellation is what goes on
        raise
