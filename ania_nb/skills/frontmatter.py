"""SKILL.md frontmatter: the YAML block between two ``---`` lines that names and describes a skill.

Compatible with the Agent Skills / Claude Code convention: only ``name`` and ``description``
are used; other keys (``license``, ``allowed-tools``, ``metadata`` …) are accepted and ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ania_nb.errors import FrontmatterError

__all__ = ["FrontmatterError", "SkillMeta", "one_line", "parse_frontmatter"]

_FENCE = "---"
_SPACE_RE = re.compile(r"\s+")


@dataclass(frozen=True)
class SkillMeta:
    """What the frontmatter says about a skill (empty strings when a key is absent)."""

    name: str = ""
    description: str = ""


def one_line(text: str) -> str:
    """Collapse all whitespace runs (newlines included) to single spaces."""
    return _SPACE_RE.sub(" ", text).strip()


def parse_frontmatter(text: str) -> SkillMeta:
    """Read ``name``/``description`` from a SKILL.md text; no frontmatter gives empty meta.

    Raises `FrontmatterError` for an unclosed block, invalid YAML, a non-mapping block, or a
    ``name``/``description`` that is not text.
    """
    import yaml  # imported here: loading skills is the only user of YAML at startup

    lines = text.lstrip("\ufeff").lstrip().splitlines()
    if not lines or lines[0].rstrip() != _FENCE:
        return SkillMeta()
    # The block ends at the next line that is exactly "---", so "---" inside a value is fine.
    closing = next((i for i, line in enumerate(lines) if i and line.rstrip() == _FENCE), None)
    if closing is None:
        raise FrontmatterError("the frontmatter starts with '---' but has no closing '---' line")
    block = "\n".join(lines[1:closing])
    try:
        data = yaml.safe_load(block) if block.strip() else {}
    except yaml.YAMLError as exc:
        raise FrontmatterError(f"the frontmatter is not valid YAML: {_yaml_reason(exc)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise FrontmatterError(
            f"the frontmatter must be a YAML mapping (name: ..., description: ...), "
            f"got {type(data).__name__}"
        )
    return SkillMeta(name=_text(data, "name"), description=_text(data, "description"))


def _text(data: dict[object, object], key: str) -> str:
    value = data.get(key)
    if value is None:
        return ""
    # YAML turns `name: 2048` or `name: yes` into int/bool; those are still readable names.
    if isinstance(value, bool | int | float):
        value = str(value)
    if not isinstance(value, str):
        raise FrontmatterError(f"frontmatter '{key}' must be text, got a {type(value).__name__}")
    return one_line(value)


def _yaml_reason(exc: Exception) -> str:
    # PyYAML messages span lines with a source excerpt; keep problem and position on one line.
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f" (frontmatter line {mark.line + 1}, column {mark.column + 1})" if mark else ""
    return f"{one_line(str(problem))}{where}"
