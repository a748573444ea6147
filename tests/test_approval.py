"""`ApprovalManager`: delivery, answers by id/session/word, timeout, cancel, per-session order."""

from __future__ import annotations

import asyncio

import pytest

from ania_nb import ApprovalRequest, Callbacks, UsageError
from ania_nb.governance.approval import ALLOW_WORDS, DENY_WORDS, ApprovalManager


class Inbox:
    """A request_approval callback that records requests and wakes waiters."""

    def __init__(self) -> None:
        self.requests: list[ApprovalRequest] = []
        self._arrived = asyncio.Condition()

    async def __call__(self, request: ApprovalRequest) -> None:
        async with self._arrived:
            self.requests.append(request)
            self._arrived.notify_all()

    async def wait_for(self, n: int) -> list[ApprovalRequest]:
        async with self._arrived:
            await asyncio.wait_for(self._arrived.wait_for(lambda: len(self.requests) >= n), 5)
        return list(self.requests)

    @property
    def callbacks(self) -> Callbacks:
        return Callbacks(request_approval=self)


def ask(manager: ApprovalManager, inbox: Inbox, session: str = "g:1", tool: str = "bash"):
    return asyncio.create_task(
        manager.request(
            session=session, tool=tool, summary=f"{tool} in {session}", callbacks=inbox.callbacks
        )
    )


async def test_request_is_delivered_and_answered_by_id():
    manager, inbox = ApprovalManager(timeout=30), Inbox()
    task = ask(manager, inbox)
    [request] = await inbox.wait_for(1)
    assert (request.session, request.tool, request.summary) == ("g:1", "bash", "bash in g:1")
    assert request.id and request.requester is None and request.admin_only is False
    assert manager.pending("g:1") == [request] and manager.pending("g:2") == []
    answered = manager.answer(request.id, allow=True, approver="qq:42")
    assert answered is request
    verdict = await task
    assert (verdict.allowed, verdict.reason, verdict.approver) == (
        True,
        "approved by qq:42",
        "qq:42",
    )
    assert manager.pending() == []


async def test_requester_and_admin_only_are_passed_through():
    manager, inbox = ApprovalManager(timeout=30), Inbox()
    task = asyncio.create_task(
        manager.request(
            session="g:1",
            tool="config_set",
            summary="x",
            callbacks=inbox.callbacks,
            requester="qq:7",
            admin_only=True,
        )
    )
    [request] = await inbox.wait_for(1)
    assert (request.requester, request.admin_only) == ("qq:7", True)
    manager.answer(session="g:1", allow=False)
    assert (await task).allowed is False


async def test_answer_by_session_with_a_reason():
    manager, inbox = ApprovalManager(timeout=30), Inbox()
    task = ask(manager, inbox, session="f:9")
    await inbox.wait_for(1)
    manager.answer(session="f:9", allow=False, reason="not on a Friday")
    verdict = await task
    assert (verdict.allowed, verdict.reason) == (False, "not on a Friday")


@pytest.mark.parametrize(
    ("word", "allowed"),
    [
        ("允许", True),
        ("同意", True),
        ("批准", True),
        ("allow", True),
        ("APPROVE", True),
        ("Yes", True),
        ("y", True),
        (" 允许 ", True),
        ("拒绝", False),
        ("deny", False),
        ("Reject", False),
        ("NO", False),
        ("n", False),
    ],
)
async def test_answer_words_including_chinese_case_insensitive(word, allowed):
    manager, inbox = ApprovalManager(timeout=30), Inbox()
    task = ask(manager, inbox)
    await inbox.wait_for(1)
    manager.answer(session="g:1", allow=word)
    assert (await task).allowed is allowed


async def test_unknown_word_is_a_usage_error_listing_the_words_and_keeps_waiting():
    manager, inbox = ApprovalManager(timeout=30), Inbox()
    task = ask(manager, inbox)
    await inbox.wait_for(1)
    with pytest.raises(UsageError) as info:
        manager.answer(session="g:1", allow="maybe")
    message = str(info.value)
    assert "'maybe' is not an answer" in message
    for word in ALLOW_WORDS | DENY_WORDS:
        assert word in message
    assert not task.done() and len(manager.pending("g:1")) == 1
    manager.answer(session="g:1", allow="同意")
    assert (await task).allowed is True


async def test_no_answer_within_the_timeout_denies_with_the_reason():
    manager, inbox = ApprovalManager(timeout=0.2), Inbox()
    verdict = await ask(manager, inbox)
    assert verdict.allowed is False
    assert verdict.reason == "no answer within 0.2 s, denied automatically"
    assert len(inbox.requests) == 1 and manager.pending() == []
    with pytest.raises(UsageError):
        manager.answer(inbox.requests[0].id, allow=True)  # too late: no longer pending


async def test_a_front_end_that_never_finishes_showing_the_request_still_times_out():
    async def hang(request: ApprovalRequest) -> None:
        await asyncio.sleep(60)

    manager = ApprovalManager(timeout=0.2)
    verdict = await asyncio.wait_for(
        manager.request(
            session="g:1", tool="bash", summary="x", callbacks=Callbacks(request_approval=hang)
        ),
        10,  # the manager's own timeout must end it long before this
    )
    assert verdict.allowed is False and "no answer within 0.2 s" in verdict.reason
    assert manager.pending() == []


async def test_a_failing_front_end_denies_with_the_cause():
    def broken(request: ApprovalRequest) -> None:
        raise ConnectionError("chat platform offline")

    manager = ApprovalManager(timeout=30)
    verdict = await manager.request(
        session="g:1", tool="bash", summary="x", callbacks=Callbacks(request_approval=broken)
    )
    assert verdict.allowed is False
    assert verdict.reason == "the approval request could not be shown: chat platform offline"
    assert manager.pending() == []


async def test_without_a_request_callback_it_is_denied_at_once():
    manager = ApprovalManager(timeout=30)
    verdict = await manager.request(session="g:1", tool="bash", summary="x", callbacks=Callbacks())
    assert verdict.allowed is False
    assert verdict.reason == "nobody can approve tool calls in this conversation"


async def test_cancel_denies_the_sessions_pending_request_only():
    manager, inbox = ApprovalManager(timeout=30), Inbox()
    mine, other = ask(manager, inbox, session="g:1"), ask(manager, inbox, session="g:2")
    await inbox.wait_for(2)
    assert manager.cancel("g:1") == 1
    verdict = await mine
    assert (verdict.allowed, verdict.reason) == (False, "stopped by the user")
    assert not other.done()
    assert manager.cancel("g:1") == 0
    manager.answer(session="g:2", allow=True)
    assert (await other).allowed is True


async def test_requests_of_one_session_are_serialised_but_other_sessions_are_not():
    manager, inbox = ApprovalManager(timeout=30), Inbox()
    first = ask(manager, inbox, session="g:1", tool="bash")
    [req1] = await inbox.wait_for(1)
    second = ask(manager, inbox, session="g:1", tool="file")
    third = ask(manager, inbox, session="g:2", tool="bash")
    requests = await inbox.wait_for(2)
    assert requests[1].session == "g:2"  # another session is not blocked
    for _ in range(5):
        await asyncio.sleep(0)
    assert [r.tool for r in manager.pending("g:1")] == ["bash"]  # the second one still waits
    assert len(inbox.requests) == 2
    manager.answer(session="g:1", allow=True)  # one pending per session: no id needed
    assert (await first).allowed is True
    requests = await inbox.wait_for(3)
    assert (requests[2].session, requests[2].tool) == ("g:1", "file")
    assert requests[2].id != req1.id
    manager.answer(session="g:1", allow="拒绝")
    manager.answer(session="g:2", allow="允许")
    assert (await second).allowed is False
    assert (await third).allowed is True


async def test_answering_with_nothing_pending_is_a_usage_error():
    manager = ApprovalManager(timeout=30)
    with pytest.raises(UsageError, match="no approval request is pending in session 'g:1'"):
        manager.answer(session="g:1", allow=True)
    with pytest.raises(UsageError, match="no pending approval request with id 'abc'"):
        manager.answer("abc", allow=True)
    with pytest.raises(UsageError, match="no approval request is pending"):
        manager.answer(allow=True)


async def test_two_sessions_pending_need_an_id_or_session():
    manager, inbox = ApprovalManager(timeout=30), Inbox()
    a, b = ask(manager, inbox, session="g:1"), ask(manager, inbox, session="g:2")
    requests = await inbox.wait_for(2)
    with pytest.raises(UsageError, match="answer one by its id"):
        manager.answer(allow=True)
    by_id = {r.session: r.id for r in requests}
    manager.answer(by_id["g:2"], allow=False)
    manager.answer(by_id["g:1"], allow=True)
    assert ((await a).allowed, (await b).allowed) == (True, False)


async def test_the_agent_answers_through_its_manager(make_agent):
    agent = make_agent()
    inbox = Inbox()
    task = ask(agent.approvals, inbox, session="nb:x")
    [request] = await inbox.wait_for(1)
    assert agent.answer_approval(session="nb:x", allow="yes", approver="me") is request
    assert (await task).approver == "me"


async def test_agent_approval_timeout_comes_from_config(make_agent):
    agent = make_agent(overrides={"approval.timeout": 15})
    assert agent.approvals.timeout == 15


async def test_allow_for_session_never_covers_admin_only_requests():
    manager = ApprovalManager(timeout=0.2)
    manager.allow_for_session("s", "config_set")
    asked: list[object] = []
    verdict = await manager.request(
        session="s",
        tool="config_set",
        summary="x",
        callbacks=Callbacks(request_approval=asked.append),
        admin_only=True,
    )
    assert len(asked) == 1  # asked again despite the session allowance
    assert not verdict.allowed  # and denied on timeout, since nobody answered
