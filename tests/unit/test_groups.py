"""A consumer group member's decisions (client/groups.py), without a server."""

from __future__ import annotations

import grpc
import pytest

from liftbridge_provider.client.errors import LiftbridgeTimeoutError
from liftbridge_provider.client.groups import (
    POLL_SECONDS,
    AfterFailure,
    Call,
    ConsumerError,
    Membership,
    Progress,
    ReadBudget,
    group_cursor,
    start_of,
)
from liftbridge_provider.client.messages import StartPosition


def joined(fetch_interval: float | None = None) -> Membership:
    member = Membership("g", "c1", ("orders",), fetch_interval)
    member.on_joined("b1", 7, 15_000_000_000, 10_000_000_000, now=100.0)
    return member


def test_the_cursor_and_the_fetch_interval_follow_go_liftbridge() -> None:
    assert group_cursor("billing") == "__group:billing"
    member = joined()
    assert (member.consumer_timeout, member.coordinator_timeout) == (15.0, 10.0)
    assert member.interval() == 0.4 * 15.0
    assert joined(fetch_interval=1.5).interval() == 1.5


def test_assignments_start_and_stop_what_changed_and_a_new_epoch_restarts_everything() -> None:
    member = joined()
    first = member.on_assignments(7, {"orders": [0, 1]}, 101.0, frozenset())
    assert first.start == frozenset({("orders", 0), ("orders", 1)})
    assert (first.stop, first.epoch) == (frozenset(), 7)
    running = frozenset(first.start)
    same_epoch = member.on_assignments(7, {"orders": [1, 2]}, 102.0, running)
    assert same_epoch.start == frozenset({("orders", 2)})
    assert same_epoch.stop == frozenset({("orders", 0)})
    running = frozenset({("orders", 1), ("orders", 2)})
    new_epoch = member.on_assignments(9, {"orders": [1, 2]}, 103.0, running)
    assert (new_epoch.start, new_epoch.stop) == (running, running), "subscriptions carry the epoch"
    assert member.epoch == 9


def test_failed_fetches_relearn_report_once_rejoin_or_retry() -> None:
    member = joined()
    assert (
        member.on_fetch_failed(grpc.StatusCode.NOT_FOUND, "consumer group does not exist", 101.0) is AfterFailure.REJOIN
    )
    not_member = member.on_fetch_failed(
        grpc.StatusCode.FAILED_PRECONDITION, "consumer is not a member of the consumer group", 101.0
    )
    assert not_member is AfterFailure.REJOIN
    moved = member.on_fetch_failed(
        grpc.StatusCode.FAILED_PRECONDITION, "broker is not the consumer group coordinator", 101.0
    )
    assert moved is AfterFailure.RELEARN
    assert member.on_fetch_failed(grpc.StatusCode.UNAVAILABLE, "down", 105.0) is AfterFailure.RETRY
    assert member.on_fetch_failed(grpc.StatusCode.UNAVAILABLE, "down", 111.0) is AfterFailure.REPORT, (
        "silent 11 s > 10 s"
    )
    assert member.on_fetch_failed(grpc.StatusCode.UNAVAILABLE, "down", 112.0) is AfterFailure.RELEARN, "reported once"
    assert member.on_group_metadata("b2", 8) is True
    assert (member.coordinator, member.epoch) == ("b2", 8)
    assert member.on_group_metadata("b2", 8) is False


def test_a_rejoin_told_already_a_member_learns_the_group_instead_and_other_failures_retry() -> None:
    """A NOT_FOUND fetch from a node that had not applied the new group, then "already a
    member" on the rejoin, left the member out of its group for good."""
    member = joined()
    assert (
        member.on_fetch_failed(grpc.StatusCode.NOT_FOUND, "consumer group does not exist", 101.0) is AfterFailure.REJOIN
    )
    member.left()
    assert (member.joined, member.coordinator) == (False, None)
    already = "consumer is already a member of the consumer group"
    assert member.on_join_failed(grpc.StatusCode.FAILED_PRECONDITION, already) is AfterFailure.RELEARN
    assert member.on_join_failed(grpc.StatusCode.UNAVAILABLE, "down") is AfterFailure.RETRY
    assert member.on_join_failed(grpc.StatusCode.NOT_FOUND, "stream does not exist") is AfterFailure.RETRY
    crossed = "consumer group already exists"  # another member's first join created the group meanwhile
    assert member.on_join_failed(grpc.StatusCode.FAILED_PRECONDITION, crossed) is AfterFailure.REJOIN
    after = member.after_join_failure
    assert [after(grpc.StatusCode.FAILED_PRECONDITION, crossed, n) for n in (1, 2, 3)] == [
        AfterFailure.REJOIN,
        AfterFailure.REJOIN,
        AfterFailure.RETRY,
    ], "joins again at once at most JOIN_ATTEMPTS times"
    assert after(grpc.StatusCode.UNAVAILABLE, "down", 1) is AfterFailure.RETRY
    # a join the server applied whose answer was lost, sent again: a member already, at any attempt
    assert after(grpc.StatusCode.FAILED_PRECONDITION, already, 1) is AfterFailure.RELEARN
    assert after(grpc.StatusCode.FAILED_PRECONDITION, already, 3) is AfterFailure.RELEARN
    assert member.on_group_metadata("b3", 9) is True
    assert (member.joined, member.coordinator, member.epoch) == (True, "b3", 9)
    assert member.on_group_metadata("", 10) is True
    assert (member.joined, member.coordinator) == (False, None), "no coordinator named: join again"


def test_a_partition_starts_after_the_committed_offset_else_from_auto_offset() -> None:
    assert start_of(41, "none", "g", ("orders", 0)) == StartPosition.at_offset(42)
    assert start_of(-1, "earliest", "g", ("orders", 0)) == StartPosition.earliest()
    assert start_of(-1, "latest", "g", ("orders", 0)) == StartPosition.new_only()
    with pytest.raises(ConsumerError, match=r"no committed position on orders/3 and auto_offset='none'"):
        start_of(-1, "none", "g", ("orders", 3))


def test_progress_checkpoints_only_what_moved_past_the_stored_offset() -> None:
    progress = Progress()
    progress.resumed(("orders", 0), 9)
    progress.resumed(("orders", 1), -1)
    progress.mark(("orders", 0), 9)
    progress.mark(("orders", 1), 4)
    progress.mark(("orders", 1), 2)  # an older offset never moves it back
    assert progress.due() == {("orders", 1): (4, -1)}
    progress.stored(("orders", 1), 4)
    assert progress.due() == {}


def test_progress_checkpoints_from_where_the_member_last_saw_the_cursor() -> None:
    """A checkpoint moves a cursor from the member's last view of it: the committed offset read at assignment
    (a later read never takes that view back), the offset it stored, or where another writer moved it."""
    progress = Progress()
    orders = ("orders", 0)
    progress.mark(orders, 3)
    assert progress.due() == {orders: (3, None)}, "never saw the cursor"
    progress.resumed(orders, 1)
    progress.mark(orders, 9)
    assert progress.due() == {orders: (9, 1)}
    progress.stored(orders, 9)
    progress.resumed(orders, 5)  # a read that crossed its own checkpoint
    assert progress.seen[orders] == 9
    progress.mark(orders, 12)
    progress.moved(orders, 20)  # another member read on and committed 20
    assert progress.due() == {}, "nothing to move: the cursor is past what this member processed"
    progress.mark(orders, 25)
    assert progress.due() == {orders: (25, 20)}


def test_a_read_budget_counts_idle_time_from_the_last_message_not_from_each_poll() -> None:
    budget = ReadBudget(timeout=None, idle_timeout=1.5, started=100.0)
    assert budget.wait(100.0) == POLL_SECONDS
    for now in (100.2, 100.4, 101.0, 101.4):  # polls come and go: the idle time keeps adding up
        budget.check(now)
    assert budget.wait(101.4) == pytest.approx(0.1)
    with pytest.raises(LiftbridgeTimeoutError, match=r"no message for 1.5s"):
        budget.check(101.5)
    budget.delivered(101.6)
    budget.check(102.0)
    overall = ReadBudget(timeout=2.0, idle_timeout=None, started=0.0)
    assert overall.wait(1.9) == pytest.approx(0.1)
    with pytest.raises(LiftbridgeTimeoutError, match=r"timed out after 2s"):
        overall.check(2.0)


def test_a_closing_member_only_heartbeats_and_never_joins_again() -> None:
    """A member that closes keeps fetching its assignments (its heartbeat) until it left, so the group does
    not drop it before its checkpoint; meanwhile an answer starts and stops nothing, a failed fetch changes
    nothing, and once it left it does not join again."""
    member = joined()
    running = frozenset({("orders", 0)})
    member.on_assignments(7, {"orders": [0]}, 101.0, frozenset())
    member.close()
    assert member.next_call() is Call.FETCH
    rebalance = member.on_assignments(8, {"orders": [0, 1]}, 102.0, running)
    assert (rebalance.start, rebalance.stop) == (frozenset(), frozenset())
    assert member.last_answer == 102.0, "the answer still counts as the coordinator's"
    assert member.on_fetch_failed(grpc.StatusCode.NOT_FOUND, "consumer group does not exist", 103.0) is (
        AfterFailure.RETRY
    )
    member.left()
    assert member.next_call() is Call.NONE
    assert joined().next_call() is Call.FETCH
    out = joined()
    out.left()
    assert out.next_call() is Call.JOIN, "a member that is not closing joins again"
