"""`file`: send a local file to the user through the front end."""

from __future__ import annotations

import base64
from pathlib import PurePath
from typing import Annotated, ClassVar

from pydantic import BaseModel, Field

from ...engine.callbacks import CallbackName
from ...errors import ToolError
from ..base import BaseTool, ToolContext
from ._paths import FileGuard


class FileParams(BaseModel):
    """file parameters."""

    name: Annotated[str, Field(description="File name to show the user, with extension.")]
    path: Annotated[str, Field(description="Path of the local file to send.")]


class SendFileTool(BaseTool[FileParams]):
    """Send a local file to the user."""

    name = "file"
    requires: ClassVar[tuple[CallbackName, ...]] = ("send_file",)
    side_effects = True

    def __init__(self, guard: FileGuard) -> None:
        self.guard = guard
        self.description = (
            f"Send a local file to the user (at most {guard.max_bytes} bytes). Only files in the "
            "allowed folders (file.roots, default the working directory); system files, the "
            "agent's data directory and files holding secrets are refused. May need the user's "
            "approval."
        )

    async def execute(self, params: FileParams, ctx: ToolContext) -> str:
        """Read the file and hand it to the front end."""
        display = PurePath(params.name.strip().replace("\\", "/")).name
        if not display or display in {".", ".."}:
            raise ToolError(f"name must be a file name such as report.csv, got {params.name!r}")
        if not ctx.callbacks.has("send_file"):
            raise ToolError("this conversation cannot receive files, so nothing was sent")
        path, data = await self.guard.read(params.path)
        await ctx.callbacks.call("send_file", display, base64.b64encode(data).decode("ascii"))
        return f"sent {display} ({len(data)} bytes from {path}) to the user"
