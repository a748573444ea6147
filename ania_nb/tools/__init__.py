"""Typed tools: the `Tool` protocol, `@tool` and `BaseTool[P]`, schemas and the executors.

Example::

    from typing import Annotated
    from ania_nb.tools import ToolExecutor, tool

    @tool
    def add(a: int, b: Annotated[int, "the second addend"]) -> int:
        '''Add two numbers.'''
        return a + b

    executor = ToolExecutor()
    executor.add(add)
    outcome = await executor.execute("add", '{"a": 1, "b": 2}')
    assert outcome.text == "3"
"""

from ania_nb.tools.base import (
    BaseTool,
    FunctionTool,
    Role,
    Tool,
    ToolArgumentsError,
    ToolContext,
    result_to_text,
    tool,
)
from ania_nb.tools.executor import SessionToolExecutor, ToolExecutor, ToolOutcome
from ania_nb.tools.schema import dumps_canonical, model_schema, normalize_input_schema

__all__ = [
    "BaseTool",
    "FunctionTool",
    "Role",
    "SessionToolExecutor",
    "Tool",
    "ToolArgumentsError",
    "ToolContext",
    "ToolExecutor",
    "ToolOutcome",
    "dumps_canonical",
    "model_schema",
    "normalize_input_schema",
    "result_to_text",
    "tool",
]
