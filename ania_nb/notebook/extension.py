"""The per-kernel state of the extension: one Agent, created lazily, and background runs."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..agent import Agent


def notebook_session(configured: str = "") -> str:
    """The default session: configured, else one per notebook (from the kernel's session name)."""
    if configured:
        return configured
    path = os.environ.get("JPY_SESSION_NAME", "")
    return f"nb:{Path(path).stem}" if path else "nb:default"


class NotebookState:
    """Everything the extension keeps for one kernel; owned by the registered magics."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.overrides: dict[str, Any] = {}
        self._agent: Agent | None = None
        self.background: set[asyncio.Task[Any]] = set()

    @property
    def agent_created(self) -> bool:
        """Whether the Agent exists yet (it is created on first use)."""
        return self._agent is not None

    def agent(self) -> Agent:
        """The kernel's Agent, created on first use from ania.toml, ANIA_ env and overrides."""
        if self._agent is None:
            from ..agent import Agent
            from .tools import NotebookVarsTool, PythonTool

            agent = Agent(overrides=self.overrides)
            namespace = self.shell.user_ns
            agent.add_tool(NotebookVarsTool(namespace), replace=True)
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
        """The session a plain %%agent cell talks to."""
        configured = self._agent.config.notebook.session if self._agent is not None else ""
        return notebook_session(configured)

    async def reconfigure(self, overrides: dict[str, Any]) -> None:
        """Apply config overrides: the current Agent is closed and a new one made on next use."""
        from ..config import Config

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
        if self._agent is not None:
            agent, self._agent = self._agent, None
            await agent.aclose()

    def run_sync(self, coro: Any) -> Any:
        """Run a coroutine where no loop is running (plain IPython, e.g. ``%unload_ext``)."""
        # IPython's own loop: rewritten cells run there in a terminal, so the Agent they made
        # (its locks, clients, store threads) stays on one loop.
        from IPython.core.async_helpers import get_asyncio_loop

        return get_asyncio_loop().run_until_complete(coro)
