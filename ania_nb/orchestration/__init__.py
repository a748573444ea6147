"""Orchestration: how agent runs are described, started and executed.

Every run — a main chat turn, a clock run, a subagent, a team member — is a `RunSpec` executed by
`execute_run` (the one run path: loop, gate, hooks, compaction, persistence). The `Agent`
façade builds main-turn specs from its session queues (`answer_batch`); the clock and the
agents packages build the other kinds as `OneShotJob`s, run through the Agent's `AgentHost`
(``agent.host``). This layer sits above the engine, the capabilities
(tools, MCP, skills) and governance, and below the front ends; it never imports them.
"""

from .checkpoint import ApprovalSuspension, Resumption, RunCheckpoint
from .host import AgentHost
from .main_turn import ContextSource, TurnContext, answer_batch, answer_resumed
from .oneshot import HIDDEN_BY_KIND, SUBAGENT_TOOLS, TEAM_TOOLS, OneShotJob, OneShotKind
from .outbox import Delivery, Outbox
from .queues import SessionQueues
from .records import RunRecorder, StoreRecord
from .run import RunLimits, RunServices, execute_run
from .runtime import Runtime
from .sessions import Pending, Session, SessionTable, merge_batch, senders_of
from .settings import SHORTCUTS, resolve_config
from .spec import ONE_SHOT_KINDS, AgentKind, Conversation, RunSpec, callbacks_for
from .tool_view import ToolView

__all__ = [
    "HIDDEN_BY_KIND",
    "ONE_SHOT_KINDS",
    "SHORTCUTS",
    "SUBAGENT_TOOLS",
    "TEAM_TOOLS",
    "AgentHost",
    "AgentKind",
    "ApprovalSuspension",
    "ContextSource",
    "Conversation",
    "Delivery",
    "OneShotJob",
    "OneShotKind",
    "Outbox",
    "Pending",
    "Resumption",
    "RunCheckpoint",
    "RunLimits",
    "RunRecorder",
    "RunServices",
    "RunSpec",
    "Runtime",
    "Session",
    "SessionQueues",
    "SessionTable",
    "StoreRecord",
    "ToolView",
    "TurnContext",
    "answer_batch",
    "answer_resumed",
    "callbacks_for",
    "execute_run",
    "merge_batch",
    "resolve_config",
    "senders_of",
]
