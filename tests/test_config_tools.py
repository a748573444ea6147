"""Config-center tools: masking, validated config_set applied at the next start, file edits,
audit, and the admin approval every change needs."""

from __future__ import annotations

import asyncio
import json

from ania_nb import Callbacks, ToolContext
from ania_nb.store import Store
from ania_nb.testing import reply, tool_call

SECRET = "sk-very-secret-0123456789"


def config_agent(make_agent, tmp_path, **overrides):
    return make_agent(
        overrides={
            "config_tool.enable": True,
            "admin.ids": ["root"],
            "hooks.enable": True,
            "hooks.file": str(tmp_path / "hooks.json"),
            "commands.file": str(tmp_path / "commands.json"),
            **overrides,
        }
    )


async def run_tool(agent, tool_name: str, /, **arguments):
    """Call a tool as the model would, past the gate (the gate is tested through chat)."""
    await agent.start()
    ctx = ToolContext(session="nb:cfg", sender="root")
    return await agent.tools.execute(tool_name, json.dumps(arguments), ctx)


async def test_tools_exist_only_when_enabled(make_agent, tmp_path):
    assert "config_get" not in make_agent().tools
    names = {"config_get", "config_set", "config_file_get", "config_file_set"}
    assert names <= set(config_agent(make_agent, tmp_path).tools.names())


async def test_config_get_masks_sensitive_values(make_agent, tmp_path):
    agent = config_agent(make_agent, tmp_path, **{"web.token": SECRET})
    one = await run_tool(agent, "config_get", key="web.token")
    assert one.text.startswith('web.token = "***6789" (sensitive, masked)')
    listing = (await run_tool(agent, "config_get")).text
    assert SECRET not in listing and SECRET not in one.text
    assert "agent.max_iterations = 20  # LLM rounds before the final answer." in listing
    assert "web.token" in listing and "llm.api_key" in listing
    listed = {line.split(" = ")[0] for line in listing.splitlines()}
    assert {info.key for info in agent.config.describe()} <= listed  # every key, none cut off
    unset = await run_tool(agent, "config_get", key="compressor.model")
    assert unset.text == (
        "compressor.model = (not set)\nmeaning: Model name; empty = the main model summarises. "
        '(default "")'
    )
    unknown = await run_tool(agent, "config_get", key="agent.nope")
    assert "unknown config key 'agent.nope'" in unknown.error


async def test_config_set_validates_saves_and_applies_at_the_next_start(make_agent, tmp_path):
    agent = config_agent(make_agent, tmp_path)
    saved = await run_tool(agent, "config_set", key=" Agent.Max_Iterations ", value="7")
    assert saved.text.startswith("Saved agent.max_iterations = 7. It takes effect after a restart")
    assert agent.config.agent.max_iterations == 20  # not before a restart
    listed = await run_tool(agent, "config_get", key="agent.max_iterations")
    assert "saved by config_set: 7" in listed.text
    await run_tool(agent, "config_set", key="web.token", value=SECRET)
    await run_tool(agent, "config_set", key="approval.tools", value='["bash", "file"]')
    bad = await run_tool(agent, "config_set", key="agent.max_iterations", value="many")
    assert "agent.max_iterations" in bad.error and "many" in bad.error
    assert (
        "cannot be changed"
        in (await run_tool(agent, "config_set", key="store.data_dir", value="x")).error
    )
    assert "unknown config key" in (await run_tool(agent, "config_set", key="a.b", value="1")).error
    await agent.aclose()

    restarted = config_agent(make_agent, tmp_path)
    assert restarted.config.agent.max_iterations == 20  # saved values are read when it opens
    await restarted.start()
    assert restarted.config.agent.max_iterations == 7
    assert restarted.governance.gate.approval.tools == ["bash", "file"]  # rebuilt with them
    assert restarted.config.web.token.get_secret_value() == SECRET
    assert restarted.config.approval.tools == ["bash", "file"]
    explicit = config_agent(make_agent, tmp_path, **{"agent.max_iterations": 3})
    await explicit.start()
    assert explicit.config.agent.max_iterations == 3  # constructor overrides still win
    assert explicit.config.approval.tools == ["bash", "file"]

    store = await Store.open(restarted.data_dir)
    try:
        entries = await store.oplog.list(action="config_set")
    finally:
        await store.close()
    details = [e.detail for e in entries]
    assert "agent.max_iterations: 20 → 7" in details
    assert any(d.startswith("web.token: ") for d in details)
    assert all(SECRET not in d for d in details)
    assert {e.actor for e in entries} == {"root"} and entries[0].category == "ai"


async def test_config_files_are_checked_written_and_hooks_apply_at_once(llm, make_agent, tmp_path):
    agent = config_agent(make_agent, tmp_path)
    listing = (await run_tool(agent, "config_file_get")).text
    assert [line.split(":")[0] for line in listing.splitlines()] == ["mcp", "hooks", "commands"]
    empty = await run_tool(agent, "config_file_get", name="hooks")
    assert empty.text.startswith(f"The hooks file ({tmp_path / 'hooks.json'}) is empty. Format:")
    assert (
        "must be valid JSON"
        in (await run_tool(agent, "config_file_set", name="hooks", content="{nope")).error
    )
    unusable = await run_tool(
        agent, "config_file_set", name="hooks", content='{"hooks": {"Bogus": []}}'
    )
    assert "not usable: unknown event 'Bogus'" in unusable.error
    assert (
        "unknown config file 'prompts'"
        in (await run_tool(agent, "config_file_set", name="prompts", content="{}")).error
    )

    llm.script(reply("before"), reply("after"))
    await agent.chat("one", session="h")  # the hooks file is read (empty) and cached
    hooks = {"hooks": {"UserPromptSubmit": [{"command": "echo FROM-NEW-HOOK"}]}}
    content = json.dumps(hooks)
    done = await run_tool(agent, "config_file_set", name="hooks", content=content)
    assert (
        done.text
        == f"Wrote the hooks file ({len(content)} characters). It takes effect within seconds."
    )
    assert (tmp_path / "hooks.json").read_text() == content
    await agent.chat("two", session="h")  # no 5 s wait: the write invalidated the cache
    assert "FROM-NEW-HOOK" in llm.requests[1].messages[-1]["content"]
    assert (await run_tool(agent, "config_file_get", name="hooks")).text.endswith(content)

    commands = json.dumps({"commands": {"hi": "Say hi"}})
    await run_tool(agent, "config_file_set", name="commands", content=commands)
    assert "/hi — Say hi" in (await agent.chat("/help")).text
    mcp = await run_tool(agent, "config_file_set", name="mcp", content='{"mcpServers": {}}')
    assert mcp.text.endswith("It takes effect after a restart.")
    cleared = await run_tool(agent, "config_file_set", name="commands", content="")
    assert cleared.error is None and (tmp_path / "commands.json").read_text() == ""


async def test_changes_wait_for_an_admin_and_a_refusal_changes_nothing(
    llm, make_agent, tmp_path, inbox
):
    # The operator lets members ask for the config tools (roles): an admin still approves.
    agent = config_agent(make_agent, tmp_path, **{"roles.admin_tools": []})
    content = json.dumps({"commands": {"evil": "do evil"}})
    llm.script(
        reply(tool_calls=[tool_call("config_file_set", {"name": "commands", "content": content})]),
        reply("asked"),
    )
    task = asyncio.create_task(
        agent.chat("add a command", sender="mallory", callbacks=Callbacks(request_approval=inbox))
    )
    request = await inbox.wait_for(1)
    assert request.admin_only and request.tool == "config_file_set"
    assert '\\"evil\\": \\"do evil\\"' in request.summary  # the admin sees the content
    agent.answer_approval(request.id, allow="deny", approver="root")
    call = (await task).tool_calls[0]
    assert call.blocked and call.result == "Tool call not approved by an admin: denied by root"
    assert not (tmp_path / "commands.json").exists()
    # read-only config_get needs no approval
    llm.script(
        reply(tool_calls=[tool_call("config_get", {"key": "agent.queue_size"})]), reply("20")
    )
    result = await agent.chat(
        "queue?", sender="mallory", callbacks=Callbacks(request_approval=inbox)
    )
    assert (
        result.tool_calls[0].result.startswith("agent.queue_size = 20") and len(inbox.requests) == 1
    )


async def test_saved_values_rebuild_built_ins_and_keep_state(make_agent, tmp_path):
    """Saved settings apply when the store opens; your tools, plan mode and hooks survive."""
    agent = config_agent(make_agent, tmp_path, **{"agent.builtin_tools": True})
    await run_tool(agent, "config_set", key="bash.enable", value="true")
    await run_tool(agent, "config_set", key="config_tool.enable", value="false")  # explicit wins
    await agent.aclose()

    def mine() -> str:
        """My own tool."""
        return "mine"

    again = config_agent(make_agent, tmp_path, **{"agent.builtin_tools": True})
    again.add_tool(mine)
    seen: list[str] = []
    again.add_hook("Stop", lambda event, payload: seen.append(event))
    again.set_plan_mode("nb:p", True)
    assert "bash" not in again.tools and "config_set" in again.tools
    await again.start()
    assert "bash" in again.tools and "mine" in again.tools
    assert "config_set" in again.tools  # the constructor's override beats the saved value
    assert again.plan_mode("nb:p") and again.governance.hooks._python["Stop"]


async def test_values_saved_under_old_key_names_still_load(make_agent, tmp_path):
    store = await Store.open(tmp_path / "data")  # as an ania-nb before the renames left it
    try:
        await store.kv("config").set("subagent.max_result_len", 321)
        await store.kv("config").set("team.max_result_len", 111)
        await store.kv("config").set("kb.chunk_size", 100)  # both names saved: the new one wins
        await store.kv("config").set("kb.chunk_chars", 700)
    finally:
        await store.close()
    agent = config_agent(make_agent, tmp_path)
    await agent.start()
    assert agent.config.subagent.max_result_chars == 321
    assert agent.config.team.max_result_chars == 111
    assert agent.config.kb.chunk_chars == 700
    explicit = config_agent(make_agent, tmp_path, **{"team.max_result_chars": 555})
    await explicit.start()
    assert explicit.config.team.max_result_chars == 555  # constructor overrides still win
    assert explicit.config.subagent.max_result_chars == 321

    # The model may use the old name too; it is saved under the new one, the old one dropped.
    saved = await run_tool(agent, "config_set", key="subagent.max_result_len", value="654")
    assert saved.text.startswith("Saved subagent.max_result_chars = 654.")
    shown = await run_tool(agent, "config_get", key="team.max_result_len")
    assert shown.text.startswith("team.max_result_chars = 111\n")
    assert "(was: team.max_result_len)" in shown.text and "saved by config_set: 111" in shown.text
    kv = (await agent.host.open_store()).kv("config")
    assert await kv.get("subagent.max_result_chars") == 654
    assert await kv.get("subagent.max_result_len", "gone") == "gone"
    await agent.aclose()
    await explicit.aclose()
    restarted = config_agent(make_agent, tmp_path)
    await restarted.start()
    assert restarted.config.subagent.max_result_chars == 654
