"""The offline demo: parallel tool calls, persistent history, knowledge across languages, records.

The model is `ania_nb.testing.ScriptedLLM`, a real OpenAI-compatible HTTP server on 127.0.0.1, so
the demo exercises the same code path as a hosted model, without a network or an API key.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from .agent import Agent
from .engine.callbacks import Callbacks, RunEvent
from .tools import tool

QUESTION = "How many words are in 'the quick brown fox jumps', what is 17 × 23, and what day is it?"
FOLLOW_UP = "What was my first question?"
KB_QUESTION = "When should the office cat be fed?"
HANDBOOK = ("办公室守则", "办公室的猫叫年糕。每天下午三点喂一次猫粮，不要给它吃巧克力或洋葱。")


@tool
def word_count(text: Annotated[str, Field(description="The text to count words in.")]) -> int:
    """Count the words of a text."""
    return len(text.split())


@tool
async def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


@tool
def today() -> str:
    """Today's date in ISO format."""
    return date.today().isoformat()


def _script(llm: Any) -> None:
    """Round 1 calls three tools at once; later answers are composed from the request."""
    from .testing import reply, tool_call, usage

    llm.script(
        reply(
            "Let me work these out in parallel.",
            tool_calls=[
                tool_call("word_count", {"text": "the quick brown fox jumps"}),
                tool_call("multiply", {"a": 17, "b": 23}),
                tool_call("today", {}),
            ],
            usage=usage(180, 40, cached=128),
        )
    )

    def respond(request: Any) -> Any:
        messages = request.messages
        results = [m["content"] for m in messages if m.get("role") == "tool"]
        users = [m["content"] for m in messages if m.get("role") == "user"]
        if "【知识库】" in str(users[-1]):  # the handbook chunk was auto-injected
            text = (
                "The office cat, 年糕 (Niangao), is fed once a day at 3 pm — and never chocolate "
                "or onions (from the handbook 《办公室守则》)."
            )
        elif messages[-1].get("role") == "tool":
            words, product, day = results[-3:]
            text = (
                f"'the quick brown fox jumps' has {words} words, "
                f"17 × 23 = {float(product):g}, and today is {day}."
            )
        else:
            first = users[0].split("] ", 1)[-1]
            text = f"Your first question was: “{first}” (I read it from the stored history)."
        return reply(text, usage=usage(260, 35, cached=192))

    llm.responder = respond


def _printer(out: Callable[[str], None]) -> Callbacks:
    def on_event(event: RunEvent) -> None:
        data = event.data
        if event.kind == "tool_start":
            out(f"  ⚙  {data['name']}({data['arguments']})")
        elif event.kind == "tool_end":
            mark = "✗" if data["error"] else "✓"
            out(f"  {mark}  {data['name']} → {data['result']}  [{data['duration_ms']} ms]")
        elif event.kind == "assistant_text":
            out(f"  …  {data['text']}")
        elif event.kind == "knowledge":
            for chunk in data["chunks"]:
                out(f"  📚 injected 《{chunk['title']}》 (similarity {chunk['similarity']:.2f})")

    return Callbacks(on_event=on_event)


async def run_demo(data_dir: Path | None = None, out: Callable[[str], None] = print) -> int:
    """Run the demo conversation and print it; returns a process exit code."""
    from .testing import ScriptedLLM

    with tempfile.TemporaryDirectory(prefix="ania-demo-") as tmp:
        folder = Path(data_dir) if data_dir is not None else Path(tmp)
        with ScriptedLLM() as llm:
            _script(llm)
            agent = Agent(
                base_url=llm.base_url,
                api_key=llm.api_key,
                model="scripted-demo",
                data_dir=folder,
                tools=[word_count, multiply, today],
                overrides={
                    "agent.system_prompt": "You are a helpful assistant with tools.",
                    "skills.dir": str(
                        folder / "skills"
                    ),  # the demo ignores ./skills and ./mcp.json
                    "mcp.config_file": str(folder / "mcp.json"),
                    # Example prices (per million tokens): runs get a cost, the report a total.
                    "pricing.models": {
                        "scripted-demo": {"input": 2.5, "output": 10.0, "cached": 1.25}
                    },
                },
            )
            async with agent:
                out(f"ania-nb demo — offline; scripted model at {llm.base_url}; data in {folder}")
                callbacks = _printer(out)
                status = 0
                for question in (QUESTION, FOLLOW_UP, KB_QUESTION):
                    if question == KB_QUESTION:  # a Chinese handbook, an English question
                        await agent.knowledge.kb.add("global", *HANDBOOK)
                        out(f"\nkb    + 《{HANDBOOK[0]}》 {HANDBOOK[1]}")
                    out(f"\nyou   › {question}")
                    result = await agent.chat(question, session="demo", callbacks=callbacks)
                    out(f"agent ‹ {result}")
                    u = result.usage
                    cost = f" · ${u.cost:.4f}" if u.cost is not None else ""
                    calls = f"{u.iterations} LLM call" + ("s" if u.iterations != 1 else "")
                    out(
                        f"        {calls} · {u.total_tokens} tokens "
                        f"({u.cached_tokens} cached){cost} · {len(result.tool_calls)} tool calls · "
                        f"{result.status}"
                    )
                    status = status or (0 if result.ok else 1)
                runs = await agent.runs(session="demo")
                history = await agent.history("demo")
                out(f"\nstored: {len(history)} history messages, {len(runs)} run records:")
                for run in reversed(runs):
                    tools = json.dumps([c.name for c in run.tool_calls])
                    out(f"  #{run.id} {run.status:<8} {run.duration_ms:>5} ms  tools={tools}")
                report = await agent.quota.report(days=1)
                [day] = report.days
                out(
                    f"usage today ({day.day}): {day.total:,} tokens, "
                    f"${day.cost or 0:.4f} at the example prices"
                )
    # After the temporary folder is gone, so the line is true when printed.
    out("\n" + where_records_went(folder, kept=data_dir is not None))
    return status


def where_records_went(folder: Path, *, kept: bool) -> str:
    """The demo's last line: where its store is, or that it was temporary."""
    if not kept:
        return (
            f"The records were in a temporary folder ({folder}), now deleted; keep them with "
            "`ania-nb demo --data-dir DIR`."
        )
    return (
        f"The records are kept in {folder}: `ANIA_STORE__DATA_DIR={folder} ania-nb runs` "
        "lists them (`... ania-nb usage`: the usage table)."
    )


def main(data_dir: Path | None = None) -> int:
    """Entry point used by ``ania-nb demo``."""
    return asyncio.run(run_demo(data_dir))
