"""``%%agent`` / ``%agent`` (run the agent) and ``%ania`` (manage it).

A cell that starts with ``%%agent`` (or is a single ``%agent …`` / ``%ania …`` line) is rewritten
by `transform_cell` into ``await run_magic(...)``: IPython's autoawait then runs it on the
kernel's event loop, so widget clicks (Allow / Deny) are handled while the cell waits. Called any
other way, the magics fall back to a background task (inside a running loop) or a private loop.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..errors import RunError, StoreError
from ..errors import UsageError as AniaUsageError
from .extension import NotebookState
from .interpolate import interpolate

T = TypeVar("T")


def _named(name: str) -> Any:
    """Give a magic's parser its user-facing name (IPython takes the function's otherwise)."""

    def mark(func: Any) -> Any:
        func.argcmd_name = name
        return func

    return mark


def _options(func: Any) -> Any:
    """The options shared by %%agent and %agent."""
    for deco in reversed(
        [
            argument("-s", "--session", help="conversation to use (default: this notebook's)"),
            argument("--new", action="store_true", help="start a new conversation (keeps the old)"),
            argument("-m", "--model", help="model for this run"),
            argument("--plan", action="store_true", help="plan mode for this run: no side effects"),
            argument("--bg", action="store_true", help="return at once; the widget keeps updating"),
            argument("-q", "--quiet", action="store_true", help="no widget; return the result"),
        ]
    ):
        func = deco(func)
    return func


@magics_class
class AgentMagics(Magics):
    """The ania-nb magics; ``state`` holds the kernel's Agent."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.state = NotebookState(shell)

    @magic_arguments()
    @_options
    @_named("%agent")  # the help shows %%agent, not the method's name
    @cell_magic("agent")  # type: ignore[arg-type]  # IPython's decorator typing is too narrow
    def agent_cell(self, line: str, cell: str) -> Any:
        """Ask the agent; the cell body is the prompt.

        {name}, {In[n]} and {Out[n]} in the prompt are filled in from the notebook. The result (a
        RunResult) is stored as ``_``. Consecutive cells are one conversation, which follows the
        notebook across renames and kernel restarts; --new starts another one and keeps the old
        one (%ania history list). The kernel's Interrupt stops the run.
        """
        return self._fallback(shown_cleanly(run_agent(self, line, cell)))

    @magic_arguments()
    @argument("prompt", nargs="+", help="the prompt")
    @_options
    @_named("agent")
    @line_magic("agent")  # type: ignore[arg-type]
    def agent_line(self, line: str) -> Any:
        """Ask the agent in one line: %agent [options] PROMPT (see %%agent?)."""
        return self._fallback(shown_cleanly(run_agent(self, line, None)))

    @line_magic("ania")  # type: ignore[arg-type]
    def ania(self, line: str) -> Any:
        """Manage the agent: settings, MCP, skills, plan mode, todos, history, clock, teams, kb.

        %ania                            status: endpoint, model, key set, data dir, MCP, skills
        %ania help                       this text (also %ania?)
        %ania config [set] [key=value …] show settings (secrets masked) or set overrides
        %ania mcp [list|add NAME CMD…|remove NAME|reconnect NAME]
        %ania skills [list|reload]
        %ania plan on|off|status
        %ania todo | stop | log [RUN_ID]
        %ania history [list|show [SESSION]|clear [SESSION]]  this notebook's conversations
        %ania tools                      the tools the model sees (sizes), and the ones off
        %ania clock [--session]          the live clock panel (scheduled tasks and results)
        %ania clock list|log|add|del|…   the /clock commands, as the notebook's admin
        %ania team [list|create [--session] NAME MEMBER[=ROLE] …|delete [--session] NAME]
        %ania kb [SCOPE]                 the knowledge panel (documents, search, add, delete)
        %ania kb add PATH|GLOB … [--scope S] | add-df VAR COLUMN [--title COL]
        %ania kb search QUERY [--scope S] | delete ID [--scope S]
        %ania memory [SCOPE] | memory forget ID [--scope S]
        %ania usage [--days N] [--session S]  today's tokens vs the quotas, daily plot, costs
        %ania quota | quota reset [SESSION|all]
        """
        return self._fallback(shown_cleanly(manage(self.state, line)))

    def _fallback(self, coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self.state.run_sync(coro)
        # A loop is running but this call was not awaited (autoawait off): run in background.
        self.state.track(asyncio.ensure_future(coro))
        return None


class RunInterrupted(RunError):
    """The kernel was interrupted during a run; IPython shows one line, no traceback.

    Raised (not swallowed) so the cell counts as failed and Run All stops there.
    """

    def _render_traceback_(self) -> list[str]:
        # IPython prints these lines instead of a traceback.
        return [f"■ {self}"]


async def shown_cleanly(work: Awaitable[T]) -> T:
    """Await ``work``, turning ania-nb's `UsageError` into IPython's (one line, no traceback).

    A store failure with a storage cause (a full disk, a read-only mount) is shown the same
    way: its message says what happened and what to do; a traceback would only hide it.
    """
    try:
        return await work
    except AniaUsageError as exc:
        # IPython prints only `UsageError` itself (not subclasses) without a traceback.
        raise UsageError(str(exc)) from None
    except StoreError as exc:
        if exc.cause is None:
            raise
        raise UsageError(str(exc)) from None


async def run_agent(magics: AgentMagics, line: str, cell: str | None) -> Any:
    """Parse options, run one agent turn with a live view, store the result as ``_``."""
    magic = magics.agent_cell if cell is not None else magics.agent_line
    try:
        args = parse_argstring(magic, line)
    except UsageError as exc:
        if cell is not None and "unrecognized arguments" in str(exc):
            raise UsageError(
                f"%%agent takes the prompt from the cell body, not the option line ({exc})"
            ) from None
        raise
    shell = magics.shell
    assert shell is not None
    raw = cell if cell is not None else " ".join(args.prompt)
    prompt = interpolate(raw, shell.user_ns).strip()
    if not prompt:
        raise UsageError("empty prompt: write it in the cell (%%agent) or after %agent")
    state = magics.state
    agent = state.agent()
    await state.first_run.check(agent.config)  # no key, no endpoint: say so now, not after retries
    session = args.session or await state.identify()
    if args.new:
        from .manage_history import archive_history

        archived = await archive_history(agent, session)
        if archived:
            print(f"new conversation; the previous one is kept as {archived}")
    view = None
    if not args.quiet:
        from IPython.display import display

        from .widgets import RunView

        view = RunView(agent, session=session, prompt=prompt)
        display(view)

    async def go() -> Any:
        try:
            result = await agent.chat(
                prompt,
                session=session,
                callbacks=view.callbacks if view is not None else None,
                model=args.model,
                plan=args.plan,  # this run only: other runs of the session are not affected
            )
        except asyncio.CancelledError:  # a --bg run ended by %ania stop
            if view is not None:
                view.abort("stopped", status="stopped")
            raise
        except Exception as exc:
            if view is not None:
                view.abort(str(exc) or type(exc).__name__)
            raise
        if view is not None:
            view.finish(result)
        shell.user_ns["_"] = result
        return result

    if args.bg:
        state.track(asyncio.ensure_future(go()))
        return None
    # The run is its own task: the kernel's Interrupt cancels this cell's task, and the run must
    # then be stopped (not withdrawn mid-flight) so its view and record say "stopped".
    running = asyncio.ensure_future(go())
    try:
        result = await asyncio.shield(running)
    except asyncio.CancelledError:
        finished = running.done()
        if not finished:
            agent.stop(session)
        try:
            result = await asyncio.wait_for(asyncio.shield(running), 30)
        except BaseException:  # an interrupt during the stop itself: say the same
            result = None
            if view is not None:
                view.abort("interrupted", status="stopped")
        if finished:
            raise RunInterrupted("interrupted after the run had finished") from None
        raise RunInterrupted(_interrupted_line(result)) from None
    return None if view is not None else result


def _interrupted_line(result: Any) -> str:
    calls = [c for c in getattr(result, "tool_calls", None) or () if c.outcome == "stopped"]
    stopped = f"; {len(calls)} tool call{'s' * (len(calls) != 1)} stopped" if calls else ""
    return f"interrupted: the run was stopped{stopped}"


async def manage(state: NotebookState, line: str) -> Any:
    """Run one ``%ania`` command (see `manage.run_ania`) for this notebook's session."""
    words = line.split()
    # config must work even when the current settings are broken; stop needs no Agent made;
    # the status panel (no words) only looks: it never creates the store to find the session.
    if not words:
        data_dir = Path(state.agent().config.store.data_dir)
        if await asyncio.to_thread(data_dir.is_dir):
            await state.identify()
    elif words[0] != "config" and (words[0] != "stop" or state.agent_created):
        await state.identify()  # the notebook may have been renamed since the last cell
    from .manage import run_ania

    return await run_ania(state, line)


async def run_magic(kind: str, line: str, cell: str | None = None) -> Any:
    """Entry point of rewritten cells: find this kernel's magics and run one."""
    from IPython import get_ipython

    shell = get_ipython()
    magics = shell.magics_manager.registry.get("AgentMagics") if shell else None
    if magics is None:
        raise UsageError("ania_nb is not loaded: run %load_ext ania_nb first")
    try:
        if kind == "ania":
            # IPython expands {expr} in line magics; the rewritten path must do the same.
            return await shown_cleanly(manage(magics.state, interpolate(line, shell.user_ns)))
        return await shown_cleanly(run_agent(magics, line, cell))
    except asyncio.CancelledError:  # Interrupt before a run started, or during an %ania command
        raise RunInterrupted("interrupted") from None


def transform_cell(lines: list[str]) -> list[str]:
    """Rewrite agent cells into an awaited call so they run on the kernel's event loop."""
    if not lines:
        return lines
    first = lines[0]
    call = "await __import__('ania_nb.notebook.magics', fromlist=['run_magic']).run_magic"
    if first.startswith("%%agent") and first[7:8] in ("", " ", "\t", "\n"):
        head = first[7:].strip()
        body = "".join(lines[1:])
        return [f"{call}('agent', {head!r}, {body!r})\n"]
    rest = "".join(lines[1:]).strip()
    for kind in ("agent", "ania"):
        prefix = f"%{kind}"
        if first.startswith(prefix) and first[len(prefix) : len(prefix) + 1] in (" ", "\n", ""):
            line = first[len(prefix) :].strip()
            if rest:
                return lines  # not a lone magic line: leave it to IPython
            return [f"{call}({kind!r}, {line!r})\n"]
    return lines


def split_words(line: str) -> list[str]:
    """Shell-like split of a magic's argument line, with a clear error on bad quoting."""
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot parse {line!r}: {exc}") from None
