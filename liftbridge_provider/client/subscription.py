"""Subscriptions: an iterator of messages from one partition (the synchronous front end).

Every decision (where to subscribe, which offsets to deliver, when to reopen,
resubscribe or give up) is :class:`~liftbridge_provider.client.reading.SubscriptionState`'s;
this class only opens the calls it asks for, on the calling thread, and can
be cancelled from any other thread.

Each Subscribe call runs on the data plane (:mod:`~liftbridge_provider.client.subscribe_call`, a
:class:`~liftbridge_provider.client.h2.blocking.BlockingCall` of its own): connected within 5 s, kept alive by
PINGs (a frozen broker ends the call within 20 s of its last frame), ended at its deadline
(``liveness_interval`` or what is left of the subscription's budgets), and closed on every exit (the stop
offset, a caller that leaves, ``cancel()`` from any thread, an error). Its responses are read a socket read
at a time and parsed from the bytes read (no grpc call, nothing kept after the call).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Generator, Iterator
from types import TracebackType

import grpc
from google.protobuf.message import DecodeError

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.columns import END, FULL, LAST, ColumnBuilder, Columns, finish, new_builder
from liftbridge_provider.client.h2.blocking import BlockingCall
from liftbridge_provider.client.h2.grpc_status import CallFailed
from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.messages import Message
from liftbridge_provider.client.reading import NoLeaderYet, Open, SubscriptionState, Verdict, closed_while_reading
from liftbridge_provider.client.routing import Router
from liftbridge_provider.client.subscribe_call import SubscribeCall, open_subscribe
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
        self._call: BlockingCall | None = None
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
        self.cancel()
        with contextlib.suppress(ValueError):  # "generator already executing": another thread iterates
            self._messages.close()  # close the call's connection now, not whenever the garbage collector runs

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
                with self._opened() as call:
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

    def _fill(self, call: SubscribeCall, builder: ColumnBuilder) -> Iterator[Columns]:
        """Read one confirmed call into the builder, yielding each batch it fills: each read's messages go to
        the builder as spans of the bytes read (``take``), and the state is told of them once per read."""
        state = self._state
        builder.window(*state.window())
        seen = builder.last_offset
        take = builder.take
        try:
            for segments in call.reads():
                for buffer, spans in segments:
                    index, count = 0, len(spans)
                    while index < count:
                        status, index = take(buffer, spans, index)
                        if status == FULL:
                            seen = self._tell_taken(builder, seen, last=False)
                            yield finish(builder)  # then the same message again, into the empty builder
                        elif status in (LAST, END):
                            self._tell_taken(builder, seen, last=status == LAST)
                            if status == END:
                                state.passed_stop()
                            return
                seen = self._tell_taken(builder, seen, last=False)
        except ValueError as exc:  # a response that is not a Message (the builders' only ValueError)
            raise LiftbridgeError(
                f"undecodable message from the server: {exc}", stream=self.stream, partition=self.partition
            ) from exc
        except BaseException:
            # The call ended (or the read was stopped) after the builder took messages the state has not been
            # told of: tell it now, so a reopened call starts after them and the window (reset from the state)
            # does not take them again.
            self._tell_taken(builder, seen, last=False)
            raise

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
        on_message, progressed, parse = state.on_message, state.progressed, api.Message.FromString
        skip, end, last = Verdict.SKIP, Verdict.END, Verdict.DELIVER_LAST
        while not self._cancelled.is_set():
            failure: grpc.RpcError | None = None
            try:
                with self._opened() as call:
                    for segments in call.reads() if call is not None else ():
                        for buffer, spans in segments:
                            for index in range(0, len(spans), 2):
                                raw = parse(buffer[spans[index] : spans[index + 1]])  # type: ignore[arg-type]
                                verdict = on_message(raw.offset)
                                if verdict is skip:
                                    continue
                                if verdict is end:
                                    return
                                yield raw
                                progressed()
                                if verdict is last:
                                    return
            except DecodeError as exc:  # as grpc ends a call whose response does not deserialize
                failure = CallFailed(grpc.StatusCode.INTERNAL, f"Exception deserializing response! ({exc})")
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
    def _opened(self) -> Iterator[SubscribeCall | None]:
        """One Subscribe call as the state asks, confirmed (its empty first message read), or None when it
        ended before confirming or the subscription was cancelled; ended and closed on leaving, whatever
        happened (RST_STREAM and the socket closed: nothing of it is kept)."""
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
        with open_subscribe(self._router.pool, step.address, step.request, timeout=step.timeout) as call:
            with self._lock:
                if self._cancelled.is_set():
                    yield None
                    return
                self._call = call  # cancel() from another thread ends it, also while it connects
            try:
                subscribe = SubscribeCall(call, step.request)
                if not subscribe.confirm():
                    yield None  # ended before confirming: the state counts it as lost
                    return
                state.confirmed()
                HEALTH.answered(step.address)
                yield subscribe
            finally:
                with self._lock:
                    self._call = None
