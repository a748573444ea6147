"""Exceptions raised by ania-nb.

Three families, kept apart so callers can catch exactly what they mean::

    AniaError
    ├── UsageError            developer misuse: bad config, bad tool definition, bad argument
    │   ├── ConfigError
    │   └── ToolDefinitionError
    ├── RunError              a run failed: carries the session and, where known, the cause
    │   ├── LLMError          the model endpoint failed (after retries and fallback)
    │   │   └── LLMStreamError    a stream broke after output had started (never retried)
    │   ├── SessionBusyError  the session's queue is full
    │   └── StoreError        the embedded store could not be read or written
    └── ToolSignal            raised *inside* a tool to steer the loop; never escapes a run
        ├── ToolError         the tool failed with a message meant for the model
        └── ToolDenied        the call was blocked (gate, hook, approval)

Messages say the likely cause and the fix; context is attached as attributes.
"""

from __future__ import annotations


class AniaError(Exception):
    """Root of every exception raised by ania-nb."""


class UsageError(AniaError):
    """The library was used wrongly (bad configuration, bad tool definition, bad argument)."""


class ConfigError(UsageError):
    """A configuration value is missing or invalid."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class ToolDefinitionError(UsageError):
    """A tool cannot be turned into a function schema (bad name, unsupported signature)."""

    def __init__(self, message: str, *, tool: str | None = None) -> None:
        super().__init__(message)
        self.tool = tool


class RunError(AniaError):
    """A run could not complete."""

    def __init__(self, message: str, *, session: str | None = None) -> None:
        super().__init__(message)
        self.session = session


class LLMError(RunError):
    """The model endpoint failed after retries and the fallback model."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        model: str | None = None,
        session: str | None = None,
    ) -> None:
        super().__init__(message, session=session)
        self.status_code = status_code
        self.model = model


class LLMStreamError(LLMError):
    """A streamed response broke after output started; retrying would duplicate output."""


class SessionBusyError(RunError):
    """The session is handling a request and its queue of waiting messages is full."""


class StoreError(RunError):
    """The embedded store failed."""


class ToolSignal(AniaError):
    """Raised inside a tool to steer the loop; converted to the tool's result text."""


class ToolError(ToolSignal):
    """A tool failed; the message is shown to the model as the tool's result."""


class ToolDenied(ToolSignal):
    """A tool call was blocked before it ran (plan mode, hook, approval)."""
