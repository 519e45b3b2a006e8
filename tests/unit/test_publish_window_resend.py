"""Messages the server refused without storing them (its metadata leader was being replaced while it resumed a
paused partition): which are sent again, in what order, and which fail instead. Pure logic of PublishWindow and
of the publish plans' reading of the server's answers."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import AckTimeoutError, LiftbridgeError
from liftbridge_provider.client.messages import Ack
from liftbridge_provider.client.publish.plans import refused_while_leader_changes
from liftbridge_provider.client.publish.publish_window import PublishWindow
from liftbridge_provider.client.retry import leader_changing

NO_RESPONDERS = "failed to resume stream: rpc error: code = Internal desc = nats: no responders available for request"


def refusal(index: int) -> LiftbridgeError:
    return LiftbridgeError(f"#{index}: {NO_RESPONDERS}", stream="s", partition=0)


def ack(offset: int) -> Ack:
    return Ack(api.Ack(offset=offset), 0)


def one_partition(index: int) -> int:
    return 0


def test_a_held_message_stops_new_sends_until_released_then_goes_first_in_order() -> None:
    window = PublishWindow(6, window=3, ack_wait=10.0, expects_ack=True)
    assert list(window.take_many(0.0, 10)) == [0, 1, 2]
    assert window.hold(0, refusal(0))
    assert window.hold(1, refusal(1))
    assert (window.holding, window.done) == (True, False)
    assert list(window.take_many(0.1, 10)) == [], "nothing new may go out while a refused message is held"
    assert window.hold(2, refusal(2))
    assert window.release(0.5, one_partition) == (3, 0)
    assert not window.holding
    assert list(window.take_many(0.6, 10)) == [0], "the released ones go again first, the first alone"
    assert window.on_ack(0, ack(0))
    assert list(window.take_many(0.6, 10)) == [1, 2], "then in index order, before new ones"
    assert list(window.take_many(0.6, 10)) == [3]
    assert list(window.take_many(0.6, 10)) == [], "the window holds 3"
    for index in (1, 2, 3):
        assert window.on_ack(index, ack(index))
    assert list(window.take_many(0.7, 10)) == [4, 5]
    for index in (4, 5):
        assert window.on_ack(index, ack(index))
    assert window.done
    assert window.result().ok


def test_a_held_message_fails_when_a_later_one_of_its_partition_may_be_stored() -> None:
    """Sending it again would store it after the later one: the batch's order within a partition comes first."""
    window = PublishWindow(4, window=4, ack_wait=10.0, expects_ack=True)
    assert list(window.take_many(0.0, 10)) == [0, 1, 2, 3]
    window.hold(0, refusal(0))  # partition 0
    window.hold(1, refusal(1))  # partition 1
    assert window.on_ack(2, ack(0))  # partition 0: stored after 0 was refused
    window.expire(20.0, lambda index: AckTimeoutError("late", may_be_stored=True))  # 3, partition 1: may be stored
    assert window.release(0.5, lambda index: index % 2) == (0, 2)
    failures = {f.index: f.error for f in window.result().failures}
    assert set(failures) == {0, 1, 3}
    assert "later message of its partition may be stored" in failures[0].message
    assert not failures[0].may_be_stored
    assert NO_RESPONDERS in failures[0].message
    assert window.done


def test_a_later_refused_or_unstored_message_of_the_partition_does_not_block_a_resend() -> None:
    window = PublishWindow(3, window=3, ack_wait=10.0, expects_ack=True)
    assert list(window.take_many(0.0, 10)) == [0, 1, 2]
    window.hold(0, refusal(0))
    window.on_error(1, LiftbridgeError("too large", may_be_stored=False))
    window.hold(2, refusal(2))
    assert window.release(0.5, one_partition) == (2, 0)
    assert list(window.take_many(1.0, 10)) == [0]
    assert window.on_ack(0, ack(0))
    assert list(window.take_many(1.0, 10)) == [2]


def test_a_message_refused_for_ack_wait_since_it_was_first_sent_fails() -> None:
    window = PublishWindow(1, window=1, ack_wait=2.0, expects_ack=True)
    assert list(window.take_many(0.0, 1)) == [0]
    window.hold(0, refusal(0))
    assert window.release(1.0, one_partition) == (1, 0)
    assert list(window.take_many(1.0, 1)) == [0]
    window.hold(0, refusal(0))
    assert window.release(2.5, one_partition) == (0, 1), "2.5 s after it was first sent, with ack_wait 2 s"
    (failure,) = window.result().failures
    assert "ack_wait" in failure.error.message
    assert window.done


def test_ending_the_batch_fails_held_and_released_messages_with_their_refusal() -> None:
    window = PublishWindow(5, window=2, ack_wait=10.0, expects_ack=True)
    assert list(window.take_many(0.0, 10)) == [0, 1]
    window.hold(0, refusal(0))
    window.hold(1, refusal(1))
    window.release(0.1, one_partition)
    assert list(window.take_many(0.2, 1)) == [0]
    window.hold(0, refusal(0))
    assert window.fail_unsent(AckTimeoutError("deadline")) == 5
    failures = window.result().failures
    assert [f.index for f in failures] == [0, 1, 2, 3, 4]
    assert NO_RESPONDERS in failures[0].error.message
    assert NO_RESPONDERS in failures[1].error.message
    assert failures[2].error.message == "deadline"
    assert window.done


def test_untaken_resends_go_back_to_the_front_and_new_messages_to_where_they_began() -> None:
    window = PublishWindow(6, window=6, ack_wait=10.0, expects_ack=True)
    assert list(window.take_many(0.0, 2)) == [0, 1]
    window.hold(0, refusal(0))
    window.hold(1, refusal(1))
    window.release(0.1, one_partition)
    assert list(window.take_many(0.2, 10)) == [0]
    assert window.on_ack(0, ack(0))
    assert list(window.take_many(0.2, 10)) == [1]
    assert list(window.take_many(0.2, 2)) == [2, 3]
    assert window.untake([1, 2, 3]) == 3, "1 (sent again) and 2, 3 (new) never left the client"
    assert take_until_empty(window, 0.3) == [1, 2, 3, 4, 5], "0 was acked: no longer one at a time"


def test_an_untaken_resend_goes_before_new_messages_it_is_not_next_to() -> None:
    window = PublishWindow(6, window=6, ack_wait=10.0, expects_ack=True)
    assert list(window.take_many(0.0, 3)) == [0, 1, 2]
    window.hold(0, refusal(0))
    assert window.on_ack(1, ack(0))
    assert window.on_ack(2, ack(1))
    window.release(0.1, lambda index: 0 if index == 0 else 1)
    assert list(window.take_many(0.2, 10)) == [0]
    assert list(window.take_many(0.2, 2)) == [], "0 goes alone until its answer"
    assert window.untake([0]) == 1
    assert take_until_empty(window, 0.3) == [0]
    assert window.on_ack(0, ack(2))
    assert take_until_empty(window, 0.4) == [3, 4, 5], "acked: the window opens again"


def take_until_empty(window: PublishWindow, now: float) -> list[int]:
    taken: list[int] = []
    while chunk := window.take_many(now, 10):
        taken.extend(chunk)
    return taken


def test_hold_ignores_a_message_not_awaiting_its_ack() -> None:
    window = PublishWindow(2, window=2, ack_wait=10.0, expects_ack=True)
    assert list(window.take_many(0.0, 1)) == [0]
    assert window.hold(1, refusal(1)) is False, "never sent"
    assert window.on_ack(0, ack(0))
    assert window.hold(0, refusal(0)) is False, "already acked"
    assert not window.holding


def late(index: int) -> LiftbridgeError:
    return AckTimeoutError(f"#{index}: no ack within 1s", stream="s", partition=0, may_be_stored=True)


def pump(window: PublishWindow, now: float) -> list[int]:
    """What the publisher's pump does: take until the window gives nothing."""
    taken: list[int] = []
    while chunk := window.take_many(now, 256):
        taken.extend(chunk)
    return taken


def test_a_resend_that_timed_out_unwritten_does_not_stop_the_messages_after_it() -> None:
    """A resend and a new message were handed to a stream that stopped reading; both timed out unwritten, the
    stream broke and they were untaken. The next stream must get the next new message: the batch sat idle on
    a healthy stream until its deadline (forever without one) when only failed resends were queued."""
    window = PublishWindow(4, window=2, ack_wait=1.0, expects_ack=True)
    assert pump(window, 0.0) == [0, 1]
    assert window.hold(0, refusal(0))
    assert window.on_ack(1, ack(0))
    assert window.release(0.1, lambda index: index) == (1, 0)
    handed = pump(window, 0.2)
    assert handed == [0], "sent again: alone until an ack"
    assert window.expire(1.3, late) == 1
    window.untake(handed)
    assert pump(window, 1.4) == [2], "the message not sent yet goes next (alone: no ack yet); 0 stays failed"
    assert window.on_ack(2, ack(1))
    assert pump(window, 1.5) == [3]
    assert window.on_ack(3, ack(2))
    assert window.done
    outcome = {f.index: f.may_be_stored for f in window.result().failures}
    assert outcome == {0: True}, "timed out after being handed over: reported as may be stored"


def test_a_new_message_untaken_behind_a_refused_one_fails_as_not_sent_at_the_deadline() -> None:
    """untake puts a never-refused message that is not at the tail (a refused index lies between it and the
    next new one) in line with the resends; the batch deadline must fail it as not sent, not crash."""
    window = PublishWindow(6, window=6, ack_wait=10.0, expects_ack=True)
    window.refuse(2, LiftbridgeError("partition 1 is readonly", stream="s", partition=1))
    handed = pump(window, 0.0)
    assert handed == [0, 1, 3, 4, 5]
    window.untake(handed)
    deadline = AckTimeoutError("not sent: the batch deadline (5s) passed first", stream="s")
    assert window.fail_unsent(deadline) == 5
    failures = {f.index: f.error for f in window.result().failures}
    assert sorted(failures) == [0, 1, 2, 3, 4, 5]
    assert all(not error.may_be_stored for error in failures.values())
    assert "readonly" in failures[2].message
    assert all("deadline" in failures[index].message for index in (0, 1, 3, 4, 5))


def test_a_refusal_after_the_ack_timed_out_says_not_stored() -> None:
    """The server's later word that nothing was stored is the more precise answer, as for any other refusal
    (on_error); the message is not sent again, its ack_wait is over."""
    window = PublishWindow(2, window=2, ack_wait=1.0, expects_ack=True)
    assert pump(window, 0.0) == [0, 1]
    assert window.expire(2.0, late) == 2
    assert window.hold(0, refusal(0))
    assert not window.holding, "not held: its time is over"
    assert window.done
    failures = {f.index: f.error for f in window.result().failures}
    assert (failures[0].may_be_stored, failures[1].may_be_stored) == (False, True)
    assert NO_RESPONDERS in failures[0].message


def async_refusal(code: Any, message: str) -> api.PublishResponse:
    return api.PublishResponse(asyncError=api.PublishAsyncError(code=code, message=message))


@pytest.mark.parametrize(
    ("code", "message", "again"),
    [
        (api.PublishAsyncError.INTERNAL, NO_RESPONDERS, True),
        (api.PublishAsyncError.INTERNAL, "failed to resume stream: no known metadata leader", True),
        (api.PublishAsyncError.INTERNAL, "failed to resume stream: raft: leadership lost", False),
        (api.PublishAsyncError.INTERNAL, "failed to publish to NATS: nats: connection closed", False),
        (api.PublishAsyncError.NOT_FOUND, "no such stream: s", False),
        (api.PublishAsyncError.READONLY, "partition is readonly", False),
    ],
)
def test_only_the_servers_word_that_nothing_was_stored_sends_a_message_again(
    code: Any, message: str, again: bool
) -> None:
    assert refused_while_leader_changes(async_refusal(code, message)) is again


def test_the_unary_path_reads_the_same_refusal_from_the_calls_status() -> None:
    """INTERNAL and the server's words; the same words as UNAVAILABLE are another failure."""
    assert leader_changing(grpc.StatusCode.INTERNAL, "nats: no responders available for request")
    assert not leader_changing(grpc.StatusCode.UNAVAILABLE, "nats: no responders available for request")


def test_messages_sent_again_go_one_at_a_time_until_one_is_acked() -> None:
    """Found by CI (test_resume_during_leader_change, batch): 8 released messages went again together while
    the new metadata leader was being elected; the server refused some and stored later ones of the same
    partition, so the refused ones could not go again without breaking the batch's order and failed unstored.
    A release must probe with one message: nothing else goes out until it is acked (the broker takes requests
    again), then the rest go together. A probe that is refused again, times out or is untaken leaves the next
    one to probe."""
    window = PublishWindow(6, window=4, ack_wait=10.0, expects_ack=True)
    assert list(window.take_many(0.0, 10)) == [0, 1, 2, 3]
    for index in (0, 1, 2, 3):
        assert window.hold(index, refusal(index))
    assert window.release(0.1, one_partition) == (4, 0)
    assert list(window.take_many(0.2, 10)) == [0], "the first message sent again goes alone"
    assert list(window.take_many(0.2, 10)) == [], "nothing else while it awaits its answer"
    assert window.take(0.2) is None, "take() keeps the same rule"
    assert window.hold(0, refusal(0)), "refused again: the broker still cannot resume"
    assert window.release(0.3, one_partition) == (1, 0)
    assert list(window.take_many(0.4, 10)) == [0], "still probing"
    assert window.untake([0]) == 1, "never written: it probes again"
    assert list(window.take_many(0.5, 10)) == [0]
    assert window.on_ack(0, ack(0))
    assert list(window.take_many(0.6, 10)) == [1, 2, 3], "acked: the others go together"
    for index in (1, 2, 3):
        assert window.on_ack(index, ack(index))
    assert list(window.take_many(0.7, 10)) == [4, 5]


def test_a_probe_that_times_out_lets_the_next_message_probe() -> None:
    window = PublishWindow(3, window=3, ack_wait=1.0, expects_ack=True)
    assert list(window.take_many(0.0, 10)) == [0, 1, 2]
    for index in (0, 1, 2):
        assert window.hold(index, refusal(index))
    window.release(0.1, one_partition)
    assert list(window.take_many(0.2, 10)) == [0]
    assert window.expire(1.3, late) == 1
    assert list(window.take_many(1.4, 10)) == [1], "no ack came: the next one goes alone"
    assert window.on_ack(1, ack(1))
    assert list(window.take_many(1.5, 10)) == [2]
    assert window.on_ack(2, ack(2))
    assert window.done
    assert [f.index for f in window.result().failures] == [0], "the probe that timed out may be stored"


def test_a_late_ack_of_a_message_sent_before_the_release_does_not_end_the_probing() -> None:
    """Found in review: an ack of a message that timed out before the release says nothing of whether the
    broker takes requests again; only the probe's own ack opens the window."""
    window = PublishWindow(6, window=3, ack_wait=1.0, expects_ack=True)
    assert list(window.take_many(0.0, 1)) == [0]
    assert window.expire(1.1, late) == 1
    assert list(window.take_many(1.2, 2)) == [1, 2]
    assert window.hold(1, refusal(1))
    assert window.hold(2, refusal(2))
    assert window.release(1.3, lambda index: index) == (2, 0), "each in a partition of its own"
    assert list(window.take_many(1.4, 10)) == [1], "the probe"
    assert window.on_ack(0, ack(0)), "the late ack of 0 still counts"
    assert list(window.take_many(1.4, 10)) == [], "but the probe has not been answered"
    assert window.on_error(1, LiftbridgeError("too large", may_be_stored=False)), "the probe fails for good"
    assert list(window.take_many(1.6, 10)) == [2], "still probing: the next goes alone"
    assert list(window.take_many(1.6, 10)) == []


def test_take_keeps_the_probing_rule_after_the_probe_failed() -> None:
    """Found in review: once the resends were used up, take() went back to taking new messages as fast as the
    window allows while no ack had come since the release."""
    window = PublishWindow(8, window=4, ack_wait=1.0, expects_ack=True)
    assert [window.take(0.0) for _ in range(2)] == [0, 1]
    assert window.hold(0, refusal(0))
    assert window.hold(1, refusal(1))
    assert window.release(0.1, lambda index: index) == (2, 0)
    assert window.take(0.2) == 0
    assert window.on_error(0, LiftbridgeError("too large", may_be_stored=False))
    assert window.take(0.3) == 1
    assert window.expire(1.4, late) == 1, "the second probe timed out"
    assert window.take(1.5) == 2
    assert window.take(1.5) is None, "no ack since the release: one at a time"
    assert window.on_ack(2, ack(0))
    assert [window.take(1.6) for _ in range(4)] == [3, 4, 5, 6], "acked: the window opens"
