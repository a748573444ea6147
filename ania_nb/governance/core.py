"""`Governance`: the hooks, gate, plan mode, todos, slash commands and config tools of an Agent.

The Agent calls it at fixed points of a run, which is where the hook events fire:

- SessionStart: the first turn of a session in this process; its context is put before the
  next user turn once (a block or ``continue: false`` is not honoured).
- UserPromptSubmit: every turn, with the user's text; a block or ``continue: false`` ends the
  run (status ``error``, the reason in ``RunResult.error``; the message is not added to the
  history); its context leads the prompt.
- PreToolUse: in the tool gate (deny/ask/allow, see `ToolGate`); its context is appended to the
  call's result. PostToolUse: after a call that actually ran; its context and a block's reason
  are appended to the result. ``continue: false`` at either ends the run (status ``error``,
  ``"stopped by a PreToolUse hook: <reason>"``).
- Stop: after a successful run, with the reply. PreCompact: before the history is compacted.
- SubagentStop: after every subagent or team-member run (with its status). Blocks and stops of
  these three are not honoured (the run already ended; nothing is compacted differently).

The prompt the model gets is, outermost first: UserPromptSubmit context, plan-mode note, todo
reminder, SessionStart context, auto-injected knowledge, the user's text. Only the user's text
is stored in the history.
"""

from __future__ import annotations

import contextvars
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..catalogue import Language, language_for
from ..text import cut
from .commands import CommandBook, parse_commands
from .config_tools import ConfigCenter, ConfigFile
from .gate import ToolGate
from .hook_config import parse_hooks
from .hooks import PRE_TOOL_OUTCOME, HookOutcome, HookRunner, payload_for, stop_run
from .plan import NAMESPACE as PLAN_NAMESPACE
from .plan import PLAN_NOTE, PlanMode
from .roles import Roles
from .slash import SlashCommands
from .todo import TodoBook, TodoWriteTool

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable

    from ..config import Config
    from ..engine.loop import ToolCallResult
    from ..engine.messages import Message
    from ..result import RunResult
    from ..store import Store
    from ..tools import Tool, ToolContext, ToolExecutor
    from .approval import ApprovalManager

MAX_STOP_PROMPT = 1000

# The session whose run is in progress (each run is its own task, so each sees its own value).
_running_session: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "ania_running_session", default=None
)


@dataclass(frozen=True)
class PreparedPrompt:
    """A prepared user turn: the prompt for the model, or why a hook refused it."""

    prompt: str
    blocked: str | None = None


class Governance:
    """Everything that decides what the model may see and do, for one Agent."""

    def __init__(
        self,
        config: Config,
        tools: ToolExecutor,
        approvals: ApprovalManager,
        *,
        stop: Callable[[str], bool],
        previous: Governance | None = None,
    ) -> None:
        """Build for ``config``.

        ``previous`` (the same Agent's, before its settings changed) hands over plan mode,
        todos, Python hooks and which sessions have started.
        """
        self.config = config
        self.admins = frozenset(config.admin.ids)
        self.hooks = HookRunner(config.hooks, config.security)
        self.plan: PlanMode = previous.plan if previous else PlanMode()
        self.todos: TodoBook = previous.todos if previous else TodoBook()
        if previous is not None:
            self.hooks.adopt_python_hooks(previous.hooks)
            if previous.center is not None and not config.config_tool.enable:
                for tool in previous.center.tools():
                    tools.remove(tool.name)
        self.approvals = approvals
        self.roles = Roles(config.roles, config.admin.ids)
        self.gate = ToolGate(
            plan=self.plan,
            hooks=self.hooks,
            approvals=approvals,
            approval=config.approval,
            roles=self.roles,
            language=self.language,
        )
        book = CommandBook(config.commands.file) if config.commands.enable else None
        self.commands = book
        self.slash = SlashCommands(
            plan=self.plan,
            book=book,
            is_admin=self.is_admin,
            stop=stop,
            roles=self.roles,
            language=self.language,
        )
        self.center: ConfigCenter | None = None
        if config.config_tool.enable:
            self.center = ConfigCenter(config, self._config_files(book))
            for tool in self.center.tools():
                tools.add(tool, replace=True)
        self._started: set[str] = previous._started if previous else set()
        # SessionStart context for the next turn
        self._session_context: dict[str, str] = previous._session_context if previous else {}

    def language(self, session: str) -> Language:
        """The language ``session``'s front end shows people (``ui.language``, else its own)."""
        return language_for(self.config.ui.language, session)

    def is_admin(self, who: str | None) -> bool:
        """Admins are the configured ids; None is the trusted local user (a notebook)."""
        return who is None or who in self.admins

    def attach(self, store: Store) -> None:
        """Bind the parts that persist to the opened store."""
        self.todos.kv = store.kv("todos")
        self.plan.kv = store.kv(PLAN_NAMESPACE)
        self.approvals.oplog = store.oplog
        self.approvals.store = store.approvals
        if self.center is not None:
            self.center.store = store

    def session_tools(self, session: str) -> list[Tool]:
        """Tools every main session gets of its own (todo_write, a built-in)."""
        wanted = self.config.todo.enable and self.config.agent.builtin_tools
        return [TodoWriteTool(self.todos, session)] if wanted else []

    # ------------------------------------------------------------------ events

    async def before_turn(
        self, session: str, text: str, *, plan: bool = False, context: str = ""
    ) -> PreparedPrompt:
        """Fire SessionStart (once) and UserPromptSubmit; assemble the prompt.

        ``context`` (auto-injected knowledge) goes right before the user's text.
        """
        _running_session.set(session)
        if session not in self._started:
            self._started.add(session)
            started = await self.hooks.run("SessionStart", payload_for("SessionStart", session))
            if started.context:
                self._session_context[session] = started.context
        submitted = await self.hooks.run(
            "UserPromptSubmit", payload_for("UserPromptSubmit", session, prompt=text)
        )
        if submitted.blocked or submitted.stopped:
            reason = submitted.reason if submitted.blocked else submitted.stop_reason
            return PreparedPrompt(text, blocked=reason)
        await self.plan.load(session)
        parts = [
            submitted.context,
            PLAN_NOTE if plan or self.plan.is_on(session) else "",
            await self.todos.reminder(session) if self.config.todo.enable else "",
            self._session_context.pop(session, ""),
            context,
            text,
        ]
        return PreparedPrompt("\n\n".join(p for p in parts if p))

    async def after_tool(self, result: ToolCallResult, ctx: ToolContext) -> None:
        """PostToolUse for calls that ran; the hooks' context joins the call's result.

        PreToolUse and PostToolUse context (and a PostToolUse block's reason, the hook's
        feedback) is appended to the result the model sees. A ``continue: false`` of either
        event ends the run with `RunError` (the run's other calls are cancelled).
        """
        pre = ctx.extras.pop(PRE_TOOL_OUTCOME, None)
        if isinstance(pre, HookOutcome):
            if pre.context:
                result.result += f"\n\n[PreToolUse hook context]\n{pre.context}"
            if pre.stopped:
                raise stop_run(ctx, "PreToolUse", pre.stop_reason)
        if result.blocked:
            return
        payload = payload_for(
            "PostToolUse",
            ctx.session,
            ctx.agent_kind,
            tool_name=result.name,
            tool_input=result.arguments,
            tool_result=result.result,
        )
        post = await self.hooks.run("PostToolUse", payload)
        if post.context:
            result.result += f"\n\n[PostToolUse hook context]\n{post.context}"
        if post.blocked:  # the call already ran: the reason is feedback for the model
            result.result += f"\n\n[PostToolUse hook feedback]\n{post.reason}"
        if post.stopped:
            raise stop_run(ctx, "PostToolUse", post.stop_reason)

    async def after_run(self, kind: str, session: str, result: RunResult, task: str = "") -> None:
        """Fire Stop or SubagentStop for a finished run.

        Stop follows a successful main or clock run, with the reply; SubagentStop every
        subagent or team-member run, whatever its outcome, with the task (``prompt``), the
        reply (``reply``) and the status.
        """
        prompt = cut(result.text or result.error or "", MAX_STOP_PROMPT)
        if kind in ("subagent", "team_member"):
            payload = payload_for("SubagentStop", session, kind, prompt=cut(task, MAX_STOP_PROMPT))
            payload["status"] = result.status
            payload["reply"] = prompt
            await self.hooks.run("SubagentStop", payload)
        elif result.ok:
            await self.hooks.run("Stop", payload_for("Stop", session, kind, prompt=prompt))

    async def pre_compact(self, history: list[Message]) -> None:
        """PreCompact, before the running session's history is compacted."""
        session = _running_session.get() or ""
        await self.hooks.run("PreCompact", payload_for("PreCompact", session))

    # ------------------------------------------------------------------ files

    def _config_files(self, book: CommandBook | None) -> list[ConfigFile]:
        config = self.config
        reload = "It takes effect within seconds"

        def check(parse: Callable[[Any], object]) -> Callable[[str], object]:
            return lambda text: parse(json.loads(text))

        return [
            ConfigFile(
                "mcp",
                config.mcp.config_file,
                'MCP servers: {"mcpServers": {"<name>": {"command": …, "args": […]}}} or '
                '{"servers": [...]}',
                "It takes effect after a restart",
            ),
            ConfigFile(
                "hooks",
                config.hooks.file,
                '{"hooks": {"<Event>": [{"matcher": "<tool regex>", "command": "<shell>", '
                '"timeout_sec": 10}]}}',
                reload if config.hooks.enable else "Hooks are off (hooks.enable)",
                check(parse_hooks),
                self.hooks.file.invalidate,
            ),
            ConfigFile(
                "commands",
                config.commands.file,
                '{"commands": {"<name>": "<prompt template, $args = the arguments>"}}',
                reload if book is not None else "Commands are off (commands.enable)",
                check(parse_commands),
                book.file.invalidate if book is not None else None,
            ),
        ]
