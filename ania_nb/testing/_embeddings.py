"""`POST /v1/embeddings` of `ScriptedLLM`: deterministic vectors, scripted failures, recorded calls.

A text's vector is a signed, hashed bag of its lower-cased character bigrams (unigrams too), L2
normalised: texts sharing many bigrams get similar vectors, unrelated ones near-orthogonal, and
the same text the same vector in every process (crc32, not Python's salted ``hash``).
"""

from __future__ import annotations

import base64
import math
import struct
import threading
import zlib
from collections import deque
from typing import TYPE_CHECKING, Any

from ania_nb.testing._script import (
    CutStream,
    Delay,
    Disconnect,
    ErrorItem,
    Garbage,
    Raw,
    Reply,
    ScriptItem,
    wait_for_requests,
)

if TYPE_CHECKING:
    from ania_nb.testing._server import RecordedRequest

DEFAULT_DIM = 64
EmbeddingItem = ErrorItem | Garbage | Delay | Disconnect | Raw
_ITEM_TYPES = (ErrorItem, Garbage, Delay, Disconnect, Raw)


def embedding_vector(text: str, dim: int = DEFAULT_DIM) -> list[float]:
    """The scripted server's vector of ``text``: hashed character bigrams, unit length."""
    if dim < 1:
        raise ValueError(f"embedding_vector: dim must be >= 1, got {dim}")
    vector = [0.0] * dim
    lowered = text.lower()
    grams = list(lowered) + [lowered[i : i + 2] for i in range(len(lowered) - 1)]
    for gram in grams:
        if gram.isspace():
            continue
        code = zlib.crc32(gram.encode("utf-8"))
        # Low bits pick the slot, one high bit the sign: collisions cancel out on average.
        vector[code % dim] += -1.0 if code & 0x80000000 else 1.0
    norm = math.sqrt(sum(x * x for x in vector))
    if norm == 0.0:  # blank text: a fixed unit vector, as real endpoints return some vector
        vector[0], norm = 1.0, 1.0
    return [x / norm for x in vector]


def _inputs(body: Any) -> list[str] | str:
    """The request's texts, or a message saying why the body is refused."""
    if not isinstance(body, dict):
        return "body is not a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "'model' is required"
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        return "'input' must be a string or a non-empty list of strings"
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            return f"'input'[{i}] is not a string (token arrays are not supported)"
        if not text:  # as OpenAI: an empty string is refused
            return f"'input'[{i}] is an empty string"
    return texts


class EmbeddingsEndpoint:
    """State of `/v1/embeddings`: vector size, queued failures, a standing failure, requests."""

    def __init__(self, dim: int = DEFAULT_DIM) -> None:
        if dim < 1:
            raise ValueError(f"ScriptedLLM: embedding_dim must be >= 1, got {dim}")
        self.dim = dim
        self._queue: deque[EmbeddingItem] = deque()
        self._failure: ErrorItem | None = None
        self._requests: list[RecordedRequest] = []
        self._cond = threading.Condition()

    def script(self, *items: EmbeddingItem) -> EmbeddingsEndpoint:
        """Queue answers for the next requests (error, delay, disconnect, garbage, raw).

        A request with nothing queued gets the deterministic vectors; so does a bare
        `delay(s)` once waited. Returns self.
        """
        for item in items:
            if not isinstance(item, _ITEM_TYPES) or (
                isinstance(item, Delay) and isinstance(item.then, Reply | CutStream)
            ):
                raise TypeError(
                    "ScriptedLLM.embeddings.script(): expected error(), delay(), disconnect(), "
                    f"garbage() or raw(), got {item!r}"
                )
        with self._cond:
            self._queue.extend(items)
        return self

    def fail(self, status: int | None = 503, message: str | None = None) -> None:
        """Answer every request with HTTP ``status`` from now on; None: answer normally again."""
        with self._cond:
            self._failure = None if status is None else ErrorItem(status, message)

    @property
    def failing(self) -> bool:
        """Whether a standing failure is set (`fail`)."""
        with self._cond:
            return self._failure is not None

    @property
    def pending(self) -> int:
        """Number of queued answers."""
        with self._cond:
            return len(self._queue)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of every embeddings request received so far, in order."""
        with self._cond:
            return list(self._requests)

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until `n` embeddings requests arrived, else raise TimeoutError."""
        return wait_for_requests(self._cond, self._requests, n, timeout, "embeddings request")

    def vector(self, text: str) -> list[float]:
        """The vector this server answers for ``text``."""
        return embedding_vector(text, self.dim)

    def reset(self) -> None:
        """Clear queued answers, the standing failure and the recorded requests."""
        with self._cond:
            self._queue.clear()
            self._failure = None
            self._requests.clear()

    # -- used by the handler threads -------------------------------------------------------

    def record(self, make: Any) -> RecordedRequest:
        """Record the request built by ``make(index)``."""
        with self._cond:
            request: RecordedRequest = make(len(self._requests))
            self._requests.append(request)
            self._cond.notify_all()
        return request

    def take(self) -> ScriptItem | None:
        """The scripted answer of the next request; None: answer with vectors."""
        with self._cond:
            if self._queue:
                return self._queue.popleft()
            return self._failure

    def answer(self, request: RecordedRequest) -> tuple[int, dict[str, Any]]:
        """Status and body for a request that is answered normally."""
        texts = _inputs(request.body)
        if isinstance(texts, str):
            message = f"ScriptedLLM: embeddings request #{request.index}: {texts}"
            return 400, ErrorItem(400, message, "invalid_request_error").body()
        body = request.body or {}
        dim = body.get("dimensions") or self.dim
        if not isinstance(dim, int) or dim < 1:
            message = f"ScriptedLLM: 'dimensions' must be a positive integer, got {dim!r}"
            return 400, ErrorItem(400, message, "invalid_request_error").body()
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(texts):
            vector = embedding_vector(text, dim)
            embedding: Any = vector
            if as_base64:  # little-endian float32, as OpenAI sends it
                embedding = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        tokens = sum(max(1, len(text) // 4) for text in texts)
        return 200, {
            "object": "list",
            "data": data,
            "model": body["model"],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
