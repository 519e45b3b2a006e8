"""What a NOT_FOUND from a data or partition call means, decided once (client/retry.after_unknown), and the
plans and the subscription state that both clients drive by it (issue 49).

A broker that has not applied a stream's creation, or loaded a partition after a restart, answers NOT_FOUND
for what exists; only fresh metadata tells that apart from a stream that is really missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType
from typing import Any, cast

import grpc
import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import (
    ClientConfig,
    LiftbridgeTimeoutError,
    NoSuchPartitionError,
    NoSuchStreamError,
    not_sent,
    plans,
)
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.metadata import BrokerInfo, Metadata, PartitionInfo, StreamInfo
from liftbridge_provider.client.partition_plans import partition_metadata
from liftbridge_provider.client.publish.plans import on_shared_streams, send_once
from liftbridge_provider.client.reading import Reopen, SubscriptionState
from liftbridge_provider.client.retry import (
    Deadline,
    Listing,
    RetryState,
    Unknown,
    after_unknown,
    refused_as_unknown,
)
from tests.unit.plan_driving import Rpc, drive

CONFIG = ClientConfig(brokers=("a.example:9292",), liveness_interval=30)
UNKNOWN_STREAM = Rpc(grpc.StatusCode.NOT_FOUND, "no such stream: s")
UNKNOWN_PARTITION = Rpc(grpc.StatusCode.NOT_FOUND, "partition not found")


@pytest.fixture(autouse=True)
def no_suspected_brokers() -> Iterator[None]:
    """No broker is suspected (the health model is process-wide and orders the addresses handed out)."""
    HEALTH.clear()
    yield
    HEALTH.clear()


def snapshot(*streams: str) -> Metadata:
    """Metadata of broker ``a`` leading partition 0 of each of ``streams``."""
    brokers = {"a": BrokerInfo("a", "a.example", 9292)}
    infos = {
        name: StreamInfo(
            name, name, MappingProxyType({0: PartitionInfo(name, 0, "a", ("a",), ("a",), 4, 4, False, False)}), 0
        )
        for name in streams
    }
    return Metadata(MappingProxyType(brokers), MappingProxyType(infos), 0.0)


@pytest.mark.parametrize(
    ("listing", "time_left", "verdict"),
    [
        (Listing.LISTED, True, Unknown.ASK_AGAIN),  # a broker behind the metadata leader
        (Listing.UNANSWERED, True, Unknown.ASK_AGAIN),  # nothing says it is missing: brokers unreachable
        (Listing.UNLISTED, True, Unknown.MISSING),  # bad input: raised at once, never a timeout
        (Listing.UNLISTED, False, Unknown.MISSING),
        (Listing.LISTED, False, Unknown.TIMED_OUT),  # the deadline ended while brokers kept refusing
        (Listing.UNANSWERED, False, Unknown.TIMED_OUT),
    ],
)
def test_the_rule_for_a_not_found_answer(listing: Listing, time_left: bool, verdict: Unknown) -> None:
    assert after_unknown(listing, time_left=time_left) is verdict


@pytest.mark.parametrize("code", [grpc.StatusCode.NOT_FOUND])
def test_only_not_found_is_a_refusal_as_unknown(code: grpc.StatusCode) -> None:
    assert refused_as_unknown(code)
    others = [c for c in grpc.StatusCode if c is not code]
    assert not any(refused_as_unknown(c) for c in others)


def answers(
    refusals: int, fresh: Metadata, result: Any, refusal: grpc.RpcError = UNKNOWN_STREAM
) -> tuple[list[str], Any]:
    """An ``answer`` for :func:`drive`: the first ``refusals`` attempts fail with ``refusal``, then ``result``;
    a refresh gives ``fresh``; sleeps do nothing. The log says what was done."""
    log: list[str] = []

    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            log.append("attempt")
            if log.count("attempt") <= refusals:
                raise refusal
            return result
        if isinstance(action, plans.Refresh):
            log.append("refresh")
            return fresh
        return None

    return log, answer


PARTITION_ANSWER = api.FetchPartitionMetadataResponse(
    metadata=api.PartitionMetadata(id=0, leader="a", highWatermark=4, newestOffset=4)
)


def test_a_leader_call_refused_as_unknown_asks_again_while_the_metadata_lists_the_partition() -> None:
    """The soak's read_slice: the high-watermark check asked a restarted node that had not loaded the
    partition yet. It is asked again after a refresh that lists it, and its answer is returned."""
    log, answer = answers(2, snapshot("s"), PARTITION_ANSWER, UNKNOWN_PARTITION)
    info, _ = drive(partition_metadata(CONFIG, snapshot("s"), Deadline(10), "s", 0), answer)
    assert info.high_watermark == 4
    assert log == ["attempt", "refresh", "attempt", "refresh", "attempt"]


@pytest.mark.parametrize(
    ("fresh", "kind"),
    [(snapshot(), NoSuchStreamError), (snapshot("other"), NoSuchStreamError)],
    ids=["no-streams", "other-streams"],
)
def test_a_leader_call_refused_as_unknown_fails_at_once_when_the_metadata_does_not_list_it(
    fresh: Metadata, kind: type[Exception]
) -> None:
    """A deleted stream: the metadata, asked twice (the first answer may come from a lagging broker too),
    does not list it; the server's typed error is raised, with no attempt after."""
    log, answer = answers(10**6, fresh, PARTITION_ANSWER)
    with pytest.raises(kind):
        drive(partition_metadata(CONFIG, snapshot("s"), Deadline(10), "s", 0), answer)
    assert log == ["attempt", "refresh", "refresh"]


def test_a_partition_the_metadata_does_not_list_is_missing() -> None:
    _log, answer = answers(10**6, snapshot("s"), PARTITION_ANSWER, UNKNOWN_PARTITION)
    with pytest.raises(NoSuchPartitionError):
        drive(partition_metadata(CONFIG, snapshot("s"), Deadline(10), "s", 3), answer)


def test_refusals_until_the_deadline_end_in_a_timeout_naming_them() -> None:
    """Brokers that never catch up: a LiftbridgeTimeoutError (transient) that names the refusal, by the
    deadline, not NoSuchStreamError (which the operators treat as permanent)."""
    _log, answer = answers(10**6, snapshot("s"), PARTITION_ANSWER)
    with pytest.raises(LiftbridgeTimeoutError, match="no such stream: s") as caught:
        drive(partition_metadata(CONFIG, snapshot("s"), Deadline(0.2), "s", 0), answer)
    assert not isinstance(caught.value, NoSuchStreamError)
    assert caught.value.code == grpc.StatusCode.NOT_FOUND


def test_a_unary_publish_refused_as_unknown_goes_again_only_while_the_metadata_lists_the_stream() -> None:
    """Nothing was stored by the refusal, so sending again is safe; a stream the metadata lacks is missing."""
    ack = api.PublishResponse(ack=api.Ack(offset=0))
    rpc: plans.Rpc = lambda stub, t: None  # noqa: E731 - the answers stand in for it
    log, answer = answers(1, snapshot("s"), ack)
    assert drive(send_once(CONFIG, snapshot("s"), rpc, Deadline(10), stream="s", partition=0), answer)[0] is ack
    assert log == ["attempt", "refresh", "attempt"]
    log, answer = answers(1, snapshot(), ack)
    with pytest.raises(NoSuchStreamError) as caught:
        drive(send_once(CONFIG, snapshot("s"), rpc, Deadline(10), stream="s", partition=0), answer)
    assert caught.value.may_be_stored is False
    log, answer = answers(10**6, snapshot("s"), ack)
    with pytest.raises(LiftbridgeTimeoutError) as timed_out:
        drive(send_once(CONFIG, snapshot("s"), rpc, Deadline(0.3), stream="s", partition=0), answer)
    assert timed_out.value.may_be_stored is False, "a refusal stored nothing, to the end"


UNKNOWN_ASYNC = api.PublishResponse(
    asyncError=api.PublishAsyncError(code=api.PublishAsyncError.NOT_FOUND, message="no such stream: s")
)


def drive_shared(responses: list[api.PublishResponse], fresh: Metadata, timeout: float) -> tuple[Any, list[str]]:
    """on_shared_streams with ``responses`` for its dispatches in turn (the last one repeated)."""
    log: list[str] = []

    def answer(action: Any) -> Any:
        if isinstance(action, plans.Dispatch):
            log.append("dispatch")
            return responses[min(log.count("dispatch"), len(responses)) - 1]
        if isinstance(action, plans.Refresh):
            log.append("refresh")
            return fresh
        return None

    plan = cast(plans.Plan[Any], on_shared_streams(lambda a: None, Deadline(timeout), stream="s", partition=0))
    return drive(plan, answer)[0], log


def test_a_shared_stream_publish_refused_as_unknown_goes_again_while_the_metadata_lists_the_stream() -> None:
    ack = api.PublishResponse(ack=api.Ack(offset=0))
    response, log = drive_shared([UNKNOWN_ASYNC, ack], snapshot("s"), 10)
    assert response is ack
    assert log == ["dispatch", "refresh", "dispatch"]
    response, log = drive_shared([UNKNOWN_ASYNC, ack], snapshot(), 10)
    assert response is UNKNOWN_ASYNC, "missing from the metadata too: the refusal, at once"
    assert log == ["dispatch", "refresh", "refresh"]
    with pytest.raises(LiftbridgeTimeoutError, match="no such stream: s") as caught:
        drive_shared([UNKNOWN_ASYNC], snapshot("s"), 0.3)
    assert caught.value.may_be_stored is False


def subscription() -> SubscriptionState:
    request = api.SubscribeRequest(stream="s", partition=0, startPosition=api.EARLIEST)
    return SubscriptionState(CONFIG, request, stop_offset=None, timeout=30, idle_timeout=None, resubscribe_wait=10)


def test_a_subscribe_refused_as_unknown_reopens_while_the_metadata_lists_the_partition() -> None:
    state = subscription()
    assert state.open(snapshot("s")).address == "a.example:9292"
    assert isinstance(state.closed(UNKNOWN_STREAM), Reopen), "reopened with refreshed metadata, not raised"
    assert state.open(snapshot("s")).address == "a.example:9292"


def test_a_subscribe_refused_as_unknown_ends_when_the_metadata_twice_does_not_list_it() -> None:
    """Established or not, a stream missing from the refreshed metadata too (asked twice) ends the subscription
    with the server's typed error (a stream deleted under a subscription raises NoSuchStreamError, as before)."""
    state = subscription()
    state.open(snapshot("s"))
    state.confirmed()
    first = state.closed(UNKNOWN_STREAM)
    assert isinstance(first, Reopen)
    assert state.open(snapshot()).address is None, "the first unlisting answer is asked again"
    second = state.closed(not_sent.NotSent("a.example:9292"))
    assert isinstance(second, Reopen)
    assert min(first.delay, second.delay) >= plans.UNKNOWN_STREAM_PAUSE, "the metadata is asked again 0.2 s on"
    with pytest.raises(NoSuchStreamError):
        state.open(snapshot())


def test_a_call_whose_attempts_hung_ends_naming_its_last_error_after_a_refusal_as_unknown_before_them() -> None:
    """The refusal-as-unknown timeout is the ending only while a refusal as unknown was the last answer: a call
    whose later attempts hung (each retried) ends with "no answer within Xs; last error: ...", not with the
    bare "Deadline Exceeded" of its last attempt or an earlier refusal's text (b132789 did both)."""
    state = RetryState(Deadline(0.3), leader_directed=True, stream="s", partition=0)
    state.attempt_timeout()
    state.after_unknown(Rpc(grpc.StatusCode.NOT_FOUND, "no such stream: s"), Listing.LISTED)
    state.attempt_timeout(0.0)  # an attempt whose own time is up at once: it hung
    state.after_failure(Rpc(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
    ended = state.timeout_error()
    assert ended.message.startswith("no answer within 0.3s; last error: "), ended.message
    assert "no such stream" not in ended.message
    fresh = RetryState(Deadline(0.3), leader_directed=True, stream="s", partition=0)
    fresh.attempt_timeout()
    fresh.after_unknown(Rpc(grpc.StatusCode.NOT_FOUND, "no such stream: s"), Listing.LISTED)
    assert "no such stream: s" in fresh.timeout_error().message, "the refusal as unknown was the last answer"
