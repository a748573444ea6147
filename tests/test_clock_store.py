"""The clock's tables (ania_nb.clock.store) on a real SQLite file: ids, order, log limits."""

from __future__ import annotations

from typing import Any

import pytest

from ania_nb.clock.runner import trigger_text
from ania_nb.clock.store import ClockStore, base36
from ania_nb.store import Store, ToolCallRecord

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends


def fields(**changes: Any) -> dict[str, Any]:
    """Checked task fields as `Clock.create` hands them to the store."""
    base = {
        "cron": "@daily",
        "title": "t",
        "content": "c",
        "target": "nb:x",
        "run_once": 0,
        "timeout": 0.0,
        "created_by": "",
        "creator": "api",
        "note": "",
        "next_run_at": None,
    }
    return {**base, **changes}


def test_ids_are_base_36():
    assert [base36(n) for n in (0, 1, 35, 36, 1295, 1296)] == ["0", "1", "z", "10", "zz", "100"]


async def test_ids_count_up_in_base_36_and_lists_keep_creation_order(tmp_path):
    store = await Store.open(tmp_path)
    try:
        clock = ClockStore(store.db)
        made = [(await clock.create(fields(title=f"t{i}")))[0] for i in range(37)]
        assert [t.id for t in made[-3:]] == ["z", "10", "11"]  # not sorted as text
        assert [t.id for t in await clock.list()] == [t.id for t in made]
        assert await clock.revision() == 37
    finally:
        await store.close()


async def test_a_log_entry_keeps_20_tool_calls_and_cuts_long_text(tmp_path):
    store = await Store.open(tmp_path)
    try:
        clock = ClockStore(store.db)
        task, _ = await clock.create(fields(content="x" * 2000))
        begun = await clock.begin_run(task.id, trigger_text, manual=True, scheduled_at=None)
        assert begun is not None
        _, entry = begun
        assert len(entry.trigger) == 500 and entry.trigger.endswith("…")
        calls = [ToolCallRecord("tool", "a" * 900, "r" * 3000, None, 5) for _ in range(25)]
        await clock.add_tool_calls(entry.id, calls[:10])
        await clock.add_tool_calls(entry.id, calls[10:])
        done = await clock.finish_run(
            entry.id, "success", usage={"total_tokens": 7, "iterations": 2}, reply="y" * 5000
        )
        assert done is not None
        assert len(done.tool_calls) == 20 and done.tool_calls_total == 25
        assert len(done.tool_calls[0].arguments) == 500 and len(done.tool_calls[0].result) == 1000
        assert done.reply is not None and len(done.reply) == 1000
        assert (done.total_tokens, done.iterations) == (7, 2)
        after = await clock.get(task.id)
        assert after is not None and after.last_status == "success"
        assert after.last_run_at == entry.started_at
    finally:
        await store.close()


async def test_a_scheduled_run_of_a_disabled_or_deleted_task_logs_nothing(tmp_path):
    store = await Store.open(tmp_path)
    try:
        clock = ClockStore(store.db)
        task, _ = await clock.create(fields())
        await clock.update(task.id, {"enabled": 0, "next_run_at": None})
        assert await clock.begin_run(task.id, trigger_text, manual=False, scheduled_at=1.0) is None
        manual = await clock.begin_run(task.id, trigger_text, manual=True, scheduled_at=None)
        assert manual is not None  # a manual run works on a disabled task
        await clock.delete(task.id)
        assert await clock.begin_run(task.id, trigger_text, manual=True, scheduled_at=None) is None
        assert len(await clock.logs()) == 1
    finally:
        await store.close()
