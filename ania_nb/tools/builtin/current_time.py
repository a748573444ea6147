"""`time`: the current local time with its UTC offset."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from ..base import BaseTool, ToolContext


class NoParams(BaseModel):
    """A tool without parameters."""


class TimeTool(BaseTool[NoParams]):
    """Get the current date and time (ISO 8601 with the local UTC offset and weekday)."""

    name = "time"

    def execute(self, params: NoParams, ctx: ToolContext) -> str:
        """Read the clock."""
        now = datetime.now().astimezone()
        return f"current time is: {now.isoformat(timespec='seconds')} ({now:%A})"
