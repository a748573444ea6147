"""The ``ania-nb`` command line: ``demo``, ``config``, ``runs``, ``usage`` and ``serve``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # pragma: no cover
    from .config import Config
    from .quota import UsageReport
    from .store import Store

T = TypeVar("T")


def _parser() -> argparse.ArgumentParser:
    from ._version import VERSION

    parser = argparse.ArgumentParser(
        prog="ania-nb",
        description="ania-nb: a Jupyter-native LLM agent. In a notebook: %load_ext ania_nb.",
    )
    parser.add_argument("--version", action="version", version=f"ania-nb {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo", help="run an offline agent conversation against the built-in scripted model"
    )
    demo.add_argument(
        "--data-dir", type=Path, help="keep the store here (default: a temporary folder, deleted)"
    )
    config = sub.add_parser("config", help="show every setting with its value, default and meaning")
    config.add_argument("--file", type=Path, help="TOML file to read (default: ./ania.toml)")
    runs = sub.add_parser("runs", help="list recent run records from the store")
    runs.add_argument("--file", type=Path, help="TOML file to read (default: ./ania.toml)")
    runs.add_argument("--session", help="only this session")
    runs.add_argument(
        "--status", choices=["running", "success", "stopped", "timeout", "error", "interrupted"]
    )
    runs.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    usage = sub.add_parser(
        "usage",
        help="today's tokens per session against the quotas and the daily totals",
        description="Print today's token usage per session against quota.daily_tokens and "
        "quota.global_daily_tokens, and the daily totals (with costs when pricing.models "
        "prices every model used) of the store in store.data_dir.",
    )
    usage.add_argument(
        "--config",
        "--file",
        dest="file",
        type=Path,
        metavar="PATH",
        help="TOML file to read (default: ./ania.toml)",
    )
    usage.add_argument(
        "--days", type=_positive, default=14, metavar="N", help="days of history (default 14)"
    )
    usage.add_argument("--session", metavar="S", help="only this session")
    _add_serve(sub)
    return parser


SERVE_DESCRIPTION = """\
Serve the agent to QQ through a OneBot v11 implementation (NapCat, Lagrange, LLOneBot, …)
until SIGINT or SIGTERM. Settings come from ania.toml (or --config), then ANIA_* environment
variables (ANIA_RUNNER__MODE, ANIA_RUNNER__ACCESS_TOKEN, ANIA_LLM__API_KEY, …); the runner.*
keys are listed by `ania-nb config`.

runner.mode = "reverse" (default): listen on runner.host:runner.port at runner.path
(ws://127.0.0.1:8080/onebot/v11/ws) for the implementation's reverse WebSocket; a listener on a
non-loopback address requires runner.access_token. runner.mode = "forward": dial the
implementation's WebSocket server at runner.url.

On a signal: stop taking messages, let running replies finish for runner.grace_seconds, stop
the rest (run records end 'stopped'), close the connection, MCP sessions and the store. A second
signal skips the grace period. Logs go to stderr, one line each; no log level prints a
configured secret (tokens, API keys, MCP header and env values are blanked as ***).

exit codes: 0 stopped by a signal; 1 crashed, or the connection loop stopped (see the log);
2 cannot start (bad config; no model: llm.base_url, llm.model or a hosted endpoint's
llm.api_key not set; a listener that may not or cannot be opened)."""


def _add_serve(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve the agent as a QQ bot over OneBot v11 (forward or reverse WebSocket)",
        description=SERVE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument(
        "--config",
        "--file",
        dest="file",
        type=Path,
        metavar="PATH",
        help="TOML file to read (default: ./ania.toml if present)",
    )
    serve.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        default="INFO",
        help="least severe log records shown (default INFO; DEBUG is ania-nb's own, the HTTP, "
        "WebSocket and MCP libraries stay at INFO)",
    )


def _positive(text: str) -> int:
    """A whole number of at least 1 (argparse type: a bad one exits with code 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _show_config(path: Path | None) -> int:
    from .config import Config

    config = Config.load(path)
    for info in config.describe():
        flag = " (sensitive)" if info.sensitive else ""
        print(
            f"{info.key} = {info.value!r}{flag}\n    {info.description} Default: {info.default!r}"
        )
    return 0


async def _read_store(
    args: argparse.Namespace, nothing: str, read: Callable[[Config, Store], Awaitable[T]]
) -> T | None:
    """``read(config, store)`` on the store of ``args.file``'s config, closed afterwards.

    None (and ``<nothing>: no store in <dir>`` printed) when there is no store yet: reading
    must not create an empty one.
    """
    from .config import Config
    from .store import Store
    from .store.db import DB_FILENAME

    config = Config.load(args.file)
    data_dir = Path(config.store.data_dir)
    url = config.store.url_in_clear()
    if not url and not (data_dir / DB_FILENAME).is_file():
        print(f"{nothing}: no store in {data_dir}")
        return None
    store = await Store.open(data_dir, url=url)
    try:
        return await read(config, store)
    finally:
        await store.close()


async def _show_runs(args: argparse.Namespace) -> int:
    async def read(config: Config, store: Store) -> None:
        records = await store.runs.list(session=args.session, status=args.status, limit=args.limit)
        if not records:
            print(f"no run records in {config.store.data_dir}")
        for r in records:
            when = datetime.fromtimestamp(r.started_at).strftime("%Y-%m-%d %H:%M:%S")
            print(
                f"#{r.id:<5} {when}  {r.status:<11} {r.session:<16} {r.duration_ms or 0:>7} ms "
                f"{r.total_tokens:>7} tok  {r.tool_calls_total} tools  {r.input[:60]!r}"
            )

    await _read_store(args, "no run records", read)
    return 0


async def _show_usage(args: argparse.Namespace) -> int:
    from .quota import Quota

    async def read(config: Config, store: Store) -> UsageReport:
        async def open_store() -> Store:
            return store

        return await Quota(lambda: config, open_store).report(args.days, args.session)

    report = await _read_store(args, "no usage recorded", read)
    if report is not None:
        print(report.to_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = _parser().parse_args(argv)
    from .errors import AniaError

    try:
        if args.command == "demo":
            from .demo import main as demo_main

            return demo_main(args.data_dir)
        if args.command == "config":
            return _show_config(args.file)
        if args.command == "runs":
            return asyncio.run(_show_runs(args))
        if args.command == "usage":
            return asyncio.run(_show_usage(args))
        if args.command == "serve":
            from .runner.serve import main as serve_main

            return serve_main(args.file, args.log_level)
    except AniaError as exc:
        print(f"ania-nb: error: {exc}", file=sys.stderr)
        return 2
    _parser().print_help()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
