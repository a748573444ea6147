"""Command line: serve a scripted LLM from a JSON script in the foreground.

    python -m ania_nb.testing serve --script script.json [--loop] [--port 0] [--chunk-size 8]
                                    [--strict-status 400|500]

Prints exactly one line, ``base_url=<url>``, then serves until SIGTERM or SIGINT (exit 0).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from ania_nb.testing._script import script_from_json
from ania_nb.testing._server import ScriptedLLM


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ania_nb.testing",
        description="Scripted OpenAI-compatible Chat Completions server on 127.0.0.1.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a JSON script until SIGTERM/SIGINT")
    serve.add_argument("--script", required=True, type=Path, help="JSON list of script items")
    serve.add_argument(
        "--loop", action="store_true", help="cycle the script instead of consuming it"
    )
    serve.add_argument("--port", type=int, default=0, help="TCP port (default: a free one)")
    serve.add_argument("--chunk-size", type=int, default=8, help="characters per stream chunk")
    serve.add_argument(
        "--strict-status",
        type=int,
        metavar="CODE",
        help="refuse conversations real servers refuse, with this HTTP status "
        "(400 as OpenAI does, 500 as llama-server does); default: accept any",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        items = script_from_json(args.script.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        parser.error(f"cannot load script {str(args.script)!r}: {exc}")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    strict = args.strict_status is not None
    try:
        llm = ScriptedLLM(
            loop=args.loop,
            chunk_size=args.chunk_size,
            port=args.port,
            strict=strict,
            strict_status=args.strict_status if strict else 400,
        )
    except ValueError as exc:
        parser.error(str(exc))
    with llm:
        llm.script(*items)
        print(f"base_url={llm.base_url}", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
