"""Whether waiting for a partition's high watermark can help: one decision for every bounded read.

A reader sees only committed offsets (up to the high watermark). When an
offset it needs is above it, the leader's own log says whether waiting makes
sense:

- the leader holds the offset (its newest offset reaches it) but has not
  committed it: the commit is on its way. This is a new leader right after a
  failover, whose high watermark lags what the old one committed until its
  followers have caught up, or a follower slow to fetch;
- the leader does not hold it: nothing is on its way from this leader, so a
  read that must not wait for new messages refuses at once.

:func:`high_watermark_reaching` is the wait as a plan (see
:mod:`~liftbridge_provider.client.plans`), driven by the synchronous client's
``wait_for_high_watermark``, which ``read_range``, ``range_subscription``,
``offset_at_time`` and the Spark source's range check call.
"""

from __future__ import annotations

from enum import Enum

from liftbridge_provider.client.metadata import Metadata, PartitionInfo
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.partition_plans import partition_metadata
from liftbridge_provider.client.plans import KeptVote, Plan, Sleep, voters_of
from liftbridge_provider.client.retry import Deadline, backoff_delay
from liftbridge_provider.core.errors import LiftbridgeError


class Standing(Enum):
    """Where an offset stands on a partition's leader."""

    COMMITTED = "committed"  # at or below the high watermark: readable now
    HELD = "held"  # in the leader's log above the high watermark: its commit is on its way
    ABSENT = "absent"  # past the leader's newest offset: waiting for the commit cannot bring it


def standing(info: PartitionInfo, offset: int) -> Standing:
    """Where ``offset`` stands on the leader whose authoritative metadata is ``info``."""
    if info.high_watermark >= offset:
        return Standing.COMMITTED
    if info.newest_offset >= offset:
        return Standing.HELD
    return Standing.ABSENT


def worth_waiting(info: PartitionInfo, offset: int, *, held_only: bool) -> bool:
    """Whether to ask the leader again for ``offset``'s commit: not once it is committed, and with
    ``held_only`` not when the leader does not hold it (a plain wait goes on for new messages too)."""
    state = standing(info, offset)
    return state is Standing.HELD or (state is Standing.ABSENT and not held_only)


def high_watermark_reaching(
    config: ClientConfig,
    snapshot: Metadata,
    deadline: Deadline,
    stream: str,
    partition: int,
    *,
    offset: int,
    held_only: bool,
) -> Plan[PartitionInfo]:
    """The leader's partition metadata, asked for again (jittered 10-500 ms backoff) while :func:`worth_waiting`
    says so and ``deadline`` has time left; the last answer.

    The first question is always asked (within what is left of ``deadline``). Before an answer makes a
    ``held_only`` wait give up (the offset is not in that leader's log), the question goes once more to the
    leader that more than half of the brokers name (:func:`~liftbridge_provider.client.plans.agreed_leader`),
    and from then on: a leader frozen past a failover still answers as leader with its old log for a moment
    after it thaws, and a client whose metadata names it would refuse a committed offset.
    An answer that fails once the deadline has passed gives way to the last one
    seen; a failure before any answer, or one while time is left, is raised (a
    missing stream, a paused partition, no leader at all).
    """
    seen: PartitionInfo | None = None
    attempt = 0
    agreed: KeptVote | None = None  # set once a refusal is to be confirmed
    may_confirm = held_only and len(voters_of(config, snapshot)) > 1  # one broker: nobody else to ask
    while seen is None or not deadline.expired:
        try:
            info = yield from partition_metadata(config, snapshot, deadline, stream, partition, agreed=agreed)
        except LiftbridgeError:
            if seen is None or not deadline.expired:
                raise
            return seen
        seen = info
        if may_confirm and agreed is None and not deadline.expired and standing(info, offset) is Standing.ABSENT:
            agreed = KeptVote()  # a refusal: confirm it with the leader that more than half of the brokers name
            continue
        if deadline.expired or not worth_waiting(info, offset, held_only=held_only):
            return info
        yield Sleep(min(backoff_delay(attempt), deadline.remaining()))
        attempt += 1
    return seen


def why_not_committed(info: PartitionInfo, offset: int, waited: float) -> str:
    """Why ``offset`` is still above the high watermark in ``info`` after a wait of ``waited`` seconds (or none),
    for the error a refused read raises."""
    if standing(info, offset) is Standing.HELD:
        return (
            f"the leader holds offsets up to {info.newest_offset} but had not committed them after {waited:g}s "
            "(a new leader catching up after a failover, or a follower slow to fetch)"
        )
    return f"the leader's newest offset is {info.newest_offset}: nothing past it was published yet"
