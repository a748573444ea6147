"""The store backends compared: bench/runner.py on SQLite and on PostgreSQL, A-B-B-A in one run.

Each block is one ``bench/runner.py --json`` run (its own child process, in-memory engine path
and durable runner path) with the store on SQLite (the embedded default) or on a fresh
PostgreSQL database. Prints throughput and CPU per message of both paths on both backends and
the ratios PostgreSQL / SQLite (target: PostgreSQL ≥ 0.8× SQLite's single-process throughput at
50 ms model latency).

    python bench/store_backends.py --pg-url postgresql://user@127.0.0.1:5432/postgres [--quick]

``--pg-url`` needs the right to create databases; each PostgreSQL block gets a fresh one.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent


def fresh_database(admin_url: str) -> tuple[str, str]:
    """Create an empty database; its name and URL."""
    import psycopg

    name = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    return name, urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}"))


def drop_database(admin_url: str, name: str) -> None:
    """Drop a database made by `fresh_database`."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def block(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """One bench/runner.py run on ``backend``; its throughput rows."""
    cmd = [sys.executable, str(HERE / "runner.py"), "--json", "--memory-messages", "0"]
    cmd += ["--latency", str(args.latency)]
    if args.quick:
        cmd.append("--quick")
    name = ""
    if backend == "postgres":
        name, url = fresh_database(args.pg_url)
        cmd += ["--store-url", url]
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    finally:
        if name:
            drop_database(args.pg_url, name)
    rows = json.loads(out)["throughput"]
    return {path: rows[path] for path in ("engine", "runner") if path in rows}


def main(argv: list[str] | None = None) -> int:
    """Run the blocks A-B-B-A and print the comparison."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--pg-url", default=os.environ.get("ANIA_BENCH_PG_URL", ""))
    p.add_argument("--quick", action="store_true", help="bench/runner.py --quick blocks")
    p.add_argument("--latency", type=float, default=0.05, help="model latency per call, s")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    args = p.parse_args(argv)
    if not args.pg_url:
        p.error("give --pg-url (or ANIA_BENCH_PG_URL): a PostgreSQL URL that may create databases")
    results: dict[str, list[dict[str, Any]]] = {"sqlite": [], "postgres": []}
    for backend in ("sqlite", "postgres", "postgres", "sqlite"):
        rows = block(backend, args)
        results[backend].append(rows)
        shown = "  ".join(
            f"{path} {r['messages_per_s']:.1f} msg/s {r['cpu_ms_per_message']:.2f} CPU ms/msg"
            for path, r in rows.items()
        )
        print(f"{backend:8} {shown}", file=sys.stderr, flush=True)
    summary: dict[str, Any] = {"blocks": results}
    for path in ("engine", "runner"):
        mean = {
            b: {
                key: statistics.fmean(r[path][key] for r in results[b])
                for key in ("messages_per_s", "cpu_ms_per_message")
            }
            for b in results
            if all(path in r for r in results[b])
        }
        if len(mean) == 2:
            ratio = {key: mean["postgres"][key] / mean["sqlite"][key] for key in mean["sqlite"]}
            summary[path] = {"mean": mean, "postgres_over_sqlite": ratio}
            print(
                f"{path}: PostgreSQL / SQLite throughput {ratio['messages_per_s']:.2f}×, "
                f"CPU per message {ratio['cpu_ms_per_message']:.2f}×",
                file=sys.stderr,
            )
    if args.json:
        print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
