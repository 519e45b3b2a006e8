"""PublishWindow (the I/O-free bookkeeping of a batch publish) and the NATS settings, as pure logic."""

from __future__ import annotations

import time

import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import (
    AckPolicy,
    AckTimeoutError,
    InvalidArgumentError,
    LiftbridgeError,
    NatsConfig,
    PublishMessage,
    ReadonlyPartitionError,
    UnavailableError,
)
from liftbridge_provider.client.messages import Ack
from liftbridge_provider.client.options import split_nats_servers
from liftbridge_provider.client.publish.envelope import decode_message
from liftbridge_provider.client.publish.nats_publisher import ack_error, partition_subject, publish_envelope
from liftbridge_provider.client.publish.prepare import batch_requests
from liftbridge_provider.client.publish.publish_window import BatchErrors, PublishWindow
from liftbridge_provider.connection import config_from_connection


def ack(offset: int) -> Ack:
    return Ack(api.Ack(offset=offset), 0)


def timeout_error(index: int) -> LiftbridgeError:
    return AckTimeoutError(f"#{index} timed out", may_be_stored=True)


def take_all(window: PublishWindow, now: float) -> list[int]:
    taken = []
    while (index := window.take(now)) is not None:
        taken.append(index)
    return taken


def test_window_holds_at_most_its_size_in_flight_and_refills_on_acks() -> None:
    window = PublishWindow(5, window=2, ack_wait=1.0, expects_ack=True)
    assert take_all(window, 0.0) == [0, 1]
    assert window.on_ack(0, ack(10))
    assert take_all(window, 0.1) == [2]
    for index, offset in ((1, 11), (2, 12)):
        window.on_ack(index, ack(offset))
    assert take_all(window, 0.2) == [3, 4]
    window.on_ack(3, ack(13))
    window.on_ack(4, ack(14))
    assert window.done
    result = window.result()
    assert result.ok
    assert [a.offset for a in result.acks if a] == [10, 11, 12, 13, 14]


def test_overdue_acks_expire_oldest_first_and_a_late_ack_still_counts() -> None:
    window = PublishWindow(3, window=3, ack_wait=1.0, expects_ack=True)
    window.take(0.0)
    window.take(0.5)
    window.take(0.9)
    assert window.next_expiry(0.6) == pytest.approx(0.4)
    assert window.expire(1.6, timeout_error) == 2  # sent at 0.0 and 0.5
    assert window.next_expiry(1.6) == pytest.approx(0.3)
    assert window.on_ack(1, ack(1)), "an ack after its timeout still counts"
    assert window.on_ack(2, ack(2))
    assert window.done
    result = window.result()
    assert [(f.index, type(f.error)) for f in result.failures] == [(0, AckTimeoutError)]
    assert result.acks[1] is not None


def test_an_ack_after_a_refusal_or_for_an_unknown_index_is_not_counted() -> None:
    window = PublishWindow(2, window=2, ack_wait=1.0, expects_ack=True)
    take_all(window, 0.0)
    assert window.on_error(0, ReadonlyPartitionError("readonly"))
    assert not window.on_ack(0, ack(0)), "the server said no: a stray ack does not undo it"
    assert not window.on_ack(7, ack(7))
    assert not window.on_ack(-1, ack(7))
    assert not window.on_error(0, ReadonlyPartitionError("again"))
    assert window.acked == 0


def test_a_lost_connection_fails_what_awaits_an_ack_and_the_rest_can_go_on() -> None:
    window = PublishWindow(4, window=2, ack_wait=5.0, expects_ack=True)
    take_all(window, 0.0)
    lost = window.lose_in_flight(lambda i: UnavailableError(f"#{i} lost", may_be_stored=True))
    assert lost == 2
    assert take_all(window, 1.0) == [2, 3], "messages not yet sent go over the next connection"
    window.on_ack(2, ack(0))
    window.on_ack(3, ack(1))
    result = window.result()
    assert [(f.index, f.may_be_stored) for f in result.failures] == [(0, True), (1, True)]


def test_refused_messages_are_skipped_and_keep_their_own_error() -> None:
    window = PublishWindow(4, window=4, ack_wait=1.0, expects_ack=True)
    window.refuse(1, ReadonlyPartitionError("readonly"))
    window.refuse(3, ReadonlyPartitionError("readonly"))
    assert take_all(window, 0.0) == [0, 2]
    window.on_ack(0, ack(0))
    window.on_ack(2, ack(1))
    assert window.done
    with pytest.raises(ValueError, match="already taken"):
        window.refuse(0, ReadonlyPartitionError("late"))


def test_fail_unsent_spares_refused_ones_and_no_ack_policy_resolves_on_send() -> None:
    window = PublishWindow(4, window=10, ack_wait=1.0, expects_ack=False)
    window.refuse(2, ReadonlyPartitionError("readonly"))
    assert window.take(0.0) == 0
    assert window.in_flight == 0, "ack policy NONE: nothing awaits an ack"
    assert window.fail_unsent(AckTimeoutError("not sent")) == 2  # 1 and 3
    result = window.result()
    assert [(f.index, type(f.error)) for f in result.failures] == [
        (1, AckTimeoutError),
        (2, ReadonlyPartitionError),
        (3, AckTimeoutError),
    ]
    assert window.done
    assert len(result.failures) == 3
    assert [f.index for f in result.failures[-2:]] == [2, 3]
    assert result.failures[-1].index == 3


def test_failures_of_a_huge_unsent_tail_are_one_range_read_like_a_list() -> None:
    """A deadline that leaves millions unsent costs no work per message (no call outlives its deadline
    by more than a second); the failures still read as a list in index order."""
    window = PublishWindow(5_000_000, window=4, ack_wait=1.0, expects_ack=True)
    for _ in range(3):
        window.take(0.0)
    window.on_ack(0, Ack(api.Ack(offset=0), 0))
    window.refuse(10, ReadonlyPartitionError("readonly"))
    window.lose_in_flight(lambda i: UnavailableError("lost", may_be_stored=True))
    started = time.perf_counter()
    assert window.fail_unsent(AckTimeoutError("not sent")) == 5_000_000 - 4
    failures = window.result().failures
    assert time.perf_counter() - started < 0.5, "no entry is built per unsent message (seconds for 5,000,000)"
    assert len(failures) == 5_000_000 - 1
    assert [(f.index, f.may_be_stored) for f in failures[:4]] == [(1, True), (2, True), (3, False), (4, False)]
    assert isinstance(failures[9].error, ReadonlyPartitionError)
    assert failures[9].index == 10
    assert failures[-1].index == 4_999_999
    assert isinstance(failures[-1].error, AckTimeoutError)
    assert [f.index for f in failures[8:11]] == [9, 10, 11]
    with pytest.raises(IndexError):
        failures[5_000_000 - 1]


def test_partition_subjects_and_ack_errors_follow_the_server() -> None:
    assert partition_subject("orders", 0) == "orders"
    assert partition_subject("orders", 3) == "orders.3"
    assert ack_error(api.Ack(), "s", 0) is None
    error = ack_error(api.Ack(ackError=api.Ack.INCORRECT_OFFSET), "s", 1)
    assert error is not None
    assert type(error).__name__ == "IncorrectOffsetError"
    assert (error.stream, error.partition, error.may_be_stored) == ("s", 1, False)


def test_the_envelope_carries_every_field_of_the_request() -> None:
    request = api.PublishRequest(
        stream="s", partition=2, key=b"k", value=b"v", ackPolicy=api.ALL, expectedOffset=7, correlationId="42"
    )
    request.headers["h"] = b"1"
    message = decode_message(publish_envelope(request, "_INBOX.x"))
    assert (message.key, message.value, message.headers["h"]) == (b"k", b"v", b"1")
    assert (message.ackInbox, message.correlationId, message.ackPolicy, message.offset) == (
        "_INBOX.x",
        "42",
        api.ALL,
        7,
    )


@pytest.mark.parametrize(
    ("given", "urls"),
    [
        ("127.0.0.1", ("nats://127.0.0.1:4222",)),
        ("a:1, tls://b:4443", ("nats://a:1", "tls://b:4443")),
        (["nats://[::1]:5"], ("nats://[::1]:5",)),
    ],
)
def test_nats_servers_are_normalised(given: object, urls: tuple[str, ...]) -> None:
    assert split_nats_servers(given) == urls


@pytest.mark.parametrize("bad", ["", "nats://user:secret@host:4222", "http://x", "a:99999", 4222, b"a:1"])
def test_bad_nats_servers_are_refused_by_name(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"NATS server|nats servers|invalid broker address"):
        split_nats_servers(bad)


def test_nats_credentials_are_checked_and_never_shown() -> None:
    with pytest.raises(InvalidArgumentError, match="user and password go together"):
        NatsConfig(servers=("a",), user="u")
    with pytest.raises(InvalidArgumentError, match="not a readable file"):
        NatsConfig(servers=("a",), credentials="/no/such.creds")
    config = NatsConfig(servers=("a",), user="u", password="hunter2", token="t0ken")
    assert "hunter2" not in repr(config)
    assert "t0ken" not in repr(config)


def test_connection_extras_turn_on_nats_and_refuse_settings_without_servers() -> None:
    config = config_from_connection("lb:9292", None, {"nats_servers": "n1:4222,n2", "nats_token": "x"})
    assert config.nats is not None
    assert config.nats.servers == ("nats://n1:4222", "nats://n2:4222")
    assert config.nats.token == "x"
    assert config_from_connection("lb", None, {"nats_servers": ""}).nats is None
    with pytest.raises(InvalidArgumentError, match="need nats_servers"):
        config_from_connection("lb", None, {"nats_user": "u", "nats_password": "p"})


def test_a_refusal_after_the_ack_timed_out_replaces_the_timeout() -> None:
    """The server's answer is more precise than our timeout: the message was refused, so it is not stored."""
    window = PublishWindow(1, window=1, ack_wait=1.0, expects_ack=True)
    window.take(0.0)
    window.expire(2.0, timeout_error)
    assert window.on_error(0, ReadonlyPartitionError("readonly"))
    (failure,) = window.result().failures
    assert isinstance(failure.error, ReadonlyPartitionError)
    assert not failure.may_be_stored


def test_batch_errors_name_the_stream_partition_and_whether_stored() -> None:
    errors = BatchErrors("s", lambda index: index % 2)
    lost = errors.lost("reset")(3)
    assert (lost.stream, lost.partition, lost.may_be_stored) == ("s", 1, True)
    assert "reset" in str(lost)
    window = PublishWindow(3, window=1, ack_wait=1.0, expects_ack=True)
    window.take(0.0)
    window.end_at_deadline(errors, 2.5)
    result = window.result()
    assert [(f.index, f.may_be_stored) for f in result.failures] == [(0, True), (1, False), (2, False)]
    assert "not sent: the batch deadline (2.5s)" in str(result.failures[2].error)


def test_a_bare_value_becomes_the_same_request_as_a_publish_message() -> None:
    """publish_batch's shortcut for bytes values (partition 0, no partitioner) builds what the general path does."""

    class ThreePartitions:
        def partition_count(self, stream: str, *, timeout: float | None = None) -> int:
            return 3

    router = ThreePartitions()  # only the partition count is asked
    fast = batch_requests(router, "s", [b"a", b"b"], None, policy=AckPolicy.ALL, deadline=None)
    general = batch_requests(
        router, "s", [PublishMessage(b"a"), PublishMessage(b"b")], None, policy=AckPolicy.ALL, deadline=None
    )
    assert fast == general
    assert [(r.partition, r.correlationId, r.expectedOffset, r.ackPolicy) for r in fast] == [
        (0, "0", -1, api.ALL),
        (0, "1", -1, api.ALL),
    ]
    with pytest.raises(InvalidArgumentError, match="message #1"):
        batch_requests(router, "s", [b"a", "text"], None, policy=AckPolicy.ALL, deadline=None)  # type: ignore[list-item]


# -- issue 47: the ack_wait of a message starts when it is written; NONE takes refusals and loses broken calls --


def test_a_message_taken_but_not_written_never_times_out_as_possibly_stored() -> None:
    """Messages held back by a full flow-control window expired with may_be_stored=True (issue 47, item 6)."""
    window = PublishWindow(4, window=4, ack_wait=1.0, expects_ack=True)
    taken = list(window.take_many(0.0, 4, written=False))
    window.mark_written(taken[:2], 0.5)
    assert window.next_expiry(0.6) == pytest.approx(0.9)
    assert window.expire(10.0, timeout_error) == 2  # only the written ones
    assert window.in_flight == 2
    assert window.next_expiry(10.0) is None  # the oldest left is unwritten: nothing can expire
    window.mark_written(taken[2:], 10.0)
    assert window.expire(10.5, timeout_error) == 0
    assert window.expire(11.0, timeout_error) == 2


def test_ack_policy_none_takes_the_servers_refusals_of_sent_messages() -> None:
    """NONE messages are never in flight, so a refusal was dropped and the message reported sent (item 2)."""
    window = PublishWindow(3, window=1, ack_wait=1.0, expects_ack=False)
    assert list(window.take_many(0.0, 3)) == [0, 1, 2]
    refused = ReadonlyPartitionError("readonly")
    assert window.on_error(1, refused)
    assert not window.on_error(1, refused)  # once
    assert not window.on_error(7, refused)  # unknown
    assert window.done
    assert [(f.index, f.error) for f in window.result().failures] == [(1, refused)]


def test_ack_policy_none_loses_what_a_broken_call_carried_as_possibly_stored() -> None:
    window = PublishWindow(4, window=1, ack_wait=1.0, expects_ack=False)
    window.take_many(0.0, 4)
    window.on_error(0, ReadonlyPartitionError("readonly"))
    lost = UnavailableError("lost", may_be_stored=True)
    assert window.lose_sent([0, 1, 2], lambda index: lost) == 2  # the refusal keeps its own error
    failures = {f.index: f.error for f in window.result().failures}
    assert isinstance(failures[0], ReadonlyPartitionError)
    assert failures[1] is lost
    assert failures[2] is lost
    assert 3 not in failures
