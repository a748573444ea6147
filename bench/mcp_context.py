"""MCP context cost: the ``tools`` field per request in eager vs lazy (two-phase) mode.

Starts N real MCP servers (stdio subprocesses of this very script, ``--serve NAME COUNT``, each an
SDK ``MCPServer`` with generated tools of 1-4 typed, described parameters), loads them through
`MCPRegistry` once in eager mode and once in lazy mode, and measures what a session sends as its
``tools`` field: ``SessionToolExecutor.definitions_json()``, the exact bytes of every request.

Eager mode is the baseline measured in the same run; the lazy figures are also given after the
model has loaded a few tools, since that is what a real conversation sends after loading.
Tokens are estimated as characters / 4. Rounds to the first result: the tool calls a model
makes before it holds a tool's result, counted as the bench makes them — eager: call it; lazy:
read the names from ``mcp_load_<server>``'s description, load them in one call, call one (the
discover tool is not needed for that any more).

    .venv/bin/python bench/mcp_context.py
    .venv/bin/python bench/mcp_context.py --servers 5 --tools 100 --loaded 3
    .venv/bin/python bench/mcp_context.py --append bench/RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

HERE = Path(__file__).resolve()
VERBS = ["get", "list", "search", "create", "update", "delete", "export", "summarize"]
NOUNS = ["issue", "page", "record", "file", "event", "invoice", "ticket", "report", "user", "job"]


# --------------------------------------------------------------------------- the generated server


def t_lookup(
    item_id: Annotated[str, Field(description="Identifier of the item, as returned by a search")],
) -> str:
    return f"item {item_id}"


def t_search(
    query: Annotated[str, Field(description="Free-text search query; supports quoted phrases")],
    limit: Annotated[int, Field(description="Maximum number of results to return")] = 10,
) -> str:
    return f"{limit} results for {query}"


def t_write(
    title: Annotated[str, Field(description="Short title shown in listings")],
    body: Annotated[str, Field(description="Full text in Markdown")],
    priority: Annotated[
        Literal["low", "normal", "high"], Field(description="How urgent the item is")
    ] = "normal",
) -> str:
    return f"created {title} ({priority}, {len(body)} chars)"


def t_range(
    start: Annotated[str, Field(description="Start of the period, ISO 8601 date or datetime")],
    end: Annotated[str, Field(description="End of the period, ISO 8601 date or datetime")],
    timezone: Annotated[str, Field(description="IANA time zone used to read the dates")] = "UTC",
    include_archived: Annotated[bool, Field(description="Also return archived items")] = False,
) -> str:
    return f"{start}..{end} {timezone} {include_archived}"


TEMPLATES = [t_lookup, t_search, t_write, t_range]


def serve(name: str, count: int) -> None:
    """Run one generated MCP server over stdio with ``count`` tools."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(name)
    for i in range(count):
        verb, noun = VERBS[i % len(VERBS)], NOUNS[(i // len(VERBS)) % len(NOUNS)]
        server.add_tool(
            TEMPLATES[i % len(TEMPLATES)],
            name=f"{name}_{verb}_{noun}_{i:02d}",
            description=(
                f"{verb.capitalize()} {noun}s in the {name} service. Returns a JSON document "
                f"describing the matching {noun}s, their owners and timestamps."
            ),
        )
    server.run("stdio")


# --------------------------------------------------------------------------- the measurement


async def measure(servers: int, tools: int, loaded: int) -> dict[str, Any]:
    """Start the servers in both modes and return the tools-field sizes."""
    from ania_nb.config import MCPSettings
    from ania_nb.mcp import MCPRegistry
    from ania_nb.tools import SessionToolExecutor, ToolContext, ToolExecutor

    counts = [tools // servers + (1 if i < tools % servers else 0) for i in range(servers)]
    entries = [
        {
            "name": f"svc{i}",
            "command": sys.executable,
            "args": [str(HERE), "--serve", f"svc{i}", str(n)],
            "description": f"the svc{i} service",
        }
        for i, n in enumerate(counts)
    ]
    out: dict[str, Any] = {"servers": servers, "tools": tools}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mcp.json"
        path.write_text(json.dumps({"servers": entries}))
        for mode in ("eager", "lazy"):
            settings = MCPSettings(config_file=path, lazy_load=mode == "lazy", connect_timeout=60)
            shared = ToolExecutor()
            async with MCPRegistry(settings, shared) as registry:
                connected = [s for s in registry.servers() if s.state == "connected"]
                if len(connected) != servers:
                    raise SystemExit(f"only {len(connected)} of {servers} servers connected")
                session = SessionToolExecutor(shared)
                out[mode] = _size(session.definitions_json(), len(session))
                ctx = ToolContext(session="bench", executor=session)
                if mode == "eager":
                    out["eager_rounds"] = await _first_result(session, ctx, sorted(session.names()))
                else:
                    load = next(
                        d["function"]
                        for d in session.definitions()
                        if d["function"]["name"] == "mcp_load_svc0"
                    )
                    listed = load["description"].split("Its tools: ", 1)[1].split(".", 1)[0]
                    names = [n.strip() for n in listed.split(",")][:loaded]
                    done = await session.execute("mcp_load_svc0", {"tool_names": names}, ctx)
                    assert done.error is None, done.text
                    out["lazy_rounds"] = 1 + await _first_result(session, ctx, names)
                    out["lazy_loaded"] = _size(session.definitions_json(), len(session))
                    listing = await session.execute("mcp_discover_svc0", {}, ctx)
                    out["discover_result_chars"] = len(listing.text)
                    out["discover_tools"] = counts[0]
    out["ratio"] = out["lazy"]["bytes"] / out["eager"]["bytes"]
    out["ratio_loaded"] = out["lazy_loaded"]["bytes"] / out["eager"]["bytes"]
    out["loaded"] = loaded
    return out


async def _first_result(session: Any, ctx: Any, names: list[str]) -> int:
    """Call the first of ``names`` with its required arguments filled in; the calls it took."""
    tool = session.get(names[0])
    schema = tool.parameters_schema()
    fill = {"string": "x", "integer": 1, "number": 1, "boolean": False}
    args = {
        key: fill.get(schema["properties"][key].get("type", "string"), "x")
        for key in schema.get("required", [])
    }
    outcome = await session.execute(names[0], args, ctx)
    assert outcome.error is None, outcome.text
    return 1


def _size(text: str, count: int) -> dict[str, int]:
    return {"tools": count, "bytes": len(text.encode("utf-8")), "tokens": round(len(text) / 4)}


def report(r: dict[str, Any]) -> str:
    """Markdown table of one measurement."""
    e, lz, ll = r["eager"], r["lazy"], r["lazy_loaded"]
    rows = [
        ("eager (baseline)", e, "1.000×"),
        ("lazy", lz, f"**{r['ratio']:.3f}×** ({r['ratio'] * 100:.1f} %)"),
        (f"lazy + {r['loaded']} loaded", ll, f"{r['ratio_loaded']:.3f}×"),
    ]
    lines = [
        "| mode | tools in the field | bytes | ≈ tokens (chars/4) | vs eager |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {m} | {s['tools']} | {_n(s['bytes'])} | {_n(s['tokens'])} | {x} |" for m, s, x in rows
    ]
    lines.append("")
    lines.append(
        f"Tool calls to the first result: eager {r['eager_rounds']}, lazy {r['lazy_rounds']} "
        "(load the names the load tool lists, then call; with discover first it was 3)."
    )
    return "\n".join(lines)


def _nproc() -> int:
    # What `nproc` prints: the CPUs this process may run on.
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _n(value: int) -> str:
    return f"{value:,}".replace(",", " ")


def section(r: dict[str, Any]) -> str:
    """The RESULTS.md section: date, machine, command, table, verdict."""
    verdict = "met" if r["ratio"] <= 0.10 else "NOT met"
    return (
        f"\n## MCP context: {datetime.date.today().isoformat()}\n\n"
        f"* Machine: {_nproc()} cores (`nproc`), {platform.system()} "
        f"{platform.release()} {platform.machine()}; Python {platform.python_version()}.\n"
        f"* Command: `.venv/bin/python bench/mcp_context.py --servers {r['servers']} "
        f"--tools {r['tools']} --loaded {r['loaded']}`. {r['servers']} real stdio MCP servers "
        f"(SDK `MCPServer`), {r['tools']} generated tools with 1-4 described parameters each.\n"
        "* Measured: `SessionToolExecutor.definitions_json()`, the exact `tools` bytes of every "
        "request of a session. Eager mode (all tools registered) is the baseline of the same "
        "run.\n\n"
        f"{report(r)}\n\n"
        f"* Target lazy ≤ 10 % of eager: **{verdict}** ({r['ratio'] * 100:.1f} %). Lazy mode sends "
        "one discover/load pair per server; a discovery call costs one tool result "
        f"({r['discover_result_chars']} characters for a {r['discover_tools']}-tool server) "
        "once, not on every request.\n"
    )


def main() -> None:
    """Parse arguments; serve a generated server or run the measurement."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--servers", type=int, default=5, help="number of MCP servers (default 5)")
    parser.add_argument("--tools", type=int, default=100, help="tools in total (default 100)")
    parser.add_argument("--loaded", type=int, default=3, help="tools loaded in the lazy session")
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    parser.add_argument("--append", type=Path, help="append a Markdown section to this file")
    parser.add_argument("--serve", nargs=2, metavar=("NAME", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    if args.servers < 1 or args.tools < args.servers:
        parser.error("need at least one server and at least one tool per server")
    result = asyncio.run(measure(args.servers, args.tools, args.loaded))
    print(json.dumps(result, indent=2) if args.json else report(result))
    if args.append:
        with args.append.open("a", encoding="utf-8") as out:
            out.write(section(result))


if __name__ == "__main__":
    main()
