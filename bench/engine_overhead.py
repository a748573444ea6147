"""Engine overhead: `Agent.chat` against hand-written raw `AsyncOpenAI` loops, same server.

One scripted conversation per run: the model asks for three parallel tool calls (``add`` and
``word_count`` are sync, ``lookup`` is async), the tools run concurrently, the model answers.
That is two non-streamed LLM calls per run, served by ``python -m ania_nb.testing serve --loop``
in a *separate process*, so the server's CPU is not counted here.

Variants, interleaved in blocks so machine drift hits all of them alike:

* ``raw``            hand-written loop: ``AsyncOpenAI(max_retries=0)``, the typed
                     ``client.chat.completions.create(...)``, ``asyncio.gather`` over the calls
                     (sync tools via ``asyncio.to_thread``), results appended, call again. This is
                     what a typical user writes.
* ``raw-post``       the same loop, but the plain dict body goes through the SDK's low-level
                     ``client.post("/chat/completions", cast_to=ChatCompletion, body=...)``, as
                     ania-nb does. It skips the SDK's TypedDict request transform, so the ratio
                     of ania to it is ania-nb's own bookkeeping (sessions, history and run record
                     in SQLite, executor, loop, events).
* ``ania``           one long-lived ``Agent`` (as in a kernel), ``await agent.chat(...)``.
* ``raw+50``, ``raw-post+50``  the raw loops sending 50 extra tool schemas (same as ania-nb's).
* ``ania+50``        the agent with 50 extra registered ``@tool`` functions (2-4 typed params).

Streamed group (``--stream-runs``, 0 skips it), on a second server process whose final answer is
long (``LONG_FINAL_TEXT``, >= 500 chunks of 8 characters) after the same tool round:

* ``raw-stream``     hand-written loop with the typed ``create(stream=True,
                     stream_options={"include_usage": True})``, accumulating content and tool-call
                     deltas from the SDK's typed chunks, tools as in ``raw``.
* ``ania-stream``    the agent with ``llm.stream = true`` (the default), no event listener.
* ``ania-nostream``  the same agent configuration with ``llm.stream = false``, same long answer.
* ``transport``      for reference only: the same two streamed requests through the SDK's
                     ``post(..., stream=True)``, every body byte read (``aiter_bytes``) and
                     discarded. No parsing, no tools: the HTTP client's own cost per chunk.

Goals (issue 11): ``ania-stream`` <= 0.8x ``raw-stream`` and <= 1.1x ``ania-nostream``.

Fairness: every run uses a fresh conversation on every side: a fresh session name per run for
ania-nb, a fresh message list for the raw loops; all send system prompt + user message, then the
tool round. All send the same model, sampling parameters, tool list and messages (the raw loops
prefix the user message with the local time, as ania-nb does). Before measuring, one run of
every variant goes to an in-process recording server and the request bodies are compared: the
tools bytes, and the whole parsed bodies with the server's call ids and the time prefix
normalised. ania-nb does more per run than the raw loops by design (argument validation, the
run log and history in SQLite on its store thread, events); that is the overhead being
measured. CPU is ``time.process_time()`` (this process, all threads, so the store thread and
the ``to_thread`` workers count); wall is ``time.perf_counter()``.

Reported: CPU and wall per run as total / R, and the ratio of each ania variant to both raw loops
sending the same tools, as the median of the per-round ratios (one round = one block of every
variant; robust to noise spikes) and as the ratio of totals, plus the CPU difference in ms/run.

Also measures ``python -X importtime -c "import ania_nb"`` and checks that openai, mcp and lancedb
are not imported by it.

    .venv/bin/python bench/engine_overhead.py --runs 200
    .venv/bin/python bench/engine_overhead.py --runs 200 --json > result.json
    .venv/bin/python bench/engine_overhead.py --runs 200 --profile /tmp/overhead
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.metadata
import inspect
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from _raw import ServerProcess, assistant_message  # bench/ is the script's folder

MODEL = "bench-model"
API_KEY = "sk-bench"
USER_TEXT = "Add 2 and 3, count the words of the sentence, and look up the capital of Norway."
FINAL_TEXT = "2 + 3 = 5, the sentence has 9 words, and the capital of Norway is Oslo."
EXTRA_TOOLS = 50
STREAM_CHUNK = 8  # characters per streamed content chunk (the server's --chunk-size)
LONG_FINAL_TEXT = " ".join(
    f"Point {i}: the sum is 5, the sentence has 9 words, and Oslo is the capital of Norway."
    for i in range(1, 51)
)  # about 4,400 characters: over 500 chunks of STREAM_CHUNK
HEAVY_MODULES = ("openai", "mcp", "lancedb")

# --------------------------------------------------------------------------- the tools


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first addend
        b: second addend
    """
    return a + b


def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: the text to count
    """
    return len(text.split())


_CAPITALS = {"norway": "Oslo", "france": "Paris", "japan": "Tokyo"}


async def lookup(key: str) -> dict[str, Any]:
    """Look up a fact in the knowledge base.

    Args:
        key: what to look up
    """
    await asyncio.sleep(0)
    return {"key": key, "value": _CAPITALS.get(key.split()[-1].lower(), "unknown")}


BASE_TOOLS: dict[str, Callable[..., Any]] = {
    "add": add,
    "word_count": word_count,
    "lookup": lookup,
}

# Hand-written schemas for the raw loop (what a developer would type next to the functions).
RAW_BASE_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "a": {"type": "integer", "description": "first addend"},
                    "b": {"type": "integer", "description": "second addend"},
                },
                "required": ["a", "b"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a fact in the knowledge base.",
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"key": {"type": "string", "description": "what to look up"}},
                "required": ["key"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "word_count",
            "description": "Count the words of a text.",
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"text": {"type": "string", "description": "the text to count"}},
                "required": ["text"],
            },
        },
    },
]

# (python type, JSON schema type, parameter description) cycled over the extra tools' params.
_PARAM_KINDS: list[tuple[type, str, str]] = [
    (int, "integer", "how many items to consider"),
    (str, "string", "the text to work on"),
    (float, "number", "a threshold between 0 and 1"),
    (bool, "boolean", "whether to include archived items"),
]


@dataclass(frozen=True)
class ExtraSpec:
    """One generated tool: name, description and (param name, kind index) pairs."""

    name: str
    description: str
    params: tuple[tuple[str, int], ...]
    is_async: bool


def extra_specs(count: int) -> list[ExtraSpec]:
    """Describe `count` distinct typed tools with 2-4 parameters each."""
    specs = []
    for i in range(count):
        n_params = 2 + i % 3
        params = tuple((f"p{j}_{i:02d}", (i + j) % len(_PARAM_KINDS)) for j in range(n_params))
        description = f"Extra tool number {i}: combine the inputs and report a short summary."
        specs.append(ExtraSpec(f"extra_tool_{i:02d}", description, params, i % 2 == 1))
    return specs


def make_extra_function(spec: ExtraSpec) -> Callable[..., Any]:
    """A typed function (sync or async) for `spec`, as a user would write it by hand."""

    def body(**kwargs: Any) -> str:
        return f"{spec.name}: " + ", ".join(f"{k}={v}" for k, v in sorted(kwargs.items()))

    async def async_body(**kwargs: Any) -> str:
        return body(**kwargs)

    fn: Callable[..., Any] = async_body if spec.is_async else body
    parameters = []
    annotations: dict[str, Any] = {}
    for pname, kind in spec.params:
        py_type, _, doc = _PARAM_KINDS[kind]
        annotation = Annotated[py_type, doc]
        annotations[pname] = annotation
        parameters.append(
            inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY, annotation=annotation)
        )
    annotations["return"] = str
    fn.__name__ = fn.__qualname__ = spec.name
    fn.__doc__ = spec.description
    fn.__annotations__ = annotations
    fn.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    return fn


def raw_extra_schema(spec: ExtraSpec) -> dict[str, Any]:
    """The hand-built OpenAI schema of an extra tool for the raw loop."""
    properties = {
        pname: {"type": _PARAM_KINDS[kind][1], "description": _PARAM_KINDS[kind][2]}
        for pname, kind in spec.params
    }
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "properties": properties,
                "required": [pname for pname, _ in spec.params],
            },
        },
    }


# --------------------------------------------------------------------------- the server


def script_items() -> list[Any]:
    """The two replies of one run; the server cycles them (`--loop`)."""
    from ania_nb.testing import reply, tool_call, usage

    return [
        reply(
            tool_calls=[
                tool_call("add", {"a": 2, "b": 3}),
                tool_call("word_count", {"text": "the quick brown fox jumps over the lazy dog"}),
                tool_call("lookup", {"key": "capital of Norway"}),
            ],
            usage=usage(420, 60),
        ),
        reply(FINAL_TEXT, usage=usage(520, 30)),
    ]


def long_script_items() -> list[Any]:
    """The streamed group's two replies: the same tool round, then a long final answer."""
    from ania_nb.testing import reply, usage

    first, _ = script_items()
    return [first, reply(LONG_FINAL_TEXT, usage=usage(520, len(LONG_FINAL_TEXT) // 4))]


def write_script(path: Path, items: list[Any] | None = None) -> None:
    """The script file for the server process."""
    from ania_nb.testing import script_to_json

    path.write_text(script_to_json(script_items() if items is None else items), encoding="utf-8")


class Server(ServerProcess):
    """The scripted LLM server in a child process."""

    def __init__(self, script: Path, chunk_size: int = STREAM_CHUNK) -> None:
        super().__init__(
            "-m",
            "ania_nb.testing",
            "serve",
            "--script",
            str(script),
            "--loop",
            "--chunk-size",
            str(chunk_size),
        )


# --------------------------------------------------------------------------- the sides


class RawLoop:
    """The hand-written baseline: what one would write with the openai SDK alone (typed call)."""

    def __init__(
        self,
        base_url: str,
        schemas: list[dict[str, Any]],
        functions: dict[str, Callable[..., Any]],
        system_prompt: str,
        params: dict[str, Any],
    ) -> None:
        import openai

        self.client = openai.AsyncOpenAI(
            base_url=base_url, api_key=API_KEY, max_retries=0, timeout=120.0
        )
        self.schemas = schemas
        self.functions = functions
        self.system_prompt = system_prompt
        self.params = params

    async def _complete(self, messages: list[dict[str, Any]]) -> Any:
        return await self.client.chat.completions.create(
            model=MODEL, messages=messages, tools=self.schemas, **self.params
        )

    async def _call_tool(self, name: str, arguments: str) -> str:
        fn = self.functions[name]
        args = json.loads(arguments)
        if inspect.iscoroutinefunction(fn):
            result = await fn(**args)
        else:
            result = await asyncio.to_thread(fn, **args)
        return result if isinstance(result, str) else json.dumps(result)

    async def run(self, text: str) -> str:
        """One conversation: model, tools in parallel, model again, until a plain answer."""
        # ania-nb tells the model when the user spoke (engine.messages.timestamped): same here.
        stamp = datetime.now().astimezone().isoformat(timespec="seconds")
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": f"[{stamp}] {text}"},
        ]
        for _ in range(10):
            response = await self._complete(messages)
            msg = response.choices[0].message
            if not msg.tool_calls:
                return msg.content or ""
            messages.append(assistant_message(msg))
            results = await asyncio.gather(
                *(self._call_tool(c.function.name, c.function.arguments) for c in msg.tool_calls)
            )
            messages += [
                {"role": "tool", "tool_call_id": c.id, "content": r}
                for c, r in zip(msg.tool_calls, results, strict=True)
            ]
        raise RuntimeError("raw loop: too many rounds")

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.client.close()


class RawPostLoop(RawLoop):
    """The same loop sending the plain dict body through ``client.post``, as ania-nb does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from openai.types.chat import ChatCompletion

        self.cast_to = ChatCompletion

    async def _complete(self, messages: list[dict[str, Any]]) -> Any:
        # Same keys in the same order as ania_nb.engine.llm.LLMClient._params.
        body = {"model": MODEL, "messages": messages, "tools": self.schemas, **self.params}
        return await self.client.post("/chat/completions", cast_to=self.cast_to, body=body)


class RawStreamLoop(RawLoop):
    """The hand-written streaming loop: typed ``create(stream=True)``, deltas accumulated."""

    async def run(self, text: str) -> str:
        """One conversation, streamed: content and tool-call deltas folded, tools, again."""
        stamp = datetime.now().astimezone().isoformat(timespec="seconds")
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": f"[{stamp}] {text}"},
        ]
        for _ in range(10):
            stream = await self.client.chat.completions.create(
                model=MODEL,
                messages=messages,
                tools=self.schemas,
                stream=True,
                stream_options={"include_usage": True},
                **self.params,
            )
            content: list[str] = []
            calls: dict[int, dict[str, Any]] = {}
            async for chunk in stream:
                if not chunk.choices:
                    continue  # the usage chunk
                delta = chunk.choices[0].delta
                if delta.content:
                    content.append(delta.content)
                for tc in delta.tool_calls or ():
                    slot = calls.setdefault(
                        tc.index,
                        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    slot["id"] = tc.id or slot["id"]
                    if tc.function is not None:
                        slot["function"]["name"] += tc.function.name or ""
                        slot["function"]["arguments"] += tc.function.arguments or ""
            if not calls:
                return "".join(content)
            tool_calls = [calls[i] for i in sorted(calls)]
            messages.append(
                {"role": "assistant", "content": "".join(content) or None, "tool_calls": tool_calls}
            )
            results = await asyncio.gather(
                *(
                    self._call_tool(c["function"]["name"], c["function"]["arguments"])
                    for c in tool_calls
                )
            )
            messages += [
                {"role": "tool", "tool_call_id": c["id"], "content": r}
                for c, r in zip(tool_calls, results, strict=True)
            ]
        raise RuntimeError("raw stream loop: too many rounds")


class TransportOnly(RawLoop):
    """Two streamed requests whose bodies are read and dropped: the HTTP stack's floor."""

    async def run(self, text: str) -> str:
        """Send the run's two requests (fixed messages), drain both bodies, parse nothing."""
        import httpx2

        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": text},
        ]
        body = {"model": MODEL, "messages": messages, "tools": self.schemas, **self.params}
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        for _ in range(2):
            response = await self.client.post(
                "/chat/completions", cast_to=httpx2.Response, body=body, stream=True
            )
            async for _ in response.aiter_bytes():
                pass
            await response.aclose()
        return LONG_FINAL_TEXT


class AniaSide:
    """One long-lived `Agent`; every run is a fresh session."""

    def __init__(self, agent: Any, label: str) -> None:
        self.agent = agent
        self.label = label
        self.count = 0

    async def run(self, text: str) -> str:
        """One `Agent.chat` in a new session; raises if the run did not succeed."""
        self.count += 1
        result = await self.agent.chat(text, session=f"{self.label}-{self.count}")
        if result.status != "success" or len(result.tool_calls) != 3:
            raise RuntimeError(f"ania run failed: {result.status} {result.error}")
        return result.text

    async def aclose(self) -> None:
        """Close the agent (store, HTTP client)."""
        await self.agent.aclose()


# --------------------------------------------------------------------------- measurement


@dataclass
class Stats:
    """Per-block CPU and wall seconds of one variant."""

    name: str
    runner: Callable[[str], Awaitable[str]]
    baselines: tuple[str, ...] = ()
    expected: str = FINAL_TEXT
    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    loop_cpu: list[float] = field(default_factory=list)
    runs: int = 0


async def run_block(stats: Stats, n: int, measure: bool) -> None:
    """Run `n` conversations back to back; record the block's CPU and wall time."""
    gc.collect()
    c0, w0, t0 = time.process_time(), time.perf_counter(), time.thread_time()
    for _ in range(n):
        text = await stats.runner(USER_TEXT)
        if text != stats.expected:
            raise RuntimeError(f"{stats.name}: unexpected reply {text!r} (script out of step?)")
    c1, w1, t1 = time.process_time(), time.perf_counter(), time.thread_time()
    if measure:
        stats.cpu.append(c1 - c0)
        stats.wall.append(w1 - w0)
        stats.loop_cpu.append(t1 - t0)
        stats.runs += n


async def measure(variants: list[Stats], runs: int, warmup: int, block: int) -> None:
    """Warm up each variant, then interleave blocks; the order rotates every round."""
    for stats in variants:
        await run_block(stats, warmup, measure=False)
    rounds = max(1, -(-runs // block))
    for r in range(rounds):
        n = min(block, runs - r * block)
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        if r % 2:
            order.reverse()
        for stats in order:
            await run_block(stats, n, measure=True)


def summarise(variants: list[Stats]) -> list[dict[str, Any]]:
    """One row per variant: per-run CPU/wall (total / R) and ratios to its baseline."""
    by_name = {s.name: s for s in variants}
    rows = []
    for s in variants:
        row: dict[str, Any] = {
            "variant": s.name,
            "runs": s.runs,
            "cpu_ms_per_run": 1000 * sum(s.cpu) / s.runs,
            "wall_ms_per_run": 1000 * sum(s.wall) / s.runs,
            "loop_thread_cpu_ms_per_run": 1000 * sum(s.loop_cpu) / s.runs,
        }
        if s.baselines:
            row["vs"] = {}
        for name in s.baselines:
            base = by_name[name]
            row["vs"][name] = {
                "cpu_ratio_median_round": statistics.median(
                    a / b for a, b in zip(s.cpu, base.cpu, strict=True)
                ),
                "cpu_ratio_total": sum(s.cpu) / sum(base.cpu),
                "cpu_ms_diff_per_run": 1000 * (sum(s.cpu) - sum(base.cpu)) / s.runs,
                "wall_ratio_median_round": statistics.median(
                    a / b for a, b in zip(s.wall, base.wall, strict=True)
                ),
            }
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- import time


def _parse_importtime(stderr: str) -> dict[str, int]:
    """Module name -> cumulative µs, from ``-X importtime`` lines ``self | cumulative | name``."""
    cumulative: dict[str, int] = {}
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cum_us, name = line.removeprefix("import time:").split("|")
        cumulative[name.strip()] = int(cum_us)
    return cumulative


def _importtime(statement: str) -> dict[str, int]:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    return _parse_importtime(proc.stderr)


def import_time(statement: str, repeat: int) -> tuple[int, dict[str, int]]:
    """Median cumulative µs of the statement's top module over `repeat` fresh interpreters."""
    module = statement.split()[-1]
    figures: list[int] = []
    modules: dict[str, int] = {}
    for _ in range(repeat):
        modules = _importtime(statement)
        figures.append(modules[module])
    return int(statistics.median(figures)), modules


def import_report(repeat: int) -> dict[str, Any]:
    """``import ania_nb`` cumulative time, heavy modules it must not load, `openai` for scale."""
    ania_us, modules = import_time("import ania_nb", repeat)
    heavy = sorted(
        name
        for name in modules
        if any(name == m or name.startswith(m + ".") for m in HEAVY_MODULES)
    )
    openai_us, _ = import_time("import openai", repeat)
    startup = set(_importtime("pass"))  # site, encodings...: loaded before ania_nb is
    top = sorted(
        (
            (name, us)
            for name, us in modules.items()
            if "." not in name and name != "ania_nb" and name not in startup
        ),
        key=lambda item: -item[1],
    )[:5]
    return {
        "ania_nb_cumulative_us": ania_us,
        "openai_cumulative_us": openai_us,
        "heavy_modules_imported": heavy,
        "repeat": repeat,
        "largest_top_level_imports_us": dict(top),
    }


# --------------------------------------------------------------------------- main


def build_stream_sides(base_url: str, data_root: Path) -> dict[str, Any]:
    """The streamed group against `base_url` (the long-answer server)."""
    from ania_nb import Agent, tool

    def make_agent(label: str, stream: bool) -> Agent:
        return Agent(
            base_url=base_url,
            api_key=API_KEY,
            model=MODEL,
            data_dir=data_root / label,
            tools=[tool(fn) for fn in BASE_TOOLS.values()],
            overrides={
                "llm.stream": stream,
                "agent.max_context_tokens": 0,
                "agent.builtin_tools": False,
                "skills.dir": str(data_root / "no-skills"),
                "mcp.config_file": str(data_root / "no-mcp.json"),
            },
        )

    agent = make_agent("ania-stream", stream=True)
    llm = agent.config.llm
    params = {
        key: getattr(llm, key)
        for key in ("temperature", "top_p", "max_tokens")
        if getattr(llm, key) is not None
    }
    return {
        "raw-stream": RawStreamLoop(
            base_url, RAW_BASE_SCHEMAS, BASE_TOOLS, agent.system_prompt, params
        ),
        "ania-nostream": AniaSide(make_agent("ania-nostream", stream=False), "bench-nostream"),
        "ania-stream": AniaSide(agent, "bench-stream"),
        "transport": TransportOnly(
            base_url, RAW_BASE_SCHEMAS, BASE_TOOLS, agent.system_prompt, params
        ),
    }


async def verify_stream_bodies(data_root: Path) -> dict[str, Any]:
    """One run of each streamed variant against an in-process server: the same requests?"""
    from ania_nb.testing import ScriptedLLM

    with ScriptedLLM(loop=True, chunk_size=STREAM_CHUNK) as server:
        server.script(*long_script_items())
        sides = build_stream_sides(server.base_url, data_root / "verify-stream")
        recorded: dict[str, list[Any]] = {}
        try:
            for name, side in sides.items():
                before = len(server.requests)
                if await side.run(USER_TEXT) != LONG_FINAL_TEXT:
                    raise RuntimeError(f"verify: {name} got an unexpected reply")
                recorded[name] = server.requests[before:]
        finally:
            for side in sides.values():
                await side.aclose()
    bodies = {n: [_normalise(r.body) for r in reqs] for n, reqs in recorded.items()}
    return {
        "requests_per_run": {n: len(reqs) for n, reqs in recorded.items()},
        "raw_stream_equals_ania_stream": bodies["raw-stream"] == bodies["ania-stream"],
        "streamed": {n: [r.stream for r in reqs] for n, reqs in recorded.items()},
    }


async def bench_stream(args: argparse.Namespace, base_url: str, data_root: Path) -> dict[str, Any]:
    """Measure the streamed group (interleaved blocks, as the main group)."""
    verify = await verify_stream_bodies(data_root)
    if not verify["raw_stream_equals_ania_stream"]:
        raise RuntimeError(f"the streamed variants do not send the same requests: {verify}")
    sides = build_stream_sides(base_url, data_root / "stream")
    variants = [
        Stats("raw-stream", sides["raw-stream"].run, expected=LONG_FINAL_TEXT),
        Stats("ania-nostream", sides["ania-nostream"].run, expected=LONG_FINAL_TEXT),
        Stats(
            "ania-stream",
            sides["ania-stream"].run,
            baselines=("raw-stream", "ania-nostream"),
            expected=LONG_FINAL_TEXT,
        ),
        Stats("transport", sides["transport"].run, expected=LONG_FINAL_TEXT),
    ]
    try:
        await measure(variants, args.stream_runs, args.warmup, args.block)
    finally:
        for side in sides.values():
            await side.aclose()
    return {
        "rows": summarise(variants),
        "chunks_per_answer": -(-len(LONG_FINAL_TEXT) // STREAM_CHUNK),
        "request_bodies": verify,
    }


def build_sides(args: argparse.Namespace, base_url: str, data_root: Path) -> dict[str, Any]:
    """Every variant's side against `base_url`, keyed by variant name (3-tool ones first)."""
    from ania_nb import Agent, tool

    overrides = {
        "llm.stream": False,
        "agent.max_context_tokens": 0,
        "agent.builtin_tools": False,  # both sides send exactly the same three tools
        "skills.dir": str(data_root / "no-skills"),  # ignore ./skills and ./mcp.json
        "mcp.config_file": str(data_root / "no-mcp.json"),
    }
    specs = extra_specs(args.extra_tools)

    def make_agent(label: str, extra: bool) -> Agent:
        tools: list[Any] = [tool(fn) for fn in BASE_TOOLS.values()]
        if extra:
            tools += [tool(make_extra_function(spec)) for spec in specs]
        return Agent(
            base_url=base_url,
            api_key=API_KEY,
            model=MODEL,
            data_dir=data_root / label,
            tools=tools,
            overrides=overrides,
        )

    agent = make_agent("ania", extra=False)
    llm = agent.config.llm
    params = {
        key: getattr(llm, key)
        for key in ("temperature", "top_p", "max_tokens")
        if getattr(llm, key) is not None
    }
    prompt = agent.system_prompt
    sides: dict[str, Any] = {
        "raw": RawLoop(base_url, RAW_BASE_SCHEMAS, BASE_TOOLS, prompt, params),
        "raw-post": RawPostLoop(base_url, RAW_BASE_SCHEMAS, BASE_TOOLS, prompt, params),
        "ania": AniaSide(agent, "bench"),
    }
    n = args.extra_tools
    if n:
        functions = {**BASE_TOOLS, **{spec.name: make_extra_function(spec) for spec in specs}}
        schemas = sorted(
            RAW_BASE_SCHEMAS + [raw_extra_schema(spec) for spec in specs],
            key=lambda d: d["function"]["name"],
        )
        sides[f"raw+{n}"] = RawLoop(base_url, schemas, functions, prompt, params)
        sides[f"raw-post+{n}"] = RawPostLoop(base_url, schemas, functions, prompt, params)
        sides[f"ania+{n}"] = AniaSide(make_agent("ania-extra", extra=True), "bench-extra")
    return sides


def tools_payload(sides: dict[str, Any]) -> dict[str, bytes]:
    """The canonical bytes of each side's tool list (before any request)."""
    from ania_nb.tools import dumps_canonical

    return {
        name: (
            side.agent.tools.definitions_json()
            if isinstance(side, AniaSide)
            else dumps_canonical(side.schemas)
        ).encode()
        for name, side in sides.items()
    }


def _normalise_text(text: str) -> str:
    """Renumber the server's ``call_<request>_<position>`` ids, blank the ``[<local time>]``."""
    text = re.sub(r'"call_\d+_(\d+)"', r'"call_N_\1"', text)
    return re.sub(r'"\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d\] ', '"[T] ', text)


def _normalise(body: Any) -> str:
    """A parsed body as canonical JSON (sorted keys), normalised."""
    return _normalise_text(json.dumps(body, sort_keys=True, ensure_ascii=False))


async def verify_bodies(args: argparse.Namespace, data_root: Path) -> dict[str, Any]:
    """One run of every variant against an in-process recording server; compare the requests.

    Variants with the same tools must send the same bodies: the tools bytes as the server
    re-serialises them, and the whole parsed body (model, sampling parameters, messages). The
    bytes on the wire are compared too (normalised the same way), for information: the typed
    ``create()`` orders the keys differently, ``post()`` sends the dict as given.
    """
    from ania_nb.testing import ScriptedLLM

    report: dict[str, Any] = {"tools_bytes": {}, "groups": {}}
    with ScriptedLLM(loop=True) as server:
        server.script(*script_items())
        sides = build_sides(args, server.base_url, data_root / "verify")
        recorded: dict[str, list[Any]] = {}
        try:
            for name, side in sides.items():
                before = len(server.requests)
                if await side.run(USER_TEXT) != FINAL_TEXT:
                    raise RuntimeError(f"verify: {name} got an unexpected reply")
                recorded[name] = server.requests[before:]
        finally:
            for side in sides.values():
                await side.aclose()
    all_ok = True
    for suffix in ("", f"+{args.extra_tools}") if args.extra_tools else ("",):
        names = [f"raw{suffix}", f"raw-post{suffix}", f"ania{suffix}"]
        ref = recorded[names[0]]
        tools_ok = all(
            len(recorded[n]) == len(ref)
            and all(a.tools_bytes == b.tools_bytes for a, b in zip(recorded[n], ref, strict=True))
            for n in names
        )
        bodies_ok = all(
            [_normalise(r.body) for r in recorded[n]] == [_normalise(r.body) for r in ref]
            for n in names
        )
        wire = {n: [_normalise_text(r.raw.decode()) for r in recorded[n]] for n in names}
        raw_bytes = {n: wire[n] == wire[names[-1]] for n in names[:-1]}
        report["groups"][names[-1]] = {
            "variants": names,
            "requests_per_run": len(ref),
            "tools_bytes_identical": tools_ok,
            "bodies_identical": bodies_ok,
            "wire_bytes_identical_to_ania": raw_bytes,
        }
        for n in names:
            report["tools_bytes"][n] = len(recorded[n][0].tools_bytes)
        all_ok = all_ok and tools_ok and bodies_ok
    report["all_identical"] = all_ok
    return report


async def bench(args: argparse.Namespace, base_url: str, data_root: Path) -> dict[str, Any]:
    """Check the request bodies, build the sides, measure them interleaved, close them."""
    verify = await verify_bodies(args, data_root)
    if not verify["all_identical"]:
        raise RuntimeError(f"the variants do not send the same requests: {verify}")
    sides = build_sides(args, base_url, data_root)
    payload = tools_payload(sides)
    n = args.extra_tools
    groups = [("raw", "raw-post", "ania")]
    if n:
        groups.append((f"raw+{n}", f"raw-post+{n}", f"ania+{n}"))
    identical = all(payload[a] == payload[b] == payload[c] for a, b, c in groups)
    variants: list[Stats] = []
    for raw_name, post_name, ania_name in groups:
        variants += [
            Stats(raw_name, sides[raw_name].run),
            Stats(post_name, sides[post_name].run),
            Stats(ania_name, sides[ania_name].run, baselines=(raw_name, post_name)),
        ]
    profile_report = None
    try:
        await measure(variants, args.runs, args.warmup, args.block)
        if args.profile:
            profile_report = await profile(
                {name: sides[name] for name in ("raw", "raw-post", "ania")},
                args.profile,
                args.runs,
                args.block,
            )
    finally:
        for side in sides.values():
            await side.aclose()
    return {
        "rows": summarise(variants),
        "tools_payload_bytes": {name: len(data) for name, data in payload.items()},
        "tools_payload_identical": identical,
        "request_bodies": verify,
        "profile": profile_report,
    }


async def profile(sides: dict[str, Any], prefix: str, runs: int, block: int) -> str:
    """cProfile `runs` more runs of each side (event-loop thread), interleaved in blocks.

    Writes ``<prefix>.<side>.pstats`` and returns a summary: own time per run grouped by
    package for each side, then the ania_nb functions with the largest cumulative time per run.
    The profiler inflates absolute times; compare the groups.
    """
    import cProfile
    import pstats

    profilers = {name: cProfile.Profile() for name in sides}
    for start in range(0, runs, block):
        for name, side in sides.items():
            profilers[name].enable()
            for _ in range(min(block, runs - start)):
                await side.run(USER_TEXT)
            profilers[name].disable()
    groups: dict[str, dict[str, float]] = {}
    ania_funcs: list[tuple[float, float, int, str]] = []
    for name, profiler in profilers.items():
        profiler.dump_stats(f"{prefix}.{name}.pstats")
        stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
        totals: dict[str, float] = {}
        for (filename, _, func), (_, ncalls, tottime, cumtime, _) in stats.items():
            if func == "<method 'poll' of 'select.epoll' objects>":
                continue  # idle: waiting for the server
            key = _group(filename, func)
            totals[key] = totals.get(key, 0.0) + 1000 * tottime / runs
            if name == "ania" and "/ania_nb/" in filename:
                where = filename.split("/ania_nb/", 1)[1].removesuffix(".py").replace("/", ".")
                ania_funcs.append(
                    (1000 * cumtime / runs, 1000 * tottime / runs, ncalls, f"{where}:{func}")
                )
        groups[name] = totals
    names = list(sides)
    ref, ania = groups["raw-post" if "raw-post" in groups else names[0]], groups["ania"]
    keys = sorted(set().union(*groups.values()), key=lambda k: -abs(ania.get(k, 0) - ref.get(k, 0)))
    lines = [
        f"profiled own time, ms/run (cProfile, loop thread, {runs} runs each), "
        "largest ania - raw-post differences first",
        f"{'group':<36}" + "".join(f"{n:>10}" for n in names) + f"{'ania-post':>10}",
    ]
    for key in ["TOTAL (busy)", *keys[:20]]:
        if key == "TOTAL (busy)":
            cells = [sum(groups[n].values()) for n in names]
        else:
            cells = [groups[n].get(key, 0.0) for n in names]
        diff = cells[names.index("ania")] - cells[names.index("raw-post")]
        lines.append(f"{key[:35]:<36}" + "".join(f"{c:>10.2f}" for c in cells) + f"{diff:>+10.2f}")
    lines += [
        "",
        "ania_nb functions by cumulative time, ms/run (cProfile; coroutines count per resume)",
        f"{'cum':>7}{'own':>7}{'calls':>7}  function",
    ]
    for cum, own, ncalls, label in sorted(ania_funcs, reverse=True)[:15]:
        lines.append(f"{cum:>7.3f}{own:>7.3f}{ncalls / runs:>7.1f}  {label}")
    return "\n".join(lines)


def _group(filename: str, func: str) -> str:
    """Bucket a profiled function: a package name, a stdlib module, or a builtin."""
    if filename == __file__:
        return "bench script (raw loops, tools)"
    if "/ania_nb/" in filename:
        return "ania_nb." + filename.split("/ania_nb/", 1)[1].removesuffix(".py").replace("/", ".")
    if "site-packages/" in filename:
        return filename.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if filename == "~":  # "<built-in method builtins.len>", "<method 'send' of 'x.y' objects>"
        inner = func.strip("<>")
        if inner.startswith("method '") and " of '" in inner:
            meth, owner = inner.removeprefix("method '").split("' of '", 1)
            return "builtin " + owner.split("'", 1)[0] + "." + meth
        return "builtin " + inner.split()[-1]
    return "stdlib " + Path(filename).stem


def fmt_table(result: dict[str, Any], meta: dict[str, Any]) -> str:
    """The human-readable report."""
    lines = [
        f"date {meta['date']}  cores {meta['cores']}  python {meta['python']}  "
        f"openai {meta['openai']}  runs {meta['runs']} (block {meta['block']}, "
        f"warm-up {meta['warmup']})",
        "",
        f"{'variant':<13} {'CPU ms/run':>10} {'loop thr':>8} {'wall ms/run':>11}   "
        f"{'CPU x raw':>9} {'(totals)':>8}   {'CPU x raw-post':>14} {'(totals)':>8} "
        f"{'+ms vs post':>11}",
    ]
    for row in result["rows"]:
        ratio = ""
        if "vs" in row:
            raw, post = row["vs"].values()  # (raw, raw-post), in that order
            ratio = (
                f"{raw['cpu_ratio_median_round']:>8.2f}x {raw['cpu_ratio_total']:>7.2f}x   "
                f"{post['cpu_ratio_median_round']:>13.2f}x {post['cpu_ratio_total']:>7.2f}x "
                f"{post['cpu_ms_diff_per_run']:>+11.2f}"
            )
        lines.append(
            f"{row['variant']:<13} {row['cpu_ms_per_run']:>10.2f} "
            f"{row['loop_thread_cpu_ms_per_run']:>8.2f} {row['wall_ms_per_run']:>11.2f}   {ratio}"
        )
    wall = ", ".join(
        f"{row['variant']} {v['wall_ratio_median_round']:.2f}x {base}"
        for row in result["rows"]
        for base, v in row.get("vs", {}).items()
    )
    bodies = result["request_bodies"]
    lines += [
        "",
        "CPU/wall ms per run = total / R (loop thr = CPU of the event-loop thread alone); "
        "CPU x = median over rounds of (ania block CPU / baseline block CPU), same tools; "
        "(totals) = ratio of total CPU; +ms vs post = CPU ms/run above raw-post.",
        f"wall ratios (median of rounds): {wall}",
        f"tools payload bytes {result['tools_payload_bytes']} identical="
        f"{result['tools_payload_identical']}",
        f"request bodies (one recorded run of each variant): identical="
        f"{bodies['all_identical']}; server-side tools bytes {bodies['tools_bytes']}",
    ]
    streamed = result.get("stream")
    if streamed:
        lines += [
            "",
            f"streamed group: final answer {len(LONG_FINAL_TEXT)} characters = "
            f"{streamed['chunks_per_answer']} content chunks; request bodies raw-stream == "
            f"ania-stream: {streamed['request_bodies']['raw_stream_equals_ania_stream']}",
            f"{'variant':<14} {'CPU ms/run':>10} {'loop thr':>8} {'wall ms/run':>11}   "
            f"{'CPU x raw-stream':>16} {'(totals)':>8}   {'CPU x ania-nostream':>19} "
            f"{'(totals)':>8}",
        ]
        for row in streamed["rows"]:
            ratio = ""
            if "vs" in row:
                raw_stream, nostream = row["vs"].values()
                ratio = (
                    f"{raw_stream['cpu_ratio_median_round']:>15.2f}x "
                    f"{raw_stream['cpu_ratio_total']:>7.2f}x   "
                    f"{nostream['cpu_ratio_median_round']:>18.2f}x "
                    f"{nostream['cpu_ratio_total']:>7.2f}x  (goals <= 0.8x, <= 1.1x)"
                )
            lines.append(
                f"{row['variant']:<14} {row['cpu_ms_per_run']:>10.2f} "
                f"{row['loop_thread_cpu_ms_per_run']:>8.2f} {row['wall_ms_per_run']:>11.2f}   "
                f"{ratio}"
            )
    if result.get("profile"):
        lines += ["", result["profile"]]
    imp = result.get("import")
    if imp:
        heavy = ", ".join(imp["heavy_modules_imported"]) or "none"
        largest = imp["largest_top_level_imports_us"]
        lines += [
            "",
            f"import ania_nb: {imp['ania_nb_cumulative_us'] / 1000:.1f} ms cumulative "
            f"(median of {imp['repeat']}, -X importtime); import openai: "
            f"{imp['openai_cumulative_us'] / 1000:.1f} ms",
            f"openai/mcp/lancedb imported by `import ania_nb`: {heavy}",
            "largest top-level imports under it (ms): "
            + ", ".join(f"{k} {v / 1000:.1f}" for k, v in largest.items()),
        ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(
        description="CPU and wall per run of Agent.chat vs raw AsyncOpenAI loops (typed "
        "create() and low-level post()) "
        "(2 LLM calls, 3 parallel tools), against a scripted server in another process."
    )
    parser.add_argument("--runs", type=int, default=200, help="measured runs per variant")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured runs per variant first")
    parser.add_argument("--block", type=int, default=10, help="runs per interleaved block")
    parser.add_argument(
        "--extra-tools", type=int, default=EXTRA_TOOLS, help="extra typed tools (0: skip variant)"
    )
    parser.add_argument(
        "--stream-runs",
        type=int,
        default=None,
        help="measured runs of the streamed group (default: --runs; 0 skips it)",
    )
    parser.add_argument("--import-repeat", type=int, default=5, help="interpreters for importtime")
    parser.add_argument("--no-import", action="store_true", help="skip the import-time check")
    parser.add_argument(
        "--profile",
        metavar="PREFIX",
        help="then cProfile --runs more raw, raw-post and ania runs (3 tools): "
        "PREFIX.raw.pstats, PREFIX.raw-post.pstats, PREFIX.ania.pstats",
    )
    parser.add_argument(
        "--json", action="store_true", help="JSON on stdout (the table goes to stderr)"
    )
    args = parser.parse_args(argv)
    if args.stream_runs is None:
        args.stream_runs = args.runs
    if (
        args.runs < 1
        or args.block < 1
        or args.warmup < 0
        or min(args.extra_tools, args.stream_runs) < 0
    ):
        parser.error("--runs and --block must be >= 1, --warmup and --extra-tools >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 0 unless something broke (targets are reported, not enforced)."""
    args = parse_args(argv)
    meta = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "openai": importlib.metadata.version("openai"),
        "platform": platform.platform(),
        "runs": args.runs,
        "block": args.block,
        "warmup": args.warmup,
        "extra_tools": args.extra_tools,
        "stream_runs": args.stream_runs,
        "command": " ".join(["python", *sys.argv]),
    }
    with tempfile.TemporaryDirectory(prefix="ania-bench-") as tmp:
        root = Path(tmp)
        script = root / "script.json"
        write_script(script)
        server = Server(script)
        try:
            result = asyncio.run(bench(args, server.base_url, root))
        finally:
            server.close()
        if args.stream_runs:
            long_script = root / "long-script.json"
            write_script(long_script, long_script_items())
            server = Server(long_script)
            try:
                result["stream"] = asyncio.run(bench_stream(args, server.base_url, root))
            finally:
                server.close()
    if not args.no_import:
        result["import"] = import_report(args.import_repeat)
    table = fmt_table(result, meta)
    if args.json:
        print(table, file=sys.stderr)
        print(json.dumps({"meta": meta, **result}, indent=2))
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
