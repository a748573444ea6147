"""Small media shared by file and image tests: a valid 1×1 PNG and a send_file recorder."""

from __future__ import annotations

from ania_nb import Callbacks

PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000001e221bc330000000049454e44ae426082"
)


class Outbox:
    """A ``send_file`` callback that records (name, base64) of what would reach the user."""

    def __init__(self) -> None:
        self.files: list[tuple[str, str]] = []

    def __call__(self, name: str, b64: str) -> None:
        self.files.append((name, b64))

    @property
    def callbacks(self) -> Callbacks:
        """Callbacks that deliver files to this outbox."""
        return Callbacks(send_file=self)
