"""Install and remove skills on disk: download, unpack into ``.upload-*``, validate, swap in.

Sources: a zip URL, a GitHub repository URL (``https://github.com/<owner>/<repo>`` → the
codeload zip of ``main``, then ``master``), a SKILL.md URL (path ending ``.md``/``.markdown``)
or the SKILL.md text itself. A failed install leaves the skills folder as it was.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import shutil
import tempfile
import unicodedata
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ania_nb.errors import StoreError
from ania_nb.text import cut

from .archive import ArchiveLimits, MiB, extract_skill_zip
from .download import Downloader
from .errors import SkillInstallError
from .frontmatter import FrontmatterError, SkillMeta, parse_frontmatter
from .manager import SKILL_FILE, Skill, SkillManager

if TYPE_CHECKING:
    import httpx2

    from ania_nb.store import OpLog

__all__ = ["Installed", "SkillInstaller", "check_dir_name"]

log = logging.getLogger("ania_nb.skills")

GITHUB_HOSTS = frozenset({"github.com", "www.github.com"})
GITHUB_BRANCHES = ("main", "master")
_BAD_NAME_RE = re.compile(r"[/\\\x00-\x1f]")
# Invisible characters that make two names look the same: refused, never silently dropped.
ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff")


@dataclass(frozen=True)
class Installed:
    """The outcome of an install: the loaded skill and whether an older version was replaced."""

    skill: Skill
    replaced: bool


def _check_visible(name: str) -> None:
    hidden = sorted({f"U+{ord(ch):04X}" for ch in name if ch in ZERO_WIDTH})
    if hidden:
        raise SkillInstallError(
            f"invalid skill name {name!r}: it contains zero-width characters "
            f"({', '.join(hidden)}); use visible characters only"
        )


def check_dir_name(name: str) -> str:
    """``name`` NFKC-normalised and stripped if it is a safe skill folder name, else raise."""
    _check_visible(name)
    # NFKC: a full-width or ligature look-alike of an installed skill's name is that name.
    cleaned = unicodedata.normalize("NFKC", name).strip()
    if not cleaned or cleaned in (".", "..") or cleaned.startswith("."):
        raise SkillInstallError(
            f"invalid skill name {name!r}: it must be non-empty and not start with '.'"
        )
    if _BAD_NAME_RE.search(cleaned):
        raise SkillInstallError(
            f"invalid skill name {name!r}: it must not contain '/', '\\' or control characters"
        )
    if len(cleaned) > 100:
        raise SkillInstallError(f"invalid skill name {cut(name, 40)!r}: longer than 100 characters")
    return cleaned


def _safe_name(*candidates: str | None) -> str:
    for candidate in candidates:
        if candidate:
            try:
                return check_dir_name(candidate)
            except SkillInstallError:
                continue
    return "skill"


class SkillInstaller:
    """Installs into and removes from the folder of a `SkillManager`, then hot-reloads it."""

    def __init__(
        self,
        manager: SkillManager,
        *,
        http_client: httpx2.AsyncClient | None = None,
        oplog: OpLog | None = None,
        codeload_base: str = "https://codeload.github.com",
        max_download_bytes: int = 64 * MiB,
        max_unpacked_bytes: int = 64 * MiB,
        max_entries: int = 500,
        max_content_bytes: int = 256 * 1024,
        timeout: float = 120.0,
        allow_private_hosts: Iterable[str] = (),
        changed: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """Configure limits; without ``http_client`` each download uses a fresh guarded client.

        Downloads reach public addresses only, plus ``allow_private_hosts`` (addresses or CIDR
        networks, ``skills.allow_private_hosts``). ``changed`` is told after every install and
        removal (an Agent bumps the store's ``skills`` revision: other replicas reload).
        """
        self.manager = manager
        self.oplog = oplog
        self.changed = changed
        self.codeload_base = codeload_base.rstrip("/")
        self.max_download_bytes = max_download_bytes
        self.max_content_bytes = max_content_bytes
        self.limits = ArchiveLimits(max_entries=max_entries, max_unpacked_bytes=max_unpacked_bytes)
        self._downloader = Downloader(
            http_client, timeout=timeout, allow_private_hosts=allow_private_hosts
        )

    async def install(
        self,
        *,
        url: str | None = None,
        content: str | None = None,
        name: str | None = None,
        actor: str | None = None,
        session: str | None = None,
        category: str = "skill",
        replace: bool = True,
    ) -> Installed:
        """Install from exactly one of ``url`` and ``content``; ``name`` picks the folder.

        ``replace=False`` refuses to overwrite an installed skill (the AI's tool passes it unless
        an admin approved the replacement). The attempt is written to the op log under
        ``category`` (``"ai"`` for the AI's tools).
        """
        source = url.strip() if url and url.strip() else "content"
        audit = _Audit(self.oplog, category, "skill_install", actor, session)
        try:
            result = await self._install(url, content, name, replace)
        except SkillInstallError as exc:
            exc.source = source
            exc.skill = exc.skill or (name.strip() if name and name.strip() else None)
            await audit(f"failed ({source}): {exc}")
            raise
        verb = "replaced" if result.replaced else "installed"
        await audit(f"{verb} {result.skill.name!r} at {result.skill.location} from {source}")
        await self._tell_others()
        return result

    async def remove(
        self,
        name: str,
        *,
        actor: str | None = None,
        session: str | None = None,
        category: str = "skill",
    ) -> Skill | Path:
        """Delete a skill (by skill name, or by folder name for one that failed to load)."""
        audit = _Audit(self.oplog, category, "skill_remove", actor, session)
        try:
            removed = await self._remove(name)
        except SkillInstallError as exc:
            exc.skill = exc.skill or name.strip() or None
            await audit(f"failed ({name!r}): {exc}")
            raise
        what = removed.location if isinstance(removed, Skill) else removed.name + "/"
        shown = removed.name if isinstance(removed, Skill) else name.strip()
        await audit(f"removed {shown!r} at {what}")
        await self._tell_others()
        return removed

    async def _tell_others(self) -> None:
        """Tell ``changed`` (the other replicas); the change itself is done whatever it says."""
        if self.changed is None:
            return
        try:
            await self.changed()
        except Exception:
            log.warning(
                "the skills folder changed, but the other replicas could not be told; they "
                "see it after skill_reload or a restart",
                exc_info=True,
            )

    # -- install ---------------------------------------------------------------------------

    async def _install(
        self, url: str | None, content: str | None, name: str | None, replace: bool = True
    ) -> Installed:
        url = url.strip() if url else ""
        if bool(url) == bool(content):
            raise SkillInstallError(
                "give exactly one of url (a zip, GitHub repository or SKILL.md link) and "
                "content (the full SKILL.md text)"
            )
        folder_name = check_dir_name(name) if name is not None and name.strip() else None
        if content:
            return await self._from_text(content, folder_name, hint=None, replace=replace)
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018  # raises ValueError for a port outside 0-65535
        except ValueError as exc:
            raise SkillInstallError(f"{url!r} is not a valid URL: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SkillInstallError(f"only http:// and https:// URLs can be installed, got {url!r}")
        segments = [s for s in parts.path.split("/") if s]
        stem = PurePosixPath(segments[-1]).stem if segments else None
        if parts.hostname.lower() in GITHUB_HOSTS and len(segments) == 2:
            owner, repo = segments[0], segments[1].removesuffix(".git")
            data = await self._github_zip(owner, repo)
            return await self._from_zip(
                data, folder_name, hint=repo, use_layout=False, replace=replace
            )
        if parts.path.lower().endswith((".md", ".markdown")):
            body = await self._downloader.fetch(url, self.max_content_bytes, "the SKILL.md")
            try:
                text = body.decode("utf-8-sig")
            except UnicodeDecodeError:
                raise SkillInstallError(f"{url} is not UTF-8 text") from None
            hint = stem if stem and stem.lower() != "skill" else None
            return await self._from_text(text, folder_name, hint=hint, replace=replace)
        data = await self._downloader.fetch(url, self.max_download_bytes, "the zip")
        return await self._from_zip(data, folder_name, hint=stem, use_layout=True, replace=replace)

    async def _github_zip(self, owner: str, repo: str) -> bytes:
        refused: list[str] = []
        for branch in GITHUB_BRANCHES:
            url = f"{self.codeload_base}/{owner}/{repo}/zip/refs/heads/{branch}"
            try:
                return await self._downloader.fetch(url, self.max_download_bytes, "the zip")
            except SkillInstallError as exc:
                if exc.status_code is None:
                    raise  # too big, timeout, network: trying another branch will not help
                refused.append(f"{branch} (HTTP {exc.status_code})")
        raise SkillInstallError(
            f"GitHub repository {owner}/{repo}: no branch could be downloaded "
            f"({', '.join(refused)}); check the URL, or link a zip or SKILL.md directly"
        )

    async def _from_text(
        self, text: str, folder_name: str | None, hint: str | None, *, replace: bool
    ) -> Installed:
        size = len(text.encode("utf-8"))
        if size > self.max_content_bytes:
            raise SkillInstallError(
                f"SKILL.md is {size} bytes, more than the limit of {self.max_content_bytes}; "
                "move details into reference files and install a zip instead"
            )
        if not text.strip():
            raise SkillInstallError("SKILL.md content is empty")

        def write(staging: Path) -> None:
            (staging / SKILL_FILE).write_text(text, encoding="utf-8")

        return await self._stage_and_place(write, folder_name, hint, replace=replace)

    async def _from_zip(
        self,
        data: bytes,
        folder_name: str | None,
        hint: str | None,
        *,
        use_layout: bool,
        replace: bool,
    ) -> Installed:
        def unpack(staging: Path) -> str | None:
            top = extract_skill_zip(data, staging, self.limits)
            return top if use_layout else None

        return await self._stage_and_place(unpack, folder_name, hint, replace=replace)

    async def _stage_and_place(
        self,
        fill: Callable[[Path], str | None],
        folder_name: str | None,
        hint: str | None,
        *,
        replace: bool,
    ) -> Installed:
        root = self.manager.dir
        staging = await asyncio.to_thread(_make_staging, root)
        try:
            top = await asyncio.to_thread(fill, staging)  # the zip's folder, if any
            meta = await asyncio.to_thread(_validate, staging)
            dir_name = folder_name or _safe_name(meta.name, top, hint)
            skill_name = meta.name or dir_name
            target = root / dir_name
            async with self.manager.lock:
                self._check_allowed(skill_name, target)
                if not replace:
                    await asyncio.to_thread(_refuse_replacing, target, skill_name)
                replaced = await asyncio.to_thread(_swap_in, staging, target)
        finally:
            await asyncio.to_thread(shutil.rmtree, staging, True)
        await self.manager.refresh()
        for skill in self.manager.skills.values():
            if skill.folder is not None and skill.folder == target.absolute():
                return Installed(skill, replaced)
        reasons = [e.reason for e in self.manager.errors if e.path.startswith(f"{dir_name}/")]
        raise SkillInstallError(
            f"the skill was written to {dir_name}/ but did not load: "
            f"{'; '.join(reasons) or 'unknown reason'}"
        )

    def _check_allowed(self, skill_name: str, target: Path) -> None:
        whitelist = self.manager.whitelist
        if whitelist and skill_name not in whitelist:
            raise SkillInstallError(
                f"skill {skill_name!r} is not in the skills whitelist ({', '.join(whitelist)}), "
                "so it would never load; nothing was installed. Ask the operator to add it to "
                "skills.whitelist first"
            )
        folder = target.absolute()
        existing = self.manager.get(skill_name)
        if existing is not None and existing.folder != folder:
            raise SkillInstallError(
                f"a skill named {skill_name!r} already exists at {existing.location}; remove it "
                "first with skill_remove, or give the new skill another frontmatter name"
            )
        # Replacing is for updating the same skill; another skill's folder is never overwritten.
        for other in self.manager.skills.values():
            if other.folder == folder and other.name != skill_name:
                raise SkillInstallError(
                    f"folder {target.name!r} holds the skill {other.name!r}; nothing was "
                    "changed. Pass another name, or remove that skill first"
                )

    # -- remove ----------------------------------------------------------------------------

    async def _remove(self, name: str) -> Skill | Path:
        wanted = name.strip()
        if not wanted:
            raise SkillInstallError("give the name of the skill to remove")
        async with self.manager.lock:
            skill = self.manager.get(wanted)
            removed: Skill | Path
            if skill is not None:
                target, removed = skill.folder or skill.path, skill
            else:
                target = removed = await asyncio.to_thread(self._broken_folder, wanted)
            await asyncio.to_thread(_delete, target)
        await self.manager.refresh()
        return removed

    def _broken_folder(self, wanted: str) -> Path:
        """A skill that failed to load has no registry name; its folder name finds it."""
        try:
            folder = self.manager.dir / check_dir_name(wanted)
        except SkillInstallError:
            folder = None
        if folder is not None and not folder.is_symlink() and (folder / SKILL_FILE).is_file():
            return folder
        names = ", ".join(self.manager.names()) or "none"
        raise SkillInstallError(f"no skill named {wanted!r}; installed skills: {names}")


@dataclass(frozen=True)
class _Audit:
    """Writes one op-log line for an install or removal (if there is an op log)."""

    oplog: OpLog | None
    category: str
    action: str
    actor: str | None
    session: str | None

    async def __call__(self, detail: str) -> None:
        if self.oplog is None:
            return
        try:
            await self.oplog.add(
                self.category, self.action, actor=self.actor, session=self.session, detail=detail
            )
        except StoreError as exc:  # the change on disk stands; losing the audit line is logged
            log.warning("op log write failed for %s: %s", self.action, exc)


# Disk side: each runs in a worker thread.


def _make_staging(root: Path) -> Path:
    # A linked skills folder (the user's choice) is followed; a link to nowhere is not created.
    if root.is_symlink() and not root.exists():
        raise SkillInstallError(
            f"the skills folder {root} is a link to {os.readlink(root)}, which does not exist; "
            "create that folder or point skills.dir elsewhere"
        )
    try:
        root.mkdir(parents=True, exist_ok=True)
        # Inside the skills folder so the final rename stays on one filesystem (atomic).
        return Path(tempfile.mkdtemp(prefix=".upload-", dir=root))
    except OSError as exc:
        raise SkillInstallError(f"cannot prepare the skills folder {root}: {exc}") from None


def _refuse_replacing(target: Path, skill_name: str) -> None:
    """Without an admin's approval an installed skill is never overwritten."""
    if (target / SKILL_FILE).exists():  # links and non-skill folders: `_swap_in` explains
        raise SkillInstallError(
            f"a skill is already installed in {target.name}/; replacing it needs an admin's "
            f"approval: call skill_install again with name={target.name!r} (an admin will be "
            "asked), or pick another name. Nothing was changed"
        )


def _validate(staging: Path) -> SkillMeta:
    try:
        meta = parse_frontmatter((staging / SKILL_FILE).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise SkillInstallError("SKILL.md is not UTF-8 text; nothing was installed") from None
    except FrontmatterError as exc:
        raise SkillInstallError(f"SKILL.md is invalid: {exc}; nothing was installed") from None
    if not meta.description:
        raise SkillInstallError(
            "SKILL.md has no description; start it with a frontmatter block such as\n"
            "---\nname: my-skill\ndescription: What it does and when to use it.\n---"
        )
    if meta.name:
        _check_visible(meta.name)
        normal = unicodedata.normalize("NFKC", meta.name)
        if normal != meta.name:  # a look-alike of another name: say which one it is
            raise SkillInstallError(
                f"the skill name {meta.name!r} in SKILL.md is not in normal form (NFKC); write "
                f"it as {normal!r}. Nothing was installed"
            )
    return meta


def _swap_in(staging: Path, target: Path) -> bool:
    """Move ``staging`` to ``target``; an old version is set aside and restored on failure."""
    if target.is_symlink():
        raise SkillInstallError(
            f"{target.name!r} in the skills folder is a link to a folder elsewhere; "
            "nothing was changed. Update that folder by hand or pass another name"
        )
    if target.exists() and not (target / SKILL_FILE).is_file():
        raise SkillInstallError(
            f"{target.name!r} already exists in the skills folder and is not a skill "
            "(no SKILL.md); nothing was changed. Pass another name"
        )
    aside: Path | None = None
    if target.exists():
        aside = target.with_name(f".old-{target.name}-{secrets.token_hex(4)}")
        try:
            os.rename(target, aside)
        except OSError as exc:
            raise SkillInstallError(f"cannot replace {target.name}: {exc}") from None
    try:
        os.rename(staging, target)
    except OSError as exc:
        if aside is not None:
            os.rename(aside, target)
        raise SkillInstallError(f"cannot move the skill into place: {exc}") from None
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return aside is not None


def _delete(target: Path) -> None:
    try:
        if target.is_symlink() or target.is_file():
            target.unlink()  # a linked skill: drop the link, never the folder it points to
            return
        # ".del-" (not ".old-"): a removal cut short must never be "restored" at start.
        aside = target.with_name(f".del-{target.name}-{secrets.token_hex(4)}")
        os.rename(target, aside)  # gone from the registry's view at once
    except OSError as exc:
        raise SkillInstallError(f"cannot remove {target.name}: {exc}") from None
    shutil.rmtree(aside, ignore_errors=True)
