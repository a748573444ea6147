"""The shipped skills describe tools that exist: every tool and parameter the clock-tasks skill
names is one the agent really gives the model."""

from __future__ import annotations

import re
from pathlib import Path

CLOCK_SKILL = Path(__file__).resolve().parent.parent / "skills" / "clock-tasks"


async def test_the_clock_skill_names_only_tools_and_parameters_that_exist(make_agent):
    agent = make_agent(
        overrides={"agent.builtin_tools": True, "skills.dir": str(CLOCK_SKILL.parent)}
    )
    await agent.start()
    definitions = {
        d["function"]["name"]: d for d in agent.session("nb:skills").executor.definitions()
    }
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(CLOCK_SKILL.glob("*.md")))
    clock_tools = {name for name in definitions if name.startswith("clock_")}
    assert set(re.findall(r"\bclock_[a-z]+\b", text)) == clock_tools  # all of them, no others
    for name in ("time", "skill_read"):
        assert name in text and name in definitions
    parameters: set[str] = set()
    for name in (*clock_tools, "skill_read"):
        parameters |= set(definitions[name]["function"]["parameters"]["properties"])
    [create] = re.findall(r"`clock_create`\n\s*\(([^)]*)\)", text)  # "(`cron`, `title`, …)"
    named = set(re.findall(r"`(\w+)`", create)) | set(re.findall(r"\b([a-z_]+)=", text))
    assert {"cron", "run_once", "timeout_sec", "id", "enabled", "file_name"} <= named
    assert named <= parameters, named - parameters
