"""ania-nb: a Jupyter-native LLM agent engine.

>>> from ania_nb import Agent, tool
>>> @tool
... def add(a: int, b: int) -> int:
...     '''Add two numbers.'''
...     return a + b
>>> agent = Agent(base_url="http://127.0.0.1:8000/v1", api_key="sk-…", model="m", tools=[add])
>>> result = await agent.chat("What is 2 + 3?")

Importing the package is cheap: openai, mcp, lancedb and APScheduler load only when first needed
(the clock's types, `Clock`, `ClockTask`, `TaskLogEntry`, `ClockEvent` and `ClockError`, are
imported on first access).

Everything a user touches through an `Agent` is importable from here, so code can be typed
without reaching into the package's modules: what ``chat`` returns (`RunResult`, `Usage`,
`ToolCallResult`), the run records and history (`RunRecord`, `ToolCallRecord`, `Message`), the
outbox (`Outbox`, `Delivery`), the clock, quotas (`Quota`, `UsageReport`), the knowledge base's
results (`Hit`, `Document`, `MemoryEntry`, `AddResult`, `KnowledgeStatus`), sessions
(`Session`), callbacks and the error tree.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._http import HttpClients
from ._version import VERSION as __version__
from .agent import Agent
from .config import Config
from .engine.callbacks import ApprovalRequest, Callbacks, RunEvent
from .engine.loop import ToolCallResult
from .engine.messages import Message
from .engine.usage import Usage
from .errors import (
    AniaError,
    ConfigError,
    FrontmatterError,
    LLMError,
    LLMStreamError,
    MCPServerError,
    MissingExtraError,
    ResourceError,
    RunError,
    SessionBusyError,
    SkillError,
    SkillInstallError,
    StoreError,
    ToolDefinitionError,
    ToolError,
    ToolSignal,
    UsageError,
)
from .governance.hooks import HookResult
from .knowledge import (
    AddResult,
    Document,
    Hit,
    Knowledge,
    KnowledgeError,
    KnowledgeStatus,
    MemoryEntry,
)
from .orchestration import Delivery, Outbox, Session
from .quota import Quota, UsageReport
from .result import RunResult
from .store import RunRecord, ToolCallRecord
from .tools import BaseTool, Tool, ToolContext, tool

if _TYPE_CHECKING:  # pragma: no cover - loaded on first access (APScheduler), see __getattr__
    from .clock import Clock, ClockError, ClockEvent, ClockTask, TaskLogEntry

_FROM_CLOCK = frozenset({"Clock", "ClockError", "ClockEvent", "ClockTask", "TaskLogEntry"})


def __getattr__(name: str) -> _Any:
    """The clock's types, imported on first access (the clock package loads APScheduler)."""
    if name in _FROM_CLOCK:
        from . import clock

        value = getattr(clock, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ania_nb' has no attribute {name!r}")


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext ania_nb``: register the %%agent, %agent and %ania magics."""
    from ._extras import require_extra

    require_extra("notebook", "%load_ext ania_nb")  # before IPython-only imports fail obscurely
    from .notebook import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    """``%unload_ext ania_nb``: remove the magics and close the kernel's Agent."""
    from .notebook import unload_ipython_extension as unload

    unload(ipython)


__all__ = [
    "AddResult",
    "Agent",
    "AniaError",
    "ApprovalRequest",
    "BaseTool",
    "Callbacks",
    "Clock",
    "ClockError",
    "ClockEvent",
    "ClockTask",
    "Config",
    "ConfigError",
    "Delivery",
    "Document",
    "FrontmatterError",
    "Hit",
    "HookResult",
    "HttpClients",
    "Knowledge",
    "KnowledgeError",
    "KnowledgeStatus",
    "LLMError",
    "LLMStreamError",
    "MCPServerError",
    "MemoryEntry",
    "Message",
    "MissingExtraError",
    "Outbox",
    "Quota",
    "ResourceError",
    "RunError",
    "RunEvent",
    "RunRecord",
    "RunResult",
    "Session",
    "SessionBusyError",
    "SkillError",
    "SkillInstallError",
    "StoreError",
    "TaskLogEntry",
    "Tool",
    "ToolCallRecord",
    "ToolCallResult",
    "ToolContext",
    "ToolDefinitionError",
    "ToolError",
    "ToolSignal",
    "Usage",
    "UsageError",
    "UsageReport",
    "__version__",
    "tool",
]
