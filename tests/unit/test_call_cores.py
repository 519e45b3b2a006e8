"""The sans-I/O cores shared by the sync and asyncio clients: call plans and the subscription state.

Pure logic, driven here by scripted outcomes (no server): the same decisions
the real front ends carry out against Liftbridge in tests/server.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from types import MappingProxyType
from typing import Any

import grpc
import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import (
    InvalidArgumentError,
    LiftbridgeError,
    LiftbridgeTimeoutError,
    NoSuchStreamError,
    PartitionPausedError,
    StreamExistsError,
    UnavailableError,
    admin_plans,
    cursor_plans,
    not_sent,
    partition_plans,
    plans,
)
from liftbridge_provider.client.addresses import KnownAddresses, broker_addresses, leader_first
from liftbridge_provider.client.health import HEALTH, Signal
from liftbridge_provider.client.metadata import BrokerInfo, Metadata, PartitionInfo, StreamInfo
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.publish import plans as publish_plans
from liftbridge_provider.client.reading import NoLeaderYet, Reopen, SubscriptionState, Verdict
from liftbridge_provider.client.requests import CURSORS_STREAM
from liftbridge_provider.client.retry import Deadline
from tests.unit.plan_driving import Rpc, drive

CONFIG = ClientConfig(brokers=("10.0.0.1:9292",), liveness_interval=30)


@pytest.fixture(autouse=True)
def no_suspected_brokers() -> Iterator[None]:
    """Each test starts and ends with no broker suspected (the health model is process-wide)."""
    HEALTH.clear()
    yield
    HEALTH.clear()


def snapshot(leader: str | None = "a", paused: bool = False, streams: tuple[str, ...] = ("s",)) -> Metadata:
    brokers = {b: BrokerInfo(b, f"{b}.example", 9292) for b in ("a", "b")}
    info = PartitionInfo("s", 0, leader, ("a", "b"), ("a", "b"), 9, 9, paused, False)
    stream = StreamInfo("s", "s", MappingProxyType({0: info}), 0)
    return Metadata(MappingProxyType(brokers), MappingProxyType({n: stream for n in streams}), 0.0)


def no_sleep(action: plans.PlanAction) -> None:
    if isinstance(action, plans.Sleep):
        return
    raise AssertionError(f"unexpected {action}")


# -- unary plans ----------------------------------------------------------------------------------


def test_leader_call_follows_a_moved_leader() -> None:
    moved = snapshot(leader="b")

    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            if action.address.startswith("a."):
                raise Rpc(grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader")
            return "ok from b"
        if isinstance(action, plans.Refresh):
            return moved
        return no_sleep(action)

    result, seen = drive(
        plans.leader_call(CONFIG, snapshot(), lambda s, t: None, Deadline(5), stream="s", partition=0), answer
    )
    assert result == "ok from b"
    assert [type(a).__name__ for a in seen] == ["Attempt", "Sleep", "Refresh", "Attempt"]


def test_a_refusing_leader_with_the_paused_flag_is_a_paused_partition() -> None:
    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            raise Rpc(grpc.StatusCode.FAILED_PRECONDITION, "The request should be sent to partition leader")
        if isinstance(action, plans.Refresh):
            return snapshot(paused=True)
        return no_sleep(action)

    with pytest.raises(PartitionPausedError):
        drive(plans.leader_call(CONFIG, snapshot(), lambda s, t: None, Deadline(5), stream="s", partition=0), answer)


def test_partition_metadata_of_a_paused_partition_comes_from_the_leaders_view() -> None:
    view = api.FetchMetadataResponse(
        brokers=[api.Broker(id="a", host="a.example", port=9292)],
        streamMetadata=[
            api.StreamMetadata(
                name="s",
                subject="s",
                partitions={0: api.PartitionMetadata(id=0, leader="a", highWatermark=41, paused=True)},
            )
        ],
    )
    calls: list[str] = []

    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            calls.append(action.address)
            if len(calls) == 1:
                raise Rpc(grpc.StatusCode.FAILED_PRECONDITION, "The request should be sent to partition leader")
            return view  # the FetchMetadata asked of the leader itself
        if isinstance(action, plans.Refresh):
            return snapshot(paused=True)
        return no_sleep(action)

    info, _ = drive(partition_plans.partition_metadata(CONFIG, snapshot(), Deadline(5), "s", 0), answer)
    assert (info.high_watermark, info.paused) == (41, True)
    assert calls == ["a.example:9292", "a.example:9292"]


def failing_first(error: grpc.RpcError, attempts: list[plans.Attempt], pause: float = 0.0) -> Any:
    """An ``answer`` for :func:`drive` whose first attempt raises ``error`` (after ``pause`` s); the next answer."""

    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            attempts.append(action)
            if len(attempts) == 1:
                time.sleep(pause)
                raise error
            return "answered"
        return no_sleep(action)

    return answer


def test_an_attempt_gets_at_most_half_the_call_and_a_hung_one_is_retried_elsewhere() -> None:
    deadline = Deadline(20)
    # make the first attempt's own time run out at once: a tiny budget for it
    deadline.attempt_budget = lambda: 0.001  # type: ignore[method-assign]
    answer = failing_first(Rpc(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), [], pause=0.01)
    result, _ = drive(plans.any_broker(CONFIG, snapshot(), lambda s, t: None, deadline), answer)
    assert result == "answered"
    assert Deadline(20).attempt_budget() == 10.0
    assert Deadline(6).attempt_budget() == pytest.approx(4.0)


def test_the_calls_deadline_also_bounds_its_refreshes() -> None:
    refreshes: list[float] = []

    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            raise Rpc(grpc.StatusCode.UNAVAILABLE, "connection refused")
        if isinstance(action, plans.Refresh):
            refreshes.append(action.timeout)
            time.sleep(0.05)
            raise UnavailableError("no broker answered")
        return no_sleep(action)

    with pytest.raises(UnavailableError):
        drive(plans.leader_call(CONFIG, snapshot(), lambda s, t: None, Deadline(0.3), stream="s", partition=0), answer)
    assert refreshes
    assert all(t <= 0.3 for t in refreshes), refreshes


def test_a_create_whose_answer_was_lost_succeeds_when_the_stream_is_ours() -> None:
    attempts = 0

    def answer(action: plans.PlanAction) -> Any:
        nonlocal attempts
        if isinstance(action, plans.Attempt):
            attempts += 1
            if attempts == 1:
                raise Rpc(grpc.StatusCode.UNAVAILABLE, "Socket closed")
            raise Rpc(grpc.StatusCode.ALREADY_EXISTS, "stream already exists")
        if isinstance(action, plans.Refresh):
            return snapshot()
        return no_sleep(action)

    deadline = Deadline(5)
    ours = admin_plans.stream_created_as("s", 1, CONFIG, deadline, "s")
    result, _ = drive(
        admin_plans.ambiguous_admin(
            CONFIG, snapshot(), lambda s, t: None, deadline, stream="s", already_done=ours, outcome="created"
        ),
        answer,
    )
    assert result is None
    other = admin_plans.stream_created_as("s", 4, CONFIG, Deadline(5), "s")  # another shape: not ours
    attempts = 0
    with pytest.raises(StreamExistsError):
        drive(
            admin_plans.ambiguous_admin(
                CONFIG, snapshot(), lambda s, t: None, Deadline(5), stream="s", already_done=other, outcome="created"
            ),
            answer,
        )


def test_a_create_whose_raft_apply_outlived_the_deadline_is_sent_again_and_found_to_be_ours() -> None:
    """The server stops waiting for a create's Raft apply at the call's deadline and answers INTERNAL "raft
    operation timed out", yet the apply may commit: that is a lost answer, not a final error."""
    attempts = 0

    def answer(action: plans.PlanAction) -> Any:
        nonlocal attempts
        if isinstance(action, plans.Attempt):
            attempts += 1
            if attempts == 1:
                raise Rpc(grpc.StatusCode.INTERNAL, "Failed to replicate partition: raft operation timed out")
            raise Rpc(grpc.StatusCode.ALREADY_EXISTS, "stream already exists")
        if isinstance(action, plans.Refresh):
            return snapshot()
        return no_sleep(action)

    request = api.CreateStreamRequest(subject="s", name="s", partitions=1)
    result, _ = drive(admin_plans.create_stream(CONFIG, snapshot(), request, Deadline(5)), answer)
    assert result is None
    assert attempts == 2


@pytest.mark.parametrize("details", ["Failed to pause stream: raft operation timed out", "context deadline exceeded"])
def test_an_idempotent_change_whose_server_wait_ended_is_retried_while_the_call_has_time(details: str) -> None:
    """A pause or readonly forwarded to a metadata leader that was being replaced came back INTERNAL "context
    deadline exceeded" (or "raft operation timed out") and failed the call at once, with 25 s of its 30 left."""
    attempts = 0

    def answer(action: plans.PlanAction) -> Any:
        nonlocal attempts
        if isinstance(action, plans.Attempt):
            attempts += 1
            if attempts == 1:
                action.rpc(None, action.timeout)
            return "paused"
        return no_sleep(action)

    def pause(stub: Any, timeout: float) -> Any:
        raise Rpc(grpc.StatusCode.INTERNAL, details)

    rpc = admin_plans.applied_again_on_timeout(pause)
    result, _ = drive(plans.any_broker(CONFIG, snapshot(), rpc, Deadline(30)), answer)
    assert (result, attempts) == ("paused", 2)


def test_a_create_that_runs_out_of_time_after_sending_says_the_stream_may_exist() -> None:
    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            time.sleep(0.06)
            raise Rpc(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        return no_sleep(action)

    request = api.CreateStreamRequest(subject="s", name="s", partitions=1)
    with pytest.raises(LiftbridgeTimeoutError) as failure:
        drive(admin_plans.create_stream(CONFIG, snapshot(), request, Deadline(0.05)), answer)
    assert "no answer within 0.05s after the request was sent" in failure.value.message
    assert "may have been created" in failure.value.message


def test_a_create_whose_metadata_refresh_fails_still_succeeds() -> None:
    """The create succeeded; a refresh of the cache that ran out of the call's last millisecond does not undo it."""

    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Refresh):
            raise LiftbridgeTimeoutError("no answer within 0.001s")
        return None

    request = api.CreateStreamRequest(subject="s", name="s", partitions=1)
    result, _ = drive(admin_plans.create_stream(CONFIG, snapshot(), request, Deadline(5)), answer)
    assert result is None


def test_a_create_refused_at_once_is_not_excused() -> None:
    def answer(action: plans.PlanAction) -> Any:
        raise Rpc(grpc.StatusCode.ALREADY_EXISTS, "stream already exists")

    ours = admin_plans.stream_created_as("s", 1, CONFIG, Deadline(5), "s")
    with pytest.raises(StreamExistsError):
        drive(
            admin_plans.ambiguous_admin(
                CONFIG, snapshot(), lambda s, t: None, Deadline(5), stream="s", already_done=ours, outcome="created"
            ),
            answer,
        )


def test_a_publish_is_never_sent_twice() -> None:
    sent: list[str] = []

    def answer(action: plans.PlanAction) -> Any:
        assert isinstance(action, plans.Attempt)
        assert action.connect_first
        sent.append(action.address)
        raise Rpc(grpc.StatusCode.UNAVAILABLE, "Socket closed")

    config = ClientConfig(brokers=("a.example:9292", "b.example:9292"))
    with pytest.raises(UnavailableError) as failure:
        drive(
            publish_plans.send_once(config, snapshot(), lambda s, t: None, Deadline(5), stream="s", partition=0), answer
        )
    assert failure.value.may_be_stored
    assert len(sent) == 1


def test_a_publish_goes_on_to_a_broker_that_connects() -> None:
    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            if action.address.startswith("a."):
                raise not_sent.NotSent(action.address)
            return "acked"
        return no_sleep(action)

    config = ClientConfig(brokers=("a.example:9292", "b.example:9292"))
    result, _ = drive(
        publish_plans.send_once(config, snapshot(), lambda s, t: None, Deadline(5), stream="s", partition=0), answer
    )
    assert result == "acked"


@pytest.mark.parametrize("details", ["nats: no responders available for request", "no known metadata leader"])
def test_a_publish_refused_while_the_metadata_leader_changes_is_sent_again(details: str) -> None:
    """The broker could not resume the paused partition: nothing was stored, so the publish goes again after
    a backoff (it failed at once before); a publish to a subject is not resumed and stays sent once."""
    calls: list[str] = []

    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            calls.append(action.address)
            if len(calls) < 3:
                raise Rpc(grpc.StatusCode.INTERNAL, details)
            return "acked"
        return no_sleep(action)

    config = ClientConfig(brokers=("a.example:9292",))
    result, _ = drive(
        publish_plans.send_once(config, snapshot(), lambda s, t: None, Deadline(5), stream="s", partition=0), answer
    )
    assert (result, len(calls)) == ("acked", 3)
    calls.clear()
    with pytest.raises(LiftbridgeError) as failure:
        drive(
            publish_plans.send_once(config, snapshot(), lambda s, t: None, Deadline(5), stream=None, partition=None),
            answer,
        )
    assert details in failure.value.message
    assert len(calls) == 1


def refused_in_real_time(attempts: list[float], slept: Callable[[float], float]) -> Callable[[Any], Any]:
    """Answers for a publish's plan: every attempt (its timeout noted in ``attempts``) refused with "no responders"
    (nothing stored), one given under 10 ms ending DEADLINE_EXCEEDED; a backoff of ``pause`` s sleeps
    ``slept(pause)`` s, for real."""

    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Sleep):
            time.sleep(slept(action.seconds))
            return None
        assert isinstance(action, plans.Attempt)
        attempts.append(action.timeout)
        if action.timeout < 0.01:
            raise Rpc(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        raise Rpc(grpc.StatusCode.INTERNAL, "nats: no responders available for request")

    return answer


def test_a_refused_publish_whose_backoff_overslept_ends_with_the_refusal_not_a_last_short_attempt() -> None:
    """On a loaded machine a backoff sleeps longer than asked. When it wakes with less than the shortest
    resend left, the plan ends with the refusal (nothing stored) instead of sending a last attempt with a few
    milliseconds, which would end DEADLINE_EXCEEDED and be reported as may be stored."""
    deadline = Deadline(1.0)
    attempts: list[float] = []

    answer = refused_in_real_time(attempts, lambda pause: max(deadline.remaining() - 0.005, 0.0))  # woken late

    config = ClientConfig(brokers=("a.example:9292",))
    with pytest.raises(LiftbridgeError) as failure:
        drive(publish_plans.send_once(config, snapshot(), lambda s, t: None, deadline, stream="s", partition=0), answer)
    assert "nats: no responders" in failure.value.message
    assert not failure.value.may_be_stored, failure.value.message
    assert attempts == [attempts[0]], f"a last short attempt after the late wake-up: {attempts}"


def test_a_shared_stream_refusal_whose_backoff_overslept_is_returned_not_sent_again() -> None:
    """The same on the shared streams: a refusal (nothing stored) that woke from its backoff with less than the
    shortest resend left is the answer; the message is not written again with a few milliseconds left."""
    deadline = Deadline(1.0)
    refusal = api.PublishResponse()
    refusal.asyncError.code = api.PublishAsyncError.INTERNAL
    refusal.asyncError.message = "failed to resume stream: nats: no responders available for request"
    plan = publish_plans.on_shared_streams(lambda addresses: None, deadline, stream="s", partition=0)
    action = next(plan)  # the first dispatch
    dispatches, result = 1, None
    try:
        while True:
            if isinstance(action, plans.Sleep):  # the scheduler wakes the caller late: 5 ms before the deadline
                time.sleep(max(deadline.remaining() - 0.005, 0.0))
                action = plan.send(None)
                dispatches += 1  # reached only when the plan dispatched again
            else:
                action = plan.send(refusal)
    except StopIteration as done:
        result = done.value
    assert result is refusal
    assert dispatches == 1, f"dispatched {dispatches} times: again after the late wake-up"


@pytest.mark.parametrize("seconds", [0.1, 0.3])
def test_a_publish_refused_until_its_deadline_ends_with_the_refusal(seconds: float) -> None:
    """In real time, sleeps included: an attempt given the last millisecond or so would end in
    DEADLINE_EXCEEDED, reported as may be stored, although the message was only ever refused. The plan gives
    up with the refusal when its next backoff would reach the deadline, and never sends a last short attempt."""
    attempts: list[float] = []

    answer = refused_in_real_time(attempts, lambda pause: pause)

    config = ClientConfig(brokers=("a.example:9292",))
    for _ in range(10):
        attempts.clear()
        with pytest.raises(LiftbridgeError) as failure:
            drive(
                publish_plans.send_once(
                    config, snapshot(), lambda s, t: None, Deadline(seconds), stream="s", partition=0
                ),
                answer,
            )
        assert "nats: no responders" in failure.value.message
        assert "not sent again" in failure.value.message
        assert not failure.value.may_be_stored, failure.value.message
        assert len(attempts) > 1, "sent again while time was left"
        assert min(attempts) >= 0.01, attempts


# -- the subscription state -----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def state(clock: Clock, **kwargs: Any) -> SubscriptionState:
    request = api.SubscribeRequest(stream="s", partition=0, startPosition=api.OFFSET, startOffset=10)
    options: dict[str, Any] = {"stop_offset": None, "timeout": None, "idle_timeout": None, "resubscribe_wait": 30}
    options.update(kwargs)
    return SubscriptionState(CONFIG, request, clock=clock, **options)


def test_offsets_below_the_next_one_are_skipped_and_past_the_stop_end_the_subscription() -> None:
    reading = state(Clock(), stop_offset=20)
    assert reading.on_message(9) is Verdict.SKIP
    assert reading.on_message(10) is Verdict.DELIVER
    assert reading.on_message(10) is Verdict.SKIP
    assert reading.on_message(25) is Verdict.END  # compaction removed 20: 25 is not delivered
    assert reading.closed(None) is None


@pytest.mark.parametrize(
    "details",
    [
        "Failed to lookup offset for timestamp: timestamp is before the beginning of the log",
        "Failed to lookup offset for timestamp: failed to find log segment for timestamp: not found",
    ],
)
def test_a_stop_time_with_no_message_at_or_before_it_ends_the_subscription_empty(details: str) -> None:
    """The server looks a stop time up as it subscribes and fails the lookup (INTERNAL) when the log's first
    message is later, or the log holds none: that was raised as a plain LiftbridgeError; nothing is at or
    before the stop, so the subscription is over. The same answer to a subscription without a stop time is
    still an error."""
    request = api.SubscribeRequest(
        stream="s", partition=0, startPosition=api.EARLIEST, stopPosition=api.STOP_TIMESTAMP, stopTimestamp=5
    )
    timed = SubscriptionState(CONFIG, request, stop_offset=None, timeout=None, idle_timeout=None, resubscribe_wait=5)
    assert timed.closed(Rpc(grpc.StatusCode.INTERNAL, details)) is None
    assert timed.ended
    with pytest.raises(LiftbridgeError, match="lookup offset"):
        state(Clock()).closed(Rpc(grpc.StatusCode.INTERNAL, details))


def test_a_timeout_that_began_before_subscribing_ends_on_time_and_is_named_whole() -> None:
    """subscribe() looks the partition up within its timeout, then subscribed with what was left: a timeout of
    0.0001 s was reported as "subscription timed out after 8.7211e-05s". The subscription ends when the whole
    timeout is up, counted from when it began, and says the timeout the caller gave."""
    clock = Clock()
    reading = state(clock, timeout=1.0, begun=clock.now - 0.4)
    assert reading.remaining() == pytest.approx(0.6)
    clock.now += 0.6
    with pytest.raises(LiftbridgeTimeoutError, match=r"subscription timed out after 1s \(last offset None\)"):
        reading.open(snapshot())


def test_the_stop_offset_itself_is_the_last_message() -> None:
    reading = state(Clock(), stop_offset=12)
    assert [reading.on_message(o) for o in (10, 11, 12)] == [Verdict.DELIVER, Verdict.DELIVER, Verdict.DELIVER_LAST]


def test_a_reopened_call_starts_after_the_last_offset() -> None:
    clock = Clock()
    reading = state(clock)
    step = reading.open(snapshot())
    assert (step.address, step.request.startOffset, step.timeout) == ("a.example:9292", 10, 30)
    reading.confirmed()
    reading.on_message(10)
    reading.on_message(11)
    clock.now += 30
    assert reading.closed(Rpc(grpc.StatusCode.DEADLINE_EXCEEDED)) == Reopen(0.0, refresh=None)
    assert reading.open(snapshot()).request.startOffset == 12


def test_a_call_to_another_broker_than_the_last_confirmed_one_names_where_it_moved_from() -> None:
    """A leader that froze is left for a new one; the move is worth a log line (moved_from)."""
    clock = Clock()
    reading = state(clock)
    assert reading.open(snapshot()).moved_from is None, "the first call moves from nowhere"
    reading.confirmed()
    clock.now += 30
    reading.closed(Rpc(grpc.StatusCode.DEADLINE_EXCEEDED))
    assert reading.open(snapshot()).moved_from is None, "the same leader again"
    reading.closed(Rpc(grpc.StatusCode.DEADLINE_EXCEEDED))  # never confirmed: lost
    assert reading.open(snapshot(leader="b")).moved_from == "a.example:9292"
    reading.confirmed()
    reading.closed(Rpc(grpc.StatusCode.UNAVAILABLE))
    assert reading.open(snapshot(leader="b")).moved_from is None


def test_a_call_that_was_never_confirmed_counts_as_lost() -> None:
    clock = Clock()
    reading = state(clock)
    reading.open(snapshot())
    clock.now += 30
    reopen = reading.closed(Rpc(grpc.StatusCode.DEADLINE_EXCEEDED))
    assert reopen is not None
    assert reopen.refresh is not None, "a frozen server: refresh and back off"


def test_loss_is_counted_from_the_first_loss_since_the_last_confirmed_call() -> None:
    """A confirmed call resets the loss clock, even without messages."""
    clock = Clock()
    reading = state(clock, resubscribe_wait=10)
    reading.open(snapshot())
    reading.confirmed()
    assert reading.closed(Rpc(grpc.StatusCode.UNAVAILABLE, "Socket closed")) is not None  # first loss
    clock.now += 5
    reading.open(snapshot())
    reading.confirmed()  # the new leader confirmed: no longer lost
    clock.now += 60  # quiet for a long time
    assert reading.closed(Rpc(grpc.StatusCode.UNAVAILABLE, "Socket closed")) is not None  # second loss: reopen
    clock.now += 11
    reading.open(snapshot())
    with pytest.raises(UnavailableError, match="10s"):
        reading.closed(NoLeaderYet())


def test_idle_and_total_timeouts() -> None:
    clock = Clock()
    reading = state(clock, idle_timeout=5, timeout=60)
    assert reading.open(snapshot()).timeout == 5, "a call lives no longer than the idle budget"
    reading.confirmed()
    clock.now += 4
    reading.on_message(10)
    reading.progressed()
    clock.now += 4
    assert reading.closed(Rpc(grpc.StatusCode.UNAVAILABLE)) is not None  # progress 4 s ago: go on
    clock.now += 2
    with pytest.raises(LiftbridgeTimeoutError, match="no new message for 5s"):
        reading.closed(Rpc(grpc.StatusCode.UNAVAILABLE))
    reading = state(clock, timeout=3)
    clock.now += 3
    with pytest.raises(LiftbridgeTimeoutError, match="timed out after 3s"):
        reading.open(snapshot())


def test_final_errors_and_clean_ends() -> None:
    reading = state(Clock())
    reading.open(snapshot())
    assert reading.closed(Rpc(grpc.StatusCode.RESOURCE_EXHAUSTED, "End of readonly partition")) is None
    reading = state(Clock())
    reading.open(snapshot())
    # NOT_FOUND ends it once refreshed metadata (asked twice) does not list the stream either (retry.after_unknown)
    assert reading.closed(Rpc(grpc.StatusCode.NOT_FOUND, "stream deleted")) is not None
    assert reading.open(snapshot(streams=())).address is None
    reading.closed(Rpc(grpc.StatusCode.UNAVAILABLE))
    with pytest.raises(NoSuchStreamError):
        reading.open(snapshot(streams=()))


def test_a_refusing_leader_with_the_paused_flag_ends_a_subscription_without_resume() -> None:
    reading = state(Clock())
    reading.open(snapshot(paused=True))
    reading.closed(Rpc(grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader"))
    with pytest.raises(PartitionPausedError):
        reading.open(snapshot(paused=True))


def test_an_established_subscription_waits_out_a_broker_that_forgot_the_stream() -> None:
    reading = state(Clock())
    reading.open(snapshot())
    reading.confirmed()
    reading.closed(Rpc(grpc.StatusCode.UNAVAILABLE))
    assert reading.open(snapshot(streams=())).address is None  # replaying its log after a restart
    fresh = state(Clock())
    with pytest.raises(NoSuchStreamError):
        fresh.open(snapshot(streams=()))


@pytest.mark.parametrize(
    ("connect_first", "connection", "sent"),
    [
        (True, not_sent.Connection.READY, True),
        (True, not_sent.Connection.REFUSED, False),  # a publish must know that nothing went out
        (True, not_sent.Connection.SILENT, False),
        (False, not_sent.Connection.READY, True),
        (False, not_sent.Connection.REFUSED, True),  # an idempotent call lets gRPC report why (a TLS error, say)
        (False, not_sent.Connection.SILENT, False),  # a frozen broker costs CONNECT_TRY, not half the deadline
    ],
)
def test_attempt_goes_out_only_on_a_channel_it_may_use(
    connect_first: bool, connection: not_sent.Connection, sent: bool
) -> None:
    attempt = plans.Attempt("b:1", 10.0, lambda stub, timeout: None, connect_first, not_sent.CONNECT_TRY)
    assert attempt.connect_budget() == not_sent.CONNECT_TRY
    if sent:
        attempt.after_connect(connection)
    else:
        with pytest.raises(not_sent.NotSent) as caught:
            attempt.after_connect(connection)
        assert "b:1" in caught.value.details()


def test_attempt_connect_budget_is_capped_by_its_timeout() -> None:
    assert plans.Attempt("b:1", 0.5, lambda stub, timeout: None, connect_timeout=2.0).connect_budget() == 0.5
    assert plans.Attempt("b:1", 7.0, lambda stub, timeout: None, connect_first=True).connect_budget() == 7.0
    assert plans.Attempt("b:1", 7.0, lambda stub, timeout: None).connect_budget() is None


@pytest.mark.parametrize(
    ("paused", "high_watermark", "newest", "expected"),
    [(True, -1, 34, True), (True, 34, 34, False), (False, -1, 34, False), (True, -1, -1, False)],
)
def test_unsettled_means_paused_with_offsets_above_the_high_watermark(
    paused: bool, high_watermark: int, newest: int, expected: bool
) -> None:
    """Chaos seeds 29/35: only a paused partition whose leader holds more than it committed is resumed."""
    info = PartitionInfo("s", 0, "a", ("a", "b"), ("a", "b"), high_watermark, newest, paused, False)
    assert partition_plans.unsettled(info) is expected


def test_brokers_are_tried_in_the_order_the_selection_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    """go-liftbridge's low-workload and low-latency server selection."""
    brokers = {
        "a": BrokerInfo("a", "a.example", 9292, partition_count=9, leader_count=3),
        "b": BrokerInfo("b", "b.example", 9292, partition_count=2, leader_count=1),
        "c": BrokerInfo("c", "c.example", 9292, partition_count=5, leader_count=5),
    }
    snapshot = Metadata(MappingProxyType(brokers), MappingProxyType({}), 0.0)
    workload = ClientConfig(brokers=("a.example",), broker_selection="workload")
    assert broker_addresses(workload, snapshot) == ["b.example:9292", "c.example:9292", "a.example:9292"]
    for address, seconds in {"a.example:9292": 0.004, "b.example:9292": 0.020, "c.example:9292": 0.001}.items():
        HEALTH.note_connect_time(address, seconds)
    latency = ClientConfig(brokers=("a.example",), broker_selection="latency")
    assert broker_addresses(latency, snapshot) == ["c.example:9292", "a.example:9292", "b.example:9292"]
    HEALTH.clear()
    HEALTH.note_connect_time("a.example:9292", 0.004)
    assert broker_addresses(latency, snapshot)[-1] == "a.example:9292", "the unmeasured ones first"
    with pytest.raises(InvalidArgumentError, match="broker_selection must be one of random, workload, latency"):
        ClientConfig(brokers=("a",), broker_selection="closest")


def test_a_dispatch_gets_every_known_broker_and_seed_sorted_and_once_and_anew_after_a_refresh() -> None:
    """The addresses a single publish orders itself: no broker of the snapshot or the seeds left out, none twice,
    and the brokers of a refreshed snapshot (a new object) rather than those remembered for the old one."""
    brokers = {
        "b": BrokerInfo("b", "b.example", 9292, partition_count=2, leader_count=1),
        "a": BrokerInfo("a", "a.example", 9292, partition_count=9, leader_count=3),
    }
    first = Metadata(MappingProxyType(brokers), MappingProxyType({}), 0.0)
    known = KnownAddresses(ClientConfig(brokers=("c.example:9292", "a.example:9292")))
    assert known.of(first) == ("a.example:9292", "b.example:9292", "c.example:9292")
    assert known.of(first) is known.of(first), "kept for the same snapshot"
    grown = {**brokers, "d": BrokerInfo("d", "d.example", 9393, partition_count=0, leader_count=0)}
    refreshed = Metadata(MappingProxyType(grown), MappingProxyType({}), 1.0)
    assert known.of(refreshed) == ("a.example:9292", "b.example:9292", "c.example:9292", "d.example:9393")


def test_a_broker_that_hung_an_attempt_goes_last_whatever_the_selection() -> None:
    """CI on 716d1a5: a frozen broker took a whole attempt of one metadata call in three (see
    test_a_broker_that_hung_an_attempt_goes_last_for_the_next_calls)."""
    tried: list[plans.Attempt] = []
    answer = failing_first(Rpc(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), tried, pause=0.01)
    deadline = Deadline(20)
    deadline.attempt_budget = lambda: 0.001  # type: ignore[method-assign]
    assert drive(plans.any_broker(CONFIG, snapshot(), lambda s, t: None, deadline), answer)[0] == "answered"
    hung = tried[0].address
    assert HEALTH.suspects() == {hung}
    for _ in range(20):
        assert broker_addresses(CONFIG, snapshot())[-1] == hung
    workload = ClientConfig(brokers=CONFIG.brokers, broker_selection="workload")
    assert broker_addresses(workload, snapshot())[-1] == hung
    HEALTH.tell(hung, Signal.ANSWERED)  # it answered since (expiry is the health model's own test)
    assert any(broker_addresses(CONFIG, snapshot())[-1] != hung for _ in range(40)), "it expires"


def test_a_broker_that_never_connects_goes_last_but_one_cut_by_the_calls_deadline_does_not() -> None:
    """Review of the hung-broker fix: a frozen broker without a READY channel fails as NotSent (silent) after
    CONNECT_TRY, and must go last too; an attempt that only got the call's last moments proves nothing."""
    tried: list[plans.Attempt] = []
    silent_first = failing_first(not_sent.NotSent("x", not_sent.Connection.SILENT), tried)
    drive(plans.any_broker(CONFIG, snapshot(), lambda s, t: None, Deadline(20)), silent_first)
    assert HEALTH.suspects() == {tried[0].address}

    HEALTH.clear()
    refused_first = failing_first(not_sent.NotSent("x", not_sent.Connection.REFUSED), [])
    drive(plans.any_broker(CONFIG, snapshot(), lambda s, t: None, Deadline(20)), refused_first)
    assert HEALTH.suspects() == set(), "a refused connection is quick: no reason to put it last"

    def out_of_time(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            time.sleep(0.06)
            raise Rpc(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        return no_sleep(action)

    with pytest.raises(LiftbridgeTimeoutError):
        drive(plans.any_broker(CONFIG, snapshot(), lambda s, t: None, Deadline(0.05)), out_of_time)
    assert HEALTH.suspects() == set(), "the call's deadline ended that attempt, not the broker's silence"


def test_a_batch_goes_to_its_partition_leader_first() -> None:
    """CI defect (2026-11-24): publish_batch streamed to a randomly ordered broker, so with a follower frozen
    one batch in three went to it and every message timed out while the leader was fine."""
    assert leader_first(["a:1", "b:2", "c:3"], "c:3") == ["c:3", "a:1", "b:2"]
    assert leader_first(["a:1", "b:2"], None) == ["a:1", "b:2"]
    assert leader_first(["a:1"], "z:9") == ["z:9", "a:1"], "a leader the seeds do not list is still tried first"


def test_a_stream_a_refresh_does_not_list_yet_is_asked_for_again_before_it_is_called_missing() -> None:
    """CI on 0f65dfd: fetch_partition_metadata right after create_stream raised NoSuchStreamError; its one
    refresh reached a broker that had not applied the create yet."""
    refreshes: list[plans.Refresh] = []

    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Refresh):
            refreshes.append(action)
            return snapshot(streams=() if len(refreshes) == 1 else ("s",))
        return no_sleep(action)

    result, actions = drive(plans.knowing(Deadline(10), snapshot(streams=()), "s"), answer)
    assert "s" in result.streams
    assert len(refreshes) == 2
    assert any(isinstance(a, plans.Sleep) for a in actions)

    refreshes.clear()
    with pytest.raises(NoSuchStreamError, match="no stream named 'gone'"):
        drive(plans.knowing(Deadline(10), snapshot(streams=()), "gone"), answer)
    assert len(refreshes) == plans.UNKNOWN_STREAM_ASKS


def three_brokers(leader: str) -> Metadata:
    """Brokers a, b, c; stream ``s`` with one partition led by ``leader``, as the snapshot has it."""
    brokers = {b: BrokerInfo(b, f"{b}.example", 9292) for b in ("a", "b", "c")}
    info = PartitionInfo("s", 0, leader, ("a", "b", "c"), ("a", "b", "c"), 9, 9, False, False)
    stream = StreamInfo("s", "s", MappingProxyType({0: info}), 0)
    return Metadata(MappingProxyType(brokers), MappingProxyType({"s": stream}), 0.0)


def naming(leader: str) -> api.FetchMetadataResponse:
    """A broker's FetchMetadata answer that names ``leader`` for ``s``/0."""
    return api.FetchMetadataResponse(
        brokers=[api.Broker(id=b, host=f"{b}.example", port=9292) for b in ("a", "b", "c")],
        streamMetadata=[
            api.StreamMetadata(name="s", subject="s", partitions={0: api.PartitionMetadata(id=0, leader=leader)})
        ],
    )


def agreed_call(snapshot: Metadata, deadline: Deadline, rpc: plans.Rpc) -> plans.Plan[Any]:
    return plans.leader_call(CONFIG, snapshot, rpc, deadline, stream="s", partition=0, agreed=plans.KeptVote())


def voting(views: dict[str, api.FetchMetadataResponse], sent: list[str]) -> Callable[[plans.PlanAction], Any]:
    """An ``answer``: the plan's FetchMetadata votes get ``views[address]`` (a missing address is a frozen
    broker); the call itself answers "done" and is recorded in ``sent``; sleeps are slept."""

    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            if action.rpc is not the_call:
                sent.append(f"vote {action.address}")
                if action.address not in views:
                    raise not_sent.NotSent(action.address)
                return views[action.address]
            sent.append(action.address)
            return "done"
        if isinstance(action, plans.Sleep):
            time.sleep(action.seconds)
            return None
        return three_brokers("a")  # a refresh

    return answer


def the_call(stub: Any, timeout: float) -> Any:
    return None


def test_an_agreed_leader_call_goes_where_a_majority_of_brokers_say_not_where_the_snapshot_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chaos seed 128: a ``__cursors`` leader frozen past a failover answered SetCursor as leader right after
    it thawed; the new leader kept its cached cursor, so the commit read back the old value."""
    views = {"a.example:9292": naming("a"), "b.example:9292": naming("c"), "c.example:9292": naming("c")}
    monkeypatch.setattr(random, "shuffle", lambda items: None)  # brokers asked in order a, b, c
    sent: list[str] = []
    result, _ = drive(agreed_call(three_brokers("a"), Deadline(5), the_call), voting(views, sent))
    assert result == "done"
    assert sent == ["vote a.example:9292", "vote b.example:9292", "vote c.example:9292", "c.example:9292"]

    monkeypatch.setattr(random, "shuffle", lambda items: items.reverse())  # seed, c, b, a
    sent.clear()
    drive(agreed_call(three_brokers("a"), Deadline(5), the_call), voting(views, sent))
    assert sent == ["vote c.example:9292", "vote b.example:9292", "c.example:9292"], "a majority ends the vote"


def test_an_agreed_leader_call_without_a_majority_ends_by_its_deadline_saying_so() -> None:
    views = {"a.example:9292": naming("a"), "b.example:9292": naming("b")}  # c is frozen
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="more than half of the brokers") as raised:
        drive(agreed_call(three_brokers("a"), Deadline(0.5), the_call), voting(views, []))
    assert time.monotonic() - started < 1.5
    assert "a.example:9292: a" in str(raised.value)
    assert "c.example:9292: unavailable" in str(raised.value)
    assert HEALTH.suspected("c.example:9292"), "the silent broker goes last next"


def test_a_vote_that_a_broker_refuses_for_good_fails_the_call_at_once() -> None:
    """A TLS handshake failure (or a permission) does not heal by asking again until the deadline."""
    attempts: list[plans.Attempt] = []

    def answer(action: plans.PlanAction) -> Any:
        assert isinstance(action, plans.Attempt), f"unexpected {action}"
        attempts.append(action)
        raise Rpc(grpc.StatusCode.UNAVAILABLE, "Ssl handshake failed: CERTIFICATE_VERIFY_FAILED")

    with pytest.raises(LiftbridgeError, match="handshake failed"):
        drive(agreed_call(three_brokers("a"), Deadline(5), the_call), answer)
    assert len(attempts) == 1


def test_an_agreed_leader_call_through_one_address_asks_no_vote() -> None:
    """One broker, or a proxy every broker is dialled through: nobody to outvote the snapshot's leader."""
    one = Metadata(MappingProxyType({"a": BrokerInfo("a", "a.example", 9292)}), snapshot().streams, 0.0)
    proxied = ClientConfig(brokers=("proxy:1",), address_resolver=lambda host, port: "proxy:1")
    for config, metadata, address in ((CONFIG, one, "a.example:9292"), (proxied, three_brokers("a"), "proxy:1")):
        sent: list[str] = []
        call = plans.leader_call(
            config, metadata, the_call, Deadline(5), stream="s", partition=0, agreed=plans.KeptVote()
        )
        result, _ = drive(call, voting({}, sent))
        assert result == "done"
        assert sent == [address], "the call itself, no FetchMetadata before it"


def cursor_cluster(leader: str) -> tuple[Metadata, Callable[[str, str], Any]]:
    """Three brokers that all name ``leader`` for ``__cursors``/0 (high watermark caught up), and the answers
    a stub at ``address`` gives to method ``name``."""
    cursors = CURSORS_STREAM
    info = PartitionInfo(cursors, 0, leader, ("a", "b", "c"), ("a", "b", "c"), 9, 9, False, False)
    brokers = {b: BrokerInfo(b, f"{b}.example", 9292) for b in ("a", "b", "c")}
    metadata = Metadata(
        MappingProxyType(brokers),
        MappingProxyType({cursors: StreamInfo(cursors, cursors, MappingProxyType({0: info}), 0)}),
        0.0,
    )
    partition = api.PartitionMetadata(id=0, leader=leader, replicas="abc", isr="abc", highWatermark=9, newestOffset=9)
    view = api.FetchMetadataResponse(
        brokers=[api.Broker(id=b, host=f"{b}.example", port=9292) for b in ("a", "b", "c")],
        streamMetadata=[api.StreamMetadata(name=cursors, subject=cursors, partitions={0: partition})],
    )

    def respond(address: str, name: str) -> Any:
        if name == "FetchMetadata":
            return view
        if name == "FetchPartitionMetadata":
            return api.FetchPartitionMetadataResponse(metadata=partition)
        return f"{name} answered by {address}"

    return metadata, respond


class RecordingStub:
    """A stub that records each method called on it as "<method> <address>" and answers with ``respond``."""

    def __init__(self, address: str, sent: list[str], respond: Callable[[str, str], Any]) -> None:
        self.address, self.sent, self.respond = address, sent, respond

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def method(request: Any, timeout: float) -> Any:
            self.sent.append(f"{name} {self.address}")
            return self.respond(self.address, name)

        return method


def test_a_cursor_read_asks_for_one_vote_and_sends_everything_to_the_leader_it_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The read checks the leader's high watermark, then fetches the cursor: both on the leader one vote named.
    Before: a vote for the check and another for the fetch (4 FetchMetadata on three agreeing brokers)."""
    monkeypatch.setattr(random, "shuffle", lambda items: None)  # brokers asked in order a, b, c
    metadata, respond = cursor_cluster("b")
    sent: list[str] = []

    def answer(action: plans.PlanAction) -> Any:
        assert isinstance(action, plans.Attempt), f"unexpected {action}"
        return action.rpc(RecordingStub(action.address, sent, respond), action.timeout)

    def fetch_cursor(stub: Any, timeout: float) -> Any:
        return stub.FetchCursor(None, timeout=timeout)

    result, _ = drive(cursor_plans.cursor_read(CONFIG, metadata, fetch_cursor, Deadline(5), partition=0), answer)
    assert result == "FetchCursor answered by b.example:9292"
    assert sent == [
        "FetchMetadata a.example:9292",
        "FetchMetadata b.example:9292",
        "FetchPartitionMetadata b.example:9292",
        "FetchCursor b.example:9292",
    ]


def test_a_cursor_call_asks_again_when_the_leader_it_was_sent_to_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vote is kept for one read only while its leader answers: a failed attempt there is followed by a new vote."""
    monkeypatch.setattr(random, "shuffle", lambda items: None)
    metadata, respond = cursor_cluster("b")
    sent: list[str] = []
    failed: list[str] = []

    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Sleep):
            return None
        if isinstance(action, plans.Refresh):
            return metadata
        calls = len(sent)
        result = action.rpc(RecordingStub(action.address, sent, respond), action.timeout)
        if sent[calls].startswith("FetchCursor") and not failed:
            failed.append(sent[calls])
            raise Rpc(grpc.StatusCode.UNAVAILABLE, "connection reset")
        return result

    def fetch_cursor(stub: Any, timeout: float) -> Any:
        return stub.FetchCursor(None, timeout=timeout)

    result, _ = drive(cursor_plans.cursor_read(CONFIG, metadata, fetch_cursor, Deadline(5), partition=0), answer)
    assert result == "FetchCursor answered by b.example:9292"
    assert failed == ["FetchCursor b.example:9292"]
    assert [s for s in sent if s.startswith("FetchMetadata")] == [
        "FetchMetadata a.example:9292",
        "FetchMetadata b.example:9292",
    ] * 2, "one vote before the read, one after the failure"


def test_a_subscription_tells_the_health_model_of_a_broken_connection_and_an_unconfirmed_timeout() -> None:
    """A subscription whose connection broke, or whose broker never confirmed it in its time, is told to the
    health model (the next choice of an ISR replica avoids it); a call ended by its own liveness time is not."""
    reading = state(Clock())
    opened = reading.open(snapshot())
    assert opened.address is not None
    broken = reading.broker_signal(Rpc(grpc.StatusCode.UNAVAILABLE, "Socket closed"))
    assert broken == (opened.address, Signal.BROKEN)
    assert reading.broker_signal(Rpc(grpc.StatusCode.DEADLINE_EXCEEDED, "")) == (opened.address, Signal.SILENT)
    reading.confirmed()
    assert reading.broker_signal(Rpc(grpc.StatusCode.DEADLINE_EXCEEDED, "")) is None
    assert reading.broker_signal(None) is None
