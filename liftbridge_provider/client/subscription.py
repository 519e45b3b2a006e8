"""Subscriptions: an iterator of messages from one partition (the synchronous front end).

Every decision (where to subscribe, which offsets to deliver, when to reopen,
resubscribe or give up) is :class:`~liftbridge_provider.client.reading.SubscriptionState`'s;
this class only opens the calls it asks for, on the calling thread, and can
be cancelled from any other thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Generator, Iterator
from types import TracebackType
from typing import Any

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.columns import END, FULL, LAST, TAKEN, ColumnBuilder, Columns, finish, new_builder
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.messages import Message
from liftbridge_provider.client.reading import NoLeaderYet, Open, SubscriptionState, Verdict, closed_while_reading
from liftbridge_provider.client.routing import Router
from liftbridge_provider.client.stream_reader import messages_of, receive_into, take_end
from liftbridge_provider.core.errors import LiftbridgeError

log = logging.getLogger(__name__)


class Subscription(Iterator[Message]):
    """Messages of one partition, in offset order. Use as an iterator and, ideally, a context manager.

    Built by :meth:`LiftbridgeClient.subscribe`; see there for the parameters.
    """

    def __init__(self, router: Router, state: SubscriptionState) -> None:
        self._router = router
        self._state = state
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._call: Any = None
        self._messages: Generator[api.Message, None, None] = self._run()

    @property
    def stream(self) -> str:
        return self._state.stream

    @property
    def partition(self) -> int:
        return self._state.partition

    @property
    def last_offset(self) -> int | None:
        """The offset of the last message delivered (None before the first)."""
        return self._state.last_offset

    @property
    def established(self) -> bool:
        """A leader has confirmed one of this subscription's calls."""
        return self._state.established

    def __next__(self) -> Message:
        return Message(next(self._messages))

    def raw_messages(self) -> Iterator[api.Message]:
        """The same messages as received protobufs, without the :class:`Message` view (the Spark task's
        read, which reads every field once anyway). Iterating both shares one position."""
        return self._messages

    def cancel(self) -> None:
        """End the subscription; a blocked ``next`` returns (iteration stops). Thread-safe."""
        self._cancelled.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    close = cancel

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Close the generator first: a call that reached the stop offset is read to its end there (its
        # release, see _opened), which cancelling it first would prevent.
        with contextlib.suppress(ValueError):  # "generator already executing": another thread iterates
            self._messages.close()  # release the channel now, not whenever the garbage collector runs
        self.cancel()

    def column_batches(self, *, max_rows: int, max_bytes: int) -> Iterator[Columns]:
        """The same messages as column buffers (the Spark task's read), each batch within ``max_rows`` rows
        and ``max_bytes`` bytes of keys, values and headers (a larger message alone is a batch of its own).

        Responses stay serialized and are decoded into the columns as they arrive
        (:mod:`~liftbridge_provider.client.columns`): no Python object per message.
        Use instead of iterating, not beside it.
        """
        builder = new_builder(max_rows=max_rows, max_bytes=max_bytes)
        while not self._cancelled.is_set():
            failure: grpc.RpcError | None = None
            try:
                with self._opened(raw=True) as call:
                    if call is not None:
                        yield from self._fill(call, builder)
                        if self._state.ended:
                            break
            except grpc.RpcError as exc:
                failure = exc
            if not self._reopen(failure):
                break
        if builder.rows:
            yield finish(builder)

    def _fill(self, call: Any, builder: ColumnBuilder) -> Iterator[Columns]:
        """Read one confirmed call into the builder, yielding each batch it fills."""
        state = self._state
        builder.window(*state.window())
        seen = builder.last_offset
        while True:
            try:
                outcome = receive_into(call, builder.add)
                if outcome is not None and outcome[0] == FULL:
                    yield finish(builder)
                    outcome = (builder.add(outcome[1]), outcome[1])
            except ValueError as exc:  # a response that is not a Message (the builders' only ValueError)
                raise LiftbridgeError(
                    f"undecodable message from the server: {exc}", stream=self.stream, partition=self.partition
                ) from exc
            except BaseException:
                # The call ended (or the read was stopped) after the builder took messages the state has not
                # been told of: tell it now, so a reopened call starts after them and the window (reset from
                # the state) does not take them again.
                self._tell_taken(builder, seen, last=False)
                raise
            status = TAKEN if outcome is None else outcome[0]
            seen = self._tell_taken(builder, seen, last=status == LAST)
            if status == END:
                state.passed_stop()
            if outcome is None or status in (LAST, END):
                return

    def _tell_taken(self, builder: ColumnBuilder, seen: int | None, *, last: bool) -> int | None:
        """Tell the state of the messages the builder took after offset ``seen`` (``last``: up to the stop
        offset); returns the builder's last offset, the next ``seen``."""
        taken = builder.last_offset
        if taken is not None and taken != seen:
            self._state.took(taken, last=last)
        return taken

    def _run(self) -> Generator[api.Message, None, None]:
        state = self._state
        # The hot path, once per message: names bound locally (cheaper than attribute lookups).
        on_message, progressed = state.on_message, state.progressed
        skip, end, last = Verdict.SKIP, Verdict.END, Verdict.DELIVER_LAST
        while not self._cancelled.is_set():
            failure: grpc.RpcError | None = None
            try:
                with self._opened(raw=False) as call:
                    for raw in messages_of(call) if call is not None else ():
                        verdict = on_message(raw.offset)
                        if verdict is skip:
                            continue
                        if verdict is end:
                            return
                        yield raw
                        progressed()
                        if verdict is last:
                            return
            except grpc.RpcError as exc:
                failure = exc
            if not self._reopen(failure):
                return

    def _reopen(self, failure: grpc.RpcError | None) -> bool:
        """After a call ended (``failure`` None: without an error): whether to open another, as the state
        decides (raises what ends the subscription); waits the backoff and refreshes metadata first."""
        if self._cancelled.is_set():
            return False
        if self._router.pool.closed:  # the call ended because the client closed its channels
            raise closed_while_reading(self.stream, self.partition)
        told = self._state.broker_signal(failure)
        if told is not None:
            HEALTH.tell(*told)
        reopen = self._state.closed(failure)
        if reopen is None:
            return False
        if reopen.refresh is not None:
            log.info("subscription to %s/%d lost (%s); resubscribing", self.stream, self.partition, failure)
            time.sleep(reopen.delay)
            with contextlib.suppress(LiftbridgeError):
                self._router.metadata.refresh(timeout=reopen.refresh)
        return True

    @contextlib.contextmanager
    def _opened(self, *, raw: bool) -> Iterator[Any]:
        """One Subscribe call as the state asks, confirmed (its empty first message read), or None when it
        ended before confirming or the subscription was cancelled; cancelled on leaving. ``raw``: the
        responses stay serialized (bytes)."""
        state = self._state
        snapshot = (
            self._router.metadata.snapshot
            if state.established
            else self._router.snapshot_with(self.stream, timeout=state.request_budget())
        )
        step: Open = state.open(snapshot)
        if step.moved_from is not None:
            log.info(
                "subscription to %s/%d moves from %s to %s",
                self.stream,
                self.partition,
                step.moved_from,
                step.address,
            )
        if step.confirm_running:
            self._router.partition_running(self.stream, self.partition, timeout=state.request_budget())
        if step.address is None:
            raise NoLeaderYet()
        with self._router.pool.lease(step.address) as pooled:
            try:
                with self._lock:
                    if self._cancelled.is_set():
                        yield None
                        return
                    if raw:
                        self._call = pooled.subscribe_raw(step.request, timeout=step.timeout)
                    else:
                        self._call = pooled.stub.Subscribe(step.request, timeout=step.timeout)
                if next(self._call, None) is None:  # the empty message that confirms the subscription
                    yield None  # ended before confirming: the state counts it as lost
                    return
                state.confirmed()
                HEALTH.answered(step.address)
                yield self._call
            finally:
                self._end_call()  # within the lease: the pool does not close the channel under the call

    def _end_call(self) -> None:
        """Release the call: right after the stop offset the server ends it itself, and its end is taken
        (grpc's core keeps a call until then); any other call is cancelled (an early exit: grpc's public API
        cannot take the end of a cancelled single-threaded call, see :func:`stream_reader.take_end`)."""
        if self._call is not None and self._state.reached_stop and not self._cancelled.is_set():
            take_end(self._call)  # not under the lock: cancel() from another thread ends the wait
        with self._lock:
            if self._call is not None:
                self._call.cancel()  # does nothing to a call that has ended
            self._call = None
