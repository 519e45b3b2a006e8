"""A bidirectional gRPC stream without grpc's per-message thread hand-offs.

grpc's synchronous stream-stream call takes requests from an iterator on a
thread of its own and hands each response to whoever iterates the call, woken
by the channel's thread: a message and its ack cross three threads, and each
hand-off costs a thread wake-up. :class:`DirectCall` instead sends from the
caller's thread and hands each response to a callback on the channel's thread,
performing the same operations on the call's own state (grpc's
``_MultiThreadedRendezvous``) as grpc's request consumer and ``_next`` do, so
a single ``publish`` waits for its ack without those hand-offs (figures in
docs/benchmarks.md).

These are grpc's private parts: :func:`direct_call_available` checks that
they are there, and :func:`open_direct_call` returns None for any other call,
whose owner then uses grpc's public iterator API.
``tests/server/test_publish_stream.py`` checks that the pinned grpcio
takes this path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

_channel: Any
cygrpc: Any
try:  # grpc's private modules: absent or different in another grpcio, then the caller uses the iterator API
    from grpc import _channel
    from grpc._cython import cygrpc  # type: ignore[attr-defined,no-redef]
except ImportError:  # pragma: no cover - grpcio always has them today
    _channel = cygrpc = None

log = logging.getLogger(__name__)
_PARTS = ("_event_handler", "_handle_event", "_MultiThreadedRendezvous")
CLOSE_WAIT = 5.0  # seconds a half-close waits for the message being written; then the call is cancelled
_CALL_PARTS = ("_state", "_call", "_response_deserializer")


class CallEnded(Exception):
    """The call has ended: nothing was sent on it."""


class SendStalled(Exception):
    """The previous message was still being written when the deadline came: this one was not sent."""


def direct_call_available() -> bool:
    """grpc has the private parts :class:`DirectCall` drives."""
    return (
        _channel is not None
        and all(hasattr(_channel, name) for name in _PARTS)
        and all(hasattr(cygrpc, name) for name in ("SendMessageOperation", "ReceiveMessageOperation", "OperationType"))
    )


def open_direct_call(
    method: Callable[[Iterator[Any]], Any],
    hold_open: Callable[[], None],
    on_response: Callable[[Any], None],
    on_end: Callable[[grpc.RpcError], None],
) -> DirectCall | None:
    """Open ``method`` (a stream-stream multi-callable) driven directly, or None when grpc's call is not the
    one this module knows (then nothing was sent and the call is cancelled).

    :param hold_open: blocks for as long as the stream should stay open; when it returns, the stream is
        half-closed (after the message being written, if any). It runs on grpc's request thread.
    :param on_response: each response, in order, on the channel's thread: keep it short.
    :param on_end: called once, on a thread of its own, with the ended call (its code and details).
    """
    if not direct_call_available():
        return None
    started = threading.Event()
    direct: list[DirectCall] = []

    def requests() -> Iterator[Any]:
        started.wait()
        if direct:
            hold_open()
            if not direct[0].wait_until_written(time.monotonic() + CLOSE_WAIT):
                direct[0].cancel()
        yield from ()  # a generator that sends nothing itself

    call = method(requests())
    if type(call) is not _channel._MultiThreadedRendezvous or not all(hasattr(call, n) for n in _CALL_PARTS):
        call.cancel()
        started.set()
        return None
    try:
        direct.append(DirectCall(call, on_response, on_end))
    except BaseException:
        call.cancel()
        raise
    finally:
        started.set()
    return direct[0]


class DirectCall:
    """One open call: :meth:`send` from any thread (one at a time), responses to ``on_response``."""

    def __init__(self, call: Any, on_response: Callable[[Any], None], on_end: Callable[[grpc.RpcError], None]) -> None:
        self._rendezvous = call
        self._state, self._core, self._deserialize = call._state, call._call, call._response_deserializer
        self._on_response = on_response
        self._send_done = _channel._event_handler(self._state, self._deserialize)
        self._send_lock = threading.Lock()
        self._send_type = cygrpc.OperationType.send_message
        self._receive_type = cygrpc.OperationType.receive_message
        call.add_done_callback(lambda ended: _on_own_thread(on_end, ended))
        with self._state.condition:
            self._receive_next()

    def send(self, request: Any, deadline: float) -> None:
        """Write one request (a protobuf message); CallEnded if the call is over, SendStalled if the previous write
        did not finish by ``deadline`` (``time.monotonic()``). Either way this request was not sent."""
        serialized = request.SerializeToString()
        if not self._send_lock.acquire(timeout=_remaining(deadline)):
            raise SendStalled()
        try:
            state = self._state
            with state.condition:
                if not self._wait_until_written(deadline):
                    raise SendStalled()
                if state.code is not None:
                    raise CallEnded()
                state.due.add(self._send_type)
                try:
                    operating = self._core.operate((cygrpc.SendMessageOperation(serialized, 0),), self._send_done)
                except ValueError:  # grpc's core refused the operation: nothing was started
                    operating = False
                if not operating:
                    state.due.discard(self._send_type)
                    raise CallEnded()
        finally:
            self._send_lock.release()

    def wait_until_written(self, deadline: float | None) -> bool:
        """Wait until no write is in progress (or the call ended); False if ``deadline`` came first."""
        with self._state.condition:
            return self._wait_until_written(deadline)

    def cancel(self) -> None:
        self._rendezvous.cancel()

    def _wait_until_written(self, deadline: float | None) -> bool:
        state = self._state
        return bool(
            state.condition.wait_for(
                lambda: state.code is not None or self._send_type not in state.due,
                None if deadline is None else _remaining(deadline),
            )
        )

    def _receive_next(self) -> None:
        """Ask for the next response (under the state's lock), as grpc's ``_next`` does."""
        state = self._state
        state.due.add(self._receive_type)
        try:
            operating = self._core.operate((cygrpc.ReceiveMessageOperation(0),), self._on_event)
        except ValueError:  # grpc's core refused the operation
            operating = False
        if not operating:
            state.due.discard(self._receive_type)
            if state.code is None:  # no response could arrive any more: end the call (its status ends it)
                self._core.cancel(cygrpc.StatusCode.cancelled, "could not ask for the next response")

    def _on_event(self, event: Any) -> bool:
        """A receive finished (the channel's thread): the next receive, then the response to its owner; any
        event but a plain response (the stream's end, a response that does not parse) through grpc's own
        handling. Returns whether the call needs no more events, as grpc's handler does."""
        state = self._state
        operations = event.batch_operations
        if len(operations) == 1 and operations[0].type() == self._receive_type:  # the common case: one response
            data = operations[0].message()
            if data is not None:
                try:
                    response = self._deserialize(data)
                except Exception:  # grpc's handling below aborts the call with INTERNAL
                    pass
                else:
                    with state.condition:
                        state.due.discard(self._receive_type)
                        if state.code is None:
                            self._receive_next()
                        done = not state.due
                    self._hand_over(response)
                    return done and state.fork_epoch >= cygrpc.get_fork_epoch()
        with state.condition:
            callbacks = _channel._handle_event(event, state, self._deserialize)
            response, state.response = state.response, None
            if response is not None and state.code is None:
                self._receive_next()
            elif response is None and state.code is not None and state.due:
                # ended, or a response did not parse (grpc set INTERNAL): end the core call too (a no-op
                # when nothing is pending in it), so its status arrives and the call is done
                self._core.cancel(cygrpc.StatusCode.internal, str(state.details))
            state.condition.notify_all()
            done = not state.due
        for callback in callbacks:
            try:
                callback()
            except Exception:  # as grpc's own handler: never end the channel's thread
                log.exception("a call-end callback failed")
        if response is not None:
            self._hand_over(response)
        return done and state.fork_epoch >= cygrpc.get_fork_epoch()

    def _hand_over(self, response: Any) -> None:
        """Give the owner a response; an error in its callback must not end the channel's thread."""
        try:
            self._on_response(response)
        except Exception:  # logged, as grpc does for its callbacks: the channel's other calls go on
            log.exception("a response handler failed; the response is dropped")


def _on_own_thread(work: Callable[[Any], None], argument: Any) -> None:
    threading.Thread(target=work, args=(argument,), name="liftbridge-call-ended", daemon=True).start()


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.0)
