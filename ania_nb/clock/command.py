"""``/clock``: the users' command for scheduled tasks [orig §4.6], answered in plain text.

Anyone may list and add the tasks of their own chat and change, inspect or delete them; an
admin (``host.is_admin(sender)``; ``None`` is the trusted local notebook user) may also touch
other chats' tasks, list every task, see the global log and run a task at once. A non-admin's
``add`` and ``on`` are held to the chat limits (``clock.max_tasks_per_chat``,
``clock.min_interval``; see `Clock.create`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import format as fmt
from .model import ClockError, ClockTask

if TYPE_CHECKING:  # pragma: no cover
    from . import Clock

__all__ = ["ADD_USAGE", "HELP", "clock_command"]

DISABLED = "clock not enabled"
ADMIN_ONLY = "admin only"
LOCAL_USER = "user"  # creator/updater recorded for the local (notebook) user, who has no id
INFO_LOGS = 5
DEFAULT_LOGS = 10
MAX_LOGS = 100
ADD_USAGE = (
    "usage: /clock add [--once] <cron> | <title> | <content>\n"
    "e.g. /clock add 0 9 * * 1-5 | standup | remind everyone of the standup at 9:30\n"
    "     /clock add --once @every 10m | tea | tell me the tea is ready"
)
HELP = "\n".join(
    [
        "/clock — scheduled tasks of this chat:",
        "/clock list — this chat's tasks; /clock list all — every task (admin)",
        "/clock add [--once] <cron> | <title> | <content> — add a task (--once: run once)",
        "/clock del <id> — delete a task (also: delete, rm)",
        "/clock on <id> | /clock off <id> — enable or pause a task (also: enable, disable)",
        "/clock info <id> — every field of a task and its last 5 runs",
        "/clock timeout <id> <seconds> — how long a run may take (0 = the default)",
        "/clock run <id> — run a task now (admin)",
        f"/clock log [n] — the latest n runs (default {DEFAULT_LOGS})",
        "/clock help — this text",
        "Schedules: 5-field cron 'minute hour day month weekday' in local time "
        "(e.g. '*/15 * * * *'), @hourly @daily @weekly @monthly @yearly, '@every 1h30m', "
        "optionally prefixed by 'CRON_TZ=<zone> '.",
    ]
)
_ID_USAGE = {
    "del": "usage: /clock del <id>",
    "on": "usage: /clock on <id>",
    "off": "usage: /clock off <id>",
    "info": "usage: /clock info <id>",
    "run": "usage: /clock run <id>",
}
_TIMEOUT_USAGE = "usage: /clock timeout <id> <seconds> (a whole number ≥ 0; 0 = the default)"
_LOG_USAGE = f"usage: /clock log [n] (n a whole number from 1 to {MAX_LOGS})"
_ALIASES = {
    "": "list",
    "ls": "list",
    "delete": "del",
    "rm": "del",
    "enable": "on",
    "disable": "off",
    "?": "help",
}


async def clock_command(clock: Clock, session: str, args: str, sender: str | None) -> str:
    """Answer ``/clock <args>`` sent by ``sender`` in ``session``."""
    if not clock.host.config.clock.enable:
        return DISABLED
    words = args.split()
    sub = words[0].lower() if words else ""
    sub = _ALIASES.get(sub, sub)
    rest = args.strip()[len(words[0]) :].strip() if words else ""
    command = _Command(clock, session, sender)
    try:
        if sub == "list":
            return await command.list_tasks(rest)
        if sub == "add":
            return await command.add(rest)
        if sub in ("del", "on", "off", "info", "run"):
            ids = rest.split()
            if len(ids) != 1:
                return _ID_USAGE[sub]
            handler = {
                "del": command.delete,
                "on": command.on,
                "off": command.off,
                "info": command.info,
                "run": command.run,
            }[sub]
            return await handler(ids[0])
        if sub == "timeout":
            return await command.timeout(rest)
        if sub == "log":
            return await command.log(rest)
        if sub == "help":
            return HELP
    except ClockError as exc:
        return f"/clock {sub}: {exc}"
    return f"unknown sub-command {words[0]!r}; /clock help lists the commands"


class _Command:
    """One ``/clock`` request: who asked, where, and the checks on them."""

    def __init__(self, clock: Clock, session: str, sender: str | None) -> None:
        self.clock = clock
        self.session = session
        self.sender = sender
        self.admin = clock.host.is_admin(sender)
        self.who = sender if sender is not None else LOCAL_USER

    async def _task(self, task_id: str) -> ClockTask | str:
        """The task if this sender may manage it, else the reply that says why not."""
        task = await self.clock.get(task_id)
        if task is None:
            return f"no clock task with id {task_id!r}; /clock list shows this chat's tasks"
        if task.target != self.session and not self.admin:
            return (
                f"task {task.id} is not a task of this chat; only an admin may manage "
                "other chats' tasks"
            )
        return task

    async def list_tasks(self, rest: str) -> str:
        """List the chat's tasks, or (``all``, admins) every task."""
        scope = rest.lower()
        if scope == "all":
            if not self.admin:
                return ADMIN_ONLY
            return fmt.tasks_text(await self.clock.list(), "All clock tasks", "No clock tasks.")
        if scope:
            return "usage: /clock list [all]"
        return fmt.tasks_text(
            await self.clock.list(target=self.session),
            f"Clock tasks of {self.session}",
            "No clock tasks in this chat. Add one with /clock add <cron> | <title> | <content>",
        )

    async def add(self, rest: str) -> str:
        """Create a task of this chat; the sender is its creator (and who it mentions)."""
        once = False
        head = rest.split(None, 1)
        if head and head[0].lower() == "--once":
            once, rest = True, head[1] if len(head) == 2 else ""
        parts = rest.split("|", 2)
        if len(parts) != 3 or not parts[0].strip() or not parts[2].strip():
            return ADD_USAGE
        cron, title, content = (part.strip() for part in parts)
        try:
            task = await self.clock.create(
                cron=cron,
                title=title,
                content=content,
                target=self.session,
                run_once=once,
                created_by=self.sender or "",
                creator=self.who,
                limited=not self.admin,
            )
        except ClockError as exc:
            return f"Not created: {exc}"
        return fmt.created_text(task)

    async def delete(self, task_id: str) -> str:
        """Delete a task (its log stays)."""
        task = await self._task(task_id)
        if isinstance(task, str):
            return task
        return fmt.deleted_text(await self.clock.delete(task.id))

    async def _enable(self, task_id: str, enabled: bool) -> str:
        task = await self._task(task_id)
        if isinstance(task, str):
            return task
        updated = await self.clock.update(
            task.id, updater=self.who, limited=not self.admin, enabled=enabled
        )
        return fmt.updated_text(updated)

    async def on(self, task_id: str) -> str:
        """Enable a task (it is scheduled again)."""
        return await self._enable(task_id, True)

    async def off(self, task_id: str) -> str:
        """Pause a task (it keeps its settings and log)."""
        return await self._enable(task_id, False)

    async def info(self, task_id: str) -> str:
        """Every field of a task and its last runs."""
        task = await self._task(task_id)
        if isinstance(task, str):
            return task
        detail = fmt.detail_text(task, self.clock.host.config.clock.default_timeout)
        entries = await self.clock.logs(task_id=task.id, limit=INFO_LOGS)
        runs = fmt.logs_text(entries, "Latest runs", "No runs yet.")
        return f"{detail}\n\n{runs}"

    async def timeout(self, rest: str) -> str:
        """Set how long a task's run may take (0 = the default)."""
        words = rest.split()
        if len(words) != 2 or not words[1].isdecimal():
            return _TIMEOUT_USAGE
        task = await self._task(words[0])
        if isinstance(task, str):
            return task
        task = await self.clock.update(task.id, updater=self.who, timeout=int(words[1]))
        default = self.clock.host.config.clock.default_timeout
        shown = f"{task.timeout:g}s" if task.timeout > 0 else f"the default ({default:g}s)"
        return f"updated ID={task.id}, timeout={shown}"

    async def run(self, task_id: str) -> str:
        """Run a task now and wait for it (admins only); its reply goes to its chat."""
        if not self.admin:
            return ADMIN_ONLY
        task = await self._task(task_id)
        if isinstance(task, str):
            return task
        entry = await self.clock.run_now(task.id)
        if entry.status == "skipped":
            return f"task {task.id} is running already; this run was skipped\n{fmt.log_line(entry)}"
        return f"ran task ID={task.id}:\n{fmt.log_line(entry)}"

    async def log(self, rest: str) -> str:
        """The latest runs: every task's for an admin, else this chat's."""
        words = rest.split()
        if len(words) > 1 or (words and not words[0].isdecimal()):
            return _LOG_USAGE
        limit = int(words[0]) if words else DEFAULT_LOGS
        if not 1 <= limit <= MAX_LOGS:
            return _LOG_USAGE
        if self.admin:
            entries = await self.clock.logs(limit=limit)
            return fmt.logs_text(entries, "Clock runs", "No clock runs yet.")
        entries = await self.clock.logs(target=self.session, limit=limit)
        return fmt.logs_text(entries, f"Clock runs of {self.session}", "No clock runs here yet.")
