"""The context window: keep the history under the token budget.

Before a turn, if the last call's prompt (or, before any call, an estimate) exceeds
``ratio × max_context_tokens``, the history is summarised by the compressor model into one
user-role message. If the summariser fails, the oldest half is dropped instead, aligned so that
no tool result is left without the assistant message that asked for it.

The budget is for the conversation: the fixed part of every request (system prompt and tool
definitions, `fixed_part`) cannot be compacted. The conversation may use ``threshold − fixed``
tokens, but never less than `MIN_CONVERSATION_SHARE` of the threshold: when the fixed part
alone leaves less than that (a small ``max_context_tokens`` with many tools), compacting on
every turn would cost a model call each time and lose facts for good, so the conversation keeps
that share instead, `ContextWindow.fixed_too_large` is set and a warning is logged once (front
ends show `ContextWindow.fixed_warning`). A history that is already one summary is never
summarised again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

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
MIN_CONVERSATION_SHARE = 0.25
"""The share of the compaction threshold the conversation always keeps, however large the
system prompt and tool definitions are."""

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
        self.fixed_tokens = 0
        """Estimated tokens of the last measured fixed part (`fixed_part`)."""
        self.fixed_warning: str | None = None
        """Why the fixed part is too large for the budget, while it is (for ``%ania``)."""
        self._warned = False

    @property
    def threshold(self) -> int:
        """Prompt size above which the history is compacted."""
        return int(self.max_context_tokens * self.ratio)

    @property
    def fixed_too_large(self) -> bool:
        """Whether the system prompt and tools leave the conversation less than its minimum."""
        return self.fixed_warning is not None

    def fixed_part(self, system_prompt: str, tools: list[dict[str, Any]] | None) -> int:
        """Estimate and remember the tokens of a request's fixed part; warn once if too large.

        UTF-8 bytes / 4: about right for English and JSON, and not far under for CJK text.
        """
        size = len(system_prompt.encode("utf-8", "replace"))
        if tools:
            size += len(json.dumps(tools, ensure_ascii=False).encode("utf-8", "replace"))
        self.fixed_tokens = tokens = size // 4
        budget = self.threshold
        if self.max_context_tokens <= 0 or budget - tokens >= budget * MIN_CONVERSATION_SHARE:
            self.fixed_warning = None
            return tokens
        self.fixed_warning = (
            f"the system prompt and tool definitions take about {tokens} tokens, too much of "
            f"the {budget}-token compaction budget (agent.compress_ratio × "
            f"agent.max_context_tokens = {self.max_context_tokens}): the conversation keeps "
            f"{int(budget * MIN_CONVERSATION_SHARE)} tokens before it is summarised. Raise "
            "agent.max_context_tokens (with the server's context size), shorten "
            "agent.system_prompt, or offer fewer tools (agent.builtin_tools = false)"
        )
        if not self._warned:
            self._warned = True
            log.warning("context window: %s", self.fixed_warning)
        return tokens

    def conversation_budget(self, fixed_tokens: int) -> int:
        """Tokens the conversation may use before it is compacted, given the fixed part."""
        threshold = self.threshold
        return max(threshold - fixed_tokens, int(threshold * MIN_CONVERSATION_SHARE))

    def needs_compaction(
        self,
        history: list[Message],
        last_prompt_tokens: int | None,
        *,
        fixed_tokens: int | None = None,
    ) -> bool:
        """Whether this history is over the budget (0 budget disables compaction).

        ``last_prompt_tokens`` is the whole prompt, fixed part included; ``fixed_tokens``
        defaults to the last `fixed_part` measured (0 before any). Without a prompt size the
        history (without its system messages) is estimated.
        """
        if self.max_context_tokens <= 0 or not history:
            return False
        conversation = [m for m in history if m.get("role") != "system"]
        if len(conversation) == 1 and _is_summary(conversation[0]):
            return False  # summarising a summary again only loses more
        fixed = self.fixed_tokens if fixed_tokens is None else fixed_tokens
        # The provider's count includes the fixed part; an estimate of the history does not.
        size = last_prompt_tokens - fixed if last_prompt_tokens else estimate_tokens(conversation)
        return size > self.conversation_budget(fixed)

    async def compact(
        self, history: list[Message], compressor: LLMClient | None = None
    ) -> Compaction:
        """Summarise the history into one user message, or drop the oldest half on failure.

        ``compressor`` summarises instead of the window's own (a run another model answers).
        """
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
            sent: list[Message] = [
                {"role": "system", "content": SUMMARISER_PROMPT},
                {"role": "user", "content": transcript},
            ]
            completion = await (compressor or self.compressor).complete(sent)
            usage.add_completion(completion, sent, count_iteration=False)
            summary = (completion.message.get("content") or "").strip()
            if not summary:
                raise LLMError("the compressor returned an empty summary")
        except LLMError as exc:
            log.warning("history compression failed, dropping the oldest half: %s", exc)
            return Compaction(drop_oldest_half(history), "truncate", usage, str(exc))
        return Compaction([{"role": "user", "content": SUMMARY_PREFIX + summary}], "summary", usage)


def _is_summary(message: Message) -> bool:
    content = message.get("content")
    return isinstance(content, str) and content.startswith(SUMMARY_PREFIX)
