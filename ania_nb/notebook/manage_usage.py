"""``%ania usage`` and ``%ania quota``: the usage panel, today's text report, quota resets.

``%ania usage [--days N] [--session S]`` shows a `UsagePanel` (the plain-text table when
ipywidgets or matplotlib is missing). ``%ania quota`` prints today's report; ``%ania quota reset
[SESSION|all]`` zeroes today's counter of a session (default: this notebook's) or of all
sessions, logged to the op log with actor ``notebook``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from IPython.core.error import UsageError

from ..errors import UsageError as AniaUsageError

if TYPE_CHECKING:  # pragma: no cover
    from .extension import NotebookState

USAGE_USAGE = "usage: %ania usage [--days N] [--session S]"
QUOTA_USAGE = "usage: %ania quota (today's usage) | %ania quota reset [SESSION|all]"
NO_PANEL = "(the usage panel needs ipywidgets and matplotlib: pip install 'ania-nb[notebook]')"


async def usage_command(state: NotebookState, args: list[str]) -> None:
    """Run ``%ania usage [--days N] [--session S]``: the panel, or the text table."""
    days, session = _usage_options(args)
    quota = state.agent().quota
    from .widgets.usage import panel_available

    if not panel_available():
        print((await quota.report(days, session)).to_text())
        print(NO_PANEL)
        return
    from IPython.display import display

    from .widgets.usage import UsagePanel

    panel = UsagePanel(quota, days=days, session=session)
    await panel.refresh()
    display(panel)


async def quota_command(state: NotebookState, args: list[str]) -> None:
    """Run ``%ania quota [reset [SESSION|all]]``."""
    quota = state.agent().quota
    if not args:
        print((await quota.report(1)).to_text())
        return
    if args[0] != "reset" or len(args) > 2:
        raise UsageError(QUOTA_USAGE)
    target = args[1] if len(args) == 2 else state.default_session
    session = None if target == "all" else target
    try:
        cleared = await quota.reset(session, actor="notebook")
    except AniaUsageError as exc:  # a malformed session name
        raise UsageError(f"{exc}\n{QUOTA_USAGE}") from None
    who = "all sessions" if session is None else session
    print(f"reset today's ({quota.today()}) quota of {who}: {cleared:,} tokens cleared")


def _usage_options(args: list[str]) -> tuple[int, str | None]:
    """``--days N`` (default 14) and ``--session S`` (default: every session)."""
    days, session = 14, None
    rest = list(args)
    while rest:
        word = rest.pop(0)
        name, eq, value = word.partition("=")
        if name not in ("--days", "--session"):
            raise UsageError(f"unknown %ania usage argument {word!r}\n{USAGE_USAGE}")
        if not eq:
            if not rest:
                raise UsageError(f"{name} needs a value\n{USAGE_USAGE}")
            value = rest.pop(0)
        if name == "--session":
            if not value.strip():
                raise UsageError(f"--session needs a session name\n{USAGE_USAGE}")
            session = value
            continue
        try:
            days = int(value)
        except ValueError:
            raise UsageError(f"--days takes a whole number, got {value!r}\n{USAGE_USAGE}") from None
        if days < 1:
            raise UsageError(f"--days must be at least 1, got {days}\n{USAGE_USAGE}")
    return days, session
