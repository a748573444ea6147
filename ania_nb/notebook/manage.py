"""``%ania``: manage the kernel's agent (config, MCP, skills, plan mode, todos, history, tools).

``%ania`` alone prints a status panel (`status`): endpoint, model, whether a key is set, the
data directory, MCP and skills, the tools on offer and any context-window warning.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from IPython.core.error import UsageError

from ..errors import MCPServerError
from .extension import NotebookState

USAGE = (
    "usage: %ania (status) | config [set] [key=value …] | "
    "mcp [list|add NAME CMD [ARGS…]|remove NAME|reconnect NAME|read NAME URI] | "
    "skills [list|reload] | "
    "plan on|off|status | todo | stop | history [list|show [S]|clear [S]] | tools | log [ID] | "
    "team [list|create|delete] | clock [list|log|…] | "
    "kb [SCOPE|add|add-df|search|delete] | memory [SCOPE|forget] | "
    "usage [--days N] [--session S] | quota [reset [SESSION|all]]"
)


async def run_ania(state: NotebookState, line: str) -> Any:
    """Run one ``%ania`` sub-command; prints text or displays a widget."""
    from .magics import split_words

    head, *rest = line.split(None, 1) or [""]
    if head in ("help", "-h", "--help") and not rest:  # what %ania? shows
        print(ania_help())
        return None
    if head == "clock":  # /clock takes free text (a task's content): passed on verbatim
        from .manage_clock import clock_command

        return await clock_command(state, rest[0].strip() if rest else "")
    if head in ("kb", "memory"):  # a search query is free text too: passed on verbatim
        from .manage_kb import kb_command, memory_command

        run = kb_command if head == "kb" else memory_command
        return await run(state, rest[0].strip() if rest else "")
    words = split_words(line)
    if not words:
        from .status import status

        return await status(state, USAGE)
    command, args = words[0], words[1:]
    handler = _COMMANDS.get(command)
    if handler is None:
        raise UsageError(f"unknown %ania command {command!r}\n{USAGE}")
    return await handler(state, args)


def ania_help() -> str:
    """The ``%ania`` magic's help: its docstring, as ``%ania?`` shows it."""
    import inspect

    from .magics import AgentMagics

    return inspect.cleandoc(AgentMagics.ania.__doc__ or USAGE)


async def _config(state: NotebookState, args: list[str]) -> None:
    if args and args[0] == "set":  # "%ania config set k=v" reads as the first-run hints say
        args = args[1:]
        if not args:
            raise UsageError("usage: %ania config set key=value …")
    if not args:
        for info in state.agent().config.describe():
            flag = " (sensitive)" if info.sensitive else ""
            print(f"{info.key} = {info.value!r}{flag}  # {info.description}")
        return
    overrides: dict[str, Any] = {}
    for item in args:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"expected key=value, got {item!r}")
        try:
            overrides[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key.strip()] = raw  # plain strings need no quotes
    try:
        await state.reconfigure(overrides)
    except Exception as exc:
        raise UsageError(str(exc)) from None
    print(f"set {', '.join(sorted(overrides))}; the agent restarts with it on the next run")


async def _mcp(state: NotebookState, args: list[str]) -> None:
    agent = await state.agent().start()
    registry = agent.mcp
    sub = args[0] if args else "list"
    if registry is None:  # nothing configured is a normal state, not an error
        from .status import no_mcp

        print(no_mcp(agent.config))
        return
    if sub == "list":
        print(f"MCP servers from {registry.source()}")
        for s in registry.servers():
            error = f"  error: {s.error}" if s.error else ""
            row = f"{s.name:<20} {s.state:<10} {s.tools:>3} tools  {s.transport:<10} {s.target}"
            print(row + error)
            manager = registry.get(s.name)
            if manager is not None and s.state == "connected" and manager.prompts:
                names = ", ".join(f"/{s.name}:{p.name}" for p in manager.prompts)
                print(f"{'':<20} prompts (run one in a %%agent cell): {names}")
        if not registry.servers():
            print("no MCP servers")
        return
    if len(args) < 2:
        raise UsageError(f"%ania mcp {sub} needs a server name")
    name = args[1]
    try:
        if sub == "add":
            from ..mcp.config import validate_server

            if len(args) < 3:
                raise UsageError("usage: %ania mcp add NAME COMMAND [ARGS…]")
            entry = {"name": name, "transport": "stdio", "command": args[2], "args": args[3:]}
            status = await registry.add(validate_server(entry, "%ania mcp add", f"server {name!r}"))
        elif sub == "remove":
            print("removed" if await registry.remove(name) else f"no server named {name!r}")
            return
        elif sub == "reconnect":
            status = await registry.reconnect(name)
        elif sub == "read":
            from .manage_mcp import read_resource

            if len(args) != 3:
                raise UsageError("usage: %ania mcp read NAME URI")
            await read_resource(state, name, args[2])
            return
        else:
            raise UsageError(f"unknown %ania mcp command {sub!r}")
    except MCPServerError as exc:  # the server's fault, not the user's: said, not a traceback
        print(exc, file=sys.stderr)
        return
    print(
        f"{status.name}: {status.state}, {status.tools} tools"
        + (f" ({status.error})" if status.error else "")
    )


async def _skills(state: NotebookState, args: list[str]) -> None:
    agent = await state.agent().start()
    manager = agent.skills
    if manager is None:  # nothing configured is a normal state, not an error
        from .status import no_skills

        print(no_skills(agent.config))
        return
    if args and args[0] == "reload":
        await manager.refresh()
    elif args and args[0] != "list":
        raise UsageError("usage: %ania skills [list|reload]")
    print(manager.listing())
    for error in manager.errors:
        print(f"broken: {error.path}: {error.reason}")


async def _plan(state: NotebookState, args: list[str]) -> None:
    agent = state.agent()
    session = state.default_session
    sub = args[0] if args else "status"
    if sub in ("on", "off"):
        agent.set_plan_mode(session, sub == "on")
    elif sub != "status":
        raise UsageError("usage: %ania plan on|off|status")
    print(f"plan mode is {'on' if agent.plan_mode(session) else 'off'} for {session}")


async def _todo(state: NotebookState, args: list[str]) -> Any:
    from IPython.display import display

    from .widgets import TodoView

    view = TodoView(state.agent(), state.default_session)
    await view.refresh()
    display(view)


async def _log(state: NotebookState, args: list[str]) -> Any:
    """``%ania log``: the run log table; ``%ania log ID``: one stored run in full."""
    from IPython.display import display

    from .widgets import LogView, record_view

    if args:
        if len(args) > 1 or not args[0].isdigit():
            raise UsageError("usage: %ania log [RUN_ID]  (a run id from the log table)")
        display(await record_view(state.agent(), int(args[0])))
        return
    view = LogView(state.agent())
    await view.refresh()
    display(view)


async def _stop(state: NotebookState, args: list[str]) -> None:
    stopped = state.agent().stop(state.default_session) if state.agent_created else False
    for task in list(state.background):
        task.cancel()
    print("stopped the running request" if stopped else "nothing was running")


async def _history(state: NotebookState, args: list[str]) -> None:
    from .manage_history import history_command

    await history_command(state, args)


async def _team(state: NotebookState, args: list[str]) -> None:
    from .manage_team import team_command

    await team_command(state, args)


async def _usage(state: NotebookState, args: list[str]) -> None:
    from .manage_usage import usage_command

    await usage_command(state, args)


async def _quota(state: NotebookState, args: list[str]) -> None:
    from .manage_usage import quota_command

    await quota_command(state, args)


async def _tools(state: NotebookState, args: list[str]) -> None:
    from .status import tool_tokens, tools_off

    agent = await state.agent().start()
    executor = agent.session(state.default_session).executor
    off = tools_off(agent, executor)
    sent = [d for d in executor.definitions() if d["function"]["name"] not in off]
    for definition in sent:
        size = len(json.dumps(definition, ensure_ascii=False).encode())
        print(f"{definition['function']['name']:<28} {size:>6} B")
    print(f"{len(sent)} tools sent to the model: ≈{tool_tokens(sent):,} tokens per request")
    for name, why in sorted(off.items()):
        print(f"{name:<28} off: {why}")


_COMMANDS = {
    "config": _config,
    "mcp": _mcp,
    "skills": _skills,
    "plan": _plan,
    "todo": _todo,
    "log": _log,
    "stop": _stop,
    "history": _history,
    "tools": _tools,
    "team": _team,
    "usage": _usage,
    "quota": _quota,
}
