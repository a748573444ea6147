"""Built-in tools, in their registration tiers.

``default_tools`` are there unless a key they need is missing (`keys_missing`: webSearch and
webExplore on Jina's public hosts need ``web.token``, meme's URL template needs ``meme.key``);
``gated_tools`` are enabled by config (bash, file, local_image). MCP tools and skill tools form
the next tiers and come from `ania_nb.mcp` and `ania_nb.skills`. Each function builds exactly
what a config asks for, so a front end or a test can assemble the same set.

Some built-ins act through the front end (``requires``: the callbacks they call, e.g. meme needs
``send_image``); `unavailable_tools` names those a run's front end cannot serve, so the run does
not offer them to the model at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..._env import secret_file_paths
from ..base import Tool
from ._http import HttpSource
from ._paths import FileGuard
from .bash import BashTool, sandbox_hidden, store_paths
from .current_time import TimeTool
from .files import SendFileTool
from .images import ImageViewer, LoadImagesTool, LocalImageTool
from .meme import MemeTool
from .messages import MessageHistoryTool, PrivateFileUrlTool
from .web import WebExploreTool, WebSearchTool

if TYPE_CHECKING:  # pragma: no cover
    import httpx2

    from ...config import Config
    from ...engine.callbacks import Callbacks

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
    "keys_missing",
    "unavailable_tools",
]

# Jina's public search and reader refuse (search) or throttle (reader) requests without a
# token; a self-hosted or test endpoint at another host is offered without one.
_JINA_HOSTS = frozenset({"s.jina.ai", "r.jina.ai"})


def image_viewer(config: Config, http_client: httpx2.AsyncClient | None = None) -> ImageViewer:
    """How this config lets the model see images (multimodal, vision model, or not at all)."""
    from ...engine.llm import LLMClient

    vision = config.vision
    describer = None
    if vision.model and not vision.multimodal:
        describer = LLMClient.from_config(config, role="vision", http_client=http_client)
    return ImageViewer(multimodal=vision.multimodal, describer=describer, prompt=vision.prompt)


def _unset(secret: object) -> bool:
    value = getattr(secret, "get_secret_value", lambda: "")()
    return not str(value).strip()


def keys_missing(config: Config) -> dict[str, str]:
    """Default built-ins left out for a missing key: tool name → the setting that turns it on.

    Each would cost its definition's tokens on every request and could only fail (~1.2k tokens
    for the three).
    """
    missing: dict[str, str] = {}
    if _unset(config.web.token):
        if urlsplit(config.web.search_url).hostname in _JINA_HOSTS:
            missing["webSearch"] = "web.token"
        if urlsplit(config.web.reader_url).hostname in _JINA_HOSTS:
            missing["webExplore"] = "web.token"
    if "${key}" in config.meme.url and _unset(config.meme.key):
        missing["meme"] = "meme.key"
    return missing


def default_tools(config: Config, http: HttpSource, viewer: ImageViewer) -> list[Tool]:
    """The default tier: time, webSearch, webExplore, meme, history, file URLs, load_images.

    Tools named by `keys_missing` are left out until their key is set.
    """
    off = keys_missing(config)
    tools: list[Tool] = [
        TimeTool(),
        WebSearchTool(config.web, http),
        WebExploreTool(config.web, http),
        MemeTool(config.meme, http),
        MessageHistoryTool(),
        PrivateFileUrlTool(),
        LoadImagesTool(viewer),
    ]
    return [t for t in tools if t.name not in off]


def unavailable_tools(tools: Iterable[Tool], callbacks: Callbacks) -> frozenset[str]:
    """Names of ``tools`` whose ``requires`` callbacks the front end (``callbacks``) lacks."""
    return frozenset(
        t.name for t in tools if any(not callbacks.has(need) for need in getattr(t, "requires", ()))
    )


def gated_tools(config: Config, viewer: ImageViewer) -> list[Tool]:
    """The config-gated tier: bash, file and local_image, each only when enabled."""
    obeyed = (Path(config.mcp.config_file), Path(config.hooks.file), Path(config.commands.file))
    loaded = (config.source_file,) if config.source_file is not None else ()
    guard = FileGuard(
        data_dir=Path(config.store.data_dir),
        max_bytes=config.file.max_bytes,
        extra_protected=(
            *obeyed,
            *loaded,
            *config.security.secret_files,
            *secret_file_paths(),
            *(path for path, _, _ in store_paths(config)),
        ),
        roots=tuple(Path(r) for r in config.file.roots),
        protected_names=tuple(p.name for p in obeyed),
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
