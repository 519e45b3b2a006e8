"""CreateStream and DeleteStream as plans without I/O: retried only in a way that cannot misreport what
happened when an answer is lost after sending."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.addresses import broker_addresses
from liftbridge_provider.client.errors import NoSuchStreamError, StreamExistsError, error_from_rpc
from liftbridge_provider.client.metadata import Metadata
from liftbridge_provider.client.not_sent import CONNECT_TRY, NotSent
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.plans import Attempt, Plan, Refresh, Rpc, Sleep, note_if_hung
from liftbridge_provider.client.retry import Action, Deadline, RetryableFailure, RetryState
from liftbridge_provider.core.errors import LiftbridgeError


def create_stream(
    config: ClientConfig, snapshot: Metadata, request: api.CreateStreamRequest, deadline: Deadline
) -> Plan[None]:
    """CreateStream as :func:`ambiguous_admin` sends it (a lost answer's AlreadyExists is ours when the stream has
    our subject and partition count), then the metadata refreshed (:func:`_refresh_after`)."""

    def create(stub: Any, timeout: float) -> Any:
        return stub.CreateStream(request, timeout=timeout)

    name = request.name
    ours = stream_created_as(request.subject, request.partitions, config, deadline, name)
    outcome = "the stream may have been created (create_stream again raises StreamExistsError if it was)"
    yield from ambiguous_admin(config, snapshot, create, deadline, stream=name, already_done=ours, outcome=outcome)
    yield from _refresh_after(deadline)


def delete_stream(
    config: ClientConfig, snapshot: Metadata, request: api.DeleteStreamRequest, deadline: Deadline
) -> Plan[None]:
    """DeleteStream as :func:`ambiguous_admin` sends it (a lost answer's NotFound means it was deleted), then the
    metadata refreshed (:func:`_refresh_after`)."""

    def delete(stub: Any, timeout: float) -> Any:
        return stub.DeleteStream(request, timeout=timeout)

    outcome = "the stream may have been deleted (delete_stream again raises NoSuchStreamError if it was)"
    yield from ambiguous_admin(
        config, snapshot, delete, deadline, stream=request.name, already_done=stream_gone, outcome=outcome
    )
    yield from _refresh_after(deadline)


def _refresh_after(deadline: Deadline) -> Plan[None]:
    """The cached metadata refreshed after a create or delete that succeeded, within what is left of the deadline
    (at least 1 ms). Its failure does not undo the success: the cache refreshes itself when next asked about a
    stream it does not know, and a call to a deleted stream is answered NotFound."""
    try:
        yield Refresh(max(deadline.remaining(), 0.001))
    except LiftbridgeError:
        return


def ambiguous_admin(
    config: ClientConfig,
    snapshot: Metadata,
    rpc: Rpc,
    deadline: Deadline,
    *,
    stream: str,
    already_done: Callable[[LiftbridgeError], Plan[bool]],
    outcome: str,
) -> Plan[Any]:
    """A CreateStream or DeleteStream: retried only in a way that cannot misreport what happened.

    An attempt that fails before anything was sent (no connection) goes to the
    next broker. One that fails after sending may have been applied; it is sent
    again, and if that answer is the error the first attempt would cause
    (AlreadyExists for a create, NotFound for a delete), ``already_done(error)``
    decides whether the first attempt did it (then the call succeeds). A call whose deadline passes after
    anything was sent ends in :class:`LiftbridgeTimeoutError` saying ``outcome``: what may have happened.
    """
    state = RetryState(deadline, leader_directed=False, stream=stream)
    maybe_applied = False
    while True:
        for address in broker_addresses(config, snapshot):
            try:
                attempt = Attempt(
                    address, state.attempt_timeout(), rpc, connect_first=True, connect_timeout=CONNECT_TRY
                )
                return (yield attempt)
            except grpc.RpcError as exc:
                if maybe_applied and exc.code() in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.NOT_FOUND):
                    error = error_from_rpc(exc, stream=stream)
                    if (yield from already_done(error)):
                        return None
                    raise error from exc
                if not isinstance(exc, NotSent):
                    maybe_applied, state.unknown_outcome = True, outcome
                note_if_hung(state, address, exc)
                action, delay = state.after_failure(_as_retryable(exc))
            if action is not Action.NEXT_BROKER:
                yield Sleep(delay)
                break
        else:
            yield Sleep(state.pause())


class _LostAnswer(grpc.RpcError):
    """An admin call sent whose answer did not come: retried (the retry finds out what happened)."""

    def __init__(self, cause: grpc.RpcError) -> None:
        self.cause = cause

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return f"sent, but no answer came ({self.cause.code().name}: {self.cause.details()})"


# The server's words (INTERNAL) when it stopped waiting at the call's deadline: for a Raft apply
# (server/raft.go, timeoutFuture), which goes on and may still commit, or for the answer of a request it forwarded
# to the metadata leader (Go's context.DeadlineExceeded), which may have been applied too.
_SERVER_WAITS = ("raft operation timed out", "context deadline exceeded")


def applied_again_on_timeout(rpc: Rpc) -> Rpc:
    """``rpc`` (PauseStream, SetStreamReadonly: the same request applied twice does no harm) with the server's
    own waits that ended at the call's deadline ("raft operation timed out", "context deadline exceeded" of a
    request forwarded to a metadata leader that is being replaced) retried while the call has time, not final."""

    def call(stub: Any, timeout: float) -> Any:
        try:
            return rpc(stub, timeout)
        except grpc.RpcError as exc:
            if _server_wait_ended(exc):
                raise RetryableFailure(exc) from exc
            raise

    return call


def _server_wait_ended(exc: grpc.RpcError) -> bool:
    details = exc.details() or ""
    return exc.code() == grpc.StatusCode.INTERNAL and any(marker in details for marker in _SERVER_WAITS)


def _as_retryable(exc: grpc.RpcError) -> grpc.RpcError:
    """Failures after sending that leave the outcome open (the connection failed, the attempt hung, the server
    gave up waiting for its own Raft apply) are worth a retry; a failure before sending stays as it is."""
    if isinstance(exc, NotSent):
        return exc
    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return _LostAnswer(exc)
    if _server_wait_ended(exc):
        return _LostAnswer(exc)
    return exc


def stream_created_as(
    subject: str, partitions: int, config: ClientConfig, deadline: Deadline, name: str
) -> Callable[[LiftbridgeError], Plan[bool]]:
    """For a create whose answer was lost: the existing stream is ours if it has our subject and partition count."""

    def check(error: LiftbridgeError) -> Plan[bool]:
        if not isinstance(error, StreamExistsError):
            return False
        fresh: Metadata = yield Refresh(deadline.remaining(), (name,))
        info = fresh.streams.get(name)
        return info is not None and info.subject == subject and len(info.partitions) == partitions

    return check


def stream_gone(error: LiftbridgeError) -> Plan[bool]:
    """For a delete whose answer was lost: NotFound means the lost attempt deleted it."""
    gone = isinstance(error, NoSuchStreamError)
    yield from ()  # a plan that needs no I/O
    return gone
