"""The ``ania-nb`` command line, run as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys


def _run(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ania_nb", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def test_demo_runs_offline_with_parallel_tools_and_history(tmp_path):
    done = _run("demo", "--data-dir", str(tmp_path / "demo"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for name in ("word_count", "multiply", "today"):
        assert f"✓  {name}" in out
    assert "has 5 words, 17 × 23 = 391" in out
    assert "Your first question was" in out
    assert "2 LLM calls" in out and "3 tool calls" in out
    assert "📚 injected 《办公室守则》" in out and "fed once a day at 3 pm" in out  # offline kb
    assert (tmp_path / "demo" / "ania.db").is_file()


def test_runs_lists_the_records_of_a_data_dir(tmp_path):
    _run("demo", "--data-dir", str(tmp_path / "d"))
    done = _run("runs", env={"ANIA_STORE__DATA_DIR": str(tmp_path / "d")}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 3 and all("success" in line for line in lines)
    failed = _run("runs", "--status", "error", env={"ANIA_STORE__DATA_DIR": str(tmp_path / "d")})
    assert "no run records" in failed.stdout


def test_config_shows_every_key_with_secrets_masked(tmp_path):
    secret = "sk-very-secret-value-1234"
    done = _run("config", cwd=tmp_path, env={"ANIA_LLM__API_KEY": secret})
    assert done.returncode == 0, done.stderr
    assert secret not in done.stdout
    assert "llm.api_key = '***1234' (sensitive)" in done.stdout
    assert "agent.max_iterations = 20" in done.stdout


def test_bad_config_is_a_clear_error_with_exit_code_2(tmp_path):
    (tmp_path / "ania.toml").write_text("[agent]\nmax_iterations = -1\n")
    done = _run("config", cwd=tmp_path)
    assert done.returncode == 2
    assert "agent.max_iterations" in done.stderr and "Traceback" not in done.stderr


def test_help():
    done = _run("--help")
    assert done.returncode == 0
    assert "demo" in done.stdout and "runs" in done.stdout
