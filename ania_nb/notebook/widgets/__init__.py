"""Notebook widgets (ipywidgets 8): run view, todo, run log and record, clock, knowledge, usage.

ipywidgets is imported only when a view is created, never when this package is imported.
Every view also renders as plain text (``text()`` and the text/plain of its MIME bundle), so
nbconvert output and terminals stay readable.
"""

from __future__ import annotations

from .approval import ApprovalCard
from .clock import ClockPanel
from .knowledge import KbPanel, MemoryList
from .log import LogView
from .record import RecordView, record_view
from .run import RunView
from .todo import TodoView
from .tools import ToolRow
from .usage import UsagePanel

__all__ = [
    "ApprovalCard",
    "ClockPanel",
    "KbPanel",
    "LogView",
    "MemoryList",
    "RecordView",
    "RunView",
    "TodoView",
    "ToolRow",
    "UsagePanel",
    "record_view",
]
