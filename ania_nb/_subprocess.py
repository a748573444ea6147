"""Run a shell command in its own process group with bounded output and a timeout that holds.

Shared by `bash` and shell hooks. The timeout bounds the shell *and* its output pipes: a child
that left the group (``setsid``, a daemon) and still holds a pipe cannot keep the caller
waiting — the group is killed, the shell gets `KILL_GRACE` seconds to be reaped, and the pipes
are closed by us instead of read on. Each pipe keeps only its first ``keep`` bytes, so a flood
cannot fill memory (``stdout_cut``/``stderr_cut`` say whether more came). Cancellation kills the
group too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

KILL_GRACE = 2.0  # seconds a killed shell gets to be reaped


@dataclass(frozen=True)
class Finished:
    """How a command ended: its (capped) output, exit code, and whether it timed out."""

    stdout: bytes
    stderr: bytes
    returncode: int | None
    timed_out: bool
    stdout_cut: bool = False  # more than ``keep`` bytes came: ``stdout`` is only the start
    stderr_cut: bool = False


async def run_capped(
    argv: Sequence[str],
    *,
    time_limit: float,
    keep: int,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: bytes | None = None,
) -> Finished:
    """Run ``argv`` (see the module docstring); `OSError` when it cannot start."""
    loop = asyncio.get_running_loop()
    transport, proc = await loop.subprocess_exec(
        lambda: _CappedOutput(keep),
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,  # its own process group: killable as a whole
    )
    timed_out = False
    try:
        if stdin is not None:
            pipe = transport.get_pipe_transport(0)
            if isinstance(pipe, asyncio.WriteTransport):
                pipe.write(stdin)
                pipe.close()
        if not (await asyncio.wait({proc.finished}, timeout=time_limit))[0]:
            timed_out = True
            kill_group(transport.get_pid())
            await asyncio.wait({proc.exited}, timeout=KILL_GRACE)
    except BaseException:  # cancelled (a stop): never leave the command running
        kill_group(transport.get_pid())
        raise
    finally:
        transport.close()  # closes the pipes now, not at garbage collection
    return Finished(
        bytes(proc.out),
        bytes(proc.err),
        transport.get_returncode(),
        timed_out,
        stdout_cut=1 in proc.cut,
        stderr_cut=2 in proc.cut,
    )


def kill_group(pid: int | None) -> None:
    """SIGKILL a process group (gone already is fine)."""
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class _CappedOutput(asyncio.SubprocessProtocol):
    """stdout and stderr (the first ``keep`` bytes of each), with two futures.

    ``exited``: the shell ended; ``finished``: its output pipes closed too.
    """

    def __init__(self, keep: int) -> None:
        loop = asyncio.get_running_loop()
        self.keep = keep
        self.out, self.err = bytearray(), bytearray()
        self.cut: set[int] = set()  # the pipes (1, 2) that sent more than ``keep`` bytes
        self.exited: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        self._open = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        """Keep the first ``keep`` bytes of each pipe."""
        buffer = self.out if fd == 1 else self.err
        room = max(0, self.keep - len(buffer))
        if len(data) > room:
            self.cut.add(fd)
        buffer += data[:room]

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        """Note that stdout or stderr reached its end."""
        self._open.discard(fd)
        self._check()

    def process_exited(self) -> None:
        """Note that the shell exited."""
        if not self.exited.done():
            self.exited.set_result(None)
        self._check()

    def _check(self) -> None:
        if self.exited.done() and not self._open and not self.finished.done():
            self.finished.set_result(None)
