"""Publishes as plans without I/O: a publish is never sent twice once it may have reached a server.

The one refusal sent again is the server's own word that nothing was stored:
the broker could not resume the paused partition because the metadata leader
is being replaced (:func:`refused_while_leader_changes` for PublishAsync,
:func:`~liftbridge_provider.client.retry.leader_changing` for a unary call).

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
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.plans import CONNECT_TRY, AnyPlan, Attempt, Dispatch, NotSent, Plan, Rpc, Sleep
from liftbridge_provider.client.retry import Deadline, RetryState, backoff_delay, leader_changing
from liftbridge_provider.core.errors import LiftbridgeError
from liftbridge_provider.core.publish_outcomes import may_be_stored_after

SHORTEST_RESEND = 0.05
"""Seconds a refused publish must still have after its backoff to be sent again; with less, the refusal (nothing
stored) stands: an attempt cut off by the deadline would end as "may be stored" instead."""


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
    refused: grpc.RpcError | None = None  # the last refusal, while its backoff runs
    while True:
        if refused is not None and deadline.remaining() < SHORTEST_RESEND:  # the backoff woke late
            raise refused_until_the_deadline(refused, deadline, stream, partition) from refused
        refused = None
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
                if stream is None or not leader_changing(exc.code(), (exc.details() or "").lower()):
                    raise after_send_error(exc, stream, partition) from exc
                refusals += 1
                pause = backoff_delay(refusals)
                if pause + SHORTEST_RESEND >= deadline.remaining():  # no time to send it again: the refusal
                    raise refused_until_the_deadline(exc, deadline, stream, partition) from exc
                refused = exc
                break
        yield Sleep(state.pause() if pause is None else pause)


def refused_until_the_deadline(
    exc: grpc.RpcError, deadline: Deadline, stream: str | None, partition: int | None
) -> LiftbridgeError:
    """The server's last refusal (nothing stored), raised once the call has no time left to send it again."""
    refusal = error_from_rpc(exc, stream=stream, partition=partition)
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
    the pause ends (a loaded machine wakes a sleeper late).
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
            if not (response.HasField("asyncError") and refused_while_leader_changes(response)):
                return response
            attempt += 1
            pause = backoff_delay(attempt)
            if pause + SHORTEST_RESEND >= deadline.remaining():
                return response
            yield Sleep(pause)
            if deadline.remaining() < SHORTEST_RESEND:  # the backoff woke late (a loaded machine): the refusal
                return response
            continue
        yield Sleep(pause)


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
