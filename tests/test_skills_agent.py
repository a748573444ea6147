"""Skills wired into an Agent: the registry in the system prompt and skill_read over a real run."""

from __future__ import annotations

from pathlib import Path

from ania_nb.testing import reply, tool_call

SHIPPED = Path(__file__).resolve().parent.parent / "skills"


async def test_shipped_skills_reach_the_model_through_prompt_and_skill_read(llm, make_agent):
    llm.script(
        reply(tool_calls=[tool_call("skill_read", {"skill_name": "pandas-explore"})]),
        reply("I will follow the skill."),
    )
    agent = make_agent(overrides={"skills.dir": str(SHIPPED)})
    result = await agent.chat("explore my dataframe")
    assert result.ok, result.error
    first, second = llm.requests
    system = first.messages[0]["content"]
    for name in ("clock-tasks", "mcp-lazy-tools", "pandas-explore"):
        assert name in system
    assert system == second.messages[0]["content"]  # byte-identical between requests
    names = [t["function"]["name"] for t in first.tools]
    assert {"skill_read", "skill_reload"} <= set(names)
    assert "skill_install" not in names  # self-management is off by default
    tool_result = second.messages[-1]["content"]
    assert "pandas" in tool_result.lower() and not tool_result.startswith("Error")


async def test_no_skills_folder_means_no_skill_tier(llm, make_agent):
    llm.script(reply("plain"))
    agent = make_agent()  # conftest points skills.dir at a missing folder
    await agent.chat("hi")
    assert llm.requests[0].tools is None
    assert "skill" not in llm.requests[0].messages[0]["content"].lower()
