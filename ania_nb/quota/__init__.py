"""Usage accounting: daily token quotas per session and for everyone, costs, usage reports.

Tokens are counted call by call, in the usage ledger, with the run step that stores each call's
result (``ania_nb.store.usage``); `Quota` checks the
limits before work, resets counters, prunes old ones and builds the `UsageReport` the notebook
view and ``ania-nb usage`` show.
"""

from .days import day_of, next_midnight
from .pricing import cost, usage_cost
from .quota import Denial, Fallback, Quota
from .report import DayUsage, ModelUsage, SessionUsage, UsageReport

__all__ = [
    "DayUsage",
    "Denial",
    "Fallback",
    "ModelUsage",
    "Quota",
    "SessionUsage",
    "UsageReport",
    "cost",
    "day_of",
    "next_midnight",
    "usage_cost",
]
