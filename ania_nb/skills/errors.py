"""The one error a skill install or removal raises: bad source, unsafe archive, failed download."""

from __future__ import annotations

from ania_nb.errors import UsageError

__all__ = ["SkillInstallError"]


class SkillInstallError(UsageError):
    """A skill could not be installed or removed; nothing on disk was changed.

    ``source`` is the URL (or ``"content"``) being installed; ``status_code`` the HTTP status
    when a download was refused.
    """

    def __init__(
        self, message: str, *, source: str | None = None, status_code: int | None = None
    ) -> None:
        super().__init__(message)
        self.source = source
        self.status_code = status_code
