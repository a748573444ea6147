"""MCP servers as tools: stdio, streamable HTTP and SSE, with lazy two-phase loading.

Example::

    from ania_nb.mcp import MCPRegistry

    registry = MCPRegistry(config.mcp, shared_executor)  # config.mcp is MCPSettings
    await registry.start()   # ConfigError for a bad file; a server that fails is skipped
    ...
    await registry.aclose()

The ``mcp`` SDK is imported on the first connection (in a worker thread), never by this import.
"""

from ania_nb.mcp.config import MCPConfigFile, MCPServerConfig, load_config_file, parse_config
from ania_nb.mcp.filters import ToolFilter
from ania_nb.mcp.manager import MCPServerError, MCPToolManager
from ania_nb.mcp.registry import MCPRegistry, MCPServerStatus
from ania_nb.mcp.tools import MCPTool, MCPToolset

__all__ = [
    "MCPConfigFile",
    "MCPRegistry",
    "MCPServerConfig",
    "MCPServerError",
    "MCPServerStatus",
    "MCPTool",
    "MCPToolManager",
    "MCPToolset",
    "ToolFilter",
    "load_config_file",
    "parse_config",
]
