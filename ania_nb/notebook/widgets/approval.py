"""`ApprovalCard`: a tool waiting for the user, with Allow / Deny / allow-for-this-session.

The card shows the complete call: the tool's one-line summary, then every argument — code as a
highlighted, scrollable block with line numbers when long — the same way for every tool. When
the run view knows the call (its tool row), the arguments come from it; otherwise the gate's
approval text is shown as it is. A click answers through `Agent.answer_approval`, the same path
as a chat reply; the card then shows the verdict and disables its buttons. The manager's
``approval_resolved`` event (answer, timeout, stop) settles the card with the final reason, and
``waited`` is how long the question was open (shown apart from the tool's own duration).
"""

from __future__ import annotations

import asyncio
import html
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from ..._preview import reveal
from ...errors import UsageError
from ...governance.approval import SESSION_ALLOWED
from ...text import flatten
from ._code import arguments_html, expected_details, parse_arguments
from ._format import elapsed_text, pre
from ._icons import color_of, icon

if TYPE_CHECKING:  # pragma: no cover
    from ...agent import Agent
    from ...engine.callbacks import ApprovalRequest
    from .tools import ToolRow

VERDICTS = {
    "pending": "waiting for your answer",
    "allowed": "allowed",
    "denied": "denied",
    "timeout": "timed out",
    "stopped": "stopped",
    "suspended": "suspended: asked again after a restart",
    "error": "not answered",
}
GLYPHS = {
    "pending": "⚠",
    "allowed": "✓",
    "denied": "✗",
    "timeout": "◷",
    "stopped": "■",
    "suspended": "■",
}
HEADINGS = {  # the card's title: the question while it is open, then how it ended
    "pending": "Approval needed",
    "allowed": "Allowed",
    "denied": "Denied",
    "timeout": "Not answered in time: denied",
    "stopped": "Stopped",
    "suspended": "Suspended",
    "error": "Not answered",
}
USER_REASONS = {True: "approved by the user", False: "denied by the user"}
COLORS = {
    "pending": "#e0a800",
    "allowed": "#2e7d32",
    "timeout": "#757575",
    "stopped": "#757575",
    "suspended": "#757575",
}


class ApprovalCard:
    """The question for one `ApprovalRequest`; ``state`` is pending until it is resolved.

    ``arguments`` is the call's raw JSON when the caller knows it (then shown field by field,
    code highlighted; ``order`` and ``shell_keys`` as in the gate's approval text).
    """

    def __init__(
        self,
        agent: Agent,
        request: ApprovalRequest,
        arguments: str | None = None,
        *,
        order: Sequence[str] = (),
        shell_keys: Sequence[str] = (),
    ) -> None:
        import ipywidgets as w

        self.agent = agent
        self.request = request
        self.arguments = arguments
        self.state = "pending"
        self.reason = ""
        self._answering = False
        self._asked = time.monotonic()
        self.waited: float | None = None  # seconds until the answer (or timeout, stop)
        try:  # the agent's loop: a click from another thread must answer on it
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        timeout = getattr(getattr(agent, "approvals", None), "timeout", None)
        # When an unanswered question denies itself (the gate's timeout, from now).
        self.deadline = time.time() + timeout if isinstance(timeout, int | float) else None
        self.heading = w.HTML(self._heading_html())
        self.summary = w.HTML(self._summary_html())
        # The whole call, never cut: a scrollable block (the model may pad arguments).
        self.details = w.HTML(self.call_html())
        self.allow_button = w.Button(description="Allow", button_style="success", icon="check")
        self.deny_button = w.Button(description="Deny", button_style="danger", icon="times")
        self.session_button = w.Button(
            description=f"Allow {request.tool_label} for the rest of this session",
            layout=w.Layout(width="auto"),
        )
        self.allow_button.on_click(lambda _: self.answer(True))
        self.deny_button.on_click(lambda _: self.answer(False))
        self.session_button.on_click(lambda _: self.answer(True, for_session=True))
        self.buttons = w.HBox([self.allow_button, self.deny_button, self.session_button])
        self.verdict = w.HTML(self._verdict_html())
        self.widget = w.VBox(
            [self.heading, self.summary, self.details, self.buttons, self.verdict],
            layout=w.Layout(border=f"2px solid {COLORS['pending']}", padding="4px", margin="4px 0"),
        )
        self.widget.add_class("ania-approval")

    def _heading_html(self) -> str:
        """``⚠ Approval needed: tool (asked by …)`` while open, then how it ended."""
        request = self.request
        askers = request.requesters or ((request.requester,) if request.requester else ())
        who = f" (asked by {', '.join(askers)})" if askers else ""
        state = "waiting" if self.state == "pending" else self.state
        mark = icon("warning", label="approval") if self.state == "pending" else icon(state)
        # Escaped twice over: hidden characters made visible (reveal), then HTML-escaped.
        return (
            f"{mark} <b>{HEADINGS.get(self.state, HEADINGS['error'])}</b>: "
            f"<code>{html.escape(request.tool_label)}</code>{html.escape(reveal(who))}"
        )

    def _summary_html(self) -> str:
        """The tool's one-line summary, unless it only restates the arguments shown below."""
        summary = self.request.summary
        parsed = parse_arguments(self.arguments) if self.arguments is not None else None
        if parsed is not None and summary.lstrip().startswith("{"):
            return ""  # the tool has no summary of its own: this is the arguments' JSON
        for value in (parsed or {}).values():
            if isinstance(value, str) and "\n" in value.strip():
                start = " ".join(value.split())[:30]
                if start and start in " ".join(summary.split()):
                    return ""  # the flattened code again: the block below says it better
        return f"<div>{html.escape(self.request.headline)}</div>" if summary else ""

    def call_html(self) -> str:
        """The complete call: every argument (code highlighted), or the gate's text as is."""
        if self.arguments is not None:
            order, shell = tool_layout(self.agent, self.request.tool)
            return arguments_html(self.request.tool, self.arguments, order=order, shell_keys=shell)
        if not self.request.details:
            return ""
        return '<div style="max-height:24em;overflow:auto">' + pre(self.request.details) + "</div>"

    def html(self) -> str:
        """The card as static HTML: its buttons shown disabled (they answer nothing there)."""
        color = COLORS.get(self.state, "#c62828")
        style = "margin:2px 4px 2px 0;padding:2px 10px;border:1px solid #bbb;border-radius:2px"
        buttons = "".join(
            f'<button disabled style="{style}">{html.escape(b.description)}</button>'
            for b in (self.allow_button, self.deny_button, self.session_button)
        )
        return (
            f'<div class="ania-approval" style="border:2px solid {color};padding:4px;margin:4px 0">'
            f"{self.heading.value}{self.summary.value}{self.details.value}<div>{buttons}</div>"
            f"{self._verdict_html()}</div>"
        )

    @property
    def disabled(self) -> bool:
        """Whether the buttons are disabled (the question is no longer open)."""
        return self.allow_button.disabled

    def answer(self, allow: bool, *, for_session: bool = False) -> None:
        """Answer the request as the local user (what the buttons do)."""
        if self.state != "pending" or self._answering:
            return
        self._answering = True  # no second answer while this one travels
        self._on_loop(lambda: self._send(allow, for_session))

    def _send(self, allow: bool, for_session: bool) -> None:
        self._set_disabled(True)
        reason = SESSION_ALLOWED if for_session else USER_REASONS[allow]
        try:
            self.agent.answer_approval(self.request.id, allow=allow, reason=reason)
        except UsageError as exc:  # already ended (timeout or stop raced the click)
            if self.state == "pending":
                self.resolve("error", str(exc))
            return
        if for_session:
            self.agent.approvals.allow_for_session(self.request.session, self.request.tool)
        if self.state == "pending":
            self.resolve("allowed" if allow else "denied", reason)

    def _on_loop(self, fn: Callable[[], None]) -> None:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self._loop is None or running is self._loop or self._loop.is_closed():
            fn()
        else:
            self._loop.call_soon_threadsafe(fn)

    def resolve(self, outcome: str, reason: str = "") -> None:
        """Show how the request ended (allowed, denied, timeout, stopped, suspended, error)."""
        if self.waited is None:
            self.waited = time.monotonic() - self._asked
        self.state = outcome if outcome in VERDICTS else "error"
        self.reason = reason
        self._set_disabled(True)
        self.verdict.value = self._verdict_html()
        self.heading.value = self._heading_html()
        color = COLORS.get(self.state, "#c62828")
        self.widget.layout.border = f"2px solid {color}"

    def _set_disabled(self, disabled: bool) -> None:
        for button in (self.allow_button, self.deny_button, self.session_button):
            button.disabled = disabled

    def _verdict_html(self) -> str:
        words = self._words()
        if self.waited is not None and self.state != "pending":
            words += f" (after {elapsed_text(self.waited)})"
        state = "waiting" if self.state == "pending" else self.state
        color = color_of(state) if self.state != "error" else "#c62828"
        return f'<b style="color:{color}">{icon(state)} {html.escape(words)}</b>'

    def _words(self) -> str:
        label = VERDICTS[self.state]
        if self.state == "pending" and self.deadline is not None and not self.reason:
            at = datetime.fromtimestamp(self.deadline).strftime("%H:%M:%S")
            return f"{label} — denied on its own at {at} if nobody answers"
        return f"{label} — {self.reason}" if self.reason else label

    def verdict_text(self) -> str:
        """The card's state in words, with the reason (a plain-text glyph first)."""
        return f"{GLYPHS.get(self.state, '✗')} {self._words()}"

    def text(self) -> str:
        """Plain-text line for the run's text rendering."""
        summary = flatten(self.request.headline, 80)
        return f"  ? approval for {self.request.tool_label} ({summary}): {self.verdict_text()}"


def tool_layout(agent: Agent, name: str) -> tuple[list[str], tuple[str, ...]]:
    """A tool's parameter order and shell arguments, as the gate's approval text uses them."""
    found = agent.tools.get(name) if hasattr(agent, "tools") else None
    if found is None:  # e.g. a session-only tool: sorted keys, no command split
        return [], ()
    order = list(found.parameters_schema().get("properties", {}))
    return order, tuple(getattr(found, "shell_arguments", ()))


def row_asking(agent: Agent, request: ApprovalRequest, rows: Sequence[ToolRow]) -> ToolRow | None:
    """Which of the unasked ``rows`` the request is about (None when it cannot be told).

    The request carries the gate's text, not the call id: the running row whose arguments give
    exactly that text wins; else the only running row of that tool; else none.
    """
    candidates = [r for r in rows if r.name == request.tool and r.state == "running"]
    order, shell = tool_layout(agent, request.tool)
    for row in candidates:
        if expected_details(row.name, row.arguments, order, shell) == request.details:
            return row
    return candidates[0] if len(candidates) == 1 else None
