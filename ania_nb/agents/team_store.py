"""Saved agent teams: named groups of role-described members, kept per scope in the store.

Teams live in the KV namespace ``team`` under ``<scope>:<name>``. The AI's scope is its session
key (``g:<id>``, ``f:<id>``, ``nb:<name>`` …); the ``global`` scope is written only through this
API or ``%ania team``. Rules [orig §5.3]: a team name is 1–20 letters, digits, ``_`` or
``-`` (any script) after trimming; at most 20 teams per scope; 1–10 members with trimmed,
non-empty, unique names; roles trimmed and cut to 500 characters. Creating a team that exists
is an error (delete it first) — nothing stored is ever replaced.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from ..session_keys import GLOBAL
from ..store.db import to_json, transaction
from .roles import MAX_ROLE_CHARS

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store
    from ..store.db import Conn

__all__ = [
    "GLOBAL_SCOPE",
    "MAX_DESCRIPTION_CHARS",
    "MAX_MEMBERS",
    "MAX_NAME_CHARS",
    "MAX_TEAMS_PER_SCOPE",
    "NAMESPACE",
    "Team",
    "TeamError",
    "TeamMember",
    "TeamStore",
    "check_members",
    "check_scope",
    "check_team_name",
]

NAMESPACE = "team"
GLOBAL_SCOPE = GLOBAL  # teams every session may run (`ania_nb.session_keys`)
MAX_NAME_CHARS = 20
MAX_TEAMS_PER_SCOPE = 20
MAX_MEMBERS = 10
MAX_DESCRIPTION_CHARS = 500


class TeamError(UsageError):
    """A team or member is invalid, a limit is reached, or the team exists already."""


@dataclass(frozen=True)
class TeamMember:
    """One member of a saved team: a name and the role it plays (may be empty)."""

    name: str
    role: str = ""

    def to_dict(self) -> dict[str, str]:
        """Plain-dict form, as stored."""
        return {"name": self.name, "role": self.role}


@dataclass(frozen=True)
class Team:
    """A saved team."""

    scope: str
    name: str
    members: tuple[TeamMember, ...]
    description: str = ""
    created_at: float = 0.0

    @property
    def key(self) -> str:
        """Its key in the ``team`` namespace."""
        return f"{self.scope}:{self.name}"

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form, as stored."""
        return {
            "scope": self.scope,
            "name": self.name,
            "description": self.description,
            "members": [m.to_dict() for m in self.members],
            "created_at": self.created_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Team:
        """Rebuild a team from its stored form."""
        members = tuple(
            TeamMember(str(m.get("name", "")), str(m.get("role", "")))
            for m in data.get("members", [])
            if isinstance(m, Mapping)
        )
        return cls(
            scope=str(data.get("scope", "")),
            name=str(data.get("name", "")),
            members=members,
            description=str(data.get("description", "")),
            created_at=float(data.get("created_at", 0.0) or 0.0),
        )


def check_team_name(name: object) -> str:
    """The trimmed name if it is 1–20 Unicode letters, digits, ``_`` or ``-``; else `TeamError`."""
    if not isinstance(name, str):
        raise TeamError(f"team name must be a string, got {type(name).__name__}")
    trimmed = name.strip()
    if not trimmed:
        raise TeamError("team name is empty; use 1-20 letters, digits, '_' or '-'")
    if len(trimmed) > MAX_NAME_CHARS:
        raise TeamError(
            f"team name {trimmed!r} has {len(trimmed)} characters (at most {MAX_NAME_CHARS})"
        )
    # The original's ^[\p{L}\p{N}_-]{1,20}$: the stdlib re has no \p, Unicode categories do.
    for char in trimmed:
        if char not in "_-" and unicodedata.category(char)[0] not in "LN":
            raise TeamError(
                f"team name {trimmed!r} contains {char!r}; use only letters, digits, '_' or '-'"
            )
    return trimmed


def check_scope(scope: object) -> str:
    """A scope is ``global`` or a session key: a non-empty string without surrounding spaces."""
    if not isinstance(scope, str) or not scope.strip() or scope != scope.strip():
        raise TeamError(f"team scope must be 'global' or a session key, got {scope!r}")
    return scope


def check_members(members: Iterable[TeamMember | Mapping[str, Any]]) -> tuple[TeamMember, ...]:
    """Members trimmed and checked (1–10, names non-empty and unique, roles cut to 500)."""
    checked: list[TeamMember] = []
    seen: set[str] = set()
    for i, raw in enumerate(members, 1):
        if isinstance(raw, TeamMember):
            name, role = raw.name, raw.role
        elif isinstance(raw, Mapping):
            name, role = raw.get("name", ""), raw.get("role", "") or ""
        else:
            raise TeamError(f"member {i} must be an object with name and role")
        if not isinstance(name, str) or not isinstance(role, str):
            raise TeamError(f"member {i}: name and role must be strings")
        name = name.strip()
        if not name:
            raise TeamError(f"member {i} has an empty name")
        if name in seen:
            raise TeamError(f"member {i}: the name {name!r} is used twice; names must be unique")
        seen.add(name)
        checked.append(TeamMember(name, role.strip()[:MAX_ROLE_CHARS]))
    if not checked:
        raise TeamError("a team needs at least one member")
    if len(checked) > MAX_MEMBERS:
        raise TeamError(f"a team has at most {MAX_MEMBERS} members, got {len(checked)}")
    return tuple(checked)


class TeamStore:
    """The saved teams of one store (KV namespace ``team``)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._kv = store.kv(NAMESPACE)

    async def create(
        self,
        scope: str,
        name: str,
        members: Iterable[TeamMember | Mapping[str, Any]],
        *,
        description: str = "",
        actor: str | None = None,
    ) -> Team:
        """Save a new team; `TeamError` if invalid, over the scope's limit or already there."""
        scope, name = check_scope(scope), check_team_name(name)
        if not isinstance(description, str):
            raise TeamError("team description must be a string")
        team = Team(
            scope=scope,
            name=name,
            members=check_members(members),
            description=description.strip()[:MAX_DESCRIPTION_CHARS],
            created_at=time.time(),
        )
        problem = await self._store.db.run(
            _insert, team.key, _prefix(scope), to_json(team.to_dict())
        )
        if problem == "exists":
            raise TeamError(
                f"team {name!r} already exists in scope {scope}; delete it first to replace it"
            )
        if problem == "full":
            raise TeamError(
                f"scope {scope} already has {MAX_TEAMS_PER_SCOPE} teams (the limit); "
                "delete one first"
            )
        await self._log("create", team, actor, f"{len(team.members)} members")
        return team

    async def get(self, scope: str, name: str) -> Team | None:
        """The team ``name`` of ``scope``, or None."""
        scope = check_scope(scope)
        try:
            key = f"{scope}:{check_team_name(name)}"
        except TeamError:
            return None  # no team can have an invalid name
        data = await self._kv.get(key)
        return Team.from_dict(data) if isinstance(data, Mapping) else None

    async def list(self, scope: str) -> list[Team]:
        """The teams of ``scope`` (not of scopes nested under it), sorted by name."""
        prefix = _prefix(check_scope(scope))
        return [
            Team.from_dict(data)
            for key, data in await self._kv.items(prefix)
            if ":" not in key[len(prefix) :] and isinstance(data, Mapping)
        ]

    async def delete(self, scope: str, name: str, *, actor: str | None = None) -> bool:
        """Remove the team; whether it existed."""
        team = await self.get(scope, name)
        if team is None or not await self._kv.delete(team.key):
            return False
        await self._log("delete", team, actor, "")
        return True

    async def find_role(self, scopes: Iterable[str], member: str) -> tuple[Team, TeamMember] | None:
        """The first saved member called ``member`` with a role, searching scopes in order."""
        wanted = member.strip()
        for scope in scopes:
            for team in await self.list(scope):
                for candidate in team.members:
                    if candidate.name == wanted and candidate.role:
                        return team, candidate
        return None

    async def _log(self, action: str, team: Team, actor: str | None, detail: str) -> None:
        session = None if team.scope == GLOBAL_SCOPE else team.scope
        text = f"{team.scope}:{team.name}" + (f" ({detail})" if detail else "")
        await self._store.oplog.add("team", action, actor=actor, session=session, detail=text)


def _prefix(scope: str) -> str:
    return f"{scope}:"


# Store operation: check and insert in one write transaction, so two creations at once
# (parallel tool calls, another process) can neither overwrite each other nor pass the limit.
async def _insert(conn: Conn, key: str, prefix: str, raw: str) -> str:
    async with transaction(conn):
        # Per scope: on PostgreSQL two creations would otherwise both count 19 and both insert.
        await conn.lock(f"teams:{prefix}")
        if await conn.fetchone("SELECT 1 FROM kv WHERE ns = ? AND key = ?", (NAMESPACE, key)):
            return "exists"
        rows = await conn.fetchall(
            "SELECT key FROM kv WHERE ns = ? AND substr(key, 1, ?) = ?",
            (NAMESPACE, len(prefix), prefix),
        )
        count = sum(1 for (k,) in rows if ":" not in k[len(prefix) :])
        if count >= MAX_TEAMS_PER_SCOPE:
            return "full"
        await conn.execute(
            "INSERT INTO kv (ns, key, value, updated_at) VALUES (?, ?, ?, ?)",
            (NAMESPACE, key, raw, time.time()),
        )
    return ""
