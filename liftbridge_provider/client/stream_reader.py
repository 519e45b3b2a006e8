"""The messages of a server-streaming gRPC call with less work per message than iterating the call.

:func:`messages_of` yields the deserialized responses; :func:`receive_into` hands the serialized
ones of a call made without a deserializer to a callback (a column builder) without yielding.

A subscription reads one message per protobuf ``Message``; iterating grpc's
single-threaded call (``SingleThreadedUnaryStream``) spends most of its CPU per
message on Python bookkeeping around one receive operation: five lock round
trips, the event handler, the deserializer wrapper. :func:`messages_of`
performs the same receive and event steps on the call's own state (grpc's
``_SingleThreadedRendezvous``), taking the lock only where grpc's cancellation
needs it, and hands any event other than a plain message (the initial
metadata, the status, a failed receive, a message that does not deserialize)
to grpc's own event handler, so an ending call ends and raises exactly as
iterating it would. ``bench/profile_paths.py read-range`` measures the
difference.

These are grpc's private parts; :func:`fast_path_available` checks the call
has them, and any other call is simply iterated. ``tests/server/test_client.py``
checks that the fast path is the one taken with the pinned grpcio.

:func:`take_end` reads a call the server is about to end to that end, through grpc's public iteration:
grpc's core keeps a call and its completion queue until the call's status is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc

_channel: Any
cygrpc: Any
try:  # grpc's private modules: absent or different in another grpcio, then calls are iterated
    from grpc import _channel
    from grpc._cython import cygrpc  # type: ignore[attr-defined,no-redef]
except ImportError:  # pragma: no cover - grpcio always has them today
    _channel = cygrpc = None

_RECEIVE = cygrpc.OperationType.receive_message if cygrpc is not None else None
STOP = 2
"""Values of ``add`` from this one up end :func:`receive_into` (the column builders' LAST, END and FULL)."""


def _lock_of(condition: Any) -> Any:
    """The lock under grpc's condition: entering it directly is what entering the condition does, without
    the two Python-level calls of ``threading.Condition.__enter__``/``__exit__`` (these loops never wait
    on or notify the condition)."""
    lock = getattr(condition, "_lock", None)
    return lock if lock is not None and hasattr(lock, "__enter__") else condition


def fast_path_available(call: Any) -> bool:
    """The call is grpc's single-threaded server-streaming call with the parts :func:`messages_of` uses."""
    rendezvous = getattr(_channel, "_SingleThreadedRendezvous", None)
    return (
        rendezvous is not None
        and type(call) is rendezvous
        and hasattr(_channel, "_handle_event")
        and all(hasattr(call, name) for name in ("_state", "_call", "_response_deserializer"))
    )


def messages_of(call: Any) -> Iterator[Any]:
    """The call's responses, as ``iter(call)`` gives them (also its end: StopIteration or the call as RpcError)."""
    if not fast_path_available(call):
        yield from call
        return
    state, core, deserialize = call._state, call._call, call._response_deserializer
    condition, due = _lock_of(state.condition), state.due
    receive = (cygrpc.ReceiveMessageOperation(0),)
    while True:
        with condition:  # as grpc: a concurrent cancel() sets the code under this lock
            code = state.code
            if code is None:
                due.add(_RECEIVE)
                if not core.operate(receive, None):
                    due.discard(_RECEIVE)
            elif code is grpc.StatusCode.OK:
                return
            else:
                raise call
        while True:
            event = core.next_event()
            operations = event.batch_operations
            if len(operations) == 1 and operations[0].type() == _RECEIVE:
                data = operations[0].message()
                if data is not None:
                    try:
                        response = deserialize(data)
                    except Exception:  # grpc's handler below aborts the call with INTERNAL, as iterating would
                        pass
                    else:
                        due.discard(_RECEIVE)
                        yield response
                        break
            with condition:
                for callback in _channel._handle_event(event, state, deserialize):
                    callback()
                response, state.response = state.response, None
                code = state.code
                if response is None and _RECEIVE not in due and code is not None:
                    if code is grpc.StatusCode.OK:
                        return
                    raise call
            if response is not None:
                yield response
                break


def receive_into(call: Any, add: Callable[[bytes], int]) -> tuple[int, bytes] | None:
    """Hand each serialized response of a call made without a deserializer to ``add``, on this thread.

    Stops at the first response for which ``add`` returns :data:`STOP` or more and returns that value
    with the response (the caller may hand it again, e.g. to a fresh batch); None once the call ended
    with status OK; raises the call (a ``grpc.RpcError``) when it ended otherwise, as iterating it would.
    The same receive and event steps as :func:`messages_of`, with one call of ``add`` per response as
    the only other work.
    """
    if not fast_path_available(call):
        for data in call:
            status = add(data)
            if status >= STOP:
                return status, data
        return None
    state, core = call._state, call._call
    condition, due = _lock_of(state.condition), state.due
    receive = (cygrpc.ReceiveMessageOperation(0),)
    while True:
        with condition:  # as grpc: a concurrent cancel() sets the code under this lock
            code = state.code
            if code is None:
                due.add(_RECEIVE)
                if not core.operate(receive, None):
                    due.discard(_RECEIVE)
            elif code is grpc.StatusCode.OK:
                return None
            else:
                raise call
        while True:
            event = core.next_event()
            operations = event.batch_operations
            if len(operations) == 1 and operations[0].type() == _RECEIVE:
                data = operations[0].message()
                if data is not None:
                    due.discard(_RECEIVE)
                    status = add(data)
                    if status >= STOP:
                        return status, data
                    break
            with condition:
                for callback in _channel._handle_event(event, state, None):
                    callback()
                response, state.response = state.response, None
                code = state.code
                if response is None and _RECEIVE not in due and code is not None:
                    if code is grpc.StatusCode.OK:
                        return None
                    raise call
            if response is not None:
                status = add(response)
                if status >= STOP:
                    return status, response
                break


def take_end(call: Any) -> None:
    """Read ``call`` to its end (its status), where the server ends it right after the last wanted message
    (a subscription at its stop offset: RESOURCE_EXHAUSTED "Stop offset reached").

    A single-threaded call (``SingleThreadedUnaryStream``) is only released by grpc's core once its status
    event is taken, and nobody takes it after ``cancel()``: a call cancelled at its stop offset stayed in
    memory for the life of the process, about 18 KB each (issue 47). Iterating takes the status; any
    message still on the way is dropped. The wait is bounded by the call's own deadline (at most
    ``liveness_interval``), and ``cancel()`` from another thread ends it at once.
    """
    if call.done():  # its end was taken already (or it was cancelled: then nothing takes it)
        return
    try:
        for _ in call:
            pass
    except grpc.RpcError:
        pass
