"""Built-in tools, in their registration tiers.

``default_tools`` are always there (time, web, meme, chat history, images); ``gated_tools`` are
enabled by config (bash, file, local_image). MCP tools and skill tools form the next tiers and
come from `ania_nb.mcp` and `ania_nb.skills`. Each function builds exactly what a config asks for,
so a front end or a test can assemble the same set.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..base import Tool
from ._http import HttpSource
from ._paths import FileGuard
from .bash import BashTool, sandbox_hidden
from .current_time import TimeTool
from .files import SendFileTool
from .images import ImageViewer, LoadImagesTool, LocalImageTool
from .meme import MemeTool
from .messages import MessageHistoryTool, PrivateFileUrlTool
from .web import WebExploreTool, WebSearchTool

if TYPE_CHECKING:  # pragma: no cover
    import httpx2

    from ...config import Config

__all__ = [
    "BashTool",
    "FileGuard",
    "HttpSource",
    "ImageViewer",
    "LoadImagesTool",
    "LocalImageTool",
    "MemeTool",
    "MessageHistoryTool",
    "PrivateFileUrlTool",
    "SendFileTool",
    "TimeTool",
    "WebExploreTool",
    "WebSearchTool",
    "default_tools",
    "gated_tools",
    "image_viewer",
]


def image_viewer(config: Config, http_client: httpx2.AsyncClient | None = None) -> ImageViewer:
    """How this config lets the model see images (multimodal, vision model, or not at all)."""
    from ...engine.llm import LLMClient

    vision = config.vision
    describer = None
    if vision.model and not vision.multimodal:
        describer = LLMClient.from_config(config, role="vision", http_client=http_client)
    return ImageViewer(multimodal=vision.multimodal, describer=describer, prompt=vision.prompt)


def default_tools(config: Config, http: HttpSource, viewer: ImageViewer) -> list[Tool]:
    """The always-on tier: time, webSearch, webExplore, meme, history, file URLs, load_images."""
    return [
        TimeTool(),
        WebSearchTool(config.web, http),
        WebExploreTool(config.web, http),
        MemeTool(config.meme, http),
        MessageHistoryTool(),
        PrivateFileUrlTool(),
        LoadImagesTool(viewer),
    ]


def gated_tools(config: Config, viewer: ImageViewer) -> list[Tool]:
    """The config-gated tier: bash, file and local_image, each only when enabled."""
    guard = FileGuard(
        data_dir=Path(config.store.data_dir),
        max_bytes=config.file.max_bytes,
        extra_protected=(Path(config.mcp.config_file), Path(config.hooks.file)),
        roots=tuple(Path(r) for r in config.file.roots),
    )
    tools: list[Tool] = []
    if config.bash.enable:
        tools.append(
            BashTool(
                config.bash,
                approval_enabled=config.approval.enable,
                security=config.security,
                hidden=sandbox_hidden(config),
            )
        )
    if config.file.enable:
        tools.append(SendFileTool(guard))
    if config.file.local_image:
        tools.append(LocalImageTool(viewer, guard))
    return tools
