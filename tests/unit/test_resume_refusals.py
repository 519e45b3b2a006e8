"""Which INTERNAL answers say the metadata leadership is moving, so that a refused publish is sent again.

Found by CI (2026-12-07): a publish to a paused partition, sent while the metadata leader was killed, was
refused "failed to resume stream: rpc error: code = Internal desc = context deadline exceeded" (the broker's
forwarded resume request ran out of time) and was reported as refused, not sent again, though the server
stores nothing after a failed resume (v1.9.0 server/api.go: the PublishAsync loop moves on to the next
request). Only a resume's wait that ended counts: the same words without the resume say nothing of storing.
"""

from __future__ import annotations

import grpc
import pytest

from liftbridge_provider.client.retry import leader_changing

INTERNAL = grpc.StatusCode.INTERNAL


@pytest.mark.parametrize(
    "details",
    [
        "failed to resume stream: no known metadata leader",
        "failed to resume stream: nats: no responders available for request",
        "failed to resume stream: rpc error: code = internal desc = context deadline exceeded",
        "failed to resume stream: raft operation timed out",
        "no known metadata leader",
    ],
)
def test_the_leadership_is_moving(details: str) -> None:
    assert leader_changing(INTERNAL, details)


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (INTERNAL, "context deadline exceeded"),  # not a resume: the publish may have been stored
        (INTERNAL, "failed to resume stream: no such stream: s"),  # a missing stream does not come back
        (grpc.StatusCode.DEADLINE_EXCEEDED, "failed to resume stream: context deadline exceeded"),
        (grpc.StatusCode.UNAVAILABLE, "no known metadata leader"),
    ],
)
def test_other_answers_are_not_read_as_a_leader_change(code: grpc.StatusCode, details: str) -> None:
    assert not leader_changing(code, details)
