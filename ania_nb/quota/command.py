"""``/quota``: a session's usage today, and (admins only) resetting counters from a chat.

``/quota`` shows the session's and everyone's tokens today against the limits; ``/quota reset``
clears this session's counter, ``/quota reset <session>`` another's and ``/quota reset all``
everyone's. Resetting needs an admin (the local notebook user is one); every reset is written
to the op log with the sender as the actor.
"""

from __future__ import annotations

from collections.abc import Callable

from .quota import Quota

HELP = "/quota [reset [SESSION|all]]: today's token usage and limits; admins may reset"
USAGE = "usage: /quota | /quota reset [SESSION|all]"


async def quota_command(
    quota: Quota,
    is_admin: Callable[[str | None], bool],
    session: str,
    args: str,
    sender: str | None,
) -> str:
    """Answer ``/quota <args>`` in ``session`` from ``sender``."""
    words = args.split()
    if not words:
        return await _status(quota, session)
    if words[0] != "reset" or len(words) > 2:
        return USAGE
    if not is_admin(sender):
        return "only an admin may reset quota counters"
    target = words[1] if len(words) == 2 else session
    everyone = target == "all"
    cleared = await quota.reset(None if everyone else target, actor=sender or "local")
    who = "every session" if everyone else target
    return f"reset today's token counter of {who} ({cleared:,} tokens cleared)"


async def _status(quota: Quota, session: str) -> str:
    report = await quota.report(days=1, session=session)
    if not report.enabled:
        return "token counting is off (quota.enable = false)"
    mine = report.sessions[0].total if report.sessions else 0
    lines = [f"tokens today in {session}: {mine:,}" + _limit(report.session_limit, mine)]
    lines.append(
        f"all sessions today: {report.global_used:,}"
        + _limit(report.global_limit, report.global_used)
    )
    if report.fallback_model:  # what answers once a limit is used up, and how much it did
        lines.append(
            f"once used up, {report.fallback_model} answers: {report.fallback_used:,} today"
            + _limit(report.fallback_limit, report.fallback_used)
        )
    lines.append(f"the day resets at {report.resets_at:%H:%M} {report.timezone}")
    return "\n".join(lines)


def _limit(limit: int, used: int) -> str:
    if not limit:
        return " (no limit)"
    return f" of {limit:,} ({used / limit:.0%})"
