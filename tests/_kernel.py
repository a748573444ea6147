"""Real Jupyter kernels in tests: the ``ania.toml`` pointing a kernel at the scripted server,
and the text of cell outputs."""

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


def output_text(outputs: list) -> str:
    """A cell's stream and text/plain outputs, joined."""
    parts = []
    for out in outputs:
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "".join(parts)
