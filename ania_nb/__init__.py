"""ania-nb: a Jupyter-native LLM agent engine.

>>> from ania_nb import Agent, tool
>>> @tool
... def add(a: int, b: int) -> int:
...     '''Add two numbers.'''
...     return a + b
>>> agent = Agent(base_url="http://127.0.0.1:8000/v1", api_key="sk-…", model="m", tools=[add])
>>> result = await agent.chat("What is 2 + 3?")

Importing the package is cheap: openai, mcp and lancedb load only when first needed.
"""

from ._http import HttpClients
from .agent import Agent
from .config import Config
from .engine.callbacks import ApprovalRequest, Callbacks, RunEvent
from .engine.loop import ToolCallResult
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
from .knowledge import Knowledge, KnowledgeError
from .result import RunResult
from .tools import BaseTool, Tool, ToolContext, tool

__version__ = "0.1.0"


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
    "Agent",
    "AniaError",
    "ApprovalRequest",
    "BaseTool",
    "Callbacks",
    "Config",
    "ConfigError",
    "FrontmatterError",
    "HookResult",
    "HttpClients",
    "Knowledge",
    "KnowledgeError",
    "LLMError",
    "LLMStreamError",
    "MCPServerError",
    "MissingExtraError",
    "ResourceError",
    "RunError",
    "RunEvent",
    "RunResult",
    "SessionBusyError",
    "SkillError",
    "SkillInstallError",
    "StoreError",
    "Tool",
    "ToolCallResult",
    "ToolContext",
    "ToolDefinitionError",
    "ToolError",
    "ToolSignal",
    "Usage",
    "UsageError",
    "tool",
]
