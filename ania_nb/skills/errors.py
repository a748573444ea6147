"""The errors of the skills tier (defined with the rest of the tree in `ania_nb.errors`)."""

from __future__ import annotations

from ania_nb.errors import FrontmatterError, SkillError, SkillInstallError

__all__ = ["FrontmatterError", "SkillError", "SkillInstallError"]
