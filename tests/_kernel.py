"""Real Jupyter kernels in tests: an ``ania.toml`` that points a kernel at the scripted server."""

from __future__ import annotations

from pathlib import Path


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
