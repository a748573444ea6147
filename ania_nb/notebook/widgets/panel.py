"""`Panel`: what the clock, knowledge and usage panels share.

A panel works on the kernel's event loop: a button starts its action as a task there, and the
action's outcome — or its error, shown instead of being raised into the kernel's loop — goes to
the panel's message line. A panel may keep a slow ticker for what sends no event. `close`
cancels every task the panel started (actions, store reads, the ticker) and closes the
widgets, so a closed panel does nothing more. Each panel builds its own widgets and
``_render``.
"""

from __future__ import annotations

import asyncio
import html
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from ...errors import UsageError
from ._display import Displayable, close_tree

log = logging.getLogger(__name__)

ERROR_COLOR = "#c62828"
NOTE_COLOR = "#555"


class Panel(Displayable):
    """A live view with guarded button actions, a message line and a `close` that stops it."""

    widget: Any

    def __init__(self) -> None:
        """Set up the message line and the task bookkeeping (subclasses build ``widget``)."""
        import ipywidgets as w

        self.message = ""  # the outcome of the last action (or its error)
        self.closed = False
        self.actions: set[asyncio.Task[Any]] = set()  # button work and store reads in flight
        self.message_html = w.HTML()
        self._ticker: asyncio.Task[None] | None = None

    def _render(self) -> None:
        """Show the panel's state (a closed panel shows nothing more)."""
        raise NotImplementedError

    async def wait_actions(self) -> None:
        """Wait until every action (and store read) started so far has finished."""
        while self.actions:
            await asyncio.wait(set(self.actions))

    def close(self) -> None:
        """Cancel every task the panel started (actions, reads, ticker); close the widgets."""
        if self.closed:
            return
        self.closed = True
        for task in [*self.actions, *([self._ticker] if self._ticker is not None else [])]:
            task.cancel()
        self._ticker = None
        close_tree(self.widget)

    # ------------------------------------------------------------------ for subclasses

    def _act(self, work: Coroutine[Any, Any, str | None]) -> asyncio.Task[Any]:
        """Run a button's ``work`` as a task; its text (if any) or its error becomes the message.

        A `UsageError` (a refusal: unknown id, blank input) is shown as it reads; anything else
        with its type, and logged. The panel renders afterwards either way.
        """

        async def guarded() -> None:
            try:
                message = await work
                if message:
                    self._set_message(message)
            except UsageError as exc:
                self._set_message(f"✗ {exc}", error=True)
            except Exception as exc:  # shown, not raised into the kernel's loop
                log.exception("a %s action failed", type(self).__name__)
                self._set_message(f"✗ {type(exc).__name__}: {exc}", error=True)
            self._render()

        task = self._spawn(guarded())
        task.add_done_callback(lambda _: work.close())  # cancelled before it began: never run
        return task

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Start ``work`` as one of the panel's actions (cancelled at once if it is closed)."""
        task = asyncio.get_running_loop().create_task(work)
        if self.closed:
            task.cancel()
            return task
        self.actions.add(task)
        task.add_done_callback(self.actions.discard)
        return task

    def _start_ticker(self, tick: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        """Run ``tick()`` as the panel's ticker until it returns or the panel closes."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # built outside a loop (a script): the panel updates with each event
        self._ticker = loop.create_task(tick(), name=name)

    def _set_message(self, text: str, *, error: bool = False) -> None:
        self.message = text
        color = ERROR_COLOR if error else NOTE_COLOR
        self.message_html.value = f'<small style="color:{color}">{html.escape(text)}</small>'
