"""Exceptions raised by ania-nb.

Four families, kept apart so callers can catch exactly what they mean (attributes in brackets)::

    AniaError
    ├── UsageError              developer misuse: bad config, bad tool definition, bad argument
    │   ├── ConfigError         a setting or a config file is missing or invalid [key]
    │   ├── ToolDefinitionError a tool cannot become a function schema [tool]
    │   ├── ClockError          (ania_nb.clock) a clock task request was refused: bad schedule,
    │   │   │                   blank content, unknown task or field
    │   │   ├── SlotTaken       (ania_nb.clock.store) a scheduled fire's planned time was
    │   │   │                   recorded by another leader: that fire must not run
    │   │   └── DuplicateTaskError  the same task (schedule, title, content, target) exists [task]
    │   ├── ApprovalRefused     (ania_nb.governance) an answer to an approval request was
    │   │                       refused: not the requester or an admin, none pending, ended
    │   │                       [key, params: its reason in the message catalogue]
    │   ├── TeamError           (ania_nb.agents) a saved team is invalid, over a limit or exists
    │   ├── KnowledgeError      (ania_nb.knowledge) a kb/memory request was refused: blank,
    │   │                       full scope, unknown id, read-only scope; or the disk refused
    │   │                       the write [cause, as StoreError's]
    │   ├── StartError          (ania_nb.runner.serve) ania-nb serve cannot start: refused or
    │   │                       impossible listener, bad runner settings (exit code 2)
    │   └── MissingExtraError   an optional dependency is not installed; also an ImportError
    │                           [extra, name]
    ├── RunError                a run failed [session]
    │   ├── LLMError            the model endpoint failed after retries and fallback
    │   │   │                   [status_code, model]
    │   │   └── LLMStreamError  a stream broke after output had started (never retried)
    │   ├── SessionBusyError    the session's queue is full
    │   └── RunInterrupted      (ania_nb.notebook) the kernel was interrupted during a run;
    │                           IPython shows one line, no traceback
    ├── ResourceError           something the agent relies on failed, inside a run or outside
    │   ├── StoreError          the embedded store could not be opened, read or written
    │   │                       [cause: no space left on device, read-only file system, …]
    │   ├── MCPServerError      an MCP server could not be connected or is closed [server]
    │   ├── EmbeddingError      (ania_nb.knowledge) the embedder failed [status_code]
    │   ├── AdapterError        (ania_nb.runner) a chat platform action failed or timed out
    │   │   └── ActionFailed    (ania_nb.runner.onebot) the OneBot implementation answered
    │   │                       status failed [action, status, retcode]
    │   └── SkillError          a skill could not be read, installed or removed [skill]
    │       ├── FrontmatterError    a SKILL.md frontmatter block is invalid; also a ValueError
    │       └── SkillInstallError   bad source, unsafe archive or failed download
    │                               [source, status_code]
    └── ToolSignal              raised inside a tool to steer the loop; never escapes a run
        └── ToolError           the tool failed with a message meant for the model
            ├── ToolArgumentsError  (ania_nb.tools.base) the model's arguments do not fit [tool]
            └── BudgetError     (ania_nb.agents) a child cannot start: its parent's time is short

A run that fails because of a `ResourceError` (say, the store) is reported through its
`RunResult` like any other failed run; the exception itself is raised where no run is involved
(opening the store, connecting an MCP server, installing a skill).

Messages say the likely cause and the fix; context is attached as attributes.
"""

from __future__ import annotations


class AniaError(Exception):
    """Root of every exception raised by ania-nb."""


# ---------------------------------------------------------------------------- usage


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


class MissingExtraError(UsageError, ImportError):
    """An optional dependency is missing; the message names the ``pip install`` that adds it.

    ``extra`` is the ania-nb extra to install (``"notebook"``), ``name`` the missing module.
    """

    def __init__(self, message: str, *, extra: str, name: str) -> None:
        super().__init__(message, name=name)  # ImportError keeps ``name``
        self.extra = extra


# ---------------------------------------------------------------------------- runs


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


# ---------------------------------------------------------------------------- resources


class ResourceError(AniaError):
    """Something the agent relies on (the store, an MCP server, a skill source) failed."""


class StoreError(ResourceError):
    """The embedded store could not be opened, read or written.

    ``cause`` names a storage cause the message starts with (``"no space left on device"``,
    ``"read-only file system"``, ``"permission denied"``), None for any other failure.
    """

    def __init__(self, message: str, *, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class MCPServerError(ResourceError):
    """An MCP server could not be connected (spawn, HTTP connect, handshake, tool listing)."""

    def __init__(self, message: str, *, server: str) -> None:
        super().__init__(message)
        self.server = server


class SkillError(ResourceError):
    """A skill could not be read, installed or removed; ``skill`` names it when known."""

    def __init__(self, message: str, *, skill: str | None = None) -> None:
        super().__init__(message)
        self.skill = skill


class FrontmatterError(SkillError, ValueError):
    """A SKILL.md frontmatter block cannot be read; the message says what to fix."""


class SkillInstallError(SkillError):
    """A skill could not be installed or removed; nothing on disk was changed.

    ``source`` is the URL (or ``"content"``) being installed; ``status_code`` the HTTP status
    when a download was refused.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        status_code: int | None = None,
        skill: str | None = None,
    ) -> None:
        super().__init__(message, skill=skill)
        self.source = source
        self.status_code = status_code


# ---------------------------------------------------------------------------- tool signals


class ToolSignal(AniaError):
    """Raised inside a tool to steer the loop; converted to the tool's result text."""


class ToolError(ToolSignal):
    """A tool failed; the message is shown to the model as the tool's result."""
