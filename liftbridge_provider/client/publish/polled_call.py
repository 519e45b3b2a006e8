"""A bidirectional gRPC stream whose waiting callers read the responses themselves.

grpc's synchronous stream-stream call reads every response on the channel's
thread and hands it to the thread that waits for it: after its ack has
arrived, a single ``publish`` still waits for a thread wake-up. A
:class:`PolledCall` is opened on a completion queue of its own (grpc's
``segregated_call``, what a blocking unary call uses) and is driven by the
callers that wait: one of them at a time polls the queue and handles every
event it returns (each response goes to ``on_response``); the others wait for
their answer or for their turn to poll. A thread publishing alone therefore
reads its own ack, and no other Python thread runs on the way.

A poll cannot be given a timeout. At the polling caller's deadline the call's
keeper thread posts an empty batch, which grpc completes at once, so the poll
returns and the caller sees its deadline. The keeper also half-closes the call
after ``idle_close`` seconds with nothing to do, and once the call is cancelled
or closed it polls it to its end, so that the call's resources are released and
``on_end`` runs.

Nobody polls a call between publishes, so its end (a broker killed meanwhile)
waits unseen on the queue, and a broker restarted on the same address makes
the channel look connected again. A send on a call no poll took an event from
for :data:`PROBE_AFTER` seconds therefore first posts an empty batch and polls
until it returns: an end that came meanwhile shows first, and the message goes
on a new call instead of being written to the dead one.

These are grpc's private parts (``grpc.Channel._channel``, cygrpc's
operations): :func:`open_polled_call` returns None when they are not there, and
the owner uses grpc's iterator API instead. ``tests/server/test_publish_stream.py``
checks that the pinned grpcio takes this path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api

cygrpc: Any
try:  # grpc's private module: absent or different in another grpcio, then the owner uses the iterator API
    from grpc._cython import cygrpc  # type: ignore[attr-defined,no-redef]
except ImportError:  # pragma: no cover - grpcio always has it today
    cygrpc = None

log = logging.getLogger(__name__)
PUBLISH_ASYNC = b"/proto.API/PublishAsync"
CLOSE_WAIT = 5.0  # seconds a half-closed call waits for the server's end of it; then it is cancelled
FOLLOW_SLICE = 0.05  # seconds a caller waits between looks at its answer while another caller polls
PROBE_AFTER = 0.25
"""Seconds without an event after which a send first probes the call: its end may have come meanwhile,
unseen, since nobody polled (its broker was killed and its channel connected again to a new process)."""
_START, _SEND, _RECEIVE, _STATUS, _CLOSE, _WAKE, _PROBE = "start", "send", "receive", "status", "close", "wake", "probe"
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_OPERATIONS = (
    "SendInitialMetadataOperation",
    "ReceiveInitialMetadataOperation",
    "ReceiveStatusOnClientOperation",
    "SendMessageOperation",
    "ReceiveMessageOperation",
    "SendCloseFromClientOperation",
    "StatusCode",
)


class CallEnded(Exception):
    """The call has ended: nothing was sent on it."""


class SendStalled(Exception):
    """The previous message was still being written when the deadline came: this one was not sent."""


class Ended(grpc.RpcError):
    """How the call ended: the status the server sent, or the one grpc gave a cancelled or broken call."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def open_polled_call(
    channel: grpc.Channel,
    *,
    name: str,
    idle_close: float,
    close_if_idle: Callable[[], bool],
    on_response: Callable[[api.PublishResponse], None],
    on_end: Callable[[grpc.RpcError], None],
) -> PolledCall | None:
    """A PublishAsync call on ``channel`` driven by its callers, or None when this grpcio lacks the parts
    (then nothing was opened). ``ValueError`` when the channel is closed, as grpc's own calls raise.

    :param name: the keeper thread's name.
    :param idle_close: seconds without a send after which ``close_if_idle`` is asked; True half-closes.
    :param on_response: each response, in order, on the polling caller's thread: keep it short.
    :param on_end: called once when the call has ended, with its status.
    """
    core = getattr(channel, "_channel", None)
    if cygrpc is None or not isinstance(core, cygrpc.Channel) or not hasattr(core, "segregated_call"):
        return None
    if not all(hasattr(cygrpc, part) for part in _OPERATIONS):
        return None
    start = (
        ((cygrpc.SendInitialMetadataOperation((), 0),), _START),
        ((cygrpc.ReceiveInitialMetadataOperation(0),), _START),
        ((cygrpc.ReceiveStatusOnClientOperation(0),), _STATUS),
    )
    call = core.segregated_call(
        cygrpc.PropagationConstants.GRPC_PROPAGATE_DEFAULTS, PUBLISH_ASYNC, None, None, (), None, start, None, None
    )
    return PolledCall(
        call,
        due=len(start),
        name=name,
        idle_close=idle_close,
        close_if_idle=close_if_idle,
        on_response=on_response,
        on_end=on_end,
    )


class PolledCall:
    """One open call: :meth:`send` from any thread, :meth:`drive` by the threads that wait for a response."""

    def __init__(
        self,
        core: Any,
        *,
        due: int,
        name: str,
        idle_close: float,
        close_if_idle: Callable[[], bool],
        on_response: Callable[[api.PublishResponse], None],
        on_end: Callable[[grpc.RpcError], None],
    ) -> None:
        self._core = core
        self._due = due  # batches started and not yet returned by a poll: the call is over at 0
        self._idle_close, self._close_if_idle = idle_close, close_if_idle
        self._on_response, self._on_end = on_response, on_end
        self._lock = threading.Lock()
        self._turn = threading.Condition(self._lock)  # callers: an answer came, or nobody polls now
        self._keeper_turn = threading.Condition(self._lock)  # the keeper: an earlier alarm, the end, a stop
        self._polling = False
        self._writing = False
        self._receiving = False  # a receive is started and not yet returned by a poll
        self._probing = False  # a probe is started and not yet returned by a poll
        self._last_event = time.monotonic()  # when a poll last returned an event
        self._messages_over = False  # the server sent its last message: no receive is started again
        self._stopping = False  # cancelled or half-closed: the keeper polls the call to its end
        self._status: Ended | None = None
        self._alarm = 0.0  # the deadline of the caller polling now, or of the last one
        self._keeper_wakes_at = 0.0
        self._last_sent = time.monotonic()
        with self._lock:
            self._receive_next()
        threading.Thread(target=self._keep, name=name, daemon=True).start()

    def send(self, request: api.PublishRequest, deadline: float) -> None:
        """Write one request; CallEnded if the call is over or closing, SendStalled if the previous write did not
        finish by ``deadline`` (``time.monotonic()``). Either way this request was not sent."""
        serialized = request.SerializeToString()
        polled_late = False  # one poll after the deadline: the last write's completion may be queued, unseen
        with self._lock:
            while True:
                if self._status is not None or self._stopping:
                    raise CallEnded()
                if not self._writing and not self._probing:  # a probe by another sender: wait for what it finds
                    if self._polling or time.monotonic() - self._last_event < PROBE_AFTER:
                        break
                    self._probe(deadline)
                    continue  # the call's state, as the probe found it
                left = deadline - time.monotonic()
                if self._polling:
                    if left <= 0:
                        raise SendStalled()
                    self._turn.wait(min(left, FOLLOW_SLICE))
                    continue
                if polled_late:
                    raise SendStalled()
                polled_late = left <= 0
                self._poll(deadline)  # past its deadline, the keeper wakes it at once
            if not self._operate((cygrpc.SendMessageOperation(serialized, 0),), _SEND):
                raise CallEnded()
            self._writing = True
            self._last_sent = time.monotonic()

    def drive(self, done: Callable[[], bool], deadline: float) -> bool:
        """Poll the call (or wait while another caller does) until ``done()``, the call is over, or ``deadline``;
        returns ``done()``."""
        with self._lock:
            while not done():
                if self._due == 0:
                    return done()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if self._polling:
                    self._turn.wait(min(left, FOLLOW_SLICE))
                else:
                    self._poll(deadline)
            return True

    def cancel(self) -> None:
        """End the call now: its status (CANCELLED) reaches ``on_end`` when the keeper has polled it."""
        with self._lock:
            self._stopping = True
            if self._due:
                self._core.cancel(cygrpc.StatusCode.cancelled, "closed by the client")
            self._keeper_turn.notify()
            self._turn.notify_all()

    def _probe(self, deadline: float) -> None:
        """Post an empty batch and poll until it returns (under the lock, nobody polling): an end of the call
        that came while nobody polled is taken off the queue first. CallEnded when grpc refuses the batch."""
        if not self._operate((), _PROBE):
            raise CallEnded()
        self._probing = True
        while self._probing and self._status is None:
            self._poll(deadline)  # an empty batch completes at once

    def _poll(self, deadline: float | None) -> None:
        """Take one event off the queue and handle it (called, and returns, holding the lock; the poll itself
        and the callbacks run without it). ``deadline``: when the keeper must wake this poll."""
        self._polling = True
        if not self._receiving and not self._messages_over and self._status is None:
            self._receive_next()  # here rather than right after a response: off the path of the ack's caller
        if deadline is not None:
            self._alarm = deadline
            if deadline < self._keeper_wakes_at:  # the keeper sleeps past it (rarely: deadlines mostly grow)
                self._keeper_turn.notify()
        response: api.PublishResponse | None = None
        ended: Ended | None = None
        self._lock.release()
        try:
            event = self._core.next_event()
            self._lock.acquire()
            try:
                response, ended = self._account(event)
            finally:
                self._lock.release()
            if response is not None:
                self._hand_over(response)
            if ended is not None:
                self._end(ended)
        finally:
            self._lock.acquire()
            self._polling = False
            self._turn.notify_all()
            if ended is not None:
                self._keeper_turn.notify()

    def _account(self, event: Any) -> tuple[api.PublishResponse | None, Ended | None]:
        """The call's state after ``event`` (under the lock): the response it carries, or the call's end."""
        self._due -= 1
        self._last_event = time.monotonic()
        tag = event.tag
        if tag == _PROBE:
            self._probing = False
        elif tag == _SEND:
            self._writing = False
        elif tag == _RECEIVE:
            self._receiving = False  # the next poll starts the next one
            data = event.batch_operations[0].message() if event.success else None
            if data is None:
                self._messages_over = True
            else:
                try:
                    response = api.PublishResponse.FromString(data)
                except Exception:  # as grpc does for a response that does not parse: the call ends
                    self._messages_over = True
                    self._core.cancel(cygrpc.StatusCode.internal, "a PublishAsync response did not parse")
                    return None, None
                return response, None
        elif tag == _STATUS:
            operation = event.batch_operations[0]
            self._status = Ended(_CODES.get(operation.code(), grpc.StatusCode.UNKNOWN), operation.details() or "")
            return None, self._status
        return None, None

    def _receive_next(self) -> None:
        """Start a receive (under the lock). Each poll starts one when none is out, so a response that comes
        while nobody polls waits in grpc's buffer (its flow control holds the server back) until a poll."""
        if self._operate((cygrpc.ReceiveMessageOperation(0),), _RECEIVE):
            self._receiving = True
        elif self._due:
            self._messages_over = True
            self._core.cancel(cygrpc.StatusCode.cancelled, "could not ask for the next response")

    def _operate(self, operations: tuple[Any, ...], tag: str) -> bool:
        """Start a batch on the call (under the lock); False when grpc refused it (the call is over)."""
        try:
            started = bool(self._core.operate(operations, tag))
        except ValueError:  # grpc's core refused the operation: nothing was started
            started = False
        if started:
            self._due += 1
        return started

    def _hand_over(self, response: api.PublishResponse) -> None:
        """Give the owner a response; an error in its callback must not leave the call without a poller."""
        try:
            self._on_response(response)
        except Exception:  # logged, as grpc does for its callbacks: the other callers go on
            log.exception("a response handler failed; the response is dropped")

    def _end(self, ended: Ended) -> None:
        try:
            self._on_end(ended)
        except Exception:  # logged: the call's remaining events are still taken off its queue
            log.exception("a call-end handler failed")

    def _keep(self) -> None:
        """The keeper thread: wakes a poll at its caller's deadline, half-closes the idle call, and polls a
        stopped call to its end. An error in one round is logged and the next round runs (a keeper that died
        would leave a poll on a silent broker without its alarm)."""
        with self._lock:
            while self._due > 0:
                try:
                    self._keep_once()
                except Exception:  # logged; waits a moment so that a lasting fault does not spin
                    log.exception("the publish stream's keeper failed a round; it goes on")
                    self._keeper_turn.wait(FOLLOW_SLICE)

    def _keep_once(self) -> None:
        """One round of :meth:`_keep` (under the lock): one duty done, or a wait until the next one is due."""
        now = time.monotonic()
        if self._stopping or self._status is not None:
            if self._polling:  # a caller polls: it or the keeper takes the rest after it
                self._keeper_turn.wait(FOLLOW_SLICE)
            else:
                self._poll(None)
            return
        if self._polling and now >= self._alarm:
            self._operate((), _WAKE)  # an empty batch: grpc completes it at once, the poll returns
            self._alarm = 0.0
        wake_at = self._last_sent + self._idle_close
        if now >= wake_at:
            if self._close_if_idle():
                self._half_close()
                return
            wake_at = now + self._idle_close / 10
        if self._alarm > now:  # the poll now or the last one: the next poll's deadline is mostly later
            wake_at = min(wake_at, self._alarm)
        self._keeper_wakes_at = wake_at
        try:
            self._keeper_turn.wait(max(wake_at - now, 0.0))
        finally:
            self._keeper_wakes_at = 0.0

    def _half_close(self) -> None:
        """Tell the server no more requests come (under the lock); cancel when that cannot be sent, or when the
        server has not ended the call ``CLOSE_WAIT`` s later."""
        self._stopping = True
        if self._writing or not self._operate((cygrpc.SendCloseFromClientOperation(0),), _CLOSE):
            self._core.cancel(cygrpc.StatusCode.cancelled, "closed by the client")
            return
        timer = threading.Timer(CLOSE_WAIT, self._cancel_if_open)
        timer.daemon = True
        timer.start()

    def _cancel_if_open(self) -> None:
        with self._lock:
            if self._status is None and self._due:
                self._core.cancel(cygrpc.StatusCode.cancelled, "the server did not end a half-closed call")
