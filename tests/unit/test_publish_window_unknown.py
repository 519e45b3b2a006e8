"""publish_batch's messages refused as unknown (NOT_FOUND, nothing stored) by a broker behind the metadata: what
PublishWindow does with the metadata's word (``after_unknown``), without a server. They go again while the
metadata lists the partition and the batch has time; they fail at once with their refusal when it does not; they
end as a timeout naming the refusal when time runs out, and never as "may be stored"."""

from __future__ import annotations

import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import LiftbridgeTimeoutError, NoSuchStreamError, UnavailableError
from liftbridge_provider.client.messages import Ack
from liftbridge_provider.client.publish.plans import async_refused_as_unknown
from liftbridge_provider.client.publish.publish_window import BatchErrors, PublishWindow, UnknownWord
from liftbridge_provider.client.retry import Listing


def not_found(index: int) -> NoSuchStreamError:
    return NoSuchStreamError(f"#{index}: no such stream: gal-1", stream="lag-1", partition=0)


def ack(offset: int) -> Ack:
    return Ack(api.Ack(offset=offset), 0)


def one_partition(index: int) -> int:
    return 0


LISTED = UnknownWord({0: Listing.LISTED}, time_left=True, timeout=30.0)


def refused_window(count: int, *, held: int, ack_wait: float = 10.0) -> PublishWindow:
    """A window of ``count`` messages, all sent, the first ``held`` refused as unknown and held."""
    window = PublishWindow(count, window=count, ack_wait=ack_wait, expects_ack=True)
    assert list(window.take_many(0.0, count)) == list(range(count))
    for index in range(held):
        assert window.hold(index, not_found(index), unknown=True)
    return window


def test_refusals_of_a_partition_the_metadata_lists_go_again_first_and_in_order() -> None:
    window = refused_window(3, held=3)
    assert window.unknown_held == [0, 1, 2], "the driver asks the metadata about these before the release"
    assert window.release(0.5, one_partition, LISTED) == (3, 0)
    assert list(window.take_many(0.6, 10)) == [0], "the first goes alone until its ack"
    assert window.on_ack(0, ack(0))
    assert list(window.take_many(0.6, 10)) == [1, 2]
    for index in (1, 2):
        assert window.on_ack(index, ack(index))
    assert window.done
    assert window.result().ok


def test_refusals_of_a_partition_the_metadata_does_not_list_fail_at_once_with_their_refusal() -> None:
    """Bad input stays fast: the missing stream's typed error, not a timeout, not stored."""
    window = refused_window(3, held=3)
    missing = UnknownWord({0: Listing.UNLISTED}, time_left=True, timeout=30.0)
    assert window.release(0.5, one_partition, missing) == (0, 3)
    assert window.done
    for failure in window.result().failures:
        assert isinstance(failure.error, NoSuchStreamError)
        assert "does not list it either" in failure.error.message
        assert failure.may_be_stored is False


@pytest.mark.parametrize("listing", [Listing.LISTED, Listing.UNANSWERED])
def test_refusals_with_no_time_left_end_as_a_timeout_naming_the_refusal_not_stored(listing: Listing) -> None:
    window = refused_window(2, held=2)
    assert window.release(0.5, one_partition, UnknownWord({0: listing}, time_left=False, timeout=3.0)) == (0, 2)
    for failure in window.result().failures:
        assert isinstance(failure.error, LiftbridgeTimeoutError)
        assert "no answer within 3s" in failure.error.message
        assert "unknown" in failure.error.message
        assert failure.may_be_stored is False


def test_without_a_batch_deadline_ack_wait_from_the_first_send_bounds_the_refusals() -> None:
    window = refused_window(1, held=1, ack_wait=2.0)
    no_deadline = UnknownWord({0: Listing.LISTED})
    assert window.release(1.0, one_partition, no_deadline) == (1, 0), "1 s of the 2 s ack_wait is left"
    assert list(window.take_many(1.1, 10)) == [0]
    assert window.hold(0, not_found(0), unknown=True)
    assert window.release(2.5, one_partition, no_deadline) == (0, 1), "first sent 2.5 s ago"
    error = window.result().failures[0].error
    assert isinstance(error, LiftbridgeTimeoutError)
    assert "no answer within 2s" in error.message


def test_a_refusal_the_metadata_lists_fails_as_transient_when_a_later_message_may_be_stored() -> None:
    """The broker caught up mid-window and stored message 1: sending 0 again would store it after 1. It fails,
    not stored, as an UnavailableError (the stream exists: an Airflow task may retry), not NoSuchStreamError."""
    window = refused_window(2, held=1)
    assert window.on_ack(1, ack(0))
    assert window.release(0.5, one_partition, LISTED) == (0, 1)
    failure = window.result().failures[0]
    assert isinstance(failure.error, UnavailableError)
    assert "refused as unknown" in failure.error.message
    assert "a later message" in failure.error.message
    assert failure.may_be_stored is False


@pytest.mark.parametrize("released", [False, True], ids=["held", "released"])
def test_the_batch_deadline_ends_held_and_released_refusals_as_a_timeout_naming_the_refusal(released: bool) -> None:
    window = refused_window(4, held=2)
    assert window.on_ack(2, ack(0))
    assert window.on_ack(3, ack(1))
    if released:  # (partitions of their own: no order to keep)
        assert window.release(0.5, lambda index: index, UnknownWord({0: Listing.LISTED, 1: Listing.LISTED})) == (2, 0)
    window.end_at_deadline(BatchErrors("lag-1", one_partition), 3.0)
    failures = window.result().failures
    assert [f.index for f in failures] == [0, 1]
    for failure in failures:
        assert isinstance(failure.error, LiftbridgeTimeoutError), repr(failure.error)
        assert "unknown" in failure.error.message
        assert failure.may_be_stored is False


def test_a_refusal_that_is_acked_when_sent_again_leaves_nothing_behind() -> None:
    window = refused_window(1, held=1)
    window.release(0.5, one_partition, LISTED)
    assert list(window.take_many(0.6, 1)) == [0]
    assert window.on_ack(0, ack(0))
    window.end_at_deadline(BatchErrors("lag-1", one_partition), 3.0)
    assert window.result().ok


def test_only_a_not_found_refusal_is_read_as_unknown() -> None:
    def refused(code: api.PublishAsyncError.Code) -> api.PublishResponse:
        return api.PublishResponse(asyncError=api.PublishAsyncError(code=code, message="x"))

    assert async_refused_as_unknown(refused(api.PublishAsyncError.NOT_FOUND))
    assert not async_refused_as_unknown(refused(api.PublishAsyncError.READONLY))
    assert not async_refused_as_unknown(api.PublishResponse(ack=api.Ack(offset=1)))
