"""Pipelined batch publishing over the PublishAsync stream.

Every message of a batch is validated and turned into a request before the
first one is sent. The requests then flow over one PublishAsync stream with at
most ``window`` messages awaiting their ack. Acks are matched to messages by
correlation id and returned in input order.

Nothing that may have been stored is re-sent: when the stream breaks, the
messages awaiting an ack are reported as failed with ``may_be_stored=True``
(they may or may not have been written) and the messages not yet sent go on
over a new stream to another broker. A message whose ack does not arrive
within ``ack_wait`` seconds is reported as an AckTimeoutError, unless its ack
still arrives before the batch ends. A message the server refused because the
metadata leader that must resume its paused partition is being replaced
(nothing stored) is sent again after a backoff, in its partition's order (see
:class:`PublishWindow`). So is one refused as unknown (NOT_FOUND: a broker
that has not applied the stream's creation yet) while fresh metadata lists its
stream and partition (:func:`~liftbridge_provider.client.retry.after_unknown`),
within the batch's deadline; when the metadata does not list them, the
refusals stand at once (NoSuchStreamError), and so do the partition's later
ones. With ack policy NONE refusals are reported as they come, never re-sent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.addresses import leader_first, replica_address
from liftbridge_provider.client.errors import (
    ClientClosedError,
    EncryptionError,
    IncorrectOffsetError,
    MessageTooLargeError,
    NoSuchStreamError,
    PermissionDeniedError,
    ReadonlyPartitionError,
    error_from_rpc,
    is_too_large,
)
from liftbridge_provider.client.h2.aio_transport import DirectStream, NotConnected
from liftbridge_provider.client.health import HEALTH, Signal
from liftbridge_provider.client.messages import Ack
from liftbridge_provider.client.plans import listed
from liftbridge_provider.client.publish.batch_result import BatchResult
from liftbridge_provider.client.publish.plans import (
    SHORTEST_RESEND,
    async_refused_as_unknown,
    refused_while_leader_changes,
)
from liftbridge_provider.client.publish.private_loop import run_in_private_loop
from liftbridge_provider.client.publish.publish_window import BatchErrors, PublishWindow, UnknownWord
from liftbridge_provider.client.retry import Deadline, Listing, Unknown, after_unknown, backoff_delay
from liftbridge_provider.client.routing import Router
from liftbridge_provider.core.errors import InvalidArgumentError, LiftbridgeError, NoSuchPartitionError
from liftbridge_provider.core.publish_outcomes import Unanswered, async_refusal, unanswered

log = logging.getLogger(__name__)
PROGRESS_EVERY = 10.0  # seconds between progress log lines
POLL = 0.05  # seconds between checks for expired acks while waiting
CONNECT_TIMEOUT = 5.0  # seconds to connect to a broker before trying the next
WRITE_BYTES = 256 * 1024  # requests queued on the stream at most before more wait for it to drain, bytes
WRITE_MESSAGES = 256  # requests handed to the stream at a time
PUBLISH_ASYNC = "/proto.API/PublishAsync"
MAX_STREAM_ATTEMPTS = 10  # broken streams in a row, with no ack in between, before giving up
# A stream that breaks with these is reopened to another broker for the messages not yet sent.
_STREAM_RETRY_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)

_ASYNC_ERRORS: dict[int, type[LiftbridgeError]] = {
    api.PublishAsyncError.NOT_FOUND: NoSuchStreamError,
    api.PublishAsyncError.BAD_REQUEST: InvalidArgumentError,
    api.PublishAsyncError.READONLY: ReadonlyPartitionError,
    api.PublishAsyncError.INCORRECT_OFFSET: IncorrectOffsetError,
    api.PublishAsyncError.ENCRYPTION_FAILED: EncryptionError,
    api.PublishAsyncError.PERMISSION_DENIED: PermissionDeniedError,
}


def async_error(response: api.PublishResponse, stream: str, partition: int) -> LiftbridgeError:
    """The typed error of a PublishAsync error response; whether the message may be stored anyway is
    :func:`~liftbridge_provider.core.publish_outcomes.async_refusal`'s to say."""
    pb = response.asyncError
    kind = _ASYNC_ERRORS.get(pb.code, LiftbridgeError)
    _, may_be_stored = async_refusal(api.PublishAsyncError.Code.Name(pb.code) if pb.code in _CODE_NAMES else "")
    if pb.code == api.PublishAsyncError.NOT_FOUND and "partition" in pb.message:
        kind = NoSuchPartitionError
    if is_too_large(pb.message):
        kind = MessageTooLargeError
    message = pb.message or api.PublishAsyncError.Code.Name(pb.code)
    return kind(message, stream=stream, partition=partition, may_be_stored=may_be_stored)


_CODE_NAMES = frozenset(api.PublishAsyncError.Code.values())


class _StreamEnded(grpc.RpcError):
    """The PublishAsync stream ended while messages were still being written."""

    def __init__(self, address: str) -> None:
        self.address = address

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return f"the PublishAsync stream to {self.address} ended early"


class BatchPublisher:
    """Sends one batch; not reusable. See the module docstring for the guarantees.

    The stream is a gRPC call of the client's own (:mod:`~liftbridge_provider.client.h2.call_state`) on a
    connection opened for the batch and closed after it, driven from a private
    event loop on its own thread. Every read hands its acks over at once, and
    every message the window then allows goes out in one write: grpc's
    per-message writes made both the client and the server work once per
    message (docs/benchmarks.md). What is sent, awaited, expired or lost is
    :class:`PublishWindow`'s to decide (as for the NATS path); everything runs
    on the one loop thread, without locks.
    """

    def __init__(
        self,
        router: Router,
        requests: Sequence[api.PublishRequest],
        *,
        window: int,
        ack_wait: float,
        deadline: Deadline | None,
        refused: Mapping[int, LiftbridgeError] | None = None,
    ) -> None:
        self._router = router
        self._requests = requests
        self._stream = requests[0].stream
        self._expects_ack = requests[0].ackPolicy != api.NONE
        self._ack_wait = ack_wait
        self._deadline = deadline
        self._window = PublishWindow(len(requests), window=window, ack_wait=ack_wait, expects_ack=self._expects_ack)
        for index, error in (refused or {}).items():  # refused before sending (e.g. too large): never taken
            self._window.refuse(index, error)
        self._errors = BatchErrors(self._stream, lambda index: requests[index].partition)
        self._last_progress = self._started = time.monotonic()
        self._call: DirectStream | None = None  # the stream being written to
        self._handed: list[int] = []  # indices handed to that stream, in order
        self._marked = 0  # how many of them the window knows were written (their ack_wait runs)
        self._wrote = False  # some message was written in full on some stream of the batch
        self._address = ""
        self._answered = False
        self._finished: asyncio.Event | None = None  # set when every message is resolved
        self._releases = 0  # times held messages were released (the backoff grows with it)
        self._release_at: float | None = None  # when to release the held messages (monotonic)
        self._asking: asyncio.Future[dict[int, Listing]] | None = None  # fresh metadata on held NOT_FOUND refusals
        self._missing: set[int] = set()  # partitions fresh metadata did not list: their NOT_FOUND refusals stand

    def run(self) -> BatchResult:
        """Publish the batch (blocking) and return the result; ClientClosedError when the client closes first."""
        pool = self._router.pool
        return run_in_private_loop(self._run(), name="liftbridge-publish-batch", closed=lambda: pool.closed)

    async def _run(self) -> BatchResult:
        self._finished = asyncio.Event()
        attempt = 0  # consecutive broken streams without a single ack in between
        while not self._window.done:
            addresses = self._broker_order()
            address = addresses[attempt % len(addresses)]
            acked_before = self._window.acked
            try:
                await self._stream_to(address)
            except ClientClosedError as exc:  # close() came between two streams: what went before may be stored
                raise ClientClosedError(
                    "the Liftbridge client was closed while a batch was being published"
                    + ("; messages sent before may have been stored" if self._wrote else "; nothing was sent"),
                    stream=self._stream,
                    may_be_stored=self._wrote,
                ) from exc
            except grpc.RpcError as exc:
                out_of_time = self._deadline_passed()  # a connection cut short by the deadline proves nothing
                if exc.code() is grpc.StatusCode.UNAVAILABLE and not out_of_time:
                    HEALTH.tell(address, _signal_of(exc))  # silent or refusing when connecting, or broken
                if out_of_time:  # what was not sent was not sent because the deadline came first
                    self._fail_at_deadline()
                    break
                self._on_broken_stream(exc)
                attempt = 0 if self._window.acked > acked_before else attempt + 1
                if exc.code() not in _STREAM_RETRY_CODES or attempt >= MAX_STREAM_ATTEMPTS:
                    self._window.fail_unsent(error_from_rpc(exc, stream=self._stream))
                    break
                await asyncio.sleep(self._bounded(backoff_delay(attempt)))
        return self._window.result()

    def _broker_order(self) -> list[str]:
        """Brokers to stream the batch to: the leader of the first message's partition first, then the rest
        in the client's ``broker_selection`` order (a randomly picked frozen follower failed whole batches)."""
        snapshot = self._router.metadata.snapshot
        try:
            leader = replica_address(self._router.config, snapshot, self._stream, self._requests[0].partition, False)
        except LiftbridgeError:  # the snapshot does not know the partition yet
            leader = None
        return leader_first(self._router.broker_addresses(), leader)

    async def _stream_to(self, address: str) -> None:
        pool = self._router.pool
        async with pool.direct_call(address, PUBLISH_ASYNC, self._on_input, self._bounded(CONNECT_TIMEOUT)) as call:
            self._call, self._handed, self._address, self._answered = call, [], address, False
            self._marked = 0
            try:
                self._pump()
                await self._supervise(call, address)
            except BaseException:
                self._return_unwritten()
                raise
            finally:
                self._call = None

    async def _supervise(self, call: DirectStream, address: str) -> None:
        """Until every message is resolved: expire overdue acks, keep the batch deadline, notice a broken stream.

        Waits on a short tick rather than on the stream alone, so acks that never
        come (no leader, the ISR below min ISR, messages dropped) end by
        ``ack_wait`` and the batch by its deadline, whatever the stream does.
        """
        assert self._finished is not None
        window, finished = self._window, asyncio.ensure_future(self._finished.wait())
        # With ack policy NONE the batch waits for the server to end the call, so its "finished" (every
        # message sent) is no reason to wake: waiting on it once set turned each wait into a busy loop.
        waits: set[asyncio.Future[Any]] = {call.ended, finished} if self._expects_ack else {call.ended}
        try:
            while True:
                await asyncio.wait(waits, timeout=POLL, return_when=asyncio.FIRST_COMPLETED)
                now = time.monotonic()
                self._mark_written(now)
                if window.expire(now, self._errors.ack_timeout(self._ack_wait)):
                    self._pump()
                if window.holding and not window.in_flight:
                    self._release_held()
                if self._deadline_passed():
                    self._return_unwritten()
                    self._fail_at_deadline()
                    return
                if self._expects_ack and window.done:
                    return
                if call.ended.done():
                    call.ended.result()  # a failed call raises its error here
                    if window.in_flight or not window.all_sent:
                        raise _StreamEnded(address)
                    return  # ack policy NONE: the server ended the stream after the last message
        finally:
            finished.cancel()

    def _release_held(self) -> None:
        """Send the held messages again once their backoff has passed (and none awaits an ack); those refused
        as unknown once fresh metadata answered (at once when it does not list their partition)."""
        now = time.monotonic()
        if self._release_at is None:
            self._release_at = now + backoff_delay(self._releases)
            self._releases += 1
            self._ask_metadata({self._requests[index].partition for index in self._window.unknown_held})
        if self._asking is not None and not self._asking.done():
            return  # the metadata's word on the NOT_FOUND refusals comes first
        listings = self._asking.result() if self._asking is not None else {}
        missing = {p for p, said in listings.items() if after_unknown(said, time_left=True) is Unknown.MISSING}
        if now < self._release_at and not missing:
            return
        self._asking = self._release_at = None
        self._missing |= missing
        deadline = self._deadline
        time_left = deadline is None or deadline.remaining() >= SHORTEST_RESEND
        word = UnknownWord(listings, time_left, deadline.timeout if deadline is not None else None)
        again, failed = self._window.release(now, lambda index: self._requests[index].partition, word)
        level = logging.INFO if failed or self._releases == 1 else logging.DEBUG
        log.log(
            level, "sending %d refused messages again (%d failed: missing, out of order or out of time)", again, failed
        )
        self._pump()

    def _ask_metadata(self, partitions: Iterable[int]) -> None:
        """Start asking fresh metadata (:func:`~liftbridge_provider.client.plans.listed`, on the loop's executor:
        the metadata calls block) whether it lists the batch's stream and each of ``partitions``."""
        wanted = sorted(partitions)
        if not wanted:
            return
        deadline = self._deadline if self._deadline is not None else Deadline(self._ack_wait)
        self._asking = asyncio.get_running_loop().run_in_executor(None, self._listings, wanted, deadline)

    def _listings(self, partitions: Sequence[int], deadline: Deadline) -> dict[int, Listing]:
        """partition -> what fresh metadata says of it (UNANSWERED when it could not be asked: then the refusal
        is asked again, or ends by the deadline, as for metadata that lists it; any failure of the asking is
        that, so none escapes the batch untyped)."""
        said: dict[int, Listing] = {}
        for partition in partitions:
            try:
                _fresh, said[partition] = self._router.run(listed(deadline, self._stream, partition))
            except Exception as exc:  # a LiftbridgeError as a rule; nothing else may end the batch untyped
                if not isinstance(exc, LiftbridgeError):
                    log.warning("asking the metadata of %s/%d failed: %r", self._stream, partition, exc)
                said[partition] = Listing.UNANSWERED
        return said

    def _on_input(self, responses: list[bytes]) -> None:
        """The responses of one read (possibly none): count them, then send what the window allows now."""
        if responses:
            if not self._answered:  # the broker answers: whatever the health model held against it is over
                HEALTH.answered(self._address)
                self._answered = True
            self._mark_written(time.monotonic())  # (an answer may come before the next tick saw its write)
            parse, requests, window, size = api.PublishResponse.FromString, self._requests, self._window, len(self)
            unreadable = 0
            for data in responses:
                try:
                    response = parse(data)
                except DecodeError:  # its message is left unanswered; the others of this read still count
                    unreadable += 1
                    continue
                ack = response.ack
                correlation_id = ack.correlationId  # empty in an error response (its id is outside the ack)
                if correlation_id.isdigit() and (index := int(correlation_id)) < size:
                    partition = requests[index].partition
                    if window.on_ack(index, Ack(ack, partition)) and window.acked % 1024 == 0:
                        self._log_progress()
                else:
                    self._on_response(response)
            if window.done and self._finished is not None:
                self._finished.set()
            if unreadable and self._call is not None:  # a broken peer: what it left unanswered may be stored
                self._call.abort(grpc.StatusCode.INTERNAL, f"{unreadable} PublishAsync responses did not parse")
                return
        self._pump()

    def __len__(self) -> int:
        return len(self._requests)

    def _pump(self) -> None:
        """Hand the stream every message the window allows, in writes of up to ``WRITE_BYTES``, while its
        connection takes them (ack policy NONE: until every message is sent, then close the sending side)."""
        call, window = self._call, self._window
        if call is None or call.ended.done() or self._deadline_passed():
            return
        requests, handed, now = self._requests, self._handed, time.monotonic()
        while not call.paused and call.state.queued_bytes < WRITE_BYTES:
            taken = window.take_many(now, WRITE_MESSAGES, written=False)
            if not taken:  # the window is full, or every message is sent
                break
            handed.extend(taken)
            call.send([requests[index].SerializeToString() for index in taken])
        self._mark_written(now)
        if not self._expects_ack and window.all_sent:
            call.close_sending()  # the server then ends the stream (no acks to wait for)

    def _mark_written(self, now: float) -> None:
        """Tell the window which handed messages the call has written in full since the last look."""
        call = self._call
        if call is None:
            return
        written = call.state.written_messages
        if written > self._marked:
            self._window.mark_written(self._handed[self._marked : written], now)
            self._marked = written
            self._wrote = True

    def _return_unwritten(self) -> None:
        """Messages handed to the stream but never written in full cannot be stored: back to the window, to
        go over the next stream (or fail as not sent)."""
        call = self._call
        if call is None:
            return
        written = call.state.written_messages
        if written < len(self._handed):
            self._window.untake(self._handed[written:])
        del self._handed[written:]

    def _bounded(self, seconds: float) -> float:
        """``seconds``, or less when the batch deadline comes first."""
        if self._deadline is None:
            return seconds
        return max(min(seconds, self._deadline.remaining()), 0.001)

    def _deadline_passed(self) -> bool:
        return self._deadline is not None and self._deadline.expired

    def _on_response(self, response: api.PublishResponse) -> None:
        failed = response.HasField("asyncError")
        correlation_id = response.correlationId if failed else response.ack.correlationId
        if not correlation_id.isdigit() or int(correlation_id) >= len(self._requests):
            log.warning("ignoring a PublishAsync response with unknown correlation id %r", correlation_id)
            return
        index = int(correlation_id)
        partition = self._requests[index].partition
        if failed:
            error = async_error(response, self._stream, partition)
            if self._expects_ack and refused_while_leader_changes(response):
                self._window.hold(index, error)
            elif self._expects_ack and async_refused_as_unknown(response) and partition not in self._missing:
                self._window.hold(index, error, unknown=True)  # a broker behind the metadata? (_release_held)
            else:
                self._window.on_error(index, error)
        elif self._window.on_ack(index, Ack(response.ack, partition)) and self._window.acked % 1024 == 0:
            self._log_progress()

    def _fail_at_deadline(self) -> None:
        timeout = self._deadline.timeout if self._deadline is not None else 0.0
        if not self._expects_ack:  # written, and the server did not confirm the call before the deadline
            self._window.lose_sent(self._handed, self._errors.deadline_in_flight(timeout))
        self._window.end_at_deadline(self._errors, timeout)

    def _on_broken_stream(self, exc: grpc.RpcError) -> None:
        """The stream died (or the server ended it with messages left): every message written on it and not
        answered is uncertain (:func:`~liftbridge_provider.core.publish_outcomes.unanswered`)."""
        lost = self._errors.lost(f"{exc.code().name}: {exc.details()}", exc.code())
        ended_normally = isinstance(exc, _StreamEnded)
        fate = unanswered(written=True, expects_ack=self._expects_ack, call_ended_normally=ended_normally)
        if fate is Unanswered.MAY_BE_STORED:
            if self._expects_ack:
                self._window.lose_in_flight(lost)
            else:
                self._window.lose_sent(self._handed, lost)
        self._handed = []
        log.warning("PublishAsync stream broke (%s); %d messages left to send", exc.code(), self._window.unsent)

    def _log_progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_EVERY:
            self._last_progress = now
            done = self._window.acked
            log.info("published %d/%d messages (%.0f msgs/s)", done, len(self._requests), done / (now - self._started))


def _signal_of(exc: grpc.RpcError) -> Signal:
    """What an UNAVAILABLE stream says of its broker: refused (nothing to hold against it), silent when
    connecting, or broken once connected."""
    if isinstance(exc, NotConnected):
        return Signal.REFUSED if exc.refused else Signal.SILENT
    return Signal.BROKEN
