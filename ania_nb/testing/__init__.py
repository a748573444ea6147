"""A scripted OpenAI-compatible LLM server on 127.0.0.1 for tests, demos and notebooks.

Real HTTP, real `openai` client underneath; never a patched client. Standard library only,
so importing this package is instant and pulls in neither openai nor httpx::

    import openai
    from ania_nb.testing import ScriptedLLM, reply, tool_call, error

    with ScriptedLLM() as llm:
        llm.script(
            reply(tool_calls=[tool_call("get_weather", {"city": "Oslo"})]),
            error(429, "slow down", retry_after=1),
            reply("It is sunny in Oslo."),
        )
        client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        ...
        assert llm.requests[0].messages[-1]["role"] == "user"

Routes give requests their own script by system prompt or model name, before the common queue::

    llm.route("You are a subagent", reply("child's answer"))   # or llm.route("cheap-model", ...)
    llm.route(lambda req: "weather" in req.tool_names, reply("..."))

`POST /v1/embeddings` answers deterministic vectors (hashed character bigrams, 64 dims), so
similar texts get similar vectors; ``llm.fail_embeddings(503)`` makes it fail until
``llm.fail_embeddings(None)``, ``llm.embeddings.script(error(500), delay(2))`` scripts the next
answers, and ``llm.embedding_requests`` records what was asked::

    llm.embeddings.vector("some text")     # the vector the server answers for it

`distractors(n)` makes ``n`` deterministic bilingual filler chunks (with unique codes in some)
and `distractor_queries(n)` questions about them, for knowledge-base tests and benches at scale.

From another process: ``python -m ania_nb.testing serve --script script.json`` prints
``base_url=...``; write the file with `script_to_json`.
"""

from __future__ import annotations

from ania_nb.testing._conversation import conversation_problem
from ania_nb.testing._corpus import Distractor, distractor_queries, distractors
from ania_nb.testing._embeddings import EmbeddingsEndpoint, embedding_vector
from ania_nb.testing._script import (
    AUTO_USAGE,
    CutStream,
    Delay,
    Disconnect,
    ErrorItem,
    Garbage,
    Raw,
    Reply,
    ScriptItem,
    ToolCallSpec,
    cut_stream,
    delay,
    disconnect,
    error,
    garbage,
    raw,
    reply,
    script_from_json,
    script_to_json,
    tool_call,
    usage,
)
from ania_nb.testing._server import RecordedRequest, Responder, RouteMatch, ScriptedLLM

__all__ = [
    "AUTO_USAGE",
    "CutStream",
    "Delay",
    "Disconnect",
    "Distractor",
    "EmbeddingsEndpoint",
    "ErrorItem",
    "Garbage",
    "Raw",
    "RecordedRequest",
    "Reply",
    "Responder",
    "RouteMatch",
    "ScriptItem",
    "ScriptedLLM",
    "ToolCallSpec",
    "conversation_problem",
    "cut_stream",
    "delay",
    "disconnect",
    "distractor_queries",
    "distractors",
    "embedding_vector",
    "error",
    "garbage",
    "raw",
    "reply",
    "script_from_json",
    "script_to_json",
    "tool_call",
    "usage",
]
