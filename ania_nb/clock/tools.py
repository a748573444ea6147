"""The model's clock tools: clock_create/list/get/update/delete/log, bound to one session.

Ownership [orig §4.5]: the tools only see and touch tasks whose target is the session they
were made for — there is no admin exemption, because the model acts for whoever is chatting. A
``target`` argument may only name that session (empty = it). A task's runs get the role of its
creator (``created_by``; empty: the local user, an admin), so a run may neither create a task
for, nor change a task of, someone whose role outranks its own. Messages are the shared texts of
`ania_nb.clock.format`, so the same task always reads the same.

Who a task's deliveries mention (``created_by``) is never the model's to say: it is the real
sender of the run that creates the task (``ToolContext.sender``; nobody in a notebook or a
one-shot run). The chat limits (``clock.max_tasks_per_chat``, ``clock.min_interval``) apply
unless every person the run answers is an admin (see `limited`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, Field

from ania_nb.errors import ToolError
from ania_nb.governance.roles import rank
from ania_nb.tools.base import BaseTool, Tool, ToolContext

from . import format as fmt
from .model import ClockError, ClockTask, DuplicateTaskError

if TYPE_CHECKING:  # pragma: no cover
    from . import Clock

__all__ = ["OWNERSHIP_ERROR", "clock_tools", "creator_of", "limited"]

OWNERSHIP_ERROR = "can only operate tasks of the current session"
CREATOR = "ai"
MAX_LOG_LIMIT = 50

_CRON_HELP = (
    "Schedule: 5-field cron 'minute hour day-of-month month day-of-week' in local time "
    "(e.g. '0 9 * * 1-5', '*/15 * * * *'), a descriptor (@hourly @daily @midnight @weekly "
    "@monthly @yearly @annually), '@every <duration>' (e.g. '@every 90s', '@every 1h30m'), "
    "optionally prefixed by 'CRON_TZ=<zone> '."
)
_TARGET = "Session key of the task's target; only the current session is allowed (empty = it)."


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """The clock's refusals (bad schedule, blank content, unknown id) as tool errors."""
    try:
        yield
    except ClockError as exc:
        raise ToolError(str(exc)) from None


class _SessionTool:
    """What every clock tool shares: its clock, its session, the ownership checks."""

    description: str

    def __init__(self, clock: Clock, session: str) -> None:
        """Bind the tool to ``clock`` and to ``session``'s tasks."""
        self.clock = clock
        self.session = session
        # The same bytes in every session (prompt caching): the scope is the chat the call is
        # made in, which the tool knows at call time; results name it.
        self.description = f"{type(self).description} Scope: the tasks of the current chat only."

    def _target(self, target: str | None) -> str:
        wanted = (target or "").strip()
        if wanted and wanted != self.session:
            raise ToolError(
                f"{OWNERSHIP_ERROR} ({self.session}); target {wanted!r} is another session"
            )
        return self.session

    def _authority(self, created_by: str, ctx: ToolContext) -> None:
        """Refuse a creator whose role outranks this run: the task's runs get that role."""
        role = self.clock.host.role_of(self.session, created_by or None)
        if rank(role) <= rank(ctx.role):
            return
        who = repr(created_by) if created_by else "nobody (its runs act as the local user)"
        raise ToolError(
            f"a task's runs get the role of its creator, and its creator {who} has the {role} "
            f"role in this chat, more than this request's {ctx.role} role; ask an admin to "
            "create or change this task"
        )

    async def _task(self, task_id: str) -> ClockTask:
        with _refusals():
            task = await self.clock.get(task_id.strip())
        if task is None:
            raise ToolError(
                f"no clock task with id {task_id.strip()!r}; clock_list shows this session's tasks"
            )
        if task.target != self.session:
            raise ToolError(
                f"{OWNERSHIP_ERROR} ({self.session}); task {task.id} is not one of them"
            )
        return task


def limited(clock: Clock, ctx: ToolContext) -> bool:
    """Whether the chat limits apply to this call: unless every requester is an admin.

    A one-shot run (a clock run, a subagent) has nobody standing behind it, so it is limited
    even though its sender is None (which elsewhere means the trusted notebook user).
    """
    if ctx.admin_only_approval:
        return True
    askers = ctx.requesters or (ctx.sender,)
    return not all(clock.host.is_admin(who) for who in askers)


def creator_of(ctx: ToolContext) -> str:
    """Whom the task's deliveries mention: the run's real sender, never a model argument."""
    return "" if ctx.admin_only_approval else ctx.sender or ""


# ------------------------------------------------------------------ clock_create


class ClockCreateParams(BaseModel):
    """Parameters of clock_create."""

    cron: str = Field("", description="For a repeating task. " + _CRON_HELP)
    after: str = Field(
        "",
        description="For a one-time task ('in 10 minutes', 'in 2 hours'): the delay until it "
        "runs, e.g. '10m', '2h', '1h30m'; give this instead of cron (the task runs once).",
    )
    title: str = Field(description="A short title (shown in lists and in the trigger).")
    content: str = Field(
        description="What the agent should do when the task fires (must not be blank)."
    )
    target: str = Field("", description=_TARGET)
    run_once: bool = Field(False, description="Run once, then delete the task (after its run).")
    timeout_sec: float = Field(
        0, description="Seconds a run may take (0 = the default; at most 1800)."
    )
    note: str = Field("", description="An extra note given to the agent with the content.")


class ClockCreateTool(_SessionTool, BaseTool[ClockCreateParams]):
    """Create a scheduled task."""

    description = (
        "Create a scheduled task: at each fire time an agent gets the content, and its final "
        "reply is delivered to this chat. Call it once per task; a one-time reminder takes "
        "'after', a repeating task 'cron'."
    )

    name = "clock_create"
    side_effects = True

    async def execute(self, params: ClockCreateParams, ctx: ToolContext) -> str:
        """Create the task (enabled, creator ai, mentioning the run's sender) and report it."""
        target = self._target(params.target)
        cron, run_once = _schedule(params)
        created_by = creator_of(ctx)
        self._authority(created_by, ctx)
        # Reserved before the await: parallel calls of one round must not all pass the cap.
        reserved = _reserve_for_clock_run(ctx, self.clock.host.config.clock.max_tasks_per_run)
        created = False
        try:
            with _refusals():
                try:
                    task = await self.clock.create(
                        cron=cron,
                        title=params.title,
                        content=params.content,
                        target=target,
                        run_once=run_once,
                        timeout=params.timeout_sec,
                        created_by=created_by,
                        creator=CREATOR,
                        note=params.note,
                        limited=limited(self.clock, ctx),
                    )
                except DuplicateTaskError as same:  # asked twice for one thing: it exists
                    return fmt.existing_text(same.task)
            created = True
        finally:
            if reserved and not created:
                ctx.run_state[CREATED_BY_RUN] -= 1
        return fmt.created_text(task)


CREATED_BY_RUN = "clock_tasks_created"  # run_state key: tasks this clock run created


def _schedule(params: ClockCreateParams) -> tuple[str, bool]:
    """The schedule and run-once flag: ``after`` is a one-time delay, else ``cron``."""
    after, cron = params.after.strip(), params.cron.strip()
    if after and cron:
        raise ToolError("give either cron (a repeating task) or after (a one-time task), not both")
    if after:
        return f"@every {after}", True  # fires once, ``after`` from now, then is deleted
    if not cron:
        raise ToolError(
            "give cron for a repeating task (e.g. '0 9 * * *') or after for a one-time task "
            "(e.g. '10m')"
        )
    return cron, params.run_once


def _reserve_for_clock_run(ctx: ToolContext, cap: int) -> bool:
    """Count one more task created by this clock run (False outside one); refused at ``cap``.

    A run a task fires gets the clock tools too: if it could create tasks freely, a task
    whose content says "remind me" would multiply with every run.
    """
    if ctx.agent_kind != "clock":
        return False
    made = int(ctx.run_state.get(CREATED_BY_RUN, 0))
    if made >= cap:
        raise ToolError(
            f"a clock run may create at most {cap} clock task(s) "
            f"(clock.max_tasks_per_run = {cap}); this run is the scheduled task itself, so do "
            "what its content asks now instead of scheduling it again"
        )
    ctx.run_state[CREATED_BY_RUN] = made + 1
    return True


# ------------------------------------------------------------------ clock_list


class ClockListParams(BaseModel):
    """Parameters of clock_list."""

    target: str = Field("", description=_TARGET)


class ClockListTool(_SessionTool, BaseTool[ClockListParams]):
    """List the scheduled tasks (one line each: state, ID, title, mode, schedule)."""

    name = "clock_list"

    async def execute(self, params: ClockListParams, ctx: ToolContext) -> str:
        """One line per task of this session, in creation order."""
        target = self._target(params.target)
        with _refusals():
            tasks = await self.clock.list(target=target)
        return fmt.tasks_text(
            tasks, f"Clock tasks of {target}", f"No clock tasks for {target} yet."
        )


# ------------------------------------------------------------------ clock_get / delete


class ClockIdParams(BaseModel):
    """Parameters of clock_get and clock_delete."""

    id: str = Field(description="The task's ID (as clock_list shows it).")


class ClockGetTool(_SessionTool, BaseTool[ClockIdParams]):
    """Show every field of a scheduled task."""

    name = "clock_get"

    async def execute(self, params: ClockIdParams, ctx: ToolContext) -> str:
        """The task's detail."""
        task = await self._task(params.id)
        return fmt.detail_text(task, self.clock.host.config.clock.default_timeout)


class ClockDeleteTool(_SessionTool, BaseTool[ClockIdParams]):
    """Delete a scheduled task (its log stays)."""

    name = "clock_delete"
    side_effects = True

    async def execute(self, params: ClockIdParams, ctx: ToolContext) -> str:
        """Delete the task if it is this session's."""
        task = await self._task(params.id)
        with _refusals():
            gone = await self.clock.delete(task.id)
        return fmt.deleted_text(gone)


# ------------------------------------------------------------------ clock_update


class ClockUpdateParams(BaseModel):
    """Parameters of clock_update: only the fields given change."""

    id: str = Field(description="The task's ID (as clock_list shows it).")
    cron: str | None = Field(None, description="New schedule. " + _CRON_HELP)
    title: str | None = Field(None, description="New title.")
    content: str | None = Field(None, description="New content (must not be blank).")
    target: str | None = Field(None, description=_TARGET)
    note: str | None = Field(None, description="New note (empty clears it).")
    enabled: bool | None = Field(None, description="Enable (true) or pause (false) the task.")
    run_once: bool | None = Field(None, description="Run once, then delete the task.")
    timeout_sec: Annotated[
        float | None, Field(description="Seconds a run may take (0 = the default; ≤1800).")
    ] = None


class ClockUpdateTool(_SessionTool, BaseTool[ClockUpdateParams]):
    """Change a scheduled task; only the fields given change."""

    name = "clock_update"
    side_effects = True

    async def execute(self, params: ClockUpdateParams, ctx: ToolContext) -> str:
        """Apply the given fields (updater ai) and report the task's state."""
        task = await self._task(params.id)
        self._authority(task.created_by, ctx)  # its runs act with its creator's role
        given = params.model_dump(exclude_none=True, exclude={"id", "timeout_sec"})
        if "target" in given:
            given["target"] = self._target(given["target"])
        if params.timeout_sec is not None:
            given["timeout"] = params.timeout_sec
        if not given:
            raise ToolError(
                "nothing to change: give at least one of cron, title, content, note, "
                "enabled, run_once, timeout_sec"
            )
        with _refusals():
            updated = await self.clock.update(
                task.id, updater=CREATOR, limited=limited(self.clock, ctx), **given
            )
        return fmt.updated_text(updated)


# ------------------------------------------------------------------ clock_log


class ClockLogParams(BaseModel):
    """Parameters of clock_log."""

    task_id: str = Field("", description="Only this task's runs (empty = every task here).")
    limit: int = Field(10, ge=1, le=MAX_LOG_LIMIT, description="How many runs, newest first.")


class ClockLogTool(_SessionTool, BaseTool[ClockLogParams]):
    """Show the latest runs of scheduled tasks (status, duration, tokens, error)."""

    name = "clock_log"

    async def execute(self, params: ClockLogParams, ctx: ToolContext) -> str:
        """Log lines of this session's tasks, newest first."""
        task_id = params.task_id.strip() or None
        if task_id is not None:
            with _refusals():
                task = await self.clock.get(task_id)
            if task is not None and task.target != self.session:
                raise ToolError(
                    f"{OWNERSHIP_ERROR} ({self.session}); task {task.id} is not one of them"
                )
        with _refusals():
            entries = await self.clock.logs(
                task_id=task_id, target=self.session, limit=params.limit
            )
        what = f"task {task_id}" if task_id else self.session
        return fmt.logs_text(entries, f"Clock runs of {what}", f"No clock runs of {what} yet.")


def clock_tools(clock: Clock, session: str) -> list[Tool]:
    """The six clock tools bound to ``session`` (its tasks only)."""
    kinds: list[type[_SessionTool]] = [
        ClockCreateTool,
        ClockListTool,
        ClockGetTool,
        ClockUpdateTool,
        ClockDeleteTool,
        ClockLogTool,
    ]
    return [kind(clock, session) for kind in kinds]  # type: ignore[misc]
