"""Plan mode: per session, the model may analyse and plan but not act.

While on, each user turn starts with `PLAN_NOTE` and the tool gate blocks every side-effect tool:
the original's list below [orig §9.1] plus any tool marked ``side_effects=True``. ``todo_write`` and
read-only tools stay available. Once the store is open, plan mode is kept in its KV namespace
``plan`` (session → on/off), so every replica of the agent on that store (and a restart) sees
it: a switch is written at once, and each turn and each gated call reads the session's state
first (one small read).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..catalogue import Language, say
from ..tools import Tool

if TYPE_CHECKING:  # pragma: no cover
    from ..store import KVNamespace

NAMESPACE = "plan"

PLAN_BLOCKED_TOOLS = frozenset(
    {
        "bash",
        "file",
        "config_set",
        "config_file_set",
        "memory_save",
        "memory_forget",
        "kb_add",
        "clock_create",
        "clock_update",
        "clock_delete",
        "skill_install",
        "skill_remove",
        "mcp_add",
        "mcp_remove",
        "mcp_reconnect",
        "subagent_run",
        "team_run",
        "team_create",
        "team_delete",
    }
)
ALWAYS_ALLOWED = frozenset({"todo_write"})


def has_side_effects(name: str, tool: Tool | None) -> bool:
    """Whether a call of ``name`` (the tool, if known) changes something outside the run."""
    return name in PLAN_BLOCKED_TOOLS or (tool is not None and tool.side_effects)


PLAN_NOTE = (
    "[Plan mode] The user turned on plan mode: only analyse and write a detailed, step-by-step "
    "plan. Tools with side effects are blocked; the user will leave plan mode (/plan off) to "
    "have the plan carried out."
)
USAGE = say("plan.usage", "en")


class PlanMode:
    """Which sessions are in plan mode."""

    def __init__(self) -> None:
        self.kv: KVNamespace | None = None  # bound when the store opens
        self._on: set[str] = set()
        self._unsaved: set[str] = set()  # switched in memory, not written to the store yet

    def is_on(self, session: str) -> bool:
        """Whether the session is in plan mode (as last read or set here)."""
        return session in self._on

    def set(self, session: str, on: bool) -> bool:
        """Turn plan mode on or off; returns whether it changed (stored by the next `load`)."""
        changed = self.is_on(session) != on
        if on:
            self._on.add(session)
        else:
            self._on.discard(session)
        self._unsaved.add(session)
        return changed

    async def load(self, session: str) -> None:
        """Bring the session's state in line with the store: write a switch made here, else read.

        What another replica (or an earlier process) stored wins over this memory; a session
        never switched anywhere keeps its state here.
        """
        if self.kv is None:
            return
        if session in self._unsaved:
            await self.save(session)
            return
        stored = await self.kv.get(session)
        if isinstance(stored, bool):
            if stored:
                self._on.add(session)
            else:
                self._on.discard(session)

    async def save(self, session: str) -> None:
        """Write the session's switch to the store (once it is open)."""
        if self.kv is not None and session in self._unsaved:
            await self.kv.set(session, self.is_on(session))
            self._unsaved.discard(session)

    def blocks(
        self, session: str, name: str, tool: Tool | None, *, this_run: bool = False
    ) -> str | None:
        """The block text if plan mode (the session's, or ``this_run``'s) stops this call."""
        if not (this_run or self.is_on(session)) or name in ALWAYS_ALLOWED:
            return None
        if has_side_effects(name, tool):
            return (
                f"[Plan mode] the tool {name} was blocked. Only analyse and write a detailed "
                "plan; wait for the user to leave plan mode with /plan off."
            )
        return None

    def command(self, session: str, args: str, language: Language = "en") -> str:
        """Answer ``/plan <args>`` (in ``language``, `ania_nb.catalogue`)."""
        arg = args.strip().lower()
        if arg in ("on", "enable"):
            key = "plan.on" if self.set(session, True) else "plan.already_on"
        elif arg in ("off", "disable"):
            key = "plan.off" if self.set(session, False) else "plan.already_off"
        elif arg in ("", "status"):
            key = "plan.is_on" if self.is_on(session) else "plan.is_off"
        else:
            key = "plan.usage"
        return say(key, language)
