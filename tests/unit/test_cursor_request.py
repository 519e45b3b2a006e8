"""A cursor request as one plan (client/cursor_plans.cursor_request), without a server: the checks that come
before anything is sent, the ``__cursors`` partition it goes to, and the errors it names. Both clients run it."""

from __future__ import annotations

import asyncio
import random
from types import MappingProxyType
from typing import Any

import grpc
import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import (
    CursorsDisabledError,
    NoSuchPartitionError,
    NoSuchStreamError,
    cursor_advance,
    cursor_plans,
    plans,
)
from liftbridge_provider.client.cursor_advance import CursorStep
from liftbridge_provider.client.metadata import BrokerInfo, Metadata, PartitionInfo, StreamInfo
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.requests import CURSORS_STREAM, set_cursor_request
from liftbridge_provider.client.retry import Deadline
from liftbridge_provider.core.errors import LiftbridgeError
from tests.unit.plan_driving import Rpc, drive

CONFIG = ClientConfig.of("a.example:9292")


def cluster(*, cursor_partitions: int | None, streams: dict[str, int]) -> Metadata:
    """One broker ``a`` leading every partition: ``__cursors`` with ``cursor_partitions`` (None: cursors
    disabled) and the user's ``streams`` {name: partition count}."""

    def stream(name: str, count: int) -> StreamInfo:
        parts = {p: PartitionInfo(name, p, "a", ("a",), ("a",), -1, -1, False, False) for p in range(count)}
        return StreamInfo(name, name, MappingProxyType(parts), 0)

    every = dict(streams)
    if cursor_partitions is not None:
        every[CURSORS_STREAM] = cursor_partitions
    return Metadata(
        MappingProxyType({"a": BrokerInfo("a", "a.example", 9292)}),
        MappingProxyType({name: stream(name, count) for name, count in every.items()}),
        0.0,
    )


def set_rpc(stub: Any, timeout: float) -> Any:
    return stub.SetCursor(None, timeout=timeout)


class Answering:
    """Stands in for I/O: Refresh gets ``fresh``; an Attempt records the partition its stub was reached through."""

    def __init__(self, fresh: Metadata, failure: grpc.RpcError | None = None) -> None:
        self.fresh, self.failure = fresh, failure
        self.attempts: list[str] = []
        self.refreshes = 0

    def __call__(self, action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Refresh):
            self.refreshes += 1
            return self.fresh
        if isinstance(action, plans.Sleep):
            return None
        assert isinstance(action, plans.Attempt)
        self.attempts.append(action.address)
        if self.failure is not None:
            raise self.failure
        return "stored"


@pytest.mark.parametrize(
    ("fresh", "error", "named"),
    [
        (cluster(cursor_partitions=None, streams={"orders": 1}), CursorsDisabledError, "cursors.stream.partitions"),
        (cluster(cursor_partitions=2, streams={}), NoSuchStreamError, "orders"),
        (cluster(cursor_partitions=2, streams={"orders": 1}), NoSuchPartitionError, "3"),
    ],
)
def test_a_cursor_for_a_partition_that_does_not_exist_is_refused_after_refreshes_and_nothing_is_sent(
    fresh: Metadata, error: type[LiftbridgeError], named: str
) -> None:
    """The server would store a cursor for any stream and partition: the plan asks the metadata again when its
    snapshot does not know the target (plans.UNKNOWN_STREAM_ASKS times: a broker may lag a moment behind a new
    stream), and refuses with a typed error before any attempt goes out."""
    stale = cluster(cursor_partitions=None, streams={})
    answering = Answering(fresh)
    request = set_cursor_request("reader", "orders", 3, 10)
    with pytest.raises(error, match=named):
        drive(cursor_plans.cursor_request(CONFIG, stale, Deadline(5), request, set_rpc), answering)
    assert answering.attempts == []
    assert answering.refreshes == plans.UNKNOWN_STREAM_ASKS


class Lagging(Answering):
    """The first refreshes reach brokers that have not applied the stream yet; later ones list it."""

    def __init__(self, answers: list[Metadata]) -> None:
        super().__init__(answers[-1])
        self.answers = answers

    def __call__(self, action: plans.PlanAction) -> Any:
        if isinstance(action, plans.Refresh):
            self.fresh = self.answers[min(self.refreshes, len(self.answers) - 1)]
        return super().__call__(action)


def test_a_stream_created_a_moment_ago_is_asked_for_again_before_it_is_called_missing() -> None:
    """Found by CI (test_cursors_survive_the_loss_of_the_cursors_leader): set_cursor right after create_stream
    got NoSuchStreamError from a refresh that reached a broker which had not applied the new stream yet. The
    plan must ask again, after a pause, as every other call does (plans.knowing), and then send."""
    stale = cluster(cursor_partitions=2, streams={})
    answering = Lagging([stale, cluster(cursor_partitions=2, streams={"orders": 1})])
    request = set_cursor_request("reader", "orders", 0, 10)
    result, _ = drive(cursor_plans.cursor_request(CONFIG, stale, Deadline(5), request, set_rpc), answering)
    assert result == "stored"
    assert answering.refreshes == 2
    assert answering.attempts == ["a.example:9292"]


def test_a_known_target_sends_without_a_refresh_and_a_failure_names_the_cursors_own_partition() -> None:
    """With the target known, the first action is the attempt itself; a final error from the ``__cursors``
    leader names the stream and partition the caller asked about, not ``__cursors``."""
    random.seed(1)
    known = cluster(cursor_partitions=3, streams={"orders": 4})
    answering = Answering(known, failure=Rpc(grpc.StatusCode.PERMISSION_DENIED, "no"))
    request = set_cursor_request("reader", "orders", 2, 10)
    with pytest.raises(LiftbridgeError) as raised:
        drive(cursor_plans.cursor_request(CONFIG, known, Deadline(5), request, set_rpc), answering)
    assert (raised.value.stream, raised.value.partition) == ("orders", 2)
    assert answering.refreshes == 0
    assert answering.attempts
    assert set(answering.attempts) == {"a.example:9292"}


def test_the_asyncio_driver_takes_the_same_steps_as_the_sync_one() -> None:
    """cursor_advance.run and run_async carry one plan out alike: fetch every partition, then store the writes."""

    def steps(driver: str) -> tuple[list[tuple[str, int]], dict[int, CursorStep]]:
        cursors = {0: 4, 1: -1}
        log: list[tuple[str, int]] = []
        plan = cursor_advance.advance("reader", "orders", {0: 9, 1: 5})

        def fetch(partition: int) -> int:
            log.append(("fetch", partition))
            return cursors[partition]

        def store(partition: int, offset: int) -> None:
            log.append(("store", partition))
            cursors[partition] = offset

        async def afetch(partition: int) -> int:
            return fetch(partition)

        async def astore(partition: int, offset: int) -> None:
            store(partition, offset)

        if driver == "sync":
            moves = cursor_advance.run(plan, fetch, store)
        else:
            moves = asyncio.run(cursor_advance.run_async(plan, afetch, astore))
        return log, {p: move.step for p, move in moves.items()}

    assert steps("sync") == steps("async")
    assert steps("async")[0] == [("fetch", 0), ("fetch", 1), ("store", 0), ("store", 1)]


def test_the_cursor_request_of_a_fetch_reads_through_the_settled_leader() -> None:
    """A read (FetchCursor) asks the leader's partition metadata before the cursor itself (cursor_read)."""
    known = cluster(cursor_partitions=1, streams={"orders": 1})
    names: list[str] = []

    class Stub:
        def __getattr__(self, name: str) -> Any:
            def method(request: Any, timeout: float) -> Any:
                names.append(name)
                if name == "FetchPartitionMetadata":
                    meta = api.PartitionMetadata(id=0, leader="a", replicas=["a"], isr=["a"], highWatermark=3)
                    return api.FetchPartitionMetadataResponse(metadata=meta)
                return api.FetchCursorResponse(offset=7)

            return method

    def answer(action: plans.PlanAction) -> Any:
        assert isinstance(action, plans.Attempt), f"unexpected {action}"
        return action.rpc(Stub(), action.timeout)

    request = api.FetchCursorRequest(cursorId="reader", stream="orders", partition=0)
    fetch: plans.Rpc = lambda stub, t: stub.FetchCursor(request, timeout=t)  # noqa: E731
    result, _ = drive(cursor_plans.cursor_request(CONFIG, known, Deadline(5), request, fetch, read=True), answer)
    assert result.offset == 7
    assert names == ["FetchPartitionMetadata", "FetchCursor"]
