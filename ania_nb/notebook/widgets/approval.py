"""`ApprovalCard`: a tool waiting for the user, with Allow / Deny / allow-for-this-session.

A click answers through `Agent.answer_approval`, the same path as a chat reply; the card then
shows the verdict and disables its buttons. The manager's ``approval_resolved`` event (answer,
timeout, stop) settles the card with the final reason.
"""

from __future__ import annotations

import asyncio
import html
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...errors import UsageError
from ...governance.approval import SESSION_ALLOWED
from ._format import one_line, pre

if TYPE_CHECKING:  # pragma: no cover
    from ...agent import Agent
    from ...engine.callbacks import ApprovalRequest

VERDICTS = {
    "pending": "⚠ waiting for your answer",
    "allowed": "✓ allowed",
    "denied": "✗ denied",
    "timeout": "⏱ timed out",
    "stopped": "■ stopped",
    "error": "✗ not answered",
}
USER_REASONS = {True: "approved by the user", False: "denied by the user"}
COLORS = {"pending": "#e0a800", "allowed": "#2e7d32", "timeout": "#757575", "stopped": "#757575"}


class ApprovalCard:
    """The question for one `ApprovalRequest`; ``state`` is pending until it is resolved."""

    def __init__(self, agent: Agent, request: ApprovalRequest) -> None:
        import ipywidgets as w

        self.agent = agent
        self.request = request
        self.state = "pending"
        self.reason = ""
        self._answering = False
        try:  # the agent's loop: a click from another thread must answer on it
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        askers = request.requesters or ((request.requester,) if request.requester else ())
        who = f" (asked by {', '.join(askers)})" if askers else ""
        self.heading = w.HTML(
            f"<b>Approval needed</b>: <code>{html.escape(request.tool)}</code>{html.escape(who)}"
        )
        self.summary = w.HTML(pre(request.summary))
        # The whole call, never cut: a scrollable block (the model may pad arguments).
        self.details = w.HTML(
            '<div style="max-height:16em;overflow:auto">' + pre(request.details) + "</div>"
            if request.details
            else ""
        )
        self.allow_button = w.Button(description="Allow", button_style="success", icon="check")
        self.deny_button = w.Button(description="Deny", button_style="danger", icon="times")
        self.session_button = w.Button(
            description=f"Allow {request.tool} for the rest of this session",
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
        """Show how the request ended (allowed, denied, timeout, stopped, error)."""
        self.state = outcome if outcome in VERDICTS else "error"
        self.reason = reason
        self._set_disabled(True)
        self.verdict.value = self._verdict_html()
        color = COLORS.get(self.state, "#c62828")
        self.widget.layout.border = f"2px solid {color}"

    def _set_disabled(self, disabled: bool) -> None:
        for button in (self.allow_button, self.deny_button, self.session_button):
            button.disabled = disabled

    def _verdict_html(self) -> str:
        return f"<b>{html.escape(self.verdict_text())}</b>"

    def verdict_text(self) -> str:
        """The card's state in words, with the reason."""
        label = VERDICTS[self.state]
        return f"{label} — {self.reason}" if self.reason else label

    def text(self) -> str:
        """Plain-text line for the run's text rendering."""
        summary = one_line(self.request.summary, 80)
        return f"  ? approval for {self.request.tool} ({summary}): {self.verdict_text()}"
