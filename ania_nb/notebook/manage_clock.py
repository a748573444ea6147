"""``%ania clock``: the live clock panel, or any ``/clock`` sub-command as plain text.

``%ania clock`` shows a `ClockPanel` of every task (the notebook user is the clock's admin);
``%ania clock list``, ``log``, ``add …``, ``del …`` and the rest answer like ``/clock …`` sent
by the local user in this notebook's session.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from IPython.core.error import UsageError

from ..errors import UsageError as AniaUsageError

if TYPE_CHECKING:  # pragma: no cover
    from .extension import NotebookState

USAGE = (
    "usage: %ania clock [--session] (the live panel; --session: this notebook's tasks only) | "
    "%ania clock list [all] | log [N] | add [--once] CRON | TITLE | CONTENT | "
    "on|off|del|info|run ID | timeout ID SECONDS | help   (the /clock commands)"
)


async def clock_command(state: NotebookState, line: str) -> None:
    """Run ``%ania clock <line>``: show the panel, or print what ``/clock <line>`` answers.

    ``line`` is taken verbatim (quotes and apostrophes in a task's content stay as typed).
    The panel shown last is ``ClockPanel.open_panels()[-1]`` (not returned: the cell would
    display it twice).
    """
    agent = await state.agent().start()  # starting the Agent starts its clock
    session = state.default_session
    if line in ("", "--session"):
        from IPython.display import display

        from .widgets.clock import ClockPanel

        panel = ClockPanel(agent, target=session if line else None)
        await panel.refresh()
        display(panel)
        return
    if line in ("-h", "--help"):
        raise UsageError(USAGE)
    try:
        # None = the trusted local (notebook) user: admin rules let it do everything.
        print(as_magic(await agent.clock.command(session, line, None)))
    except AniaUsageError as exc:
        raise UsageError(as_magic(str(exc))) from None


_CHAT_COMMAND = re.compile(r"(?<![\w/%])/clock\b")


def as_magic(text: str) -> str:
    """``/clock …`` in an answer as this front end's spelling, ``%ania clock …``.

    The answers are the chat command's; a task's own text quoting ``/clock`` (rare) is
    shown rewritten too, which only changes how it reads here.
    """
    return _CHAT_COMMAND.sub("%ania clock", text)
