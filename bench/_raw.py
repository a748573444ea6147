"""Shared by the benchmarks' hand-written baseline loops."""

from __future__ import annotations

from typing import Any


def assistant_message(msg: Any) -> dict[str, Any]:
    """A typed SDK assistant message with tool calls as the plain dict sent back next round."""
    return {
        "role": "assistant",
        "content": msg.content,
        "tool_calls": [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in msg.tool_calls
        ],
    }
