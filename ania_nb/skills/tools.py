"""The model's skill tools: reading and reloading always; listing, installing, removing opt-in.

``skill_read``/``skill_reload`` are always given; ``skill_list``/``skill_install``/
``skill_remove`` only when the AI may manage skills itself (``skills.self_manage``). Skills are
shared — a skill's name and description reach every chat's system prompt — so every install,
replacement and removal waits for an admin's approval (``needs_admin_approval``, which the tool
gate asks; the requester cannot approve). Installing a name that was removed before is an
install like any other: it asks too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from ania_nb._preview import visible
from ania_nb.errors import ToolError
from ania_nb.text import cut
from ania_nb.tools.base import BaseTool, Tool, ToolContext

from .errors import SkillInstallError
from .frontmatter import FrontmatterError, parse_frontmatter
from .install import SkillInstaller, check_dir_name
from .manager import SKILL_FILE, Skill, SkillManager

if TYPE_CHECKING:
    import httpx2

    from ania_nb.store import OpLog

__all__ = [
    "SkillInstallTool",
    "SkillListTool",
    "SkillReadTool",
    "SkillReloadTool",
    "SkillRemoveTool",
    "skill_tools",
]

MAX_READ_CHARS = 16000
MAX_PARSED_CHARS = 256 * 1024  # larger SKILL.md text is refused by the installer anyway
SUMMARY_CONTENT_CHARS = 4000  # SKILL.md text shown to the admin who approves a replacement
MAX_LISTED = 200  # attachments listed per section; a vendored tree must not flood the context
CATEGORY = "ai"  # op-log category of AI-originated changes; the actor is the requesting user


log = logging.getLogger(__name__)


def _truncated(text: str, what: str, path: str, extra: str = "") -> str:
    def hint(left_out: int) -> str:
        return (
            f"\n\n[{what} truncated: showing {len(text) - left_out} of {len(text)} characters. "
            f"Read the rest with bash from {path}{extra}.]"
        )

    return cut(text, MAX_READ_CHARS, marker=hint)


def _listed(lines: list[str]) -> str:
    if len(lines) <= MAX_LISTED:
        return "\n".join(lines)
    return "\n".join([*lines[:MAX_LISTED], f"- … and {len(lines) - MAX_LISTED} more"])


def _find(manager: SkillManager, name: str) -> Skill:
    skill = manager.get(name)
    if skill is None:
        names = manager.names()
        if not names:
            raise ToolError(f"no skill named {name!r}; no skills are installed")
        raise ToolError(f"no skill named {name!r}; available skills: {', '.join(names)}")
    return skill


def _counts(skill: Skill) -> str:
    refs, files = len(skill.references), len(skill.files)
    return f"location {skill.location}, references {refs}, files {files}"


class _NoParams(BaseModel):
    """No parameters."""


class SkillReadParams(BaseModel):
    """Parameters of skill_read."""

    skill_name: str = Field(
        description="Name of the skill from the skills registry; an empty string lists all skills"
    )
    file_name: str = Field(
        "",
        description="A reference document of the skill (path as listed by skill_read) to read "
        "instead of SKILL.md",
    )


class SkillReadTool(BaseTool[SkillReadParams]):
    """Read a skill's full instructions (SKILL.md) before doing a task the skill covers.

    Pass file_name to read one of the skill's reference documents. An empty skill_name lists
    the installed skills.
    """

    name = "skill_read"

    def __init__(self, manager: SkillManager) -> None:
        """Read from ``manager``'s registry."""
        self.manager = manager

    async def execute(self, params: SkillReadParams, ctx: ToolContext) -> str:
        """Return SKILL.md (with its attachment lists) or one reference document."""
        name = params.skill_name.strip()
        if not name:
            return self.manager.listing()
        skill = _find(self.manager, name)
        rel = params.file_name.strip().replace("\\", "/").removeprefix("./")
        if rel and rel != SKILL_FILE:
            return await self._reference(skill, rel)
        extra = ", or read the references listed below with file_name" if skill.references else ""
        parts = [_truncated(skill.content, SKILL_FILE, str(skill.path), extra)]
        if skill.references or skill.files:
            parts.append("---")
        if skill.references:
            parts.append(
                "## References (read one with skill_read: skill_name="
                f'"{skill.name}", file_name="<path>")\n'
                + _listed([f"- {rel}" for rel in skill.references])
            )
        if skill.files:
            parts.append(
                "## Files (read or run them with bash, e.g. `sh <path>` or `python <path>`)\n"
                + _listed([f"- {rel} → {path}" for rel, path in skill.files.items()])
            )
        return "\n\n".join(parts)

    async def _reference(self, skill: Skill, rel: str) -> str:
        path = skill.references.get(rel)
        if path is None:
            if rel in skill.files:
                raise ToolError(
                    f"{rel!r} of skill {skill.name!r} is not a reference document but a file at "
                    f"{skill.files[rel]}; read or run it with bash"
                )
            if not skill.references:
                raise ToolError(f"skill {skill.name!r} has no reference documents")
            raise ToolError(
                f"skill {skill.name!r} has no reference {rel!r}; its references: "
                f"{', '.join(skill.references)}"
            )
        try:
            text = await asyncio.to_thread(path.read_text, encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ToolError(
                f"cannot read {rel!r} of skill {skill.name!r}: {exc.strerror or exc}; if the "
                "skill changed on disk, run skill_reload"
            ) from None
        return _truncated(text, rel, str(path))


class SkillReloadTool(BaseTool[_NoParams]):
    """Reload all skills from disk, e.g. after editing skill files with bash."""

    name = "skill_reload"

    def __init__(
        self, manager: SkillManager, changed: Callable[[], Awaitable[object]] | None = None
    ) -> None:
        """Refresh ``manager``; tell ``changed`` (the other replicas reload the folder too)."""
        self.manager = manager
        self.changed = changed

    async def execute(self, params: _NoParams, ctx: ToolContext) -> str:
        """Reload and report the loaded and the skipped skills."""
        await self.manager.refresh()
        if self.changed is not None:
            try:
                await self.changed()
            except Exception:
                log.warning("the other replicas could not be told to reload", exc_info=True)
        names = self.manager.names()
        text = (
            f"Skills reloaded from {self.manager.dir.absolute()}: {len(names)} "
            f"skill{'' if len(names) == 1 else 's'}: [{', '.join(names)}]"
        )
        return text + _broken(self.manager)


def _broken(manager: SkillManager) -> str:
    errors = manager.errors
    if not errors:
        return ""
    lines = [f"- {e.path}: {e.reason}" for e in errors]
    return "\nSkipped (fix these files, then run skill_reload):\n" + "\n".join(lines)


class SkillListTool(BaseTool[_NoParams]):
    """List the installed skills with their location and attachment counts."""

    name = "skill_list"  # read-only, so plan mode lets it through

    def __init__(self, manager: SkillManager) -> None:
        """List ``manager``'s skills."""
        self.manager = manager

    async def execute(self, params: _NoParams, ctx: ToolContext) -> str:
        """Return one line per skill, then any skipped ones."""
        skills = list(self.manager.skills.values())
        if skills:
            lines = [f"Installed skills ({len(skills)}):"]
            lines += [f"- {s.name}: {s.description} ({_counts(s)})" for s in skills]
            text = "\n".join(lines)
        else:
            text = (
                "No skills are installed. Search the web (webSearch/webExplore) for a skill "
                "repository or zip link and install it with skill_install(url=...), or write "
                "one with skill_install(content=<the full SKILL.md>)."
            )
        if self.manager.whitelist:
            text += f"\nOnly these skills may load (whitelist): {', '.join(self.manager.whitelist)}"
        return text + _broken(self.manager)


class SkillInstallParams(BaseModel):
    """Parameters of skill_install (give url or content, not both)."""

    url: str = Field(
        "",
        description="A zip URL, a GitHub repository URL https://github.com/<owner>/<repo>, or a "
        "SKILL.md URL ending in .md",
    )
    content: str = Field(
        "",
        description="The full SKILL.md text instead of a URL: a frontmatter block with name and "
        "description between --- lines, then the instructions",
    )
    name: str = Field("", description="Folder to install into (default: the frontmatter name)")


class SkillInstallTool(BaseTool[SkillInstallParams]):
    """Install a skill from a URL or from SKILL.md text; it is active at once.

    Every install waits for an admin's approval. To replace an installed skill, pass its folder
    as name.
    """

    name = "skill_install"
    side_effects = True

    def __init__(self, installer: SkillInstaller) -> None:
        """Install through ``installer``."""
        self.installer = installer

    def _target(self, arguments: Mapping[str, Any]) -> str | None:
        """The folder the call installs into, when it is known before downloading."""
        name = str(arguments.get("name") or "")
        content = str(arguments.get("content") or "")
        url = str(arguments.get("url") or "").strip()
        if not name.strip() and content and not url and len(content) <= MAX_PARSED_CHARS:
            try:
                name = parse_frontmatter(content).name or ""
            except FrontmatterError:
                return None
        try:
            return check_dir_name(name) if name.strip() else None
        except SkillInstallError:
            return None

    def _installed(self, folder: str) -> bool:
        manager = self.installer.manager
        if any(s.folder is not None and s.folder.name == folder for s in manager.skills.values()):
            return True
        if any(e.path.startswith(f"{folder}/") for e in manager.errors):
            return True
        return (manager.dir / folder / SKILL_FILE).exists()  # one stat: a skill not loaded yet

    def _replaces(self, arguments: Mapping[str, Any]) -> bool:
        """Whether the call would overwrite an installed skill (known before downloading)."""
        target = self._target(arguments)
        return target is not None and self._installed(target)

    def needs_admin_approval(self, arguments: Mapping[str, Any]) -> bool:
        """Every install waits for an admin (the gate asks): skills are shared by every chat."""
        return True

    def approval_summary(self, arguments: Mapping[str, Any]) -> str:
        """What the approver sees: which skill is replaced, and the source in full."""
        target = self._target(arguments)
        if target is not None and self._installed(target):
            head = f"skill_install REPLACES the installed skill in {visible(target + '/')} with"
        else:
            head = "skill_install installs a new skill from"
        url = str(arguments.get("url") or "")
        if url.strip():
            return f"{head} the download {visible(url)}"
        content = str(arguments.get("content") or "")
        shown = cut(
            content,
            SUMMARY_CONTENT_CHARS,
            marker=lambda more: f"\n… ({more} more characters not shown)",
        )
        return f"{head} this SKILL.md ({len(content)} characters):\n{shown}"

    async def execute(self, params: SkillInstallParams, ctx: ToolContext) -> str:
        """Install, then describe the active skill."""
        # Overwriting is allowed only when the gate asked an admin about this very replacement.
        replace = ctx.approved and self._replaces(params.model_dump())
        try:
            done = await self.installer.install(
                url=params.url,
                content=params.content,
                name=params.name,
                actor=ctx.sender,
                session=ctx.session,
                category=CATEGORY,
                replace=replace,
            )
        except SkillInstallError as exc:
            raise ToolError(str(exc)) from None
        skill = done.skill
        verb = "updated" if done.replaced else "installed"
        return (
            f"Skill {skill.name!r} {verb} and active: {skill.description} ({_counts(skill)}). "
            f"Read it with skill_read before using it."
        )


class SkillRemoveParams(BaseModel):
    """Parameters of skill_remove."""

    name: str = Field(description="The skill's name (for a skill that failed to load: its folder)")


class SkillRemoveTool(BaseTool[SkillRemoveParams]):
    """Delete an installed skill and its files."""

    name = "skill_remove"
    side_effects = True

    def __init__(self, installer: SkillInstaller) -> None:
        """Remove through ``installer``."""
        self.installer = installer

    def needs_admin_approval(self, arguments: Mapping[str, Any]) -> bool:
        """Every removal waits for an admin (the gate asks): skills are shared by every chat."""
        return True

    def approval_summary(self, arguments: Mapping[str, Any]) -> str:
        """What the admin sees: the skill that is deleted, where, and what it is for."""
        name = str(arguments.get("name") or "").strip()
        head = f"skill_remove DELETES the skill {visible(name)} and its files"
        skill = self.installer.manager.get(name)
        if skill is None:
            return f"{head} (no loaded skill has that name: a folder that failed to load, or none)"
        return f"{head}: {visible(skill.description)} ({_counts(skill)})"

    async def execute(self, params: SkillRemoveParams, ctx: ToolContext) -> str:
        """Remove, then say what is left."""
        try:
            removed = await self.installer.remove(
                params.name, actor=ctx.sender, session=ctx.session, category=CATEGORY
            )
        except SkillInstallError as exc:
            raise ToolError(str(exc)) from None
        where = removed.location if isinstance(removed, Skill) else f"{removed.name}/"
        left = len(self.installer.manager)
        return f"Skill {params.name.strip()!r} removed ({where}); {left} skills remain."


def skill_tools(
    manager: SkillManager,
    *,
    self_manage: bool,
    oplog: OpLog | None = None,
    http_client: httpx2.AsyncClient | None = None,
    installer: SkillInstaller | None = None,
    allow_private_hosts: Iterable[str] = (),
    changed: Callable[[], Awaitable[object]] | None = None,
) -> list[Tool]:
    """The skill tools for ``manager``, sorted by name; admin tools only with ``self_manage``.

    ``allow_private_hosts``: non-public addresses/networks downloads may reach (tests, intranet);
    ``changed``: told after each install and removal (`SkillInstaller`).
    """
    tools: list[Tool] = [SkillReadTool(manager), SkillReloadTool(manager, changed)]
    if self_manage:
        if installer is None:
            installer = SkillInstaller(
                manager,
                http_client=http_client,
                oplog=oplog,
                allow_private_hosts=allow_private_hosts,
                changed=changed,
            )
        tools += [SkillListTool(manager), SkillInstallTool(installer), SkillRemoveTool(installer)]
    return sorted(tools, key=lambda t: t.name)
