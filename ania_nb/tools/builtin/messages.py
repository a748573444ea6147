"""`get_msg_history` and `get_private_file_url`: reach into the chat through the front end."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, Field

from ...engine.callbacks import CallbackName
from ...errors import ToolError
from ..base import BaseTool, ToolContext

MAX_HISTORY = 30


class HistoryParams(BaseModel):
    """get_msg_history parameters."""

    count: Annotated[int, Field(description="How many messages (default 10, at most 30).")] = 10
    message_seq: Annotated[
        int, Field(description="Paging cursor: messages before this seq; 0 = the latest.")
    ] = 0


class FileUrlParams(BaseModel):
    """get_private_file_url parameters."""

    file_id: Annotated[str, Field(description="The file id shown in a received file message.")]


class MessageHistoryTool(BaseTool[HistoryParams]):
    """Read recent chat messages (each with its message_seq for paging back)."""

    name = "get_msg_history"
    requires: ClassVar[tuple[CallbackName, ...]] = ("get_msg_history",)

    async def execute(self, params: HistoryParams, ctx: ToolContext) -> str:
        """Ask the front end for the history."""
        if not ctx.callbacks.has("get_msg_history"):
            raise ToolError("message history is not available in this conversation")
        count = MAX_HISTORY if params.count > MAX_HISTORY else params.count
        count = 10 if count <= 0 else count
        seq = max(0, params.message_seq)
        history = await ctx.callbacks.call("get_msg_history", count, seq)
        return str(history) if history else "no messages found"


class PrivateFileUrlTool(BaseTool[FileUrlParams]):
    """Get a download URL for a file the user sent in a private chat."""

    name = "get_private_file_url"
    requires: ClassVar[tuple[CallbackName, ...]] = ("get_private_file_url",)

    async def execute(self, params: FileUrlParams, ctx: ToolContext) -> str:
        """Ask the front end for the URL."""
        if not params.file_id.strip():
            raise ToolError("file_id must not be empty")
        if not ctx.callbacks.has("get_private_file_url"):
            raise ToolError("this conversation's platform cannot give file URLs")
        url = await ctx.callbacks.call("get_private_file_url", params.file_id.strip())
        if not url:
            raise ToolError(f"no URL for file {params.file_id!r}")
        return str(url)
