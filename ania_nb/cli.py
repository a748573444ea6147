"""The ``ania-nb`` command line: demo, config, runs, usage, status, serve, chat and store."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, get_args

if TYPE_CHECKING:  # pragma: no cover
    from .config import Config
    from .quota import UsageReport
    from .store import Store

T = TypeVar("T")


def _parser() -> argparse.ArgumentParser:
    from ._version import VERSION
    from .result import RunStatus

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
    _add_config_flag(config)
    runs = sub.add_parser("runs", help="list recent run records from the store")
    _add_config_flag(runs)
    runs.add_argument("--session", help="only this session")
    runs.add_argument("--status", choices=["running", *get_args(RunStatus)])
    runs.add_argument(
        "--limit", type=_positive, default=20, metavar="N", help="how many (default 20)"
    )
    usage = sub.add_parser(
        "usage",
        help="today's tokens per session against the quotas and the daily totals",
        description="Print today's token usage per session against quota.daily_tokens and "
        "quota.global_daily_tokens, and the daily totals (with costs when pricing.models "
        "prices every model used) of the store in store.data_dir.",
    )
    _add_config_flag(usage)
    usage.add_argument(
        "--days", type=_positive, default=14, metavar="N", help="days of history (default 14)"
    )
    usage.add_argument("--session", metavar="S", help="only this session")
    status = sub.add_parser(
        "status",
        help="the replicas serving the store, the inbox depth and the outbox backlog",
        description="Show the replicas of `ania-nb serve` on the configured store (alive: "
        "holding their lock now), how many chat messages wait or are being answered, and how "
        "many replies wait to be sent. Exit code 0; with --json, one JSON object (for health "
        "checks).",
    )
    _add_config_flag(status)
    status.add_argument("--json", action="store_true", help="print one JSON object")
    _add_serve(sub)
    _add_chat(sub)
    _add_store(sub)
    return parser


def _add_config_flag(parser: argparse.ArgumentParser, what: str = "") -> None:
    """``--config PATH`` (alias ``--file``): the TOML file a command reads."""
    parser.add_argument(
        "--config",
        "--file",
        dest="file",
        type=Path,
        metavar="PATH",
        help=f"TOML file to read{what} (default: ./ania.toml if present)",
    )


STORE_MIGRATE_DESCRIPTION = """\
Copy the SQLite store of a data directory (its ania.db) into a PostgreSQL database: every
table with its ids — chat history, run records, the op log, KV namespaces (saved teams among
them), clock tasks and their log, usage counters and ledger, the inbox, outbox and pending
approvals — in one transaction, then move each id sequence past the largest copied id so new
rows never collide. Stop every ania-nb process using the directory first.

The source is only read (a consistent snapshot, upgraded to this ania-nb's schema in a
temporary copy): it is never changed, so the directory keeps working if you go back. The target
gets ania-nb's tables if it has none; a target that already holds ania-nb rows is refused
unless --force, which DELETES those rows and replaces them with the source's (running the
command again with --force gives the same result). Afterwards set store.url to the same URL.

Give the password through PGPASSWORD or a PGPASSFILE rather than in the URL (the command line
is visible to other users); messages never show it.

exit codes: 0 copied; 2 nothing copied (no store in the directory, a bad URL, the server
unreachable or refusing the credentials, a non-empty target without --force)."""


def _add_store(sub: Any) -> None:
    store = sub.add_parser("store", help="operate on the store (migrate: SQLite to PostgreSQL)")
    actions = store.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    migrate = actions.add_parser(
        "migrate",
        help="copy a data directory's SQLite store into a PostgreSQL database",
        description=STORE_MIGRATE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    migrate.add_argument(
        "--to", required=True, metavar="URL", help="the target: postgresql://user@host:port/db"
    )
    migrate.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="the directory holding ania.db (default: store.data_dir of the config)",
    )
    _add_config_flag(migrate, " for store.data_dir")
    migrate.add_argument(
        "--force",
        action="store_true",
        help="replace the ania-nb rows the target already holds (they are deleted)",
    )


SERVE_DESCRIPTION = """\
Serve the agent to QQ through a OneBot v11 implementation (NapCat, Lagrange, LLOneBot, …)
until SIGINT or SIGTERM. Settings come from ania.toml (or --config), then ANIA_* environment
variables (ANIA_RUNNER__MODE, ANIA_RUNNER__ACCESS_TOKEN, ANIA_LLM__API_KEY, …); the runner.*
keys are listed by `ania-nb config`.

runner.mode = "reverse" (default): listen on runner.host:runner.port at runner.path
(ws://127.0.0.1:8095/onebot/v11/ws) for the implementation's reverse WebSocket; a listener on a
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
    _add_config_flag(serve)
    serve.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        default="INFO",
        help="least severe log records shown (default INFO; DEBUG is ania-nb's own, the HTTP, "
        "WebSocket and MCP libraries stay at INFO)",
    )
    serve.add_argument(
        "--replica-id",
        metavar="NAME",
        help="this replica's name when several replicas share one PostgreSQL store "
        "(runner.replica_id; default <host>:<pid>); a live replica's name is refused",
    )


CHAT_DESCRIPTION = """\
Try the bot without QQ: you type as a QQ user, the bot's replies (approval requests included)
are printed as they come. By default this starts a small OneBot v11 implementation on 127.0.0.1
(ania_nb.testing.onebot, the one the tests use) and `ania-nb serve` with the same config,
told to dial it with a one-time token; --connect dials a `serve` already running in reverse
mode instead (runner.host, runner.port, runner.path and runner.access_token of the config).

Each line is a message from the current user. Lines starting with ':' are the simulator's:
:private [QQ], :group GROUP [QQ] (messages there @ the bot), :plain TEXT (a group message
without the @), :who, :help, :quit. /commands and approval answers (允许, 拒绝) are plain
messages, as in QQ. At the end of input (Ctrl-D, or a closed pipe) it waits until the bot has
been quiet for --settle seconds, then stops what it started.

exit codes: 0 done; 1 `ania-nb serve` ended on its own; 2 the bot never connected, or a bad
config."""


def _add_chat(sub: Any) -> None:
    chat = sub.add_parser(
        "chat",
        help="try the bot without QQ: type as a QQ user, see its replies (approvals included)",
        description=CHAT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_config_flag(chat)
    chat.add_argument(
        "--connect",
        action="store_true",
        help="dial a running `ania-nb serve` (reverse mode) instead of starting one",
    )
    chat.add_argument("--user", type=_positive, default=10001, metavar="QQ", help="you (10001)")
    chat.add_argument("--self-id", default="10000", metavar="QQ", help="the bot's QQ (10000)")
    chat.add_argument(
        "--settle",
        type=float,
        default=3.0,
        metavar="S",
        help="at the end of input, wait until the bot was quiet this long (default 3)",
    )
    chat.add_argument(
        "--wait", type=float, default=120.0, metavar="S", help="but at most this long (120)"
    )
    chat.add_argument(
        "--wait-connect",
        type=float,
        default=60.0,
        metavar="S",
        help="how long the bot may take to connect (default 60)",
    )


def _serve_address(path: Path | None) -> tuple[str, str | None]:
    """The URL and token a running reverse-mode ``serve`` listens with, from the config."""
    from .config import Config

    runner = Config.load(path).runner
    token = runner.access_token.get_secret_value() if runner.access_token else None
    host = "127.0.0.1" if runner.host in ("0.0.0.0", "::", "") else runner.host
    return f"ws://{host}:{runner.port}{runner.path}", token


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
    from .result import run_headline

    async def read(config: Config, store: Store) -> None:
        records = await store.runs.list(session=args.session, status=args.status, limit=args.limit)
        if not records:
            print(f"no run records in {config.store.data_dir}")
        for r in records:
            when = datetime.fromtimestamp(r.started_at).strftime("%Y-%m-%d %H:%M:%S")
            _, words = run_headline(r.status, (call.outcome for call in r.tool_calls))
            print(
                f"#{r.id:<5} {when}  {words:<11} {r.session:<16} {r.duration_ms or 0:>7} ms "
                f"{r.total_tokens:>7} tok  {r.tool_calls_total} tools  {r.input[:60]!r}"
            )

    await _read_store(args, "no run records", read)
    return 0


async def _show_status(args: argparse.Namespace) -> int:
    import json

    from .store.replicas import service_status

    async def read(config: Config, store: Store) -> None:
        status = await store.db.run(service_status)
        print(json.dumps(status.to_json()) if args.json else status.to_text())

    await _read_store(args, "no status", read)
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


async def _migrate_store(args: argparse.Namespace) -> int:
    """``ania-nb store migrate``: copy the data directory's SQLite store into ``--to``."""
    import tempfile

    from .addresses import mask_url
    from .errors import UsageError
    from .store.db import DB_FILENAME
    from .store.postgres import PostgresDatabase
    from .store.transfer import copy_store, open_snapshot

    if not args.to.startswith(("postgresql://", "postgres://")):
        raise UsageError(
            f"--to must be a postgresql:// (or postgres://) URL, got {mask_url(args.to)!r}"
        )
    if args.data_dir is None:
        from .config import Config

        data_dir = Path(Config.load(args.file).store.data_dir)
    else:
        data_dir = args.data_dir
    db_file = data_dir / DB_FILENAME
    if not db_file.is_file():
        raise UsageError(f"no store in {data_dir} ({DB_FILENAME} not found): nothing to migrate")
    with tempfile.TemporaryDirectory(prefix="ania-migrate-") as folder:
        source = await open_snapshot(db_file, Path(folder))
        try:
            target = await PostgresDatabase.open(args.to)
            try:
                copied = await copy_store(source, target, force=args.force)
            finally:
                await target.close()
        finally:
            await source.close()
    for table, rows in copied.items():
        print(f"{table:<15} {rows:>9} rows")
    print(f"copied {sum(copied.values())} rows from {db_file} into {mask_url(args.to)}")
    return 0


def _without_password(message: str, url: str) -> str:
    """``message`` with the password of ``url`` masked, wherever a driver may have echoed it."""
    from urllib.parse import unquote, urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        return message
    for form in {password, unquote(password)} if password else ():
        message = message.replace(form, "***")
    return message


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
        if args.command == "status":
            return asyncio.run(_show_status(args))
        if args.command == "serve":
            from .runner.serve import main as serve_main

            return serve_main(args.file, args.log_level, replica_id=args.replica_id)
        if args.command == "chat":
            from .testing.chat import run_chat

            connect = _serve_address(args.file) if args.connect else None
            return asyncio.run(run_chat(args, connect))
        if args.command == "store" and args.store_command == "migrate":
            return asyncio.run(_migrate_store(args))
    except AniaError as exc:
        message = str(exc)
        if args.command == "store":
            message = _without_password(message, args.to)
        print(f"ania-nb: error: {message}", file=sys.stderr)
        return 2
    _parser().print_help()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
