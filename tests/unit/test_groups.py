"""A consumer group member's decisions (client/groups.py), without a server."""

from __future__ import annotations

import grpc

from liftbridge_provider.client.groups import AfterFailure, Membership, group_cursor


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
