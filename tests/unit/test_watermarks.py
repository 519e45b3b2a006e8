"""When a bounded read waits for the high watermark: the pure decision and the plan that polls by it.

Driven by scripted leader answers (no server); tests/server covers the
same decision against Liftbridge (a range nothing will fill is refused at
once, a range the leader holds uncommitted is waited for).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any

import grpc
import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import NoSuchStreamError, plans
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.metadata import BrokerInfo, Metadata, PartitionInfo, StreamInfo
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.retry import Deadline
from liftbridge_provider.client.watermarks import (
    Standing,
    high_watermark_reaching,
    standing,
    why_not_committed,
    worth_waiting,
)
from tests.unit.plan_driving import Rpc, drive

CONFIG = ClientConfig(brokers=("10.0.0.1:9292",))


@pytest.fixture(autouse=True)
def no_suspected_brokers() -> Iterator[None]:
    """Each test starts and ends with no broker suspected (the health model is process-wide)."""
    HEALTH.clear()
    yield
    HEALTH.clear()


def info(high_watermark: int, newest_offset: int) -> PartitionInfo:
    return PartitionInfo("s", 0, "a", ("a",), ("a",), high_watermark, newest_offset, False, False)


def snapshot() -> Metadata:
    brokers = MappingProxyType({"a": BrokerInfo("a", "a.example", 9292)})
    stream = StreamInfo("s", "s", MappingProxyType({0: info(-1, -1)}), 0)
    return Metadata(brokers, MappingProxyType({"s": stream}), 0.0)


@pytest.mark.parametrize(
    ("high_watermark", "newest_offset", "offset", "expected"),
    [
        (9, 9, 9, Standing.COMMITTED),
        (9, 12, 5, Standing.COMMITTED),
        (5, 12, 11, Standing.HELD),  # a new leader whose high watermark lags what it holds
        (-1, 12, 12, Standing.HELD),  # right after a failover the high watermark can read -1
        (9, 9, 11, Standing.ABSENT),  # a healthy partition: the range ends past the newest message
        (5, 9, 11, Standing.ABSENT),  # held in part: the rest was never published
        (-1, -1, 0, Standing.ABSENT),  # an empty partition
    ],
)
def test_where_an_offset_stands_on_the_leader(
    high_watermark: int, newest_offset: int, offset: int, expected: Standing
) -> None:
    assert standing(info(high_watermark, newest_offset), offset) is expected


def test_a_read_waits_only_for_a_commit_on_its_way_and_a_plain_wait_for_new_messages_too() -> None:
    held, absent, committed = info(5, 12), info(9, 9), info(12, 12)
    assert worth_waiting(held, 11, held_only=True)
    assert not worth_waiting(absent, 11, held_only=True)
    assert worth_waiting(absent, 11, held_only=False)
    assert not worth_waiting(committed, 11, held_only=True)
    assert not worth_waiting(committed, 11, held_only=False)


def test_the_refusal_says_why_the_offset_is_not_committed() -> None:
    assert "holds offsets up to 12 but had not committed them after 10s" in why_not_committed(info(5, 12), 11, 10)
    assert "newest offset is 9: nothing past it was published yet" in why_not_committed(info(9, 9), 11, 10)


def leader_answering(answers: Iterator[PartitionInfo], asked: list[str]) -> Any:
    """A driver's stand-in: each FetchPartitionMetadata gets the next of ``answers``; sleeps are slept."""

    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Attempt):
            asked.append(action.address)
            try:
                given = next(answers)
            except StopIteration:
                raise Rpc(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer") from None
            metadata = api.PartitionMetadata(
                id=0, leader="a", highWatermark=given.high_watermark, newestOffset=given.newest_offset
            )
            return api.FetchPartitionMetadataResponse(metadata=metadata)
        if isinstance(action, plans.Sleep):
            time.sleep(action.seconds)
            return None
        raise AssertionError(f"unexpected {action}")

    return answer


def reaching(offset: int, deadline: Deadline, *, held_only: bool) -> plans.Plan[PartitionInfo]:
    return high_watermark_reaching(CONFIG, snapshot(), deadline, "s", 0, offset=offset, held_only=held_only)


def test_an_offset_the_leader_does_not_hold_is_answered_after_one_question() -> None:
    asked: list[str] = []
    result, seen = drive(
        reaching(11, Deadline(10), held_only=True), leader_answering(iter([info(9, 9), info(12, 12)]), asked)
    )
    assert (result.high_watermark, result.newest_offset) == (9, 9)
    assert asked == ["a.example:9292"]
    assert not any(isinstance(action, plans.Sleep) for action in seen)


def test_an_offset_the_leader_holds_is_asked_for_again_until_committed() -> None:
    asked: list[str] = []
    answers = iter([info(-1, 12), info(5, 12), info(12, 12)])
    result, seen = drive(reaching(11, Deadline(10), held_only=True), leader_answering(answers, asked))
    assert result.high_watermark == 12
    assert len(asked) == 3
    assert [type(a).__name__ for a in seen] == ["Attempt", "Sleep", "Attempt", "Sleep", "Attempt"]


def test_a_plain_wait_asks_again_for_messages_nobody_published_yet() -> None:
    asked: list[str] = []
    answers = iter([info(9, 9), info(9, 9), info(11, 11)])
    result, _seen = drive(reaching(11, Deadline(10), held_only=False), leader_answering(answers, asked))
    assert result.high_watermark == 11
    assert len(asked) == 3


def test_a_commit_that_does_not_come_ends_the_wait_by_its_deadline_with_the_last_answer() -> None:
    """The deadline covers the questions too: the last one, cut by it, gives way to the last answer seen."""
    asked: list[str] = []
    started = time.monotonic()
    result, _seen = drive(
        reaching(11, Deadline(0.3), held_only=True), leader_answering(iter([info(5, 12)] * 1000), asked)
    )
    assert (result.high_watermark, result.newest_offset) == (5, 12)
    assert time.monotonic() - started < 0.3 + 0.5, "the wait ended by its deadline"


def test_a_first_question_that_fails_is_raised() -> None:
    def answer(action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Refresh):
            return Metadata(MappingProxyType({}), MappingProxyType({}), 0.0)
        if isinstance(action, plans.Sleep):
            return None
        raise AssertionError(f"unexpected {action}")

    with pytest.raises(NoSuchStreamError):
        drive(
            high_watermark_reaching(
                CONFIG,
                Metadata(MappingProxyType({}), MappingProxyType({}), 0.0),
                Deadline(1),
                "s",
                0,
                offset=0,
                held_only=True,
            ),
            answer,
        )


def three_brokers() -> Metadata:
    """Three brokers; the snapshot names ``a`` as the partition's leader (stale: ``b`` leads now)."""
    brokers = MappingProxyType({n: BrokerInfo(n, f"{n}.example", 9292) for n in ("a", "b", "c")})
    partition = PartitionInfo("s", 0, "a", ("a", "b", "c"), ("a", "b", "c"), -1, -1, False, False)
    stream = StreamInfo("s", "s", MappingProxyType({0: partition}), 0)
    return Metadata(brokers, MappingProxyType({"s": stream}), 0.0)


class Brokers:
    """Stubs of three brokers: ``a``, frozen past a failover and thawed, still answers as leader with its old
    log (high watermark 0); ``b`` and ``c`` name ``b`` as the leader, whose high watermark is 50."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def answer(self, action: plans.PlanAction) -> Any:
        assert isinstance(action, plans.Attempt), action
        return action.rpc(self.Stub(self, action.address.split(".")[0]), action.timeout)

    class Stub:
        def __init__(self, brokers: Brokers, name: str) -> None:
            self.brokers, self.name = brokers, name

        def FetchPartitionMetadata(self, request: Any, timeout: float) -> Any:
            self.brokers.asked.append((self.name, "partition"))
            high = 0 if self.name == "a" else 50
            metadata = api.PartitionMetadata(id=0, leader=self.name, highWatermark=high, newestOffset=high)
            return api.FetchPartitionMetadataResponse(metadata=metadata)

        def FetchMetadata(self, request: Any, timeout: float) -> Any:
            self.brokers.asked.append((self.name, "metadata"))
            leader = "a" if self.name == "a" else "b"
            brokers = [api.Broker(id=n, host=f"{n}.example", port=9292) for n in ("a", "b", "c")]
            partition = api.PartitionMetadata(id=0, leader=leader, replicas=["a", "b", "c"], isr=["a", "b", "c"])
            stream = api.StreamMetadata(name="s", subject="s", partitions={0: partition})
            return api.FetchMetadataResponse(brokers=brokers, streamMetadata=[stream])


def test_a_refusal_is_confirmed_with_the_leader_most_brokers_name() -> None:
    """The leader the snapshot names does not hold offset 50 (it was frozen past a failover and still acts as
    leader after its thaw): before refusing, the wait asks the leader that more than half of the brokers name,
    and answers with its metadata (chaos seed 86). Before, the ex-leader's answer was final."""
    config = ClientConfig(brokers=("a.example:9292",))
    brokers = Brokers()
    plan = high_watermark_reaching(config, three_brokers(), Deadline(10), "s", 0, offset=50, held_only=True)
    result, _seen = drive(plan, brokers.answer)
    assert result.high_watermark == 50
    assert brokers.asked[0] == ("a", "partition"), "the snapshot's leader first"
    assert brokers.asked[-1] == ("b", "partition"), "then the agreed leader"
    assert sum(kind == "metadata" for _, kind in brokers.asked) >= 2, "a vote of the brokers in between"


def test_with_one_broker_a_refusal_needs_no_vote() -> None:
    """One broker: nobody else could name another leader, so the first answer stands (one question)."""
    asked: list[str] = []
    result, _seen = drive(reaching(50, Deadline(10), held_only=True), leader_answering(iter([info(9, 9)]), asked))
    assert result.high_watermark == 9
    assert len(asked) == 1
