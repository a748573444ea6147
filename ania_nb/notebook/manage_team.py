"""``%ania team``: list, create and delete saved agent teams (global scope or this notebook's).

The AI can only save teams of its own session; ``global`` teams — whose roles every session's
``team_run`` may use — are made here or through `ania_nb.agents.team_store.TeamStore`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from IPython.core.error import UsageError

if TYPE_CHECKING:  # pragma: no cover
    from .extension import NotebookState

USAGE = (
    "usage: %ania team list | create [--session] NAME MEMBER[=ROLE] … [--desc TEXT] | "
    "delete [--session] NAME   (global scope unless --session: this notebook's session)"
)


async def team_command(state: NotebookState, args: list[str]) -> None:
    """Run ``%ania team …`` (see `USAGE`)."""
    from ..agents.team_store import GLOBAL_SCOPE, TeamError, TeamStore
    from ..agents.team_tools import format_teams

    sub, rest = (args[0], args[1:]) if args else ("list", [])
    scope = GLOBAL_SCOPE
    if "--session" in rest:
        rest = [a for a in rest if a != "--session"]
        scope = state.default_session
    teams = TeamStore(await state.agent().host.open_store())
    try:
        if sub == "list" and not rest:
            session = state.default_session
            shown = [
                format_teams(await teams.list(GLOBAL_SCOPE), "global teams"),
                format_teams(await teams.list(session), f"teams of {session}"),
            ]
            print("\n\n".join(shown))
        elif sub == "create" and rest:
            name, members, description = _create_args(rest)
            team = await teams.create(scope, name, members, description=description)
            print(f"saved team {team.name} in {scope} ({len(team.members)} members)")
        elif sub == "delete" and len(rest) == 1:
            if await teams.delete(scope, rest[0]):
                print(f"deleted team {rest[0].strip()} from {scope}")
            else:
                print(f"no team named {rest[0]!r} in {scope}")
        else:
            raise UsageError(USAGE)
    except TeamError as exc:
        raise UsageError(str(exc)) from None


def _create_args(words: list[str]) -> tuple[str, list[dict[str, str]], str]:
    """NAME, members (``name=role`` or ``name``) and ``--desc TEXT`` from the words."""
    description = ""
    if "--desc" in words:
        at = words.index("--desc")
        if at + 1 >= len(words):
            raise UsageError("--desc needs a text (quote it if it has spaces)")
        description = words[at + 1]
        words = words[:at] + words[at + 2 :]
    if len(words) < 2:
        raise UsageError(f"a team needs a name and at least one member\n{USAGE}")
    members = []
    for word in words[1:]:
        name, _, role = word.partition("=")
        members.append({"name": name, "role": role})
    return words[0], members, description
