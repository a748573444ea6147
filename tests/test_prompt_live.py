"""The default system prompt teaches no failure: it quotes none of the engine's error phrases.

A small model copies what its prompt quotes (issue 20: a prompt quoting "Error executing tool:"
made Qwen2.5-Coder-1.5B write it into 29 of 54 answers whose tools had all succeeded). The
phrases are collected from the package's source, not listed by hand, so a new engine message is
covered as soon as it is written.

With ``ANIA_TEST_LLM_URL`` set (an OpenAI-compatible base URL, e.g. ``http://127.0.0.1:8080/v1``
for ``llama-server --jinja``; ``ANIA_TEST_LLM_MODEL`` and ``ANIA_TEST_LLM_KEY`` optional), the
live test replays `PROMPTS` through a real model with tools that always succeed and reports how
many prompts ran a tool, how many answers contain an engine error phrase, how many calls were
repeats not run, and the share of prompt tokens the server had cached. It fails when fewer than
``ANIA_TEST_LLM_MIN_TOOL_PROMPTS`` prompts (default: half of them) ran a tool — a model whose
calls never run proves nothing — or when more than ``ANIA_TEST_LLM_MAX_BAD`` answers (default: a
tenth of them) quote the engine. Settings of the Agent come from ``ANIA_TEST_<KEY>`` variables
named like the ``ANIA_<KEY>`` ones (``ANIA_TEST_LLM__TEXT_TOOL_CALLS=false`` sets
``llm.text_tool_calls``; the test configuration removes every other ``ANIA_*`` variable, so
these are the way in). Without a URL the test is skipped. Run it with ``-s`` to see the report.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import pytest

import ania_nb
from ania_nb import Agent, tool
from ania_nb.engine.loop import ToolOutcomeKind
from ania_nb.prompts import DEFAULT_SYSTEM_PROMPT
from ania_nb.testing import ScriptedLLM, reply, tool_call

PACKAGE = Path(ania_nb.__file__).parent
# Calls whose text arguments become what the model reads after a failed or refused call.
_MESSAGE_CALLS = ("ToolOutcome", "ToolCallResult", "GateDecision", "HookOutcome")
_CLAUSE = re.compile(r"[.:;!?()\[\]\n]+")
_WORD = re.compile(r"[a-z][a-z'-]*")


def _strings(node: ast.AST) -> list[str]:
    """The literal text pieces of an expression (f-string parts and concatenations too)."""
    return [
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def _call_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


@functools.cache
def _engine_texts() -> tuple[str, ...]:
    """Literal texts the package can put in front of the model when something goes wrong.

    Module-level constants (``NOT_APPROVED = "Tool call not approved: "``), the messages of
    raised errors (``ToolError(...)``, every ``...Error(...)`` call) and the texts given to the
    loop's result types. The prompt module itself is left out.
    """
    texts: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "prompts.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Assign) and all(
                isinstance(t, ast.Name) and t.id.isupper() for t in node.targets
            ):
                texts.extend(_strings(node.value))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = _call_name(node)
                if name.endswith("Error") or name in _MESSAGE_CALLS:
                    for arg in [*node.args, *(k.value for k in node.keywords)]:
                        texts.extend(_strings(arg))
    return tuple(texts)


def _normal(text: str) -> str:
    return " ".join(_WORD.findall(text.lower()))


@functools.cache
def engine_phrases() -> frozenset[str]:
    """Every clause of three or more words in the engine's error texts, normalised."""
    phrases: set[str] = set()
    for text in _engine_texts():
        for clause in _CLAUSE.split(text):
            words = _normal(clause)
            if words.count(" ") >= 2:
                phrases.add(words)
    return frozenset(phrases)


@functools.cache
def result_prefixes() -> frozenset[str]:
    """The headers of failed or refused tool results ("Error executing tool", "Tool call …")."""
    prefixes = set()
    for text in _engine_texts():
        head, colon, _ = text.partition(":")
        if colon and head[:1].isupper() and re.search(r"\b(tool|call)\b", head, re.I):
            words = _normal(head)
            if words.count(" ") >= 2:
                prefixes.add(words)
    return frozenset(prefixes)


OUTCOME_WORDS = sorted(set(get_args(ToolOutcomeKind)) - {"ok"})
"""How a call can end besides "ok": error, denied, blocked, timeout, stopped."""


def quoted_phrases(text: str) -> list[str]:
    """The engine phrases and outcome words found in ``text`` (strict: for the prompt)."""
    normal = f" {_normal(text)} "
    found = [p for p in sorted(engine_phrases()) if f" {p} " in normal]
    found += [w for w in OUTCOME_WORDS if f" {w} " in normal]
    return found


def copied_phrases(answer: str) -> list[str]:
    """The failed-result headers and refusal words found in an answer (no generic clauses)."""
    normal = f" {_normal(answer)} "
    found = [p for p in sorted(result_prefixes()) if f" {p} " in normal]
    found += [w for w in ("blocked", "denied") if f" {w} " in normal]
    return found


def test_the_collector_finds_the_engine_messages() -> None:
    phrases, prefixes = engine_phrases(), result_prefixes()
    # Anchors: if the collector broke, it would find nothing and every check would pass.
    for known in ("error executing tool", "tool call not approved", "tool call blocked by a hook"):
        assert known in phrases
        assert known in prefixes
    assert len(phrases) > 100


def test_the_default_prompt_quotes_no_engine_message() -> None:
    assert quoted_phrases(DEFAULT_SYSTEM_PROMPT) == []
    assert len(DEFAULT_SYSTEM_PROMPT) < 500  # short: a small model's context is small


async def test_a_run_without_a_configured_prompt_sends_the_default(
    llm: ScriptedLLM, make_agent: Any
) -> None:
    llm.script(reply("hi"))
    await make_agent().chat("hello")
    assert llm.requests[0].system.startswith(DEFAULT_SYSTEM_PROMPT)


# -- the live replay ----------------------------------------------------------------------


@tool
def add(a: float, b: float) -> str:
    """Add two numbers."""
    return str(a + b)


@tool
def word_count(text: str) -> str:
    """Count the words in a text."""
    return str(len(text.split()))


@tool
def city_weather(city: str) -> str:
    """Today's weather in a city."""
    return f"{city}: 18 °C, light wind, no rain"


@tool
def list_files(folder: str = ".") -> str:
    """List the files in a folder of the project."""
    return "data.csv\nnotes.md\nanalysis.ipynb"


@tool
def read_file(path: str) -> str:
    """Read a text file of the project."""
    return "name,score\nada,91\nbob,78\ncy,85\n"


LIVE_TOOLS = [add, word_count, city_weather, list_files, read_file]

PROMPTS = [
    "What is 17.5 plus 24.25? Use the add tool.",
    "How many words are in 'the quick brown fox jumps over the lazy dog'?",
    "What's the weather in Oslo today?",
    "Compare the weather in Paris and in Rome.",
    "Which files are in the project folder?",
    "Read data.csv and tell me who has the highest score.",
    "What is the average score in data.csv?",
    "Add 3 and 4, then add 10 to the result.",
    "Count the words in: 'to be or not to be, that is the question'.",
    "Say hello in French.",
    "Explain in two sentences what a Python list comprehension is.",
    "Write a one-line Python expression that reverses a string s.",
    "Is it raining in Berlin?",
    "List the files, then read notes.md.",
    "What is 2 to the power of 10? You may use add several times or just answer.",
    "Summarise what tools you have, in one sentence.",
    "Give me a haiku about notebooks.",
    "What's 1234 + 4321?",
    "How many rows does data.csv have, header excluded?",
    "Tell me the weather in Tokyo and how many words the answer has.",
    "What does pandas.read_csv return?",
    "Suggest a name for a variable holding a list of scores.",
]


@dataclass
class Replay:
    """What a replay of `PROMPTS` found."""

    answers: list[str] = field(default_factory=list)
    bad: list[tuple[str, list[str]]] = field(default_factory=list)  # (answer, phrases found)
    failed_tools: int = 0
    tool_prompts: int = 0  # prompts in which at least one tool ran
    tool_calls: int = 0  # calls that ran (repeats not run are not counted)
    repeats: int = 0  # identical calls answered from an earlier result instead of run
    statuses: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    model_calls: int = 0

    def report(self) -> str:
        """One line per answer that quoted an engine phrase, then the counts."""
        lines = [f"  {found}: {answer[:160]!r}" for answer, found in self.bad]
        cached = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        lines.append(
            f"{self.tool_prompts} of {len(self.answers)} prompts ran a tool "
            f"({self.tool_calls} calls ran, {self.failed_tools} failed, {self.repeats} repeats "
            f"not run); {len(self.bad)} answers contain engine error phrases; statuses "
            f"{self.statuses}; {self.model_calls} model calls, {cached:.0%} of "
            f"{self.prompt_tokens} prompt tokens cached"
        )
        return "\n".join(lines)


def settings_from_environment(environ: dict[str, str]) -> dict[str, Any]:
    """Agent overrides from ``ANIA_TEST_<SECTION>__<KEY>`` variables (JSON values, else text)."""
    overrides: dict[str, Any] = {}
    for name, value in environ.items():
        key = name.removeprefix("ANIA_TEST_")
        if key == name or "__" not in key:
            continue  # not ours, or one of the test's own (ANIA_TEST_LLM_URL …)
        try:
            parsed: Any = json.loads(value)
        except ValueError:
            parsed = value
        overrides[key.lower().replace("__", ".")] = parsed
    return overrides


async def replay(
    base_url: str,
    model: str,
    api_key: str | None,
    data_dir: Path,
    settings: dict[str, Any] | None = None,
) -> Replay:
    """Ask every prompt in a fresh session with the default prompt; collect what happened."""
    agent = Agent(
        base_url=base_url,
        api_key=api_key or "not-needed",
        model=model,
        data_dir=data_dir,
        tools=LIVE_TOOLS,
        overrides={
            "agent.builtin_tools": False,
            "skills.dir": str(data_dir / "no-skills"),
            "mcp.config_file": str(data_dir / "no-mcp.json"),
            "llm.temperature": None,
            "llm.top_p": None,
            "llm.timeout": 600,
            "agent.run_timeout": 900,
            **(settings or {}),
        },
    )
    found = Replay()
    try:
        for number, prompt in enumerate(PROMPTS):
            result = await agent.chat(prompt, session=f"nb:live-{number}")
            answer = result.text or f"({result.status}: {result.error})"
            found.answers.append(answer)
            found.statuses[result.status] = found.statuses.get(result.status, 0) + 1
            ran = [c for c in result.tool_calls if "repeated call" not in (c.error or "")]
            found.tool_prompts += bool(ran)
            found.tool_calls += len(ran)
            found.repeats += len(result.tool_calls) - len(ran)
            found.failed_tools += sum(1 for call in ran if call.error is not None)
            found.prompt_tokens += result.usage.prompt_tokens
            found.cached_tokens += result.usage.cached_tokens
            found.model_calls += result.usage.iterations
            phrases = copied_phrases(answer)
            if phrases:
                found.bad.append((answer, phrases))
    finally:
        await agent.aclose()
    return found


async def test_replay_counts_quoted_phrases_on_a_scripted_server(
    llm: ScriptedLLM, tmp_path: Path
) -> None:
    # The harness itself, against the scripted server: every second answer quotes the engine;
    # prompts about the weather go through a native tool round first, prompts about files
    # through a call written as text (as llama-server --jinja returns a small model's calls).
    replies = iter(range(10_000))

    def answer(request: Any) -> Any:
        last = request.messages[-1]
        if last["role"] == "user" and "weather" in str(last["content"]).lower():
            return reply(tool_calls=[tool_call("city_weather", {"city": "Oslo"})])
        if last["role"] == "user" and "files" in str(last["content"]).lower():
            return reply('{"name": "list_files", "arguments": {}}')
        n = next(replies)
        return reply("Error executing tool: none, all fine." if n % 2 else f"Answer {n}.")

    llm.responder = answer
    found = await replay(llm.base_url, "scripted", llm.api_key, tmp_path)
    assert len(found.answers) == len(PROMPTS) >= 20
    expected = sum(("weather" in p.lower() or "files" in p.lower()) for p in PROMPTS)
    assert found.tool_prompts == found.tool_calls == expected >= 5
    assert len(found.bad) == len(PROMPTS) // 2
    assert all("error executing tool" in phrases for _, phrases in found.bad)
    assert found.failed_tools == 0 and found.repeats == 0
    assert f"{expected} of {len(PROMPTS)} prompts ran a tool" in found.report()

    # With text calls turned off, the files prompts run nothing: the count shows it.
    off = await replay(
        llm.base_url, "scripted", llm.api_key, tmp_path / "off", {"llm.text_tool_calls": False}
    )
    assert off.tool_prompts == sum("weather" in p.lower() for p in PROMPTS) < expected


def test_settings_come_from_ania_test_variables() -> None:
    environ = {
        "ANIA_TEST_LLM__TEXT_TOOL_CALLS": "false",
        "ANIA_TEST_AGENT__MAX_ITERATIONS": "8",
        "ANIA_TEST_LLM__MODEL": "qwen",
        "ANIA_TEST_LLM_URL": "http://127.0.0.1:8080/v1",  # the test's own
        "ANIA_LLM__STREAM": "false",  # not a test variable
    }
    assert settings_from_environment(environ) == {
        "llm.text_tool_calls": False,
        "agent.max_iterations": 8,
        "llm.model": "qwen",
    }


@pytest.mark.skipif(not os.environ.get("ANIA_TEST_LLM_URL"), reason="ANIA_TEST_LLM_URL not set")
async def test_live_model_runs_tools_and_answers_quote_no_engine_message(tmp_path: Path) -> None:
    found = await replay(
        os.environ["ANIA_TEST_LLM_URL"],
        os.environ.get("ANIA_TEST_LLM_MODEL", "local"),
        os.environ.get("ANIA_TEST_LLM_KEY"),
        tmp_path,
        settings_from_environment(dict(os.environ)),
    )
    print("\n" + found.report())
    least = int(os.environ.get("ANIA_TEST_LLM_MIN_TOOL_PROMPTS", len(PROMPTS) // 2))
    assert found.tool_prompts >= least, found.report()
    limit = int(os.environ.get("ANIA_TEST_LLM_MAX_BAD", len(PROMPTS) // 10))
    assert len(found.bad) <= limit, found.report()
