"""The public surface: `__all__` matches the exports, and importing stays light."""

from __future__ import annotations

import subprocess
import sys

import ania_nb


def test_all_is_sorted_and_matches_the_public_names():
    public = sorted(
        n for n in vars(ania_nb) if (not n.startswith("_") and n[0].isupper()) or n == "tool"
    )
    exported = [n for n in ania_nb.__all__]
    assert exported == sorted(exported)
    assert set(public) <= set(exported) | {"annotations"}
    assert all(hasattr(ania_nb, name) for name in exported)


def test_import_does_not_load_heavy_dependencies():
    code = (
        "import sys, ania_nb, ania_nb.testing; "
        "heavy = [m for m in ('openai', 'mcp', 'lancedb', 'httpx2') if m in sys.modules]; "
        "print(heavy)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
