"""SKILL.md frontmatter: the YAML block between two ``---`` lines that names and describes a skill.

Compatible with the Agent Skills / Claude Code convention: only ``name`` and ``description``
are used; other keys (``license``, ``allowed-tools``, ``metadata`` …) are accepted and ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ania_nb.errors import FrontmatterError

__all__ = ["FrontmatterError", "SkillMeta", "one_line", "parse_frontmatter"]

_FENCE = "---"
_SPACE_RE = re.compile(r"\s+")
# Bounds that keep a hostile SKILL.md from exhausting the parser: real frontmatter is a few
# short keys, so these are far above any honest use.
MAX_FRONTMATTER_BYTES = 64 * 1024
MAX_DEPTH = 64  # nesting of lists/mappings; PyYAML's composer recurses per level
MAX_NODES = 10_000  # nodes after expanding every alias ("billion laughs" stays small on disk)


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
    size = len(block.encode("utf-8", "surrogatepass"))
    if size > MAX_FRONTMATTER_BYTES:
        raise FrontmatterError(
            f"the frontmatter is {size} bytes, more than the limit of {MAX_FRONTMATTER_BYTES}"
        )
    try:
        data = _load_bounded(yaml, block) if block.strip() else {}
    except yaml.YAMLError as exc:
        raise FrontmatterError(f"the frontmatter is not valid YAML: {_yaml_reason(exc)}") from None
    except RecursionError:  # a last resort; the depth bound normally stops it first
        raise FrontmatterError(
            f"the frontmatter nests too deeply (more than {MAX_DEPTH} levels)"
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise FrontmatterError(
            f"the frontmatter must be a YAML mapping (name: ..., description: ...), "
            f"got {type(data).__name__}"
        )
    return SkillMeta(name=_text(data, "name"), description=_text(data, "description"))


def _load_bounded(yaml: Any, block: str) -> object:
    """``yaml.safe_load`` with the nesting depth and the alias-expanded size bounded."""

    class Loader(yaml.SafeLoader):  # type: ignore[misc,name-defined]
        depth = 0

        def compose_node(self, parent: object, index: object) -> object:
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise FrontmatterError(
                        f"the frontmatter nests too deeply (more than {MAX_DEPTH} levels)"
                    )
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    loader = Loader(block)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded_size(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_expanded_size(root: Any) -> None:
    """Refuse a node graph whose alias-expanded size exceeds `MAX_NODES` or that holds a cycle.

    Aliases make the composed graph share nodes, so its size on disk says nothing about the
    size of what it stands for; sizes are counted per distinct node with memoisation.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            on_path.discard(key)
            total = 1 + sum(sizes[id(child)] for child in children)
            if total > MAX_NODES:
                raise FrontmatterError(
                    f"the frontmatter expands to more than {MAX_NODES} values "
                    "(YAML aliases repeat the same block over and over)"
                )
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise FrontmatterError(
                "the frontmatter refers to itself (a YAML alias in its own anchor)"
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)


def _children(node: Any) -> list[Any]:
    value = node.value
    if isinstance(value, list):  # sequence: nodes; mapping: (key, value) pairs
        return [part for item in value for part in (item if isinstance(item, tuple) else (item,))]
    return []


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
