"""MCP sampling: a server's ``sampling/createMessage`` answered by ania-nb's own model.

Off by default: a server may sample only with ``"sampling": true`` in its entry of the MCP
config file; otherwise (and whenever it is refused) the server gets an error saying why. A
request is answered only inside a tool call of that server made by a run (its context says
who started it), and only after a person approved it — they see the server's name, the model,
the system prompt and every message. The `Sampler` (the Agent) asks, calls the model with
``maxTokens`` capped by ``mcp.sampling_max_tokens`` and counts the tokens in the run's usage
(and so in the session's quota). Only text is sampled; tool use in sampling is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ania_nb.errors import ToolError
from ania_nb.text import cut

if TYPE_CHECKING:
    from ania_nb.tools.base import ToolContext

__all__ = ["SampledReply", "Sampler", "SamplingRequest", "answer_sampling", "describe_request"]

_SHOWN_CHARS = 4000  # of each message in what the approver reads


@dataclass(frozen=True)
class SamplingRequest:
    """A server's sampling request, SDK-independent."""

    server: str
    system_prompt: str
    messages: tuple[tuple[str, str], ...]  # (role, text)
    max_tokens: int
    hints: tuple[str, ...] = ()  # modelPreferences.hints names, in the server's order
    temperature: float | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class SampledReply:
    """What the model answered."""

    text: str
    model: str
    stop_reason: str = "endTurn"


class Sampler(Protocol):
    """Answers sampling requests (the Agent: approval, model, usage)."""

    async def __call__(self, request: SamplingRequest, ctx: ToolContext) -> SampledReply:
        """The reply, or `ToolError` saying why the request was refused."""


def describe_request(request: SamplingRequest, model: str) -> str:
    """What the approver reads: server, model, token cap, system prompt and every message."""
    lines = [
        f"MCP server '{request.server}' asks {model} for a completion "
        f"(at most {request.max_tokens} tokens).",
        f"System prompt: {cut(request.system_prompt, _SHOWN_CHARS) or '(none)'}",
    ]
    lines += [f"[{role}] {cut(text, _SHOWN_CHARS)}" for role, text in request.messages]
    return "\n".join(lines)


def _text(content: Any) -> str:
    blocks = content if isinstance(content, list) else [content]
    parts = []
    for block in blocks:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("tool_use", "tool_result"):
            raise ToolError("sampling with tools is not supported")
        else:
            parts.append(f"[{kind or 'content'} not passed on: only text is sampled]")
    return "\n".join(parts)


async def answer_sampling(
    server: str,
    params: Any,
    *,
    allowed: bool,
    ctx: ToolContext | None,
    sampler: Sampler | None,
    cap: int,
) -> Any:
    """The SDK answer to ``sampling/createMessage``: a ``CreateMessageResult`` or ``ErrorData``."""
    import mcp_types

    def refuse(why: str) -> Any:
        return mcp_types.ErrorData(code=mcp_types.INVALID_REQUEST, message=why)

    if not allowed:
        return refuse(
            f"sampling is off for MCP server '{server}': the operator can allow it with "
            f'"sampling": true in its entry of the MCP config file'
        )
    if sampler is None:
        return refuse("this ania-nb agent has no model for sampling")
    if ctx is None:
        return refuse(
            f"sampling requests of MCP server '{server}' are answered only during one of its "
            "tool calls, when a person can approve them"
        )
    try:
        if params.tools:
            raise ToolError("sampling with tools is not supported")
        hints = ()
        if params.model_preferences is not None and params.model_preferences.hints:
            hints = tuple(h.name for h in params.model_preferences.hints if h.name)
        request = SamplingRequest(
            server=server,
            system_prompt=params.system_prompt or "",
            messages=tuple((str(m.role), _text(m.content)) for m in params.messages),
            max_tokens=max(1, min(int(params.max_tokens), cap)),
            hints=hints,
            temperature=params.temperature,
            stop=tuple(params.stop_sequences or ()),
        )
        reply = await sampler(request, ctx)
    except ToolError as exc:
        return refuse(str(exc))
    return mcp_types.CreateMessageResult(
        role="assistant",
        content=mcp_types.TextContent(type="text", text=reply.text),
        model=reply.model,
        stop_reason=reply.stop_reason,
    )
