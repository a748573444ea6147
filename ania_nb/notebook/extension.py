"""The per-kernel state of the extension: one Agent, created lazily, and background runs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..session_keys import DEFAULT_NOTEBOOK, notebook_key

if TYPE_CHECKING:  # pragma: no cover
    from ..agent import Agent


def notebook_session(configured: str = "") -> str:
    """The default session before the notebook is identified: configured, else ``nb:default``."""
    return configured or DEFAULT_NOTEBOOK


class NotebookState:
    """Everything the extension keeps for one kernel; owned by the registered magics."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.overrides: dict[str, Any] = {}
        self._agent: Agent | None = None
        self.background: set[asyncio.Task[Any]] = set()
        self._session: str | None = None  # this notebook's session, once identified
        # (server, uri) -> stop watching: the live output of %ania mcp read, one per resource
        self.resource_views: dict[tuple[str, str], Callable[[], Awaitable[None]]] = {}
        from .firstrun import FirstRun

        self.first_run = FirstRun()  # checks key and endpoint before a run, until one passes

    @property
    def agent_created(self) -> bool:
        """Whether the Agent exists yet (it is created on first use)."""
        return self._agent is not None

    def agent(self) -> Agent:
        """The kernel's Agent, created on first use from ania.toml, ANIA_ env and overrides."""
        if self._agent is None:
            from ..agent import Agent
            from .tools import NotebookVarsTool, PythonTool, cell_tools

            agent = Agent(overrides=self.overrides)
            namespace = self.shell.user_ns
            agent.add_tool(NotebookVarsTool(namespace), replace=True)
            for cell_tool in cell_tools(self.shell):  # notebook_cells, propose_cell
                agent.add_tool(cell_tool, replace=True)
            if agent.config.notebook.python_tool:
                ask = agent.config.notebook.python_approval
                agent.add_tool(PythonTool(namespace, ask=ask), replace=True)
            from .widgets.clock import panel_callbacks

            # Images, files and approvals of clock runs go to the open clock panels.
            agent.outbox.callbacks_for = panel_callbacks(agent)
            self._agent = agent
        return self._agent

    @property
    def default_session(self) -> str:
        """The session a plain %%agent cell talks to (`identify` keeps it current)."""
        configured = self._agent.config.notebook.session if self._agent is not None else ""
        return configured or self._session or notebook_session()

    @property
    def identified(self) -> bool:
        """Whether `default_session` is known (configured, or found by `identify`)."""
        configured = self._agent is not None and bool(self._agent.config.notebook.session)
        return configured or self._session is not None

    async def identify(self) -> str:
        """Find this notebook's session (following renames) and note the running cell in it.

        Configured ``notebook.session`` wins; outside a Jupyter notebook it is ``nb:default``.
        See `_identity` for how a notebook is recognised after a rename, restart or reopen.
        """
        from . import _identity as ident

        agent = self.agent()
        # A notebook.session saved by config_set is in agent.config once the store is open.
        store = await agent.host.open_store()
        if agent.config.notebook.session:
            return agent.config.notebook.session
        first = self._session is None
        facts = await asyncio.to_thread(ident.gather, self.shell, cells=first)
        if not facts.path:
            self._session = notebook_session()
            return self._session
        kv = store.kv(ident.NAMESPACE)
        session = self._session
        record = await kv.get(session, None) if session is not None else None
        if session is None or not isinstance(record, dict):
            records = {k: v for k, v in await kv.items() if isinstance(v, dict)}
            session = await asyncio.to_thread(ident.choose, records, facts)
            if session is None:
                session = await self._legacy_session(facts.path, records)
            record = records.get(session, {})
        await kv.set(session, ident.update(record, facts))
        self._session = session
        return session

    async def _legacy_session(self, path: str, records: dict[str, Any]) -> str:
        """A new notebook's session, or the ``nb:<file stem>`` one it had before notebooks had ids.

        Never an ``Untitled…`` one: every new notebook starts with that name.
        """
        from ._identity import new_session

        stem = Path(path).stem
        if not stem or stem.startswith("Untitled") or notebook_key(stem) in records:
            return new_session()
        legacy = notebook_key(stem)
        store = await self.agent().host.open_store()
        return legacy if await store.history.count(legacy) else new_session()

    async def reconfigure(self, overrides: dict[str, Any]) -> None:
        """Apply config overrides: the current Agent is closed and a new one made on next use."""
        from ..config import Config, current_keys

        overrides = current_keys(overrides)  # an old key name replaces what its new one set
        Config.load().with_overrides({**self.overrides, **overrides})  # validate before keeping
        self.overrides.update(overrides)
        await self.close_agent()

    def track(self, task: asyncio.Task[Any]) -> None:
        """Keep a background run alive (and stoppable) until it finishes."""
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def close_agent(self) -> None:
        """Cancel background runs and close the Agent."""
        for task in list(self.background):
            task.cancel()
        self._session = None  # the next Agent may use another data dir: identify again
        if self._agent is not None:
            agent, self._agent = self._agent, None
            await agent.aclose()

    def run_sync(self, coro: Any) -> Any:
        """Run a coroutine where no loop is running (plain IPython, e.g. ``%unload_ext``)."""
        # IPython's own loop: rewritten cells run there in a terminal, so the Agent they made
        # (its locks, clients, store threads) stays on one loop.
        from IPython.core.async_helpers import get_asyncio_loop

        return get_asyncio_loop().run_until_complete(coro)
