"""``%ania history [list|show [SESSION]|clear [SESSION]]`` and ``%%agent --new``'s archive.

``--new`` never deletes: the old conversation moves to ``<session>~<date-time>`` (listed by
``%ania history list``, readable with ``show``, continued with ``%%agent -s NAME``); only
``%ania history clear`` deletes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from IPython.core.error import UsageError

from ..session_keys import archive_key, archived_from
from ..text import flatten
from ._identity import NAMESPACE

if TYPE_CHECKING:  # pragma: no cover
    from ..agent import Agent
    from .extension import NotebookState

USAGE = "usage: %ania history [list | show [SESSION] | clear [SESSION]]"


async def history_command(state: NotebookState, args: list[str]) -> None:
    """Run ``%ania history …`` (``args`` without the word ``history``); prints its answer."""
    sub, rest = (args[0], args[1:]) if args else ("show", [])
    if sub not in ("list", "show", "clear") or len(rest) > 1 or (sub == "list" and rest):
        raise UsageError(USAGE)
    agent = state.agent()
    current = await state.identify()
    if sub == "list":
        await _list(agent, current)
        return
    session = rest[0] if rest else current
    if sub == "clear":
        removed = await agent.clear_history(session)
        print(f"removed {removed} messages from {session}")
        return
    messages = await agent.history(session)
    if not messages:
        print(f"{session} has no history")
    for m in messages:
        content = m.get("content") or ""
        if not isinstance(content, str):  # multi-part content (text and images)
            content = " ".join(
                str(p.get("text", "[image]")) for p in content if isinstance(p, dict)
            )
        if m.get("tool_calls"):
            content += " → " + ", ".join(c["function"]["name"] for c in m["tool_calls"])
        print(f"{m['role']:>9}: {flatten(str(content), 200)}")


async def _list(agent: Agent, current: str) -> None:
    store = await agent.host.open_store()
    sessions = await store.history.sessions()
    if current not in sessions:
        sessions.append(current)
    paths = {k: v.get("path") for k, v in await store.kv(NAMESPACE).items() if isinstance(v, dict)}
    print(f"{'':2}{'session':<32} {'messages':>8}  notebook")
    for session in sorted(sessions, key=lambda s: (s != current, s)):
        count = await store.history.count(session)
        path = paths.get(archived_from(session))  # archives belong to their notebook too
        mark = "* " if session == current else "  "
        print(f"{mark}{session:<32} {count:>8}  {Path(path).name if path else ''}".rstrip())
    print("* this notebook's conversation; %%agent -s SESSION continues another one")


async def archive_history(agent: Agent, session: str) -> str | None:
    """Move the session's conversation to ``<session>~<date-time>``; return that name.

    Nothing moves (None) when the session is empty. The copy is written before the original is
    cleared, so a failure in between leaves the messages in both places, never in neither.
    """
    messages = await agent.history(session)
    if not messages:
        return None
    store = await agent.host.open_store()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    archive, n = archive_key(session, stamp), 1
    while await store.history.count(archive):  # two --new in one second: never overwrite
        n += 1
        archive = archive_key(session, f"{stamp}-{n}")
    await store.history.replace(archive, messages)
    await agent.clear_history(session)
    return archive
