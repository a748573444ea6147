"""The durable inbox and outbox: unique keys, effects riding with a run's steps, states, pruning."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ania_nb.errors import UsageError
from ania_nb.store import InboxRow, InboxState, OutboxRow, Store
from ania_nb.store.db import Conn
from ania_nb.store.mailbox import owner_text
from ania_nb.store.owner import Owner

pytestmark = pytest.mark.usefixtures("backend")  # every test on both store backends

USER = {"role": "user", "content": "hi"}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "data")
    yield s
    await s.close()


def row(key: str, session: str = "f:1", text: str = "hello") -> InboxRow:
    return InboxRow("onebot", "10000", key, session, "qq:1", {"text": text})


async def test_a_key_is_accepted_once_and_its_duplicate_writes_nothing(store: Store) -> None:
    first = await store.inbox.accept(row("m1"))
    again = await store.inbox.accept(
        row("m1", text="re-sent"), [OutboxRow("f:1", "notice", {"text": "must not exist"})]
    )
    other_account = await store.inbox.accept(InboxRow("onebot", "20000", "m1", "f:1", None, {}))
    assert first is not None and again is None and other_account not in (None, first)
    stored = await store.inbox.list()
    assert [(e.message_key, e.account, e.payload) for e in stored] == [
        ("m1", "10000", {"text": "hello"}),
        ("m1", "20000", {}),
    ]
    assert await store.outbox.list() == []  # the duplicate's effects were not written


async def test_accept_with_effects_is_one_transaction(store: Store) -> None:
    inbox_id = await store.inbox.accept(
        row("cmd"), [InboxState((), "answered"), OutboxRow("f:1", "reply", {"text": "done"})]
    )
    assert inbox_id is not None
    entry = await store.inbox.get(inbox_id)
    assert entry is not None and entry.state == "answered"
    [out] = await store.outbox.list()
    assert (out.session, out.kind, out.payload, out.state) == (
        "f:1",
        "reply",
        {"text": "done"},
        "pending",
    )


async def test_a_runs_begin_and_finish_carry_the_inbox_and_the_reply(store: Store) -> None:
    ids = tuple([i for k in ("a", "b") if (i := await store.inbox.accept(row(k))) is not None])
    run_id, _ = await store.journal.begin(
        "f:1",
        "go",
        sender="qq:1",
        message=USER,
        load_history=False,
        effects=[InboxState(ids, "running")],
    )
    running = await store.inbox.list(states=["running"])
    assert [(e.id, e.run_id) for e in running] == [(i, run_id) for i in ids]
    await store.journal.finish(
        "f:1",
        run_id,
        "success",
        reply="hi",
        effects=[InboxState(ids, "answered"), OutboxRow("f:1", "reply", {"text": "hi"})],
    )
    assert {e.state for e in await store.inbox.list()} == {"answered"}
    [out] = await store.outbox.list()
    assert out.run_id == run_id and out.payload == {"text": "hi"}


async def test_a_final_inbox_row_is_never_reopened(store: Store) -> None:
    inbox_id = await store.inbox.accept(row("x"))
    assert inbox_id is not None
    await store.inbox.update([InboxState((inbox_id,), "answered")])
    await store.inbox.update([InboxState((inbox_id,), "running", run_id=7)])
    entry = await store.inbox.get(inbox_id)
    assert entry is not None and (entry.state, entry.run_id) == ("answered", None)


async def test_outbox_claims_in_id_order_per_session_and_recovers_sending_as_uncertain(
    store: Store,
) -> None:
    ids = [
        await store.outbox.add(OutboxRow(s, "text", {"n": n}))
        for n, s in enumerate(["f:1", "f:2", "f:1", "f:1"])
    ]
    assert await store.outbox.sessions_pending() == ["f:1", "f:2"]
    first = await store.outbox.claim("f:1")
    assert first is not None and (first.id, first.state, first.attempts) == (ids[0], "sending", 1)
    second = await store.outbox.mark(first.id, "sent", claim_next="f:1")  # one round trip
    assert second is not None and second.id == ids[2]
    await store.outbox.mark(second.id, "pending")  # provably never written: back in line
    again = await store.outbox.claim("f:1")
    assert again is not None and (again.id, again.attempts) == (ids[2], 2)
    assert await store.outbox.recover() == []  # its claimer (this process) is alive: left to it
    # a crash now (its claimer is gone): the row being sent may have reached the platform
    dead = owner_text(Owner(socket.gethostname(), 999999999, "gone"))

    async def died(conn: Conn) -> None:
        await conn.execute("UPDATE outbox SET owner = ? WHERE state = 'sending'", (dead,))

    await store.db.run(died)
    uncertain = await store.outbox.recover()
    assert [e.id for e in uncertain] == [ids[2]]
    states = {e.id: e.state for e in await store.outbox.list()}
    assert states == {ids[0]: "sent", ids[1]: "pending", ids[2]: "uncertain", ids[3]: "pending"}
    nxt = await store.outbox.claim("f:1")
    assert nxt is not None and nxt.id == ids[3]  # the uncertain row is never claimed again
    assert await store.outbox.claim("f:9") is None


async def test_prune_removes_only_old_final_rows(store: Store, tmp_path: Path) -> None:
    old_done = await store.inbox.accept(row("old-done"))
    old_pending = await store.inbox.accept(row("old-pending"))
    assert old_done is not None and old_pending is not None
    await store.inbox.update([InboxState((old_done,), "answered")])
    sent = await store.outbox.add(OutboxRow("f:1", "reply", {}))
    waiting = await store.outbox.add(OutboxRow("f:1", "reply", {}))
    await store.outbox.claim("f:1")
    await store.outbox.mark(sent, "sent")
    week_ago = time.time() - 8 * 86400

    async def age(conn: Conn) -> None:
        await conn.execute("UPDATE inbox SET received_at = ?", (week_ago,))
        await conn.execute("UPDATE outbox SET created_at = ?", (week_ago,))

    await store.db.run(age)
    fresh = await store.inbox.accept(row("fresh"))
    await store.inbox.update([InboxState((fresh,), "answered")]) if fresh else None
    assert await store.inbox.prune(7 * 86400) == 1
    assert await store.outbox.prune(7 * 86400) == 1
    assert {e.message_key for e in await store.inbox.list()} == {"old-pending", "fresh"}
    assert [e.id for e in await store.outbox.list()] == [waiting]
    # the pruned key may come again (outside the window it is a new message)
    assert await store.inbox.accept(row("old-done")) is not None


async def test_bad_effects_are_refused_before_anything_is_written(store: Store) -> None:
    with pytest.raises(UsageError, match="inbox state"):
        await store.inbox.update([InboxState((1,), "lost")])  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="needs a session"):
        await store.outbox.add(OutboxRow("", "reply", {}))
    with pytest.raises(UsageError, match="JSON-serialisable"):
        await store.outbox.add(OutboxRow("f:1", "reply", {"x": object()}))
    with pytest.raises(UsageError, match="outbox state"):
        await store.outbox.mark(1, "gone")  # type: ignore[arg-type]
    assert await store.outbox.list() == [] and await store.inbox.list() == []


async def test_side_effects_mark_is_on_the_run_record(store: Store) -> None:
    run_id, _ = await store.journal.begin(
        "f:1", "go", sender=None, message=USER, load_history=False
    )
    await store.journal.mark_side_effects(run_id)

    async def flag(conn: Conn) -> int:
        return (
            await conn.fetchone("SELECT side_effects_started FROM runs WHERE id = ?", (run_id,))
        )[0]

    assert await store.db.run(flag) == 1


async def test_rows_confirmed_sent_are_marked_by_the_next_accept(store: Store) -> None:
    claimed = OutboxRow("f:1", "reply", {"text": "hi"}, claimed=True)
    sent_id = await store.outbox.add(claimed)
    assert (await store.outbox.get(sent_id)).state == "sending"  # type: ignore[union-attr]
    store.outbox.confirm(sent_id)
    with pytest.raises(UsageError, match="JSON-serialisable"):  # a failed accept marks nothing
        await store.inbox.accept(InboxRow("onebot", "10000", "bad", "f:1", None, {"x": {1, 2}}))
    assert (await store.outbox.get(sent_id)).state == "sending"  # type: ignore[union-attr]
    assert await store.inbox.accept(row("m1")) is not None  # ... and gave them back to this one
    assert (await store.outbox.get(sent_id)).state == "sent"  # type: ignore[union-attr]
    assert store.outbox.take_confirmed() == []
    with pytest.raises(UsageError, match="only a claimed outbox row"):
        store.outbox.entry(OutboxRow("f:1", "notice"), 1)


async def test_two_processes_claiming_one_row_never_both_get_it(backend: str, store: Store) -> None:
    """A second claimer that picked the same row while the first held it gets nothing."""
    if store.db.dialect.name != "postgres":
        pytest.skip("one writer at a time on SQLite: nothing to race")
    import asyncio

    from ania_nb.store.mailbox import _claim_row

    row_id = await store.outbox.add(OutboxRow("f:1", "reply", {"text": "once"}))
    held, release = asyncio.Event(), asyncio.Event()

    async def first(conn: Conn) -> int | None:
        await conn.execute("BEGIN")
        claimed = await _claim_row(conn, "f:1", time.time())
        held.set()
        await release.wait()  # PostgreSQL only: the operation may wait with its transaction open
        await conn.execute("COMMIT")
        return None if claimed is None else claimed.id

    first_claim = asyncio.ensure_future(store.db.run(first))
    await held.wait()
    # The second picks the same row (the first's update is not visible yet), then waits on it.
    second_claim = asyncio.ensure_future(store.outbox.claim("f:1"))
    await asyncio.sleep(0.2)  # let it reach the row lock (with the fix, None either way)
    release.set()
    assert await first_claim == row_id
    assert await second_claim is None  # re-checked after the first committed: not pending
    row = await store.outbox.get(row_id)
    assert row is not None and (row.state, row.attempts) == ("sending", 1)
