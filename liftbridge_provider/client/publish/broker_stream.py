"""One PublishAsync call to one broker, shared by a client's single publishes: written by its callers and read by
them, in turns, on the data plane's synchronous driver (:class:`~liftbridge_provider.client.h2.blocking.BlockingCall`).

Why the callers drive it: a thread publishing alone writes its message and reads its own ack on its own thread,
with no thread wake-up between the ack's arrival and ``publish`` returning (a sync publish's latency is what
matters here). With several threads, one waiting caller at a time reads (the turn); each ack it reads goes to
the caller it belongs to, by correlation id, and the others wait on the stream's condition for their answer or
for the turn. The stream has no thread of its own, so nothing of it can outlive the client.

The rules of every streaming call (docs/client.md, "Single publishes share a stream per broker"):

- **Keepalive**: every read is bounded by the call's keepalive tick: a broker silent for ``KEEPALIVE_IDLE``
  (10 s) is sent a PING, and the call ends UNAVAILABLE when it goes unanswered for ``KEEPALIVE_TIMEOUT`` (10 s),
  so a frozen broker fails the callers waiting on it within 20 s of its last frame (sooner by their deadlines).
- **A deadline on every exit**: a caller waits for its turn to write, and for its ack, at most until its own
  deadline. The call itself has none: it lives while it is used, and ends when idle (:meth:`close_if_idle`),
  replaced (:meth:`retire`), broken, or closed with the client (:meth:`close`).
- **What waits on the socket is read before a write** when nobody is reading (unless the call was read in the
  last :data:`FRESH` s): a broker killed since the last publish, or restarted on the same address, shows as the
  connection's end, and the message goes on a new call.
- **Bounded in flight, one write at a time**: a message is handed to the call only once every earlier one has
  gone to the socket in full, so a message that cannot be written by its deadline (the broker stopped reading)
  is not sent (:class:`SendStalled`), and one the broker's flow-control window held back wholly is withdrawn at
  its deadline. What the server may send ahead is bounded by the call's receive window.
- **A truthful may_be_stored** (:func:`~liftbridge_provider.core.publish_outcomes.unanswered`): at a caller's
  deadline, or when the call ends, a message none of whose bytes was written is not sent (it may go to another
  broker); any other may be stored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.errors import UnavailableError
from liftbridge_provider.client.h2.blocking import BlockingCall
from liftbridge_provider.client.h2.inbound import Segments
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.core.errors import LiftbridgeError
from liftbridge_provider.core.publish_outcomes import Unanswered, unanswered

PUBLISH_ASYNC = "/proto.API/PublishAsync"
FRESH = 0.001
"""Seconds since the call was last read within which a write does not look at its socket first: in a loop of
publishes the previous ack's read was moments ago, and what came since (a broker's end included) is read with
the next answer; a look costs a system call on the latency of every publish."""


class StreamClosed(Exception):
    """The stream takes no more requests (closing, ended, or draining after the server's GOAWAY): open a new one.
    Nothing was sent on it."""


class SendStalled(Exception):
    """The previous message was still being written when the caller's deadline came: this one was not sent."""


class NoAnswer(Exception):
    """The caller's deadline passed without an answer; ``sent``: some of its message went out (else it was taken
    back and will never be written)."""

    def __init__(self, sent: bool) -> None:
        super().__init__("sent" if sent else "not sent")
        self.sent = sent


class Unsent(Exception):
    """The call ended before any byte of the message was written: it may go to another broker."""


class Answer:
    """One caller's request on the stream and what came back for it (set under the stream's lock)."""

    __slots__ = ("correlation_id", "error", "response", "start")

    def __init__(self, correlation_id: str) -> None:
        self.correlation_id = correlation_id
        self.start = 0  # where the request starts among the call's DATA bytes (what was written is counted so)
        self.response: api.PublishResponse | None = None
        self.error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.response is not None or self.error is not None


class BrokerStream:
    """The shared call to one broker (see the module docstring): :meth:`send`, then :meth:`result`.

    :param address: the broker dialled.
    :param call: the connected call (``/proto.API/PublishAsync``, no deadline of its own).
    :param idle_close: seconds without a send after which :meth:`close_if_idle` ends it.
    :param release: closes the call and forgets it (the connection pool's ``release_call``), once.
    """

    def __init__(
        self, address: str, call: BlockingCall, *, idle_close: float, release: Callable[[BlockingCall], None]
    ) -> None:
        self.address = address
        self._call = call
        self._idle_close = idle_close
        self._release = release
        self._lock = threading.Lock()
        self._turn = threading.Condition(self._lock)  # an answer came, the reader left, or a write went out
        self._pending: dict[str, Answer] = {}
        self._reading = False  # a caller has the turn: it reads the call
        self._waiters = 0  # callers waiting on the condition
        self._closing = False  # takes no more requests; ended once nobody waits on it
        self._released = False
        self._last_used = time.monotonic()

    @property
    def usable(self) -> bool:
        """Takes requests: not closing, its call neither ended nor draining (as far as was read)."""
        call = self._call
        return not self._closing and not call.over and not call.state.draining

    @property
    def ended(self) -> bool:
        """The call is closed and its connection given back."""
        return self._released

    def send(self, request: api.PublishRequest, deadline: float) -> Answer:
        """Write ``request`` on the call; its :class:`Answer` gets the response. StreamClosed when this stream
        takes no more, SendStalled when the previous write had not gone out by ``deadline`` (both: not sent)."""
        data = request.SerializeToString()
        answer = Answer(request.correlationId)
        call = self._call
        with self._lock:
            while True:
                if not self._open_locked():
                    raise StreamClosed(self.address)
                if not self._reading and call.news(FRESH):
                    self._turn_locked(None)  # what waits on the socket now: an end shows before the write
                    if not self._open_locked():
                        raise StreamClosed(self.address)
                if call.clear:
                    break
                if time.monotonic() >= deadline:
                    raise SendStalled(self.address)
                self._turn_locked(deadline)
            answer.start = call.state.queued_through
            self._pending[answer.correlation_id] = answer
            self._last_used = time.monotonic()
            try:
                call.send((data,))
            except BaseException:
                self._pending.pop(answer.correlation_id, None)
                raise
        return answer

    def result(self, answer: Answer, deadline: float) -> api.PublishResponse:
        """``answer``'s response once it comes, or the error the call's end gave it (LiftbridgeError, or
        :class:`Unsent`); :class:`NoAnswer` at ``deadline`` (``time.monotonic()``)."""
        with self._lock:
            while not answer.done:
                if time.monotonic() >= deadline:
                    self._expire_locked(answer)
                self._turn_locked(deadline)
        if answer.error is not None:
            raise answer.error
        assert answer.response is not None
        return answer.response

    def close(self, error: Callable[[bool], LiftbridgeError]) -> None:
        """End the stream now (the client closes): every waiting caller fails with ``error(sent)`` (``sent``: some
        of its message was written), then the call is cancelled (a reader waiting on it returns at once) and
        closed (by that reader, when there is one, as it leaves)."""
        with self._lock:
            self._closing = True
            waiting, self._pending = self._pending, {}
            for answer in waiting.values():
                answer.error = error(self._written(answer))
            self._call.cancel("the Liftbridge client was closed")
            self._settle_locked()
            self._turn.notify_all()  # a caller waiting for its turn to write sees the stream closed

    def retire(self) -> None:
        """Replaced by a new stream to the same broker: take no more requests, and end the call once no caller
        waits on it (at once when none does)."""
        with self._lock:
            self._closing = True
            self._settle_locked()
            self._turn.notify_all()

    def close_if_idle(self, now: float) -> bool:
        """Nothing sent for ``idle_close`` s and nobody waiting: half-close the call and end it (True)."""
        with self._lock:
            if self._released:
                return True
            if self._closing or self._pending or self._reading or now - self._last_used < self._idle_close:
                return False
            self._closing = True
            self._call.close_sending()
            self._settle_locked()
            return True

    # -- inside (every method below runs under the lock) -------------------------------------------------------

    def _open_locked(self) -> bool:
        """Takes requests; when it no longer does, it is closing, and its end is handled."""
        call = self._call
        if call.over or call.state.draining:
            self._closing = True
        if call.over:
            self._settle_locked()
        return not self._closing

    def _turn_locked(self, until: float | None) -> None:
        """One step of a caller's wait: read the call once when nobody reads (until ``until``; None: only what is
        there now), else wait until the reader has news or ``until`` passes."""
        if self._reading:
            if until is None:
                return
            self._waiters += 1
            try:
                self._turn.wait(max(until - time.monotonic(), 0.0))
            finally:
                self._waiters -= 1
            return
        self._reading = True
        responses: list[api.PublishResponse] = []
        unreadable = False
        self._lock.release()
        try:
            segments = self._call.receive(until=time.monotonic() if until is None else until)
            if segments:
                responses, unreadable = _parse(segments)
                HEALTH.answered(self.address)
        finally:
            self._lock.acquire()
            self._reading = False
            for response in responses:
                failed = response.HasField("asyncError")
                answer = self._pending.pop(response.correlationId if failed else response.ack.correlationId, None)
                if answer is not None:  # else its caller left at its deadline: a late answer is dropped
                    answer.response = response
            if unreadable:  # as grpc does: the call ends, after the responses that parsed
                self._call.abort(grpc.StatusCode.INTERNAL, "a PublishAsync response did not parse")
            self._settle_locked()
            if self._waiters:
                self._turn.notify_all()

    def _expire_locked(self, answer: Answer) -> None:
        """The caller's deadline passed: it stops waiting (a late ack is dropped); NoAnswer says whether some of
        its message went out (else it is taken back, never to be written)."""
        self._pending.pop(answer.correlation_id, None)
        sent = self._written(answer) or not self._call.withdraw(answer.start)
        self._settle_locked()
        if self._waiters:
            self._turn.notify_all()  # a withdrawn message leaves the call clear: a writer may go on
        raise NoAnswer(sent)

    def _settle_locked(self) -> None:
        """Fail what waits on an ended call (the table of core/publish_outcomes.py), and close a call that takes no
        more requests once nobody waits on it or reads it."""
        call = self._call
        ended = call.state.ended
        if ended is not None and self._pending:
            waiting, self._pending = self._pending, {}
            normally = ended.code is grpc.StatusCode.OK
            reason = "the server ended the stream" if normally else f"{ended.code.name}: {ended.details}"
            for answer in waiting.values():
                fate = unanswered(written=self._written(answer), expects_ack=True, call_ended_normally=normally)
                answer.error = Unsent(self.address) if fate is Unanswered.NOT_SENT else _broken(self.address, reason)
        if (self._closing or ended is not None) and not self._pending and not self._reading and not self._released:
            self._closing = True
            self._released = True
            self._release(call)

    def _written(self, answer: Answer) -> bool:
        """Some of ``answer``'s request was written (handed to the connection's bytes to write)."""
        return self._call.state.written_through > answer.start


def _parse(segments: Segments) -> tuple[list[api.PublishResponse], bool]:
    """The responses of one read, and whether one of them did not parse (those after it are dropped)."""
    parse = api.PublishResponse.FromString
    responses: list[api.PublishResponse] = []
    for buffer, spans in segments:
        for i in range(0, len(spans), 2):
            try:
                responses.append(parse(buffer[spans[i] : spans[i + 1]]))  # type: ignore[arg-type]  # a bytearray too
            except Exception:  # protobuf's DecodeError: the call ends, as grpc ends a call it cannot read
                return responses, True
    return responses, False


def _broken(address: str, reason: str) -> LiftbridgeError:
    return UnavailableError(
        f"PublishAsync stream to {address} ended before the ack ({reason}); "
        "the message may or may not have been stored",
        code=grpc.StatusCode.UNAVAILABLE,
        may_be_stored=True,
    )
