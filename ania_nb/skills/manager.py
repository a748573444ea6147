"""The skill registry: load ``SKILL.md`` skills from a folder and describe them to the model.

Layouts: ``<dir>/<name>/SKILL.md`` (every other file in that folder is an attachment) and a
single ``<dir>/SKILL.md``. A skill whose SKILL.md cannot be read is reported in
`SkillManager.errors` and skipped; the others still load. The first load of a folder also
recovers what an interrupted install or removal left behind (see `recover_leftovers`).
"""

from __future__ import annotations

import asyncio
import html
import logging
import os
import re
import shutil
import time
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import NamedTuple

from ania_nb.errors import SkillError, UsageError
from ania_nb.text import cut

from .frontmatter import FrontmatterError, parse_frontmatter

__all__ = [
    "SKILL_FILE",
    "Skill",
    "SkillLoadError",
    "SkillManager",
    "recover_leftovers",
    "scan_skills",
]

log = logging.getLogger("ania_nb.skills")

SKILL_FILE = "SKILL.md"
REFERENCE_SUFFIXES = (".md", ".markdown")
MAX_ATTACHMENTS = 2000  # per skill; a vendored tree (node_modules …) must not flood the listing
MAX_REGISTRY_DESCRIPTION = 1024  # the Agent Skills limit for a description
_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules"})
# Names the installer uses (skills/install.py): ``.upload-*`` staging folders, ``.old-<name>-<hex>``
# for a replaced version set aside during the swap, ``.del-<name>-<hex>`` for a removal.
_OLD_RE = re.compile(r"^\.old-(.+)-[0-9a-f]{8}$")
_UPLOAD_PREFIX = ".upload-"
_DELETE_PREFIX = ".del-"
# A staging folder this young may belong to an install running in another process right now.
UPLOAD_GRACE_SECONDS = 600.0

_INSTRUCTION = (
    "Skills are task guides kept outside this prompt; only their names and descriptions are "
    "listed here. Before acting on a request, check it against these skills. When one "
    "matches, call skill_read with its name first and follow what it says."
)


@dataclass(frozen=True, eq=False)
class Skill:
    """One loaded skill: its frontmatter, its SKILL.md text and its attachments."""

    name: str
    description: str
    path: Path  # the SKILL.md file (absolute)
    location: str  # that file relative to the skills folder, e.g. "pdf/SKILL.md"
    content: str
    folder: Path | None = None  # the skill's own folder; None for a single <dir>/SKILL.md
    references: Mapping[str, Path] = field(default_factory=dict)  # other .md files, by rel path
    files: Mapping[str, Path] = field(default_factory=dict)  # every other file, by rel path


class SkillLoadError(NamedTuple):
    """A skill that was skipped: where it is (relative to the skills folder) and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class _Registry:
    """Everything one load produced; swapped in with a single assignment."""

    dir: Path
    whitelist: tuple[str, ...]
    skills: Mapping[str, Skill]
    errors: tuple[SkillLoadError, ...]
    prompt: str


class SkillManager:
    """Holds the skills of one folder; `reload` swaps the whole registry at once."""

    def __init__(
        self, dir: str | PathLike[str] = "skills", *, whitelist: Iterable[str] | None = None
    ) -> None:
        """Remember the folder and whitelist; nothing is read until `reload`."""
        self._registry = _Registry(Path(dir), _check_whitelist(whitelist), {}, (), "")
        self._recovered: set[Path] = set()  # folders whose install leftovers were handled
        # Held while the folder is scanned or changed (installs take it to swap folders).
        self.lock = asyncio.Lock()

    @property
    def dir(self) -> Path:
        """The folder of the last load (or the one given to the constructor)."""
        return self._registry.dir

    @property
    def whitelist(self) -> tuple[str, ...]:
        """Skill names allowed to load; empty means all."""
        return self._registry.whitelist

    @property
    def skills(self) -> Mapping[str, Skill]:
        """The loaded skills by name, in name order (a read-only snapshot)."""
        return self._registry.skills

    @property
    def errors(self) -> list[SkillLoadError]:
        """The skills the last load skipped, each as ``(path, reason)``."""
        return list(self._registry.errors)

    def get(self, name: str) -> Skill | None:
        """The skill called ``name``, or None."""
        return self._registry.skills.get(name)

    def names(self) -> list[str]:
        """Loaded skill names, sorted."""
        return list(self._registry.skills)

    def __len__(self) -> int:
        return len(self._registry.skills)

    def __contains__(self, name: object) -> bool:
        return name in self._registry.skills

    async def reload(
        self, dir: str | PathLike[str] | None = None, whitelist: Iterable[str] | None = None
    ) -> None:
        """Load the folder (default: the last one) with the whitelist (default: the last one).

        A missing folder means no skills. Broken skills land in `errors` and are logged.
        """
        root = self.dir if dir is None else Path(dir)
        allowed = self.whitelist if whitelist is None else _check_whitelist(whitelist)
        async with self.lock:
            # Once per folder: later reloads may run while an install of ours is staging.
            if root.absolute() not in self._recovered:
                self._recovered.add(root.absolute())
                for action in await asyncio.to_thread(recover_leftovers, root):
                    log.warning("skills folder %s: %s", root, action)
            skills, errors = await asyncio.to_thread(scan_skills, root, allowed)
            for error in errors:
                log.warning("skill %s skipped: %s", error.path, error.reason)
            # Build the complete registry first; readers see the old one or the new one.
            frozen = types.MappingProxyType(skills)
            self._registry = _Registry(root, allowed, frozen, tuple(errors), _prompt(skills))

    async def refresh(self) -> None:
        """Reload from the last folder and whitelist (after skill files changed on disk)."""
        await self.reload()

    def registry_prompt(self) -> str:
        """The system-prompt block naming every skill (same bytes until the next reload)."""
        return self._registry.prompt

    def listing(self) -> str:
        """``- name: description`` lines in name order, or a note that there are none."""
        if not self._registry.skills:
            return "No skills are installed."
        return "\n".join(
            f"- {s.name}: {s.description or '(no description)'}"
            for s in self._registry.skills.values()
        )

    def __repr__(self) -> str:
        return f"<SkillManager {str(self.dir)!r} skills={len(self)} errors={len(self.errors)}>"


def _check_whitelist(whitelist: Iterable[str] | None) -> tuple[str, ...]:
    if whitelist is None:
        return ()
    if isinstance(whitelist, str):
        raise UsageError(f"whitelist must be a list of skill names, not the string {whitelist!r}")
    names = tuple(whitelist)
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise UsageError(f"whitelist entries must be non-empty skill names, got {name!r}")
    return tuple(sorted({name.strip() for name in names}))


def _prompt(skills: Mapping[str, Skill]) -> str:
    if not skills:
        return ""
    lines = ["<agent_skills_registry>", f"<instruction>{_INSTRUCTION}</instruction>"]
    for skill in skills.values():
        description = cut(skill.description or "(no description)", MAX_REGISTRY_DESCRIPTION)
        lines.append(
            f"<skill><name>{html.escape(skill.name, quote=False)}</name>"
            f"<description>{html.escape(description, quote=False)}</description></skill>"
        )
    lines.append("</agent_skills_registry>")
    return "\n".join(lines)


# Disk side: runs in a worker thread.


def recover_leftovers(root: Path, *, upload_grace: float = UPLOAD_GRACE_SECONDS) -> list[str]:
    """Undo or clean what an interrupted install/removal left in ``root`` (blocking).

    A ``.old-<name>-*`` folder whose ``<name>`` is missing is the previous version of a skill
    whose replacement crashed between its two renames: it is put back. Every other leftover
    (``.old-*`` next to its skill, ``.del-*``, ``.upload-*`` older than ``upload_grace``
    seconds) is deleted. Returns one line per action taken.
    """
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return []  # missing or unreadable: scan_skills reports it
    actions: list[str] = []
    asides: dict[str, list[os.DirEntry[str]]] = {}
    doomed: list[os.DirEntry[str]] = []
    now = time.time()
    for entry in entries:
        if entry.is_symlink() or not entry.is_dir():
            continue  # the installer only ever makes folders; anything else is not ours
        match = _OLD_RE.match(entry.name)
        if match:
            asides.setdefault(match.group(1), []).append(entry)
        elif entry.name.startswith(_DELETE_PREFIX):
            doomed.append(entry)
        elif entry.name.startswith(_UPLOAD_PREFIX):
            try:
                age = now - entry.stat().st_mtime
            except OSError:
                continue
            if age >= upload_grace:
                doomed.append(entry)
    for name, found in asides.items():
        target = root / name
        if not target.exists() and not target.is_symlink():
            # The newest set-aside copy is the version that was live when the swap broke.
            newest = max(found, key=_changed)
            try:
                os.rename(newest.path, target)
            except OSError as exc:
                actions.append(f"could not restore {name!r} from {newest.name}: {exc}")
            else:
                actions.append(f"restored {name!r} from {newest.name} (an interrupted replace)")
            found = [entry for entry in found if entry is not newest]
        doomed.extend(found)
    for entry in doomed:
        shutil.rmtree(entry.path, ignore_errors=True)
        gone = not os.path.lexists(entry.path)
        actions.append(f"{'deleted' if gone else 'could not delete'} leftover {entry.name}")
    return actions


def _changed(entry: os.DirEntry[str]) -> float:
    try:
        stat = entry.stat()
    except OSError:
        return 0.0
    return max(stat.st_ctime, stat.st_mtime)  # a rename updates ctime


def scan_skills(
    root: Path, whitelist: Iterable[str] = ()
) -> tuple[dict[str, Skill], list[SkillLoadError]]:
    """Load every skill under ``root`` (blocking); returns skills by name and skipped ones."""
    allowed = frozenset(whitelist)
    errors: list[SkillLoadError] = []
    if not root.exists():
        return {}, errors
    if not root.is_dir():
        return {}, [SkillLoadError(str(root), "the skills path exists but is not a folder")]
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        return {}, [SkillLoadError(str(root), f"cannot list the skills folder: {exc}")]
    candidates: list[tuple[str, Path, Path | None]] = []  # (location, SKILL.md, folder)
    for entry in entries:
        if entry.name.startswith("."):  # .upload-*/.old-*/.del-* folders of an install
            continue
        if entry.name.lower() == SKILL_FILE.lower() and entry.is_file():
            candidates.append((entry.name, Path(entry.path), None))
        elif entry.is_dir() and (Path(entry.path) / SKILL_FILE).is_file():
            sub = Path(entry.path)
            candidates.append((f"{entry.name}/{SKILL_FILE}", sub / SKILL_FILE, sub))
    found: dict[str, Skill] = {}
    # Sorted by path, so which of two same-named skills wins never depends on the file system.
    for location, path, folder in sorted(candidates, key=lambda c: c[0]):
        try:
            skill = _load(root, location, path, folder)
        except _Skip as exc:
            errors.append(SkillLoadError(location, str(exc)))
            continue
        if allowed and skill.name not in allowed:
            continue
        if skill.name in found:
            first = found[skill.name].location
            errors.append(
                SkillLoadError(
                    location, f"duplicate skill name {skill.name!r}: {first} already defines it"
                )
            )
            continue
        found[skill.name] = skill
    return dict(sorted(found.items())), errors


class _Skip(SkillError):
    """Internal: why a candidate skill could not be loaded (becomes a `SkillLoadError`)."""


def _load(root: Path, location: str, path: Path, folder: Path | None) -> Skill:
    try:
        content = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _Skip("SKILL.md is not UTF-8 text") from None
    except OSError as exc:
        raise _Skip(f"cannot read SKILL.md: {exc.strerror or exc}") from None
    try:
        meta = parse_frontmatter(content)
    except FrontmatterError as exc:
        raise _Skip(str(exc)) from None
    default_name = (folder or root).absolute().name
    references: dict[str, Path] = {}
    files: dict[str, Path] = {}
    if folder is not None:
        references, files = _attachments(folder.absolute())
    return Skill(
        name=meta.name or default_name,
        description=meta.description,
        path=path.absolute(),
        location=location,
        content=content,
        folder=folder.absolute() if folder is not None else None,
        references=references,
        files=files,
    )


def _attachments(folder: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """Split a skill folder's other files into .md references and everything else."""
    references: dict[str, Path] = {}
    files: dict[str, Path] = {}
    count = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and d not in _SKIPPED_DIRS
        )
        for filename in sorted(filenames):
            if filename.startswith("."):
                continue
            path = Path(dirpath, filename)
            rel = path.relative_to(folder).as_posix()
            if rel == SKILL_FILE:
                continue
            count += 1
            if count > MAX_ATTACHMENTS:
                log.warning("skill folder %s: only %d files are listed", folder, count - 1)
                return dict(sorted(references.items())), dict(sorted(files.items()))
            if filename.lower().endswith(REFERENCE_SUFFIXES):
                references[rel] = path
            else:
                files[rel] = path
    return dict(sorted(references.items())), dict(sorted(files.items()))
