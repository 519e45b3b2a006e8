"""The one table of what a publish without an ack means (core/publish_outcomes.py), case by case."""

from __future__ import annotations

import pytest

from liftbridge_provider.core.publish_outcomes import (
    ASYNC_REFUSALS,
    Unanswered,
    async_refusal,
    may_be_stored_after,
    unanswered,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("code", "details", "may_be_stored"),
    [
        # refused by the server before it handed the message to NATS: nothing stored
        ("NOT_FOUND", "No such stream", False),
        ("INVALID_ARGUMENT", "Invalid subject", False),
        ("FAILED_PRECONDITION", "partition is readonly", False),
        ("UNKNOWN", "client1 is not authorized to Publish on s", False),
        ("UNKNOWN", "nats: maximum payload exceeded", False),
        ("INTERNAL", "failed to resume stream: no known metadata leader", False),
        ("INTERNAL", "failed to publish to NATS: nats: connection closed", False),
        ("RESOURCE_EXHAUSTED", "grpc: received message larger than max (5 vs. 4)", False),
        # cut short or ended by the server's own error after it took the message: it may be stored
        ("CANCELLED", "Channel closed!", True),  # close() (issue 47, item 3)
        ("CANCELLED", "Locally cancelled by application!", True),
        ("UNAVAILABLE", "Socket closed", True),
        ("DEADLINE_EXCEEDED", "Deadline Exceeded", True),
        ("INTERNAL", "context deadline exceeded", True),  # the server's wait for the ack ran out
        ("UNKNOWN", "", True),
        ("RESOURCE_EXHAUSTED", "too_many_pings", True),
    ],
)
def test_a_sent_publish_may_be_stored_unless_the_server_refused_it_first(
    code: str, details: str, may_be_stored: bool
) -> None:
    assert may_be_stored_after(code, details) is may_be_stored


def test_async_refusals_store_nothing_except_a_denial() -> None:
    """v1.9.0 publishes a message PublishAsync denied (api.go has no `continue` after the denial)."""
    stored = {code for code, (_, may_be_stored) in ASYNC_REFUSALS.items() if may_be_stored}
    assert stored == {"PERMISSION_DENIED"}
    assert async_refusal("READONLY") == ("readonly partition", False)
    assert async_refusal("SOMETHING_NEW") == ("unknown refusal", False)


@pytest.mark.parametrize(
    ("written", "expects_ack", "ended_normally", "fate"),
    [
        (False, True, False, Unanswered.NOT_SENT),
        (False, False, True, Unanswered.NOT_SENT),
        (True, False, True, Unanswered.SENT),  # NONE: the server's normal end confirms the batch
        (True, False, False, Unanswered.MAY_BE_STORED),  # NONE on a call that broke (issue 47, item 1)
        (True, True, True, Unanswered.MAY_BE_STORED),  # acks asked for and none came before the end
        (True, True, False, Unanswered.MAY_BE_STORED),
    ],
)
def test_an_unanswered_message_once_its_call_is_over(
    written: bool, expects_ack: bool, ended_normally: bool, fate: Unanswered
) -> None:
    assert unanswered(written=written, expects_ack=expects_ack, call_ended_normally=ended_normally) is fate
