"""Which local files the file-reading tools may touch, and reading them safely off the loop."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ToolError

SECRET_NAMES = frozenset({"ania.toml", ".env", ".netrc", "credentials", "id_rsa", "id_ed25519"})


@dataclass(frozen=True)
class FileGuard:
    """Protected places: the data dir (database, vectors) and files that hold secrets."""

    data_dir: Path
    max_bytes: int
    extra_protected: tuple[Path, ...] = field(default_factory=tuple)

    def check(self, raw: str) -> Path:
        """Resolve ``raw`` and refuse protected, missing, non-regular or oversized files."""
        if not raw or not raw.strip():
            raise ToolError("path must not be empty")
        path = Path(os.path.expanduser(raw.strip())).resolve()
        data_dir = self.data_dir.expanduser().resolve()
        if path == data_dir or data_dir in path.parents:
            raise ToolError(f"refused: {path} is inside the agent's data directory ({data_dir})")
        if path.name in SECRET_NAMES or any(path == p.resolve() for p in self.extra_protected):
            raise ToolError(f"refused: {path.name} may hold secrets")
        if not path.exists():
            raise ToolError(f"no such file: {path}")
        if path.is_dir():
            raise ToolError(f"{path} is a directory, not a file")
        if not path.is_file():
            raise ToolError(f"{path} is not a regular file")
        size = path.stat().st_size
        if size > self.max_bytes:
            raise ToolError(
                f"{path} is {size} bytes, above the limit of {self.max_bytes} (file.max_bytes)"
            )
        return path

    async def read(self, raw: str) -> tuple[Path, bytes]:
        """Check and read a file in a worker thread."""
        path = await asyncio.to_thread(self.check, raw)
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except OSError as exc:
            raise ToolError(f"cannot read {path}: {exc.strerror or exc}") from None
        return path, data
