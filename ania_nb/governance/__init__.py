"""Governance: hooks, the tool gate, approvals, plan mode, todos, slash commands, config tools."""

from .approval import (
    ALLOW_WORDS,
    DENY_WORDS,
    ApprovalManager,
    ApprovalRefused,
    parse_verdict_word,
)
from .core import Governance, PreparedPrompt
from .hook_config import HOOK_EVENTS, ShellHook, parse_hooks
from .hooks import HookOutcome, HookResult, HookRunner, PythonHook, payload_for
from .plan import PLAN_BLOCKED_TOOLS, PLAN_NOTE, PlanMode
from .todo import TodoBook, TodoWriteTool

__all__ = [
    "ALLOW_WORDS",
    "DENY_WORDS",
    "HOOK_EVENTS",
    "PLAN_BLOCKED_TOOLS",
    "PLAN_NOTE",
    "ApprovalManager",
    "ApprovalRefused",
    "Governance",
    "HookOutcome",
    "HookResult",
    "HookRunner",
    "PlanMode",
    "PreparedPrompt",
    "PythonHook",
    "ShellHook",
    "TodoBook",
    "TodoWriteTool",
    "parse_hooks",
    "parse_verdict_word",
    "payload_for",
]
