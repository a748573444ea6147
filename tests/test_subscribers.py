"""`Subscribers`, under the outbox and the clock's events: every subscriber gets every item."""

from __future__ import annotations

import logging

import pytest

from ania_nb.orchestration.outbox import Delivery, Outbox
from ania_nb.orchestration.subscribers import Subscribers


async def test_each_subscriber_gets_the_item_and_a_failing_one_is_only_logged(caplog) -> None:
    subscribers: Subscribers[str] = Subscribers("note")
    got: list[str] = []

    def broken(item: str) -> None:
        raise RuntimeError("boom")

    async def later(item: str) -> None:
        got.append(f"async {item}")

    subscribers.subscribe(got.append)
    subscribers.subscribe(broken)
    stop = subscribers.subscribe(later)
    assert len(subscribers) == 3
    with caplog.at_level(logging.ERROR):
        assert await subscribers.publish("a", "first") == 2  # the broken one did not take it
    assert got == ["a", "async a"]
    assert "a subscriber failed to take a first note" in caplog.text and "boom" in caplog.text
    stop()
    stop()  # twice: no error
    assert await subscribers.publish("b") == 1 and got[-1] == "b" and len(subscribers) == 2


async def test_the_outbox_counts_the_subscribers_that_took_a_delivery() -> None:
    outbox = Outbox()
    delivery = Delivery("nb:a", "done", "clock")
    assert await outbox.publish(delivery) == 0
    taken: list[Delivery] = []
    stop = outbox.subscribe(taken.append)
    outbox.subscribe(lambda d: 1 / 0)
    assert await outbox.publish(delivery) == 1 and taken == [delivery]
    assert outbox.subscribers == 2
    stop()
    assert outbox.subscribers == 1


@pytest.mark.parametrize("what", ["clock event", "delivery"])
def test_what_names_the_items(what: str) -> None:
    assert Subscribers(what).what == what
