"""Publishes as plans without I/O: a publish is never sent twice once it may have reached a server.

The refusals sent again are the server's own word that nothing was stored:
the broker could not resume the paused partition because the metadata leader
is being replaced (:func:`refused_while_leader_changes` for PublishAsync,
:func:`~liftbridge_provider.client.retry.leader_changing` for a unary call),
or it does not know the stream or partition (NOT_FOUND) while fresh metadata
lists them: a broker that has not applied the stream's creation yet
(:func:`~liftbridge_provider.client.retry.after_unknown`).

:func:`send_once` is a unary Publish or PublishToSubject call;
:func:`on_shared_streams` a single publish on the PublishAsync streams every
publish of a client shares (``publish_stream.py``). Both drivers of
:mod:`~liftbridge_provider.client.routing` carry them out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.addresses import broker_addresses
from liftbridge_provider.client.errors import AckTimeoutError, UnavailableError, error_from_rpc
from liftbridge_provider.client.metadata import Metadata
from liftbridge_provider.client.not_sent import CONNECT_TRY, NotSent
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.plans import (
    AnyPlan,
    Attempt,
    Dispatch,
    Plan,
    Rpc,
    Sleep,
    listed,
    listing,
)
from liftbridge_provider.client.retry import (
    Deadline,
    Listing,
    RetryState,
    Unknown,
    after_unknown,
    backoff_delay,
    leader_changing,
    refused_as_unknown,
    unknown_timeout,
)
from liftbridge_provider.core.errors import LiftbridgeError
from liftbridge_provider.core.publish_outcomes import may_be_stored_after

SHORTEST_RESEND = 0.05
"""Seconds a refused publish must still have after its backoff to be sent again; with less, the refusal (nothing
stored) stands: an attempt cut off by the deadline would end as "may be stored" instead."""


def async_refused_as_unknown(response: api.PublishResponse) -> bool:
    """A PublishAsync refusal NOT_FOUND (nothing stored): the broker does not know the stream or partition, a
    missing one or one it has not applied yet; fresh metadata tells which
    (:func:`~liftbridge_provider.client.retry.after_unknown`)."""
    return response.HasField("asyncError") and response.asyncError.code == api.PublishAsyncError.NOT_FOUND


def refused_while_leader_changes(response: api.PublishResponse) -> bool:
    """The server did not store the message: the broker could not resume its paused partition because the
    metadata leader is being replaced (see :func:`~liftbridge_provider.client.retry.leader_changing`). Sending
    it again a moment later is safe."""
    pb = response.asyncError
    message = pb.message.lower()
    return (
        pb.code == api.PublishAsyncError.INTERNAL
        and "failed to resume stream" in message
        and leader_changing(grpc.StatusCode.INTERNAL, message)
    )


def send_once(
    config: ClientConfig, snapshot: Metadata, rpc: Rpc, deadline: Deadline, *, stream: str | None, partition: int | None
) -> Plan[Any]:
    """A publish: sent to one broker, never again once it may have arrived.

    Brokers that refuse or do not connect within :data:`CONNECT_TRY` s are
    skipped (nothing was sent); the first one that connects gets the rest of
    the time. A failure after
    sending is raised with ``may_be_stored=True`` where the message may have
    been stored. A publish the broker refused because the metadata leader
    that must resume its paused partition is being replaced stored nothing:
    it is sent again after a backoff while :data:`SHORTEST_RESEND` s are left
    after it (counted before the pause and again when it ends: a loaded
    machine wakes a sleeper late), and fails with the refusal
    (``may_be_stored=False``) then.
    """
    state = RetryState(deadline, leader_directed=False, stream=stream)
    refusals = 0
    late: LiftbridgeError | None = None  # what the last refusal ends in if its backoff wakes too late
    while True:
        if late is not None and deadline.remaining() < SHORTEST_RESEND:  # the backoff woke late
            raise late
        late = None
        pause: float | None = None
        for address in broker_addresses(config, snapshot):
            try:
                return (
                    yield Attempt(
                        address, max(deadline.remaining(), 0.001), rpc, connect_first=True, connect_timeout=CONNECT_TRY
                    )
                )
            except NotSent as exc:
                state.after_failure(exc)
            except grpc.RpcError as exc:
                unknown = stream is not None and refused_as_unknown(exc.code())
                if stream is None or not (unknown or leader_changing(exc.code(), (exc.details() or "").lower())):
                    raise after_send_error(exc, stream, partition) from exc
                said = None
                if unknown:  # a broker behind the metadata, or a missing stream: fresh metadata tells
                    snapshot, said = yield from listing(deadline, snapshot, stream, partition)
                refusals += 1
                pause = backoff_delay(refusals)
                time_left = pause + SHORTEST_RESEND < deadline.remaining()
                if said is not None and after_unknown(said, time_left=time_left) is Unknown.MISSING:
                    raise after_send_error(exc, stream, partition) from exc
                late = refused_until_the_deadline(exc, deadline, stream, partition, said)
                if not time_left:  # no time to send it again: the refusal
                    raise late from exc
                late.__cause__ = exc
                break
        yield Sleep(state.pause() if pause is None else pause)


def refused_until_the_deadline(
    exc: grpc.RpcError, deadline: Deadline, stream: str | None, partition: int | None, said: Listing | None = None
) -> LiftbridgeError:
    """The server's last refusal (nothing stored), raised once the call has no time left to send it again; a
    refusal as unknown of a stream the metadata listed (``said``) is a LiftbridgeTimeoutError naming it."""
    refusal = error_from_rpc(exc, stream=stream, partition=partition)
    if said is not None:
        refusal.may_be_stored = False
        return unknown_timeout(refusal, deadline.timeout, said)
    return type(refusal)(
        f"{refusal.message}; not sent again: refused for {deadline.timeout:g}s (the call's timeout)",
        stream=stream,
        partition=partition,
        code=refusal.code,
        may_be_stored=False,
    )


def on_shared_streams(
    send: Callable[[Sequence[str]], Any], deadline: Deadline, *, stream: str, partition: int
) -> AnyPlan[Any]:
    """A single publish on the shared PublishAsync streams: ``send(addresses)`` (a :class:`Dispatch`, with the
    brokers the client knows at that moment) tries them in the partition's order and raises NotSent when none
    connected, so nothing was sent.

    Then every broker is tried again after a jittered backoff
    (:func:`~liftbridge_provider.client.retry.backoff_delay` from its second
    step: 10-20 ms first, growing to 500 ms), as long as the pause ends
    before the deadline; otherwise UnavailableError (nothing was sent). A
    response that says nothing was stored (:func:`refused_while_leader_changes`)
    is sent again the same way, and returned as it is when less than
    :data:`SHORTEST_RESEND` s would be left after the pause, or are left when
    the pause ends (a loaded machine wakes a sleeper late). A NOT_FOUND refusal
    is sent again the same way while fresh metadata lists the stream and
    partition (:func:`~liftbridge_provider.client.plans.listed`), returned at
    once when it does not, and ends in a LiftbridgeTimeoutError naming it when
    the time runs out.
    Any other failure is ``send``'s own and raised as it is: once written, a
    message is never re-sent (``publish_stream.py`` names whether it may be
    stored).
    """
    attempt = 0
    while True:
        try:
            response = yield Dispatch(send)
        except NotSent as exc:
            attempt += 1
            pause = backoff_delay(attempt)
            if pause >= deadline.remaining():
                raise UnavailableError(
                    f"no broker connected within {deadline.timeout:g}s ({exc.details()}); nothing was sent",
                    stream=stream,
                    partition=partition,
                    code=grpc.StatusCode.UNAVAILABLE,
                ) from exc
        else:
            said: Listing | None = None
            if async_refused_as_unknown(response):
                _fresh, said = yield from listed(deadline, stream, partition)  # a broker behind the metadata?
            elif not (response.HasField("asyncError") and refused_while_leader_changes(response)):
                return response
            attempt += 1
            pause = backoff_delay(attempt)
            time_left = pause + SHORTEST_RESEND < deadline.remaining()
            if not time_left or (said is not None and after_unknown(said, time_left=True) is Unknown.MISSING):
                return _refusal(response, deadline, stream, partition, said)
            yield Sleep(pause)
            if deadline.remaining() < SHORTEST_RESEND:  # the backoff woke late (a loaded machine): the refusal
                return _refusal(response, deadline, stream, partition, said)
            continue
        yield Sleep(pause)


def _refusal(
    response: api.PublishResponse, deadline: Deadline, stream: str, partition: int, said: Listing | None
) -> api.PublishResponse:
    """The refusal ``response`` a single publish ends with (the caller raises its typed error), or, for a
    refusal as unknown of a stream and partition the metadata lists (``said``) once the deadline ends, a
    LiftbridgeTimeoutError naming it (nothing stored)."""
    if said is None or after_unknown(said, time_left=False) is Unknown.MISSING:
        return response
    refusal = LiftbridgeError(
        response.asyncError.message or "NOT_FOUND", stream=stream, partition=partition, code=grpc.StatusCode.NOT_FOUND
    )
    raise unknown_timeout(refusal, deadline.timeout, said)


def after_send_error(exc: grpc.RpcError, stream: str | None, partition: int | None) -> LiftbridgeError:
    """A publish failed after it was sent: never retried. ``may_be_stored`` unless the server's answer says it
    refused the message before handing it on (:func:`~liftbridge_provider.core.publish_outcomes.may_be_stored_after`):
    a call cancelled by ``close()``, or ended by an error of the server's own, may have stored it."""
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return AckTimeoutError(
            "no ack before the deadline; the message may have been stored",
            stream=stream,
            partition=partition,
            code=code,
            may_be_stored=True,
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        return UnavailableError(
            f"connection lost during publish ({exc.details()}); the message may have been stored",
            stream=stream,
            partition=partition,
            code=code,
            may_be_stored=True,
        )
    error = error_from_rpc(exc, stream=stream, partition=partition)
    error.may_be_stored = may_be_stored_after(code.name, exc.details() or "")
    return error
