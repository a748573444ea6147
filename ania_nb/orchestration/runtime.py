"""What an Agent opens on first use: the store, the model clients, skills and MCP servers.

Kept apart from the façade so `Agent` stays about sessions and runs; `Runtime.open` assembles the
async tiers (MCP, skills) onto the shared tool table that the constructor started with the
built-in tiers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .._http import HttpClients
from ..config import SAVED_CONFIG_NAMESPACE, Config, ConfigLayers
from ..engine.context import BeforeCompact, ContextWindow
from ..engine.llm import LLMClient
from ..store import Store
from ..store.kv import REVISIONS_NAMESPACE
from .shared import SharedChanges

if TYPE_CHECKING:  # pragma: no cover
    from ..mcp import MCPRegistry
    from ..skills import SkillManager
    from ..tools import ToolExecutor

log = logging.getLogger(__name__)

SKILLS_REVISION = "skills"  # the store's counter bumped by skill_install / skill_remove


@dataclass
class Runtime:
    """The opened parts of an Agent; `aclose` releases them in reverse order."""

    config: Config  # effective: with the values saved by config_set
    store: Store
    llm: LLMClient
    window: ContextWindow
    one_shot_llm: LLMClient | None = None  # clock, subagent and team runs (None = ``llm``)
    skills: SkillManager | None = None
    mcp: MCPRegistry | None = None
    shared: SharedChanges | None = None  # other replicas' MCP and skill changes

    @classmethod
    async def open(
        cls,
        layers: ConfigLayers,
        tools: ToolExecutor,
        *,
        http: HttpClients | None = None,
        before_compact: BeforeCompact | None = None,
    ) -> Runtime:
        """Open the store, resolve the config with its saved values, build clients, start tiers.

        Runs of ended processes are marked interrupted; skills are loaded and MCP started.
        """
        base = layers.resolve()
        store = await Store.open(
            Path(base.store.data_dir),
            url=base.store.url_in_clear(),
            run_log_max_entries=base.store.run_log_max_entries,
            run_log_max_per_session=base.store.run_log_max_per_session,
        )
        http = http or HttpClients()
        runtime: Runtime | None = None
        try:
            saved = dict(await store.kv(SAVED_CONFIG_NAMESPACE).items())
            config = layers.resolve(saved) if saved else base
            # Runs of this host's ended processes, and other hosts' runs older than any run
            # may last (containers sharing the data directory under other host names).
            interrupted = await store.runs.mark_interrupted(
                stale_after=config.agent.run_timeout + 60
            )
            if interrupted:
                log.warning("%d run(s) of ended processes were marked interrupted", interrupted)
            llm = LLMClient.from_config(config, http_client=http.llm)
            compressor = (
                LLMClient.from_config(config, role="compressor", http_client=http.llm)
                if config.compressor.model.strip()
                else llm
            )
            window = ContextWindow(
                max_context_tokens=config.agent.max_context_tokens,
                ratio=config.agent.compress_ratio,
                compressor=compressor,
                before_compact=before_compact,
            )
            one_shot = (
                LLMClient.from_config(config, role="subagent", http_client=http.llm)
                if config.subagent.own_endpoint
                else None
            )
            runtime = cls(config, store, llm, window, one_shot)
            shared = SharedChanges(store.kv(REVISIONS_NAMESPACE), config.store.sync_interval)
            runtime.shared = shared
            runtime.skills = await _open_skills(config, tools, store)
            if runtime.skills is not None:
                shared.on(SKILLS_REVISION, runtime.skills.refresh)
            runtime.mcp = await _open_mcp(config, tools, http, store)
            if runtime.mcp is not None:
                from ..mcp.shared import REVISION_KEY as MCP_REVISION

                shared.on(MCP_REVISION, runtime.mcp.sync_shared)
            await shared.start()
            return runtime
        except BaseException:
            if runtime is not None:
                await runtime.aclose()
            else:
                await store.close()
            raise

    def skills_prompt(self) -> str:
        """The skills registry block for the system prompt ('' without skills)."""
        return self.skills.registry_prompt() if self.skills is not None else ""

    async def aclose(self) -> None:
        """Stop watching for shared changes and MCP servers, close model clients and the store."""
        if self.shared is not None:
            await self.shared.aclose()
        if self.mcp is not None:
            await self.mcp.aclose()
            if self.mcp.viewer is not None and self.mcp.viewer.describer is not None:
                await self.mcp.viewer.describer.aclose()
        await self.llm.aclose()
        if self.one_shot_llm is not None:
            await self.one_shot_llm.aclose()
        if self.window.compressor is not self.llm:
            await self.window.compressor.aclose()
        await self.store.close()


async def _open_skills(config: Config, tools: ToolExecutor, store: Store) -> SkillManager | None:
    """The skill tier: when the skills folder exists, or the AI may install the first skill."""
    folder = Path(config.skills.dir)
    if not await asyncio.to_thread(folder.is_dir) and not config.skills.self_manage:
        return None
    from ..skills import SkillManager, skill_tools

    manager = SkillManager(folder, whitelist=config.skills.whitelist)
    await manager.reload()
    for tool in skill_tools(
        manager,
        self_manage=config.skills.self_manage,
        oplog=store.oplog,
        allow_private_hosts=config.skills.allow_private_hosts,
        changed=lambda: store.kv(REVISIONS_NAMESPACE).incr(SKILLS_REVISION),
    ):
        tools.add(tool, replace=True)
    return manager


async def _open_mcp(
    config: Config, tools: ToolExecutor, http: HttpClients, store: Store
) -> MCPRegistry | None:
    """The MCP tier: when the MCP servers file has content, or a replica's mcp_add left some.

    An empty file means none, like a missing one (the bash sandbox's stand-in for it is empty).
    """
    from ..mcp.shared import MCP_SERVERS_NAMESPACE, SharedServers

    shared = SharedServers(store.kv(MCP_SERVERS_NAMESPACE), store.kv(REVISIONS_NAMESPACE))
    exists = await asyncio.to_thread(_has_content, Path(config.mcp.config_file))
    if not exists and not config.mcp.self_manage and not await shared.entries.keys():
        return None
    from ..mcp import MCPRegistry
    from ..tools.builtin import image_viewer

    registry = MCPRegistry(
        config.mcp,
        tools,
        client_factory=http.mcp,
        approval_enabled=config.approval.enable,
        security=config.security,
        viewer=image_viewer(config, http.vision_client),  # images MCP tools return
        shared_servers=shared,
    )
    await registry.start(wait=False)  # a slow server never delays the first reply
    return registry


def _has_content(path: Path) -> bool:
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False
