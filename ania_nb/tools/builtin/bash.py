"""`bash`: run a shell command, with a three-tier verdict.

1. a blacklist regex matches → refused (the rule is named);
2. a whitelist regex matches → runs;
3. otherwise → a person is asked (by the tool gate, see `needs_approval`) when approval is
   enabled; when it is not, the command runs.

Regexes search anywhere in the raw command. The command runs in its own process group so a
timeout or a stop kills everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, Field

from ...config import BashSettings
from ...errors import ConfigError, ToolError
from ..base import BaseTool, ToolContext

TRUNCATED = "\n...(output truncated)"
SUMMARY_LIMIT = 300
KILL_GRACE = 2.0  # seconds to wait for a killed command's pipes to close


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


def summarize(command: str, limit: int = SUMMARY_LIMIT) -> str:
    """Whitespace collapsed and cut to ``limit`` characters, for approval prompts."""
    flat = " ".join(command.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class BashTool(BaseTool[BashParams]):
    """Run a shell command."""

    name = "bash"
    side_effects = True
    shell_arguments = ("command",)  # approvals show each command of the line separately

    def __init__(self, settings: BashSettings, *, approval_enabled: bool) -> None:
        self.settings = settings
        self.approval_enabled = approval_enabled
        self.blacklist = compile_rules(settings.blacklist, "bash.blacklist")
        self.whitelist = compile_rules(settings.whitelist, "bash.whitelist")
        self.shell = settings.shell or "sh"
        ask = (
            "other commands need a human's approval"
            if approval_enabled
            else "other commands run directly"
        )
        self.description = (
            f"Run a command with `{self.shell} -c` on this machine and get stdout and stderr. "
            f"Commands time out after {settings.timeout:g} s (the whole process tree is killed); "
            f"output is truncated to {settings.max_output} characters. Blacklisted commands are "
            f"refused, whitelisted ones run, {ask}. Prefer `sh script.sh` for scripts and check "
            "a program exists with `command -v name` first."
        )

    def verdict(self, command: str) -> str:
        """``deny:<rule>``, ``allow`` or ``ask`` for a command."""
        for rule in self.blacklist:
            if rule.search(command):
                return f"deny:{rule.pattern}"
        if any(rule.search(command) for rule in self.whitelist):
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
        return "run command: " + summarize(str(arguments.get("command", "")))

    async def _run(self, command: str) -> str:
        env = dict(os.environ)
        for entry in self.settings.env:
            key, sep, value = entry.partition("=")
            if sep and key:
                env[key] = value
        try:
            proc = await asyncio.create_subprocess_exec(
                self.shell,
                "-c",
                command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,  # its own process group: killable as a whole
            )
        except OSError as exc:
            raise ToolError(f"bash: cannot start {self.shell!r}: {exc.strerror or exc}") from None
        # Read both pipes as the command runs, keeping only what the output limit can show:
        # what was printed before a timeout survives, and a flood cannot fill memory.
        keep = self.settings.max_output * 4 + 4  # bytes enough for max_output characters
        out, err = bytearray(), bytearray()
        assert proc.stdout is not None and proc.stderr is not None
        tasks = [
            asyncio.ensure_future(proc.wait()),
            asyncio.ensure_future(_drain(proc.stdout, out, keep)),
            asyncio.ensure_future(_drain(proc.stderr, err, keep)),
        ]
        try:
            # Done when the shell exited and the pipes closed (background children included).
            _, pending = await asyncio.wait(tasks, timeout=self.settings.timeout)
            timed_out = bool(pending)
            if timed_out:
                _kill_group(proc.pid)
                await _settle(pending)
        except asyncio.CancelledError:  # /stop: do not leave the command running
            _kill_group(proc.pid)
            with contextlib.suppress(Exception):
                await asyncio.shield(_settle(tasks))
            raise
        return self._format(bytes(out), bytes(err), proc.returncode, timed_out)

    def _format(self, stdout: bytes, stderr: bytes, code: int | None, timed_out: bool) -> str:
        out = stdout.decode("utf-8", "replace")
        err = stderr.decode("utf-8", "replace")
        text = out
        if err:
            text += ("\n" if text and not text.endswith("\n") else "") + "stderr: " + err
        limit = self.settings.max_output
        if len(text) > limit:
            text = text[:limit] + TRUNCATED
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


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _drain(stream: asyncio.StreamReader, into: bytearray, keep: int) -> None:
    """Read ``stream`` to its end, keeping the first ``keep`` bytes (the rest is discarded)."""
    while chunk := await stream.read(65536):
        room = keep - len(into)
        if room > 0:
            into += chunk[:room]


async def _settle(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """After a kill: let the process be reaped and the pipes close, briefly.

    A process that left the group (``setsid``) may keep a pipe open; its reader is then
    abandoned rather than waited for.
    """
    _, stuck = await asyncio.wait(list(tasks), timeout=KILL_GRACE)
    for task in stuck:
        task.cancel()
