"""Shared by the benchmarks: the scripted server's child process, the baselines' messages."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


class ServerProcess:
    """A scripted LLM server in a child process: ``python <args>`` printing ``base_url=…``."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.startswith("base_url="):
            self.close()
            raise RuntimeError(f"scripted server did not start (got {line!r})")
        self.base_url = line.removeprefix("base_url=")

    def cpu(self) -> float:
        """CPU seconds the server process has used so far (user + system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        """SIGTERM the server and wait for it (SIGKILL after 15 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def assistant_message(msg: Any) -> dict[str, Any]:
    """A typed SDK assistant message with tool calls as the plain dict sent back next round."""
    return {
        "role": "assistant",
        "content": msg.content,
        "tool_calls": [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in msg.tool_calls
        ],
    }
