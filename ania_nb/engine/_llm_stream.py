"""Streamed answers: server-sent event framing, the chunk accumulator and the reading loop.

They run once per chunk of every streamed answer, so they stay flat: `SSEParser` has a fast
path for the usual one-event-per-network-chunk case, and `StreamState.feed` reads each parsed
chunk with a handful of dict lookups. Shape rules and the final `Completion` come from
`_llm_wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ._llm_repeat import REPETITION, RepetitionGuard, notice
from ._llm_wire import Completion, Malformed, _kind, build, content_text, loads, provider_error

_log = logging.getLogger("ania_nb.engine.llm")  # the client's logger: one place to look


class _Slot:
    """One tool call being assembled from stream deltas."""

    __slots__ = ("arguments", "id", "name", "other_arguments", "other_name")

    def __init__(self) -> None:
        self.id: Any = None
        self.name: list[str] = []
        self.other_name: Any = None
        self.arguments: list[str] = []
        self.other_arguments: Any = None

    def raw(self) -> dict[str, Any]:
        name = "".join(self.name) if self.name else self.other_name
        if self.arguments:
            arguments: Any = "".join(self.arguments)
        else:
            arguments = self.other_arguments
        return {"id": self.id, "function": {"name": name, "arguments": arguments}}


class StreamState:
    """Accumulates ``chat.completion.chunk`` objects; `feed` returns the text to show."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.slots: dict[int, _Slot] = {}
        self.usage: Any = None
        self.finish: Any = None
        self.model: Any = None
        self.chunks = 0
        self.choices = False

    def feed(self, chunk: Any) -> str | None:
        """Take one parsed chunk; returns its content piece (None when it has none)."""
        if not isinstance(chunk, dict):
            raise Malformed(f"a stream event is {_kind(chunk)}, not a JSON object")
        self.chunks += 1
        if chunk.get("error"):
            raise provider_error(chunk["error"])
        model = chunk.get("model")
        if model:
            self.model = model
        usage = chunk.get("usage")
        if usage is not None:
            self.usage = usage
        choices = chunk.get("choices")
        if not choices:
            return None
        if not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise Malformed(f"a stream chunk's choices is {_kind(choices)}, not a list of objects")
        choice = choices[0]
        self.choices = True
        finish = choice.get("finish_reason")
        if finish:
            self.finish = finish
        delta = choice.get("delta")
        if not delta:
            return None
        if not isinstance(delta, dict):
            raise Malformed(f"a stream chunk's delta is {_kind(delta)}, not an object")
        reasoning = delta.get("reasoning_content")
        if reasoning:
            self.reasoning.append(content_text(reasoning, "a reasoning_content delta") or "")
        calls = delta.get("tool_calls")
        if calls:
            self._calls(calls)
        piece = delta.get("content")
        if not piece:
            return None
        if not isinstance(piece, str):
            piece = content_text(piece, "a content delta") or ""
        self.content.append(piece)
        return piece

    def _calls(self, deltas: Any) -> None:
        if not isinstance(deltas, list):
            raise Malformed(f"a tool_calls delta is {_kind(deltas)}, not a list")
        for delta in deltas:
            if not isinstance(delta, dict):
                raise Malformed(f"a tool call delta is {_kind(delta)}, not an object")
            index = delta.get("index")
            call_id = delta.get("id")
            if not isinstance(index, int) or isinstance(index, bool):
                # No index (some servers): a new id opens a call, otherwise the last one goes on.
                known = any(s.id == call_id for s in self.slots.values())
                last = max(self.slots, default=-1)
                index = last + 1 if last < 0 or (call_id and not known) else last
            slot = self.slots.get(index)
            if slot is None:
                slot = self.slots[index] = _Slot()
            if call_id:
                slot.id = call_id
            function = delta.get("function")
            if function is None:
                continue
            if not isinstance(function, dict):
                raise Malformed(f"a tool call delta's function is {_kind(function)}")
            name = function.get("name")
            if isinstance(name, str):
                slot.name.append(name)
            elif name is not None:
                slot.other_name = name
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                slot.arguments.append(arguments)
            elif arguments is not None:
                slot.other_arguments = arguments

    def cut(self, guard: RepetitionGuard) -> None:
        """End the reply where ``guard`` saw a runaway: text cut, unfinished tool calls dropped."""
        self.content = [guard.cut("".join(self.content))]
        self.slots = {}
        self.finish = REPETITION

    def finish_completion(self, *, done: bool, default_model: str, turn: int) -> Completion:
        """The `Completion` once the stream has ended (``done``: ``[DONE]`` arrived)."""
        if not done and not self.finish:
            raise Malformed(
                "the stream ended without a finish_reason or [DONE] (the answer was cut short)",
                retryable=True,
            )
        if not self.choices:
            raise Malformed("no choices in the response (the stream had none)", retryable=True)
        if not self.finish and not self.content and not self.slots:
            raise Malformed("the stream ended before the model produced any output", retryable=True)
        raw_calls = [self.slots[i].raw() for i in sorted(self.slots)]
        return build(
            "".join(self.content) or None,
            "".join(self.reasoning) or None,
            raw_calls,
            self.finish,
            self.usage,
            self.model,
            default_model,
            turn,
        )


DONE = b"[DONE]"


class SSEParser:
    """Splits server-sent event bytes into ``data`` payloads (comments, other fields skipped).

    A ``data:`` line that is complete JSON on its own is a payload at once (some servers send
    no blank line between events); one that is not waits for the event's next ``data:`` lines.
    """

    def __init__(self) -> None:
        self._partial: list[bytes] = []  # bytes after the last newline
        self._lines: list[bytes] = []  # data lines of a multi-line event

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads completed by ``data``."""
        if (
            data[:6] == b"data: "
            and not self._partial
            and not self._lines
            and data.find(b"\n") == len(data) - 2
            and data[-1:] == b"\n"
        ):
            # The common case: one whole event per network chunk ("data: {...}\n\n").
            return [data[6:-2]]
        if b"\n" not in data:
            self._partial.append(data)
            return []
        if self._partial:
            self._partial.append(data)
            data = b"".join(self._partial)
            self._partial = []
        lines = data.split(b"\n")
        tail = lines.pop()
        if tail:
            self._partial.append(tail)
        out: list[bytes] = []
        for line in lines:
            self._line(line[:-1] if line.endswith(b"\r") else line, out)
        return out

    def close(self) -> list[bytes]:
        """Payloads left when the stream ends without a final blank line."""
        out: list[bytes] = []
        if self._partial:
            self._line(b"".join(self._partial), out)
            self._partial = []
        if self._lines:
            out.append(b"\n".join(self._lines))
            self._lines = []
        return out

    def _line(self, line: bytes, out: list[bytes]) -> None:
        if not line:
            if self._lines:  # the end of a multi-line event
                out.append(b"\n".join(self._lines))
                self._lines = []
            return
        if not line.startswith(b"data:"):
            return  # ": comment", "event:", "id:", "retry:"
        value = line[6:] if line[5:6] == b" " else line[5:]
        if self._lines:
            self._lines.append(value)
        elif value == DONE or _is_json_object(value):
            out.append(value)
        else:
            self._lines.append(value)


def _is_json_object(value: bytes) -> bool:
    # Cheap completeness test: a single-line event is a JSON object from { to }.
    return value.startswith(b"{") and value.rstrip().endswith(b"}")


async def read_events(
    response: Any,
    *,
    model: str,
    turn: int,
    cut_repeats: int,
    on_piece: Callable[[str], Awaitable[None]] | None,
) -> Completion:
    """Read a streamed answer's events into a `Completion`; text pieces go to ``on_piece``.

    A reply that keeps repeating itself (``cut_repeats`` copies in a row; 0: never) is cut: reading
    stops, and closing the response lets the server stop generating.
    """
    acc = StreamState()
    parser = SSEParser()
    guard = RepetitionGuard(cut_repeats) if cut_repeats else None
    done = False
    chunks = response.aiter_bytes()
    httpx2 = importlib.import_module("httpx2")
    try:
        # One flat loop: this runs for every chunk of every streamed answer.
        async for data in chunks:
            for payload in parser.feed(data):
                if payload == DONE:
                    done = True
                    break
                piece = acc.feed(_parse_event(payload, acc))
                if piece is None:
                    continue
                if on_piece is not None:
                    await on_piece(piece)
                if guard is not None and guard.feed(piece):
                    acc.cut(guard)
                    _log.warning("%s: cut a reply that kept repeating itself", model)
                    if on_piece is not None:
                        await on_piece(notice(guard.repeats))
                    return acc.finish_completion(done=False, default_model=model, turn=turn)
            if done:
                break
        else:
            for payload in parser.close():
                if payload == DONE:
                    done = True
                else:
                    acc.feed(_parse_event(payload, acc))
    except httpx2.RequestError:
        if not acc.finish:
            raise
        # The answer was complete (finish_reason came); only the usage chunk or [DONE] was lost
        # with the connection: keep the answer rather than ask again.
        return acc.finish_completion(done=False, default_model=model, turn=turn)
    if done:
        # Read what follows [DONE] (normally only the end of the body) so the connection can be
        # reused, but never wait for a server that keeps it open.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(0.1):
                async for _ in chunks:
                    pass
    return acc.finish_completion(done=done, default_model=model, turn=turn)


async def read_body(response: Any, work: Awaitable[Any]) -> Any:
    """Await reading the body; httpx errors become the SDK's, as for the request itself."""
    httpx2 = importlib.import_module("httpx2")
    openai = importlib.import_module("openai")
    try:
        return await work
    except httpx2.TimeoutException as exc:
        raise openai.APITimeoutError(request=response.request) from exc
    except httpx2.RequestError as exc:
        raise openai.APIConnectionError(
            message=f"the connection broke while reading the answer: {exc}",
            request=response.request,
        ) from exc


def _parse_event(payload: bytes, acc: StreamState) -> Any:
    try:
        return loads(payload)
    except ValueError as exc:
        if not acc.chunks:
            raise  # the first event is garbage: a wrong URL, not a glitch
        raise Malformed(f"a stream event is not valid JSON ({exc})", retryable=True) from exc
