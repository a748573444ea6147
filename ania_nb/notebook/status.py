"""``%ania`` with no arguments: where the agent stands, and what to do next when it is not set up.

Everything shown is read from the config and from what the Agent already has open: the panel
never starts the Agent (which would create the data directory and connect MCP servers); the
one thing it probes is the endpoint (one TCP connect, as `firstrun` does before a run).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import missing_model_keys
from .firstrun import api_key_set, missing_settings, unreachable

if TYPE_CHECKING:  # pragma: no cover
    from ..agent import Agent
    from ..config import Config
    from .extension import NotebookState

# The callbacks a notebook run gives the engine (the run widget's); a test keeps this in step
# with `RunView.callbacks`. Tools needing any other one are not offered in a notebook.
NOTEBOOK_CALLBACKS = frozenset(
    {"send_text", "send_image", "send_file", "request_approval", "on_event"}
)
_CAPABILITY = {
    "get_msg_history": "chat message history to read",
    "get_private_file_url": "private file URLs",
    "load_images": "images attached to the user's message",
    "send_image": "way to show images",
    "send_file": "way to send files",
}
PROBE_TIMEOUT = 2.0


def _restart_hint(key: str, value: Any) -> str:
    return f"then %ania config set {key}={value} (restarts the agent with it)"


def no_mcp(config: Config) -> str:
    """What ``%ania mcp`` says when no MCP config file exists: the next step."""
    path = config.mcp.config_file
    return (
        f"no MCP servers: {path} does not exist (mcp.config_file).\n"
        f'To add one, write {path} like {{"mcpServers": {{"time": {{"command": "uvx", '
        f'"args": ["mcp-server-time"]}}}}}},\n{_restart_hint("mcp.config_file", path)}.'
    )


def no_skills(config: Config) -> str:
    """What ``%ania skills`` says when the skills folder does not exist: the next step."""
    folder = config.skills.dir
    return (
        f"no skills: the folder {folder} does not exist (skills.dir).\n"
        f"Put a skill in {folder}/NAME/SKILL.md (a name and description in its front matter),\n"
        f"{_restart_hint('skills.dir', folder)}."
    )


def tools_off(agent: Agent, table: Any) -> dict[str, str]:
    """Built-ins not offered in this notebook, with why: a missing key or a missing capability.

    ``table`` is the session's tool table (its names and tools); key-gated tools are not in it.
    """
    from ..tools.builtin import keys_missing

    off: dict[str, str] = {}
    if agent.config.agent.builtin_tools:
        off = {name: f"needs {key}" for name, key in keys_missing(agent.config).items()}
    for name in table.names():
        tool = table.get(name)
        for need in getattr(tool, "requires", ()):
            if need not in NOTEBOOK_CALLBACKS:
                off[name] = f"the notebook has no {_CAPABILITY.get(need, need)}"
    return off


async def _endpoint(config: Config) -> str:
    """The endpoint row: the URL and whether it answers (not probed without URL or key)."""
    url = config.llm.base_url
    if not url.strip():
        return "(not set, see below)"
    if "llm.api_key" in missing_model_keys(config):
        return f"{url}  (no key (see below))"
    why = await unreachable(url, PROBE_TIMEOUT)
    return f"{url}  " + ("(reachable)" if why is None else f"(NOT reachable: {why})")


@dataclass(frozen=True)
class _Files:
    """What the panel needs from the file system (read in a worker thread)."""

    data_dir: Path
    data_dir_exists: bool
    toml: Path
    toml_exists: bool
    mcp_exists: bool
    skills_exist: bool

    @classmethod
    def read(cls, config: Config) -> _Files:
        data_dir = Path(config.store.data_dir).resolve()
        toml = Path.cwd() / "ania.toml"
        return cls(
            data_dir,
            data_dir.is_dir(),
            toml,
            toml.is_file(),
            Path(config.mcp.config_file).is_file(),
            Path(config.skills.dir).is_dir(),
        )


def _mcp_line(agent: Agent, files: _Files) -> str:
    registry = agent.mcp
    if registry is not None:
        servers = registry.servers()
        if not servers:
            return f"no servers in {registry.source()}"
        states = ", ".join(f"{s.name} {s.state}" for s in servers)
        return f"{len(servers)} server(s): {states}"
    path = agent.config.mcp.config_file
    if files.mcp_exists:
        return f"{path} (servers connect on the first run)"
    return f"none ({path} does not exist; %ania mcp says how to add one)"


def _skills_line(agent: Agent, files: _Files) -> str:
    manager = agent.skills
    if manager is not None:
        broken = f", {len(manager.errors)} broken" if manager.errors else ""
        return f"{len(manager.skills)} in {agent.config.skills.dir}{broken}"
    folder = agent.config.skills.dir
    if files.skills_exist:
        return f"{folder} (loaded on the first run)"
    return f"none ({folder} does not exist; %ania skills says how to add one)"


def _tools_line(agent: Agent, session: str) -> str:
    """What the model is sent: how many tools, their tokens per request, and the ones off.

    Once the agent has started, the session's own tool table (built-ins, MCP loaders, skills,
    the agent's tools); before, only what exists yet — starting it here could wait for MCP
    servers, and ``%ania`` answers at once.
    """
    started = getattr(agent, "_rt", None) is not None
    table = agent.session(session).executor if started else agent.tools
    off = tools_off(agent, table)
    sent = [d for d in table.definitions() if d["function"]["name"] not in off]
    tokens = tool_tokens(sent)
    line = f"{len(sent)} sent to the model (≈{tokens:,} tokens per request), {len(off)} off"
    if not started:
        line += "; more join when the agent starts (MCP, skills, clock, kb): %ania tools"
    return line + " (%ania tools lists them)"


def tool_tokens(definitions: list[dict[str, Any]]) -> int:
    """Tokens the tool definitions cost per request, estimated as the context window does."""
    return len(json.dumps(definitions, ensure_ascii=False).encode("utf-8", "replace")) // 4


def knowledge_line(agent: Agent) -> str | None:
    """What the knowledge store's background upkeep says, when it says anything (no I/O).

    Only an open store is asked (the panel never opens one): a failed compaction or index
    build (a full disk, say) is shown until an upkeep succeeds; a running one is mentioned.
    """
    store = agent.knowledge.store
    failed = store.upkeep_errors()
    if failed:
        return "; ".join(f"upkeep of {name} FAILED: {why}" for name, why in failed.items())
    if any(t.upkeep_running for t in store.tables.values()):
        return "index upkeep running in the background (searches answer meanwhile)"
    return None


_NEW_SESSION = "a new conversation, chosen by the first %%agent (no data directory yet)"


async def status(state: NotebookState, usage: str = "") -> None:
    """Print the status panel of the kernel's agent, then ``usage`` (the sub-commands)."""
    agent = state.agent()
    config = agent.config
    llm = config.llm
    files = await asyncio.to_thread(_Files.read, config)
    tools_row = _tools_line(agent, state.default_session)
    rows = [
        ("endpoint", await _endpoint(config)),
        ("model", llm.model or "(not set, see below)"),
        ("API key", "set" if api_key_set(config) else "not set"),
        ("session", state.default_session if state.identified else _NEW_SESSION),
        ("data dir", f"{files.data_dir}" + ("" if files.data_dir_exists else "  (not yet)")),
        ("config", f"{files.toml} ({'found' if files.toml_exists else 'not found'}), ANIA_*"),
        ("MCP", _mcp_line(agent, files)),
        ("skills", _skills_line(agent, files)),
        ("tools", tools_row),
    ]
    # The window exists once the agent has started; it measures the fixed part on each run.
    runtime = getattr(agent, "_rt", None)
    warning = getattr(getattr(runtime, "window", None), "fixed_warning", None)
    if warning:
        rows.append(("context", f"WARNING: {warning}"))
    knowledge = knowledge_line(agent)
    if knowledge is not None:
        rows.append(("knowledge", knowledge))
    print("ania-nb status")
    for label, value in rows:
        print(f"  {label:<9} {value}")
    problem = missing_settings(config)
    if problem is not None:
        print("\n" + problem)
    if usage:
        print("\n" + usage)
