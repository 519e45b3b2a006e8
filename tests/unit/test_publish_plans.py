"""A single publish on the shared PublishAsync streams as a plan (publish/plans.on_shared_streams), and the
Dispatch action both drivers of routing.py carry out."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence

import grpc
import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import AckTimeoutError, ClientConfig, UnavailableError
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.not_sent import Connection, NotSent
from liftbridge_provider.client.plans import Dispatch, Sleep
from liftbridge_provider.client.publish.plans import on_shared_streams
from liftbridge_provider.client.retry import MIN_BACKOFF, Deadline
from liftbridge_provider.client.routing import AsyncRouter, Router

CONFIG = ClientConfig(brokers=("a.example:9292", "b.example:9292"))
ACKED = api.PublishResponse(ack=api.Ack(offset=7))
REFUSED = api.PublishResponse(
    asyncError=api.PublishAsyncError(
        code=api.PublishAsyncError.INTERNAL,
        message="failed to resume stream: rpc error: code = Internal desc = nats: no responders available for request",
    )
)


@pytest.fixture(autouse=True)
def no_suspected_brokers() -> Iterator[None]:
    """No broker is suspected (the health model is process-wide and orders the addresses handed out)."""
    HEALTH.clear()
    yield
    HEALTH.clear()


def never_called(addresses: Sequence[str]) -> None:
    raise AssertionError("the plan's Dispatch is carried out by the test")


def test_brokers_that_did_not_connect_are_tried_again_after_a_backoff() -> None:
    plan = on_shared_streams(never_called, Deadline(5), stream="s", partition=0)
    assert isinstance(next(plan), Dispatch)
    pause = plan.throw(NotSent("a.example:9292"))
    assert isinstance(pause, Sleep)
    assert MIN_BACKOFF <= pause.seconds <= 2 * MIN_BACKOFF  # the backoff's second step
    assert isinstance(plan.send(None), Dispatch)
    with pytest.raises(StopIteration) as done:
        plan.send(ACKED)
    assert done.value.value is ACKED


def test_a_refusal_that_stored_nothing_is_sent_again_after_a_backoff() -> None:
    """The broker could not resume the paused partition while the metadata leader was replaced: nothing was
    stored, so the same request goes again (it failed at once before)."""
    plan = on_shared_streams(never_called, Deadline(5), stream="s", partition=0)
    next(plan)
    pause = plan.send(REFUSED)
    assert isinstance(pause, Sleep)
    assert MIN_BACKOFF <= pause.seconds <= 2 * MIN_BACKOFF
    assert isinstance(plan.send(None), Dispatch)
    with pytest.raises(StopIteration) as done:
        plan.send(ACKED)
    assert done.value.value is ACKED


@pytest.mark.parametrize(
    "answer",
    [
        api.PublishResponse(asyncError=api.PublishAsyncError(code=api.PublishAsyncError.READONLY, message="readonly")),
        api.PublishResponse(
            asyncError=api.PublishAsyncError(code=api.PublishAsyncError.INTERNAL, message="failed to publish to NATS")
        ),
    ],
)
def test_other_refusals_are_returned_as_they_are(answer: api.PublishResponse) -> None:
    plan = on_shared_streams(never_called, Deadline(5), stream="s", partition=0)
    next(plan)
    with pytest.raises(StopIteration) as done:
        plan.send(answer)
    assert done.value.value is answer


def test_a_refusal_that_stored_nothing_is_returned_when_no_time_is_left_for_a_backoff() -> None:
    plan = on_shared_streams(never_called, Deadline(0.005), stream="s", partition=0)
    next(plan)
    with pytest.raises(StopIteration) as done:
        plan.send(REFUSED)
    assert done.value.value is REFUSED


def test_no_broker_connecting_before_the_deadline_fails_as_not_sent() -> None:
    plan = on_shared_streams(never_called, Deadline(0.005), stream="s", partition=1)
    next(plan)
    with pytest.raises(UnavailableError) as failure:
        plan.throw(NotSent("a.example:9292", Connection.REFUSED))  # the first pause (>= 10 ms) ends too late
    error = failure.value
    assert str(error.message) == (
        "no broker connected within 0.005s (could not connect to a.example:9292 (refused or unreachable)); "
        "nothing was sent"
    )
    assert (error.stream, error.partition, error.code, error.may_be_stored) == (
        "s",
        1,
        grpc.StatusCode.UNAVAILABLE,
        False,
    )
    assert isinstance(error.__cause__, NotSent)


def test_a_failure_after_sending_is_raised_as_it_is() -> None:
    plan = on_shared_streams(never_called, Deadline(5), stream="s", partition=0)
    next(plan)
    lost = AckTimeoutError("no ack before the deadline", may_be_stored=True)
    with pytest.raises(AckTimeoutError) as failure:
        plan.throw(lost)
    assert failure.value is lost


def test_both_drivers_give_a_dispatch_the_brokers_known_when_it_runs() -> None:
    seen: list[Sequence[str]] = []

    def send(addresses: Sequence[str]) -> api.PublishResponse:
        seen.append(addresses)
        if len(seen) == 1:
            raise NotSent(addresses[0])
        return ACKED

    async def send_async(addresses: Sequence[str]) -> api.PublishResponse:
        return send(addresses)

    router = Router(CONFIG, pool=None)  # type: ignore[arg-type]  # a Dispatch and a Sleep lease no channel
    assert router.run(on_shared_streams(send, Deadline(5), stream="s", partition=0)) is ACKED
    seen.clear()
    async_router = AsyncRouter(CONFIG)
    plan = on_shared_streams(send_async, Deadline(5), stream="s", partition=0)
    assert asyncio.run(async_router.run(plan)) is ACKED
    assert len(seen) == 2
    assert all(sorted(addresses) == sorted(CONFIG.brokers) for addresses in seen)
