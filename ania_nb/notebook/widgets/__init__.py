"""Notebook widgets (ipywidgets 8): the live run view, todo list, run log and clock panel.

ipywidgets is imported only when a view is created, never when this package is imported.
Every view also renders as plain text (``text()`` and the text/plain of its MIME bundle), so
nbconvert output and terminals stay readable.
"""

from __future__ import annotations

from .approval import ApprovalCard
from .clock import ClockPanel
from .log import LogView
from .run import RunView
from .todo import TodoView
from .tools import ToolRow

__all__ = ["ApprovalCard", "ClockPanel", "LogView", "RunView", "TodoView", "ToolRow"]
