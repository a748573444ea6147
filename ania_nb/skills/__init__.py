"""Skills: ``SKILL.md`` task guides the model reads on demand, and the tools to manage them.

Example::

    from ania_nb.skills import SkillManager, skill_tools

    manager = SkillManager("skills", whitelist=[])
    await manager.reload()                  # a missing folder means no skills
    prompt = manager.registry_prompt()      # "" when there are none
    tools = skill_tools(manager, self_manage=False)
"""

from ania_nb.skills.archive import ArchiveLimits
from ania_nb.skills.errors import SkillInstallError
from ania_nb.skills.frontmatter import FrontmatterError, SkillMeta, parse_frontmatter
from ania_nb.skills.install import Installed, SkillInstaller
from ania_nb.skills.manager import Skill, SkillLoadError, SkillManager
from ania_nb.skills.tools import skill_tools

__all__ = [
    "ArchiveLimits",
    "FrontmatterError",
    "Installed",
    "Skill",
    "SkillInstallError",
    "SkillInstaller",
    "SkillLoadError",
    "SkillManager",
    "SkillMeta",
    "parse_frontmatter",
    "skill_tools",
]
