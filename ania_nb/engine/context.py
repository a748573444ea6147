"""The context window: keep the history under the token budget.

Before a turn, if the last call's prompt (or, before any call, an estimate) exceeds
``ratio × max_context_tokens``, the history is summarised by the compressor model into one
user-role message. If the summariser fails, the oldest half is dropped instead, aligned so that
no tool result is left without the assistant message that asked for it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..errors import LLMError
from .llm import LLMClient
from .messages import SUMMARY_PREFIX, Message, drop_oldest_half, estimate_tokens, render_transcript
from .usage import Usage

log = logging.getLogger(__name__)

SUMMARISER_PROMPT = (
    "You summarise a conversation between a user and an AI assistant. Keep the key facts, the "
    "user's intent and preferences, decisions and conclusions, and open questions. Omit tool "
    "details and intermediate reasoning. Write in the conversation's language."
)
EMPTY_SUMMARY = "(the earlier conversation had no text content)"

BeforeCompact = Callable[[list[Message]], Awaitable[None]]


@dataclass(frozen=True)
class Compaction:
    """A replaced history and how it was made."""

    messages: list[Message]
    method: str  # "summary" or "truncate"
    usage: Usage
    error: str | None = None


class ContextWindow:
    """Decides when to compact a history and does it."""

    def __init__(
        self,
        *,
        max_context_tokens: int,
        compressor: LLMClient,
        ratio: float = 0.8,
        before_compact: BeforeCompact | None = None,
    ) -> None:
        self.max_context_tokens = max_context_tokens
        self.ratio = ratio
        self.compressor = compressor
        self.before_compact = before_compact

    @property
    def threshold(self) -> int:
        """Prompt size above which the history is compacted."""
        return int(self.max_context_tokens * self.ratio)

    def needs_compaction(self, history: list[Message], last_prompt_tokens: int | None) -> bool:
        """Whether this history is over the budget (0 budget disables compaction)."""
        if self.max_context_tokens <= 0 or not history:
            return False
        size = last_prompt_tokens if last_prompt_tokens else estimate_tokens(history)
        return size > self.threshold

    async def compact(self, history: list[Message]) -> Compaction:
        """Summarise the history into one user message, or drop the oldest half on failure."""
        if self.before_compact is not None:
            try:
                await self.before_compact(history)
            except Exception:  # a notification hook must not stop compaction
                log.exception("before_compact (PreCompact hooks) failed")
        usage = Usage()
        transcript = render_transcript(history)
        if not transcript:
            return Compaction(
                [{"role": "user", "content": SUMMARY_PREFIX + EMPTY_SUMMARY}], "summary", usage
            )
        try:
            completion = await self.compressor.complete(
                [
                    {"role": "system", "content": SUMMARISER_PROMPT},
                    {"role": "user", "content": transcript},
                ]
            )
            model = completion.asked or completion.model
            usage.add_call(completion.usage, model=model, count_iteration=False)
            summary = (completion.message.get("content") or "").strip()
            if not summary:
                raise LLMError("the compressor returned an empty summary")
        except LLMError as exc:
            log.warning("history compression failed, dropping the oldest half: %s", exc)
            return Compaction(drop_oldest_half(history), "truncate", usage, str(exc))
        return Compaction([{"role": "user", "content": SUMMARY_PREFIX + summary}], "summary", usage)
