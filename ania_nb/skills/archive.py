"""Unpack an untrusted skill zip safely (blocking; run it in a worker thread).

Refused: more than ``max_entries`` entries, absolute paths, ``..`` segments, symlinks and other
special files, anything that would land outside the target, and archives whose content
expands past ``max_unpacked_bytes`` — counted while writing, so a zip bomb stops early
whatever its headers claim.
"""

from __future__ import annotations

import io
import os
import re
import stat
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from .errors import SkillInstallError

__all__ = ["ArchiveLimits", "extract_skill_zip"]

MiB = 1024 * 1024
_SKILL_FILE = "SKILL.md"
_JUNK_TOP = frozenset({"__MACOSX"})  # resource forks added by macOS's "Compress"
_SEP_RE = re.compile(r"[/\\]")
_DRIVE_RE = re.compile(r"^[A-Za-z]:")


@dataclass(frozen=True)
class ArchiveLimits:
    """How much a skill zip may hold."""

    max_entries: int = 500
    max_unpacked_bytes: int = 64 * MiB
    chunk_size: int = 64 * 1024


@dataclass(frozen=True)
class _Entry:
    info: zipfile.ZipInfo
    parts: tuple[str, ...]


def extract_skill_zip(data: bytes, dest: Path, limits: ArchiveLimits) -> str | None:
    """Unpack the skill in ``data`` into the empty folder ``dest``.

    Returns the zip's single top-level folder name when SKILL.md sits inside one, or None when
    SKILL.md is at the root. Raises `SkillInstallError` saying exactly what is wrong.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError) as exc:
        raise SkillInstallError(
            f"the download is not a zip archive ({exc}); {_sniff(data)}"
        ) from None
    with archive:
        infos = archive.infolist()
        if len(infos) > limits.max_entries:
            raise SkillInstallError(
                f"the zip has {len(infos)} entries, more than the limit of {limits.max_entries}"
            )
        entries = [e for e in (_check_entry(info) for info in infos) if e is not None]
        prefix = _layout(entries)
        _unpack(archive, entries, prefix, dest, limits)
    return prefix[0] if prefix else None


def _check_entry(info: zipfile.ZipInfo) -> _Entry | None:
    name = info.filename
    if "\x00" in name:
        raise SkillInstallError(f"zip entry {name!r} has a NUL byte in its name")
    if name.startswith(("/", "\\")) or _DRIVE_RE.match(name):
        raise SkillInstallError(f"zip entry {name!r} has an absolute path; refusing the zip")
    raw_parts = _SEP_RE.split(name)
    if ".." in raw_parts:
        raise SkillInstallError(
            f"zip entry {name!r} climbs out of its folder with '..'; refusing the zip"
        )
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    if stat.S_ISLNK(mode):
        raise SkillInstallError(f"zip entry {name!r} is a symbolic link; refusing the zip")
    if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
        raise SkillInstallError(f"zip entry {name!r} is a special file; refusing the zip")
    parts = tuple(p for p in raw_parts if p not in ("", "."))
    if not parts or parts[0] in _JUNK_TOP:
        return None
    return _Entry(info, parts)


def _layout(entries: list[_Entry]) -> tuple[str, ...]:
    """Where SKILL.md is: ``()`` for the root, ``(folder,)`` for the only top-level folder."""
    files = {e.parts for e in entries if not e.info.is_dir()}
    if not files:
        raise SkillInstallError("the zip holds no files")
    if (_SKILL_FILE,) in files:
        return ()
    tops = sorted({e.parts[0] for e in entries})
    if len(tops) == 1 and (tops[0], _SKILL_FILE) in files:
        return (tops[0],)
    shown = ", ".join(tops[:10]) + (", …" if len(tops) > 10 else "")
    nested = any(p[-1] == _SKILL_FILE for p in files)
    hint = (
        "; it holds skills deeper down (several skills in one repository?): install one by "
        "the URL of its SKILL.md or a zip of its folder"
        if nested
        else ""
    )
    raise SkillInstallError(
        "SKILL.md not found: the zip must hold SKILL.md at its root or inside exactly one "
        f"top-level folder (its top level has: {shown}){hint}"
    )


def _unpack(
    archive: zipfile.ZipFile,
    entries: list[_Entry],
    prefix: tuple[str, ...],
    dest: Path,
    limits: ArchiveLimits,
) -> None:
    base = os.path.realpath(dest)
    written = 0
    for entry in entries:
        rel = entry.parts[len(prefix) :]
        if not rel:
            continue  # the top-level folder itself
        target = dest.joinpath(*rel)
        if os.path.commonpath([base, os.path.realpath(target)]) != base:
            raise SkillInstallError(f"zip entry {entry.info.filename!r} resolves outside the skill")
        try:
            if entry.info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(entry.info) as src, open(target, "xb") as out:
                while chunk := src.read(limits.chunk_size):
                    written += len(chunk)
                    if written > limits.max_unpacked_bytes:
                        raise SkillInstallError(
                            f"the zip expands past the limit of {limits.max_unpacked_bytes} "
                            f"bytes; extraction stopped after {written} bytes (at "
                            f"{entry.info.filename!r}, which declares {entry.info.file_size})"
                        )
                    out.write(chunk)
        except FileExistsError:
            raise SkillInstallError(
                f"zip entry {entry.info.filename!r} appears twice or clashes with a folder"
            ) from None
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise SkillInstallError(
                f"zip entry {entry.info.filename!r} is corrupt: {exc}"
            ) from None
        except (NotImplementedError, RuntimeError) as exc:  # unsupported method, encryption
            raise SkillInstallError(
                f"zip entry {entry.info.filename!r} cannot be read: {exc}"
            ) from None
        except OSError as exc:
            raise SkillInstallError(
                f"cannot write zip entry {entry.info.filename!r}: {exc.strerror or exc}"
            ) from None


def _sniff(data: bytes) -> str:
    """A hint about what was downloaded instead of a zip."""
    head = data[:256].lstrip().lower()
    if not data:
        return "the server sent an empty body"
    if head.startswith((b"<!doctype", b"<html")):
        return (
            "the server sent an HTML page; link the zip file itself (for GitHub, the "
            "repository URL https://github.com/<owner>/<repo> or a release asset)"
        )
    if head.startswith(b"---") or head.startswith(b"#"):
        return "it looks like Markdown; link a SKILL.md by a URL ending in .md"
    return f"it starts with {data[:16]!r}"
