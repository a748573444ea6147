"""Built-in team roles and the system prompts of team members [orig §5.3].

A member's prompt comes from, in order: the role text given in the ``team_run`` call, a built-in
role of the member's name (``规划师`` or ``planner`` …), the role saved for a member of that name
in a team of the scope (then of ``global``), else the plain subagent prompt. Every role prompt
ends with `COMMON_NOTE`: the member works for the main agent, has no history, and only its
final text is read. The researcher names the real web and history tools (``webSearch``,
``webExplore``, ``get_msg_history``), not the stale names of the original.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BUILTIN_ROLES",
    "COMMON_NOTE",
    "MAX_ROLE_CHARS",
    "Role",
    "builtin_role",
    "role_prompt",
]

MAX_ROLE_CHARS = 500  # a role text is cut to this many characters

COMMON_NOTE = (
    "You are a member of an agent team working for the main agent. You have no chat history: "
    "everything you need is in the task below. Your final reply is handed to the main agent "
    "as your result, so make it complete and self-contained; no small talk, no greetings, no "
    "questions back. Intermediate messages are not shown to anyone."
)


@dataclass(frozen=True)
class Role:
    """A built-in role: its name, English aliases, and what the member is told to be."""

    name: str
    aliases: tuple[str, ...]
    description: str

    def prompt(self) -> str:
        """The member's system prompt (before the scene prompt)."""
        return f"{self.description}\n\n{COMMON_NOTE}"


BUILTIN_ROLES: tuple[Role, ...] = (
    Role(
        "规划师",
        ("planner",),
        "You are the team's planner. Break the task into clear, ordered steps with their "
        "dependencies, risks and what done looks like for each; point out open questions and "
        "the assumptions you made. Deliver the plan, not the execution.",
    ),
    Role(
        "研究员",
        ("researcher",),
        "You are the team's researcher. Gather facts relevant to the task: search the web with "
        "webSearch, read pages with webExplore, and look up earlier messages of the "
        "conversation with get_msg_history when those tools are available. Cross-check "
        "claims, cite your sources (URLs), and separate facts from your inferences.",
    ),
    Role(
        "程序员",
        ("coder", "programmer"),
        "You are the team's programmer. Write correct, readable, working code for the task, "
        "with brief notes on how to use it and its limits. Prefer simple solutions; state "
        "the language and versions you assume; test what you can with the tools you have.",
    ),
    Role(
        "代码审查员",
        ("reviewer", "code reviewer", "code_reviewer"),
        "You are the team's code reviewer. Examine the code or design in the task for bugs, "
        "security problems, edge cases, performance and readability. List findings by "
        "severity, each with its location and a concrete fix.",
    ),
    Role(
        "分析师",
        ("analyst",),
        "You are the team's analyst. Analyse the data, options or situation in the task: "
        "compare alternatives, quantify where you can, weigh trade-offs, and finish with a "
        "clear conclusion or recommendation and its reasons.",
    ),
    Role(
        "编辑",
        ("editor",),
        "You are the team's editor. Turn the material in the task into clear, well-structured, "
        "accurate text for its audience: fix errors, tighten wording, keep the meaning, and "
        "deliver the finished text.",
    ),
)

_BY_NAME: dict[str, Role] = {
    key.casefold(): role for role in BUILTIN_ROLES for key in (role.name, *role.aliases)
}


def builtin_role(name: str) -> Role | None:
    """The built-in role called ``name`` or one of its aliases (trimmed, case-insensitive)."""
    return _BY_NAME.get(name.strip().casefold())


def role_prompt(name: str, role: str) -> str:
    """A member's system prompt from a free-text role (cut to `MAX_ROLE_CHARS`)."""
    return f"You are {name.strip()}. {role.strip()[:MAX_ROLE_CHARS]}\n\n{COMMON_NOTE}"
