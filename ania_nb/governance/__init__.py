"""Governance: approvals (and, next, hooks, the tool gate, plan mode, todos, slash commands)."""

from .approval import ALLOW_WORDS, DENY_WORDS, ApprovalManager, parse_verdict_word

__all__ = ["ALLOW_WORDS", "DENY_WORDS", "ApprovalManager", "parse_verdict_word"]
