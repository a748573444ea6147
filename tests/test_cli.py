"""The ``ania-nb`` command line, run as a real subprocess."""

from __future__ import annotations

import os
import re
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
    turns = [int(t) for t in re.findall(r"LLM calls? · (\d+) tokens", out)]
    assert len(turns) == 3 and "1 LLM call · " in out
    assert re.search(rf"usage today \(\d{{4}}-\d\d-\d\d\): {sum(turns):,} tokens, \$0\.0", out)
    assert out.count(" · $0.00") == 3  # each turn's cost at the example prices
    assert (tmp_path / "demo" / "ania.db").is_file()
    assert out.rstrip().endswith(
        f"The records are kept in {tmp_path / 'demo'}: "
        f"`ANIA_STORE__DATA_DIR={tmp_path / 'demo'} ania-nb runs` lists them "
        "(`... ania-nb usage`: the usage table)."
    )


def test_demo_without_a_data_dir_leaves_nothing_behind_and_says_so(tmp_path):
    done = _run("demo", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    last = done.stdout.rstrip().splitlines()[-1]
    assert last.startswith("The records were in a temporary folder (")
    folder = last.split("(", 1)[1].split(")", 1)[0]
    assert "now deleted; keep them with `ania-nb demo --data-dir DIR`." in last
    assert not os.path.exists(folder)
    assert list(tmp_path.iterdir()) == []  # no .ania/ in the working directory
    runs = _run("runs", cwd=tmp_path)  # and looking for records does not make one either
    assert runs.returncode == 0 and runs.stdout.strip() == "no run records: no store in .ania"
    assert list(tmp_path.iterdir()) == []


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


def test_config_lists_the_new_key_names_and_an_old_one_still_works(tmp_path):
    (tmp_path / "ania.toml").write_text("[subagent]\nmax_result_len = 1234\n")
    done = _run("config", cwd=tmp_path, env={"ANIA_BASH__MAX_OUTPUT": "5000"})
    assert done.returncode == 0, done.stderr
    keys = [line.split(" = ")[0] for line in done.stdout.splitlines() if " = " in line[:60]]
    assert "subagent.max_result_len" not in keys and "bash.max_output" not in keys
    assert "subagent.max_result_chars = 1234" in done.stdout
    assert "bash.max_output_chars = 5000" in done.stdout
    assert "(was: subagent.max_result_len)" in done.stdout
    assert done.stderr.count("config key subagent.max_result_len was renamed to") == 1
    assert done.stderr.count("config key bash.max_output was renamed to") == 1
    assert "llm.base_url = ''" in done.stdout and "llm.model = ''" in done.stdout  # no vendor


def test_bad_config_is_a_clear_error_with_exit_code_2(tmp_path):
    (tmp_path / "ania.toml").write_text("[agent]\nmax_iterations = -1\n")
    done = _run("config", cwd=tmp_path)
    assert done.returncode == 2
    assert "agent.max_iterations" in done.stderr and "Traceback" not in done.stderr


def test_help():
    done = _run("--help")
    assert done.returncode == 0
    assert "demo" in done.stdout and "runs" in done.stdout and "--version" in done.stdout


def test_version():
    from ania_nb import __version__

    done = _run("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"ania-nb {__version__}"


# ------------------------------------------------------------------ ania-nb usage


def _seed_usage(data_dir) -> str:
    """Counters of today and yesterday (UTC) written through the store; returns today."""
    import asyncio
    import time

    from ania_nb.engine.usage import Tokens
    from ania_nb.quota.days import day_of, days_back, zone
    from ania_nb.store import Store

    today = day_of(time.time(), zone("UTC"))
    yesterday = days_back(today, 2)[0]

    async def seed() -> None:
        store = await Store.open(data_dir)
        try:
            await store.usage.add(today, "nb:a", {"m": Tokens(1000, 200, 100, 1200)})
            await store.usage.add(today, "nb:b", {"m": Tokens(50, 10, 0, 60)})
            await store.usage.add(yesterday, "nb:a", {"m": Tokens(500, 0, 0, 500)})
        finally:
            await store.close()

    asyncio.run(seed())
    return today


def test_usage_prints_today_per_session_and_the_daily_table(tmp_path):
    today = _seed_usage(tmp_path / "d")
    config = tmp_path / "quota.toml"
    config.write_text(
        f'[store]\ndata_dir = "{tmp_path / "d"}"\n'
        '[quota]\ntimezone = "UTC"\ndaily_tokens = 1000\n'
        "[pricing.models.m]\ninput = 1.0\noutput = 2.0\ncached = 0.5\n"
    )
    done = _run("usage", "--config", str(config), "--days", "3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"Usage on {today} (UTC); the day resets at 00:00"
    assert "All sessions today: 1,260 tokens (limit unlimited)" in lines
    row = next(x for x in lines if x.startswith("nb:a "))
    assert row.split() == ["nb:a", "1,200", "1,000", "120%", "1,000", "200", "100"]
    assert "Daily tokens, all sessions, last 3 days:" in lines
    assert lines[-1].split()[:2] == [today, "1,260"]
    # today: 950 fresh × 1 + 100 cached × 0.5 + 210 completion × 2, per million
    assert lines[-1].split()[-1] == "$0.0014" and lines[-2].split()[-1] == "$0.0005"
    assert lines[-3].split()[-1] == "-"  # nothing used that day: no cost

    mine = _run("usage", "--file", str(config), "--session", "nb:b", cwd=tmp_path)
    assert mine.returncode == 0, mine.stderr
    assert "Daily tokens, session nb:b, last 14 days:" in mine.stdout
    assert "nb:a" not in mine.stdout and "\nnb:b " in mine.stdout


def test_usage_without_a_store_creates_none_and_bad_arguments_exit_2(tmp_path):
    env = {"ANIA_STORE__DATA_DIR": str(tmp_path / "nothing")}
    done = _run("usage", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"no usage recorded: no store in {tmp_path / 'nothing'}"
    assert not (tmp_path / "nothing").exists()
    for bad, why in (("0", "must be at least 1, got 0"), ("two", "expected a whole number")):
        failed = _run("usage", "--days", bad, env=env, cwd=tmp_path)
        assert failed.returncode == 2 and why in failed.stderr, failed.stderr
    (tmp_path / "ania.toml").write_text('[quota]\ntimezone = "Mars/Base"\n')
    broken = _run("usage", cwd=tmp_path)
    assert broken.returncode == 2 and "unknown time zone 'Mars/Base'" in broken.stderr
    assert "Traceback" not in broken.stderr


def test_usage_help_lists_every_option():
    done = _run("usage", "--help")
    assert done.returncode == 0
    for option in ("--days N", "--session S", "--config PATH", "--file PATH"):
        assert option in done.stdout
    top = _run("--help")
    assert "usage" in top.stdout and "quotas" in top.stdout


def test_every_command_takes_config_and_file_and_checks_runs_arguments_up_front(tmp_path):
    toml = tmp_path / "bot.toml"
    toml.write_text(f'[store]\ndata_dir = "{tmp_path / "data"}"\n[agent]\nqueue_size = 7\n')
    for flag in ("--config", "--file"):
        shown = _run("config", flag, str(toml), cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert "agent.queue_size = 7" in shown.stdout
        listed = _run("runs", flag, str(toml), cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
    for command in ("config", "runs", "usage", "status", "serve"):
        assert "--config PATH, --file PATH" in _run(command, "--help").stdout, command
    refused = _run("runs", "--limit", "-3", cwd=tmp_path)  # no store here: refused anyway
    assert refused.returncode == 2 and "--limit: must be at least 1, got -3" in refused.stderr
    denied = _run("runs", "--status", "denied", "--config", str(toml), cwd=tmp_path)
    assert denied.returncode == 0, denied.stderr
    assert not (tmp_path / "data").exists()  # looking made no store
