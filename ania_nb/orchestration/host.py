"""`AgentHost`: what the clock and the agents packages may ask of their Agent.

They sit in the orchestration layer and never import the façade; the `Agent` satisfies this
protocol and hands itself over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from ..config import Config
    from ..engine.callbacks import Callbacks
    from ..engine.usage import Usage
    from ..result import RunResult
    from ..store import Store
    from ..tools import Role
    from .oneshot import OneShotJob
    from .outbox import Outbox


class AgentHost(Protocol):
    """The Agent as the clock, subagents and teams see it."""

    @property
    def config(self) -> Config:
        """The effective settings (with values saved by config_set once open)."""
        ...

    @property
    def outbox(self) -> Outbox:
        """Where the final results of background work go."""
        ...

    async def open_store(self) -> Store:
        """The store, opening the Agent first if needed."""
        ...

    async def run_one_shot(self, job: OneShotJob) -> RunResult:
        """Run a clock run, subagent or team member; failures are in the result's status."""
        ...

    def system_prompt_for(self, session: str) -> str:
        """The system prompt a session's runs get (base prompt + skills registry)."""
        ...

    def inject(
        self,
        session: str,
        text: str,
        *,
        sender: str = "subagent",
        callbacks: Callbacks | None = None,
        role: Role = "member",
    ) -> bool:
        """Queue a synthetic message for the session; False when its queue is full.

        ``role`` is the reply run's role: that of whoever started the work that reports.
        """
        ...

    def add_derived_usage(self, session: str, usage: Usage) -> None:
        """Show background work's tokens (counted by its own records) in the next run record."""
        ...

    def on_stop(self, listener: Callable[[str], object]) -> None:
        """Call ``listener(session)`` on every stop (a truthy return: it stopped something)."""
        ...

    async def quota_denial(self, session: str) -> str | None:
        """Why new work for ``session`` is refused today (a daily token quota), or None."""
        ...

    def is_admin(self, who: str | None) -> bool:
        """Whether ``who`` is an admin (None is the trusted local user)."""
        ...

    def role_of(self, session: str, who: str | None) -> Role:
        """The role of sender ``who`` in ``session`` (None is the local user, an admin)."""
        ...
