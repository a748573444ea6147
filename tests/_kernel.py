"""Real Jupyter kernels in tests: the ``ania.toml`` pointing a kernel at the scripted server,
the text of cell outputs, and kernels started (or connected to) with bounded retries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def write_config(folder: Path, base_url: str) -> None:
    """Write ``folder/ania.toml``: the scripted model, fast retries, an isolated data dir."""
    (folder / "ania.toml").write_text(
        f"""
[llm]
base_url = "{base_url}"
api_key = "sk-scripted"
model = "scripted"
stream = false
[retry]
base_delay = 0.01
[store]
data_dir = "{folder / "data"}"
[skills]
dir = "{folder / "no-skills"}"
[mcp]
config_file = "{folder / "no-mcp.json"}"
"""
    )


def output_text(outputs: list) -> str:
    """A cell's stream and text/plain outputs, joined."""
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)


# A loaded machine can make a kernel miss a heartbeat or die while it starts (jupyter_client
# then says "Kernel died before replying to kernel_info"): start or connect again, a bounded
# number of times, and skip, saying why, only when every attempt failed.
KERNEL_ATTEMPTS = 3
HEARTBEAT_GRACE = 10.0  # seconds without a heartbeat before a client calls the kernel dead


def ready_client(connection_file: str | Path, timeout: float = 90) -> Any:
    """A started client of a running kernel (e.g. a Jupyter server's) that answered kernel_info.

    A client no KernelManager owns judges the kernel by its heartbeat, whose default grace
    (1 s) a busy machine exceeds: the grace is widened and the wait retried.
    """
    from jupyter_client import BlockingKernelClient

    failures: list[str] = []
    for _ in range(KERNEL_ATTEMPTS):
        client = BlockingKernelClient(connection_file=str(connection_file))
        client.load_connection_file()
        client.hb_channel.time_to_dead = HEARTBEAT_GRACE
        client.start_channels()
        try:
            client.wait_for_ready(timeout=timeout)
        except RuntimeError as exc:
            client.stop_channels()
            failures.append(str(exc))
            continue
        return client
    pytest.skip(f"the kernel did not get ready in {KERNEL_ATTEMPTS} attempts: {failures}")


def start_kernel(cwd: Path, timeout: float = 90) -> tuple[Any, Any]:
    """Start a kernel in ``cwd``; return its manager and a started, ready blocking client."""
    from jupyter_client.manager import KernelManager

    failures: list[str] = []
    for _ in range(KERNEL_ATTEMPTS):
        manager = KernelManager()
        manager.start_kernel(cwd=str(cwd))
        client = manager.blocking_client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=timeout)
        except RuntimeError as exc:  # it died while starting (or never answered)
            client.stop_channels()
            manager.shutdown_kernel(now=True)
            failures.append(str(exc))
            continue
        return manager, client
    pytest.skip(f"no Jupyter kernel could be started in {KERNEL_ATTEMPTS} attempts: {failures}")
