"""Batch publishing straight to the streams' NATS subjects: the fast path of ``publish_batch``.

A Liftbridge partition listens on a NATS subject (the stream's subject for
partition 0, ``<subject>.<n>`` for partition n). A message wrapped in the
Liftbridge envelope, carrying an ack inbox and a correlation id, is acked by
the partition's leader on that inbox, exactly as the server's own PublishAsync
does it. This module keeps a window of such messages in flight on one
nats-py connection and matches the acks by correlation id; the
:class:`~liftbridge_provider.client.publish.publish_window.PublishWindow` decides the
rest, as for every publisher.

Guarantees, as for the gRPC path:

- every message is checked before the first is sent; a message over the NATS
  server's ``max_payload`` (announced on connect) is refused before anything is
  sent, naming its size and the limit;
- nothing is re-sent behind the caller's back: when the connection breaks, the
  messages awaiting an ack fail with ``may_be_stored=True`` and the messages
  not yet sent go on over a new connection;
- an ack that does not come within ``ack_wait`` fails its message
  (AckTimeoutError, ``may_be_stored``), and the batch ends by its deadline.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.aio_timeout import within
from liftbridge_provider.client.errors import (
    EncryptionError,
    EnvelopeError,
    IncorrectOffsetError,
    MessageTooLargeError,
    PermissionDeniedError,
    UnavailableError,
)
from liftbridge_provider.client.messages import Ack
from liftbridge_provider.client.options import NatsConfig
from liftbridge_provider.client.publish.batch_result import BatchResult
from liftbridge_provider.client.publish.envelope import decode_ack, wrap_publish
from liftbridge_provider.client.publish.nats_direct import deliver_directly
from liftbridge_provider.client.publish.private_loop import run_in_private_loop
from liftbridge_provider.client.publish.publish_window import BatchErrors, PublishWindow
from liftbridge_provider.client.retry import Deadline, backoff_delay
from liftbridge_provider.core.errors import LiftbridgeError

log = logging.getLogger(__name__)
MAX_CONNECT_ATTEMPTS = 10  # broken connections in a row, with no ack in between, before giving up
FLUSH_TIMEOUT = 5.0  # seconds for the server to confirm the ack subscription before the first publish
SEND_CHUNK = 256  # messages sent in a row before acks, the deadline and the connection are looked at again
CLOSE_TIMEOUT = 2.0  # seconds to close a connection at the end
CLOSE_GRACE = 0.25  # seconds a close may take past the batch deadline (unsent buffers are dropped)
_ENVELOPE_SLACK = 16  # bytes: envelope header and the inbox field's tag and length, over the request's own size

_ACK_ERRORS: dict[int, tuple[type[LiftbridgeError], str]] = {
    api.Ack.INCORRECT_OFFSET: (IncorrectOffsetError, "incorrect expected offset"),
    api.Ack.TOO_LARGE: (MessageTooLargeError, "message exceeds max replication size"),
    api.Ack.ENCRYPTION: (EncryptionError, "encryption failed on partition"),
}


def partition_subject(stream_subject: str, partition: int) -> str:
    """The NATS subject partition ``partition`` of a stream on ``stream_subject`` listens on."""
    return stream_subject if partition == 0 else f"{stream_subject}.{partition}"


def ack_error(ack: api.Ack, stream: str, partition: int) -> LiftbridgeError | None:
    """The typed error an ack carries (the message was not stored), or None for a plain ack."""
    if ack.ackError == api.Ack.OK:
        return None
    kind, text = _ACK_ERRORS.get(ack.ackError, (LiftbridgeError, f"ack error {ack.ackError}"))
    return kind(text, stream=stream, partition=partition)


def publish_envelope(request: api.PublishRequest, inbox: str) -> bytes:
    """The NATS payload of one validated publish request: the envelope the server's PublishAsync would send.

    The fields the messages of a batch share (the inbox, the ack policy and, unless each message has its own,
    the expected offset) are serialized once and appended to each message's own (a protobuf parser merges
    concatenated messages), so each message serializes only its own fields.
    """
    message = api.Message(key=request.key, value=request.value, correlationId=request.correlationId)
    if request.headers:  # (copying an empty map still costs a Python-level update)
        message.headers.update(request.headers)
    shared = _shared_fields(inbox, request.ackPolicy, request.expectedOffset)
    return _PUBLISH_HEADER + message.SerializeToString() + shared


_PUBLISH_HEADER = wrap_publish(api.Message())  # the envelope header alone: an empty message serializes to b""


@functools.lru_cache(maxsize=256)
def _shared_fields(inbox: str, ack_policy: api.AckPolicy, expected_offset: int) -> bytes:
    return api.Message(ackInbox=inbox, ackPolicy=ack_policy, offset=expected_offset).SerializeToString()


def probe_nats(config: NatsConfig) -> int:
    """Connect to NATS and close again; the server's ``max_payload`` (bytes). Raises a typed error naming why not."""

    async def probe() -> int:
        try:
            client = await within(config.connect_timeout * len(config.servers), _connect(config))
        except nats.errors.Error as exc:
            kind = PermissionDeniedError if _refused(exc) else UnavailableError
            raise kind(f"cannot connect to NATS {list(config.servers)}: {exc!r}") from exc
        except (OSError, TimeoutError) as exc:
            raise UnavailableError(f"cannot connect to NATS {list(config.servers)}: {exc!r}") from exc
        try:
            return client.max_payload
        finally:
            await within(CLOSE_TIMEOUT, client.close())

    return run_in_private_loop(probe(), name="liftbridge-nats-probe")


def _refused(exc: Exception) -> bool:
    """NATS refused the credentials (trying again cannot help)."""
    return "authorization" in str(exc).lower()


_DENIAL = re.compile(r'permissions violation for (publish|subscription) to "(.*)"')


def _denial(exc: Exception) -> tuple[str, str] | None:
    """``("publish" | "subscription", subject)`` when NATS denied this user that subject (the connection stays
    up, the message or subscription is dropped); nats-py hands the server's error over lower-cased."""
    found = _DENIAL.search(str(exc).lower())
    return (found.group(1), found.group(2)) if found else None


async def _connect(config: NatsConfig, **callbacks: Any) -> NatsClient:
    """One connection that never reconnects by itself: a lost connection is the publisher's to report.

    ``pending_size=0``: nats-py never flushes its outgoing buffer from inside ``publish`` and waits for it
    there. With a limit (2 MiB by default) a publish past it waits for that flush with no timeout, so a peer
    that stopped reading blocked the batch past its deadline for good. Without it, publishing only appends to
    the buffer that nats-py's own flusher task writes out; what the buffer can hold is bounded by the batch's
    window of messages awaiting an ack, and the batch ends by its deadline whatever the socket does.
    """
    return await nats.connect(
        servers=list(config.servers),
        user=config.user,
        password=config.password,
        token=config.token,
        user_credentials=config.credentials,
        tls=config.ssl_context(),
        connect_timeout=config.connect_timeout,
        allow_reconnect=False,
        max_reconnect_attempts=1,
        skip_subject_validation=True,  # subjects come from the streams' metadata, which the server checked
        name="liftbridge-provider",
        pending_size=0,
        **callbacks,
    )


class _ConnectionBroken(Exception):
    """The NATS connection failed or was lost; ``final`` when trying again cannot help."""

    def __init__(self, reason: str, *, final: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.final = final


class _DeadlineReached(Exception):
    """A connect or flush, bounded by the batch deadline, was cut short by it."""


class NatsBatchPublisher:
    """Sends one batch over NATS; not reusable.

    :param config: the NATS servers and credentials.
    :param requests: validated publish requests, correlation id = index.
    :param subjects: NATS subject of each partition the requests go to.
    :param refused: errors of messages refused before sending (e.g. readonly partitions).
    """

    def __init__(
        self,
        config: NatsConfig,
        requests: Sequence[api.PublishRequest],
        subjects: Mapping[int, str],
        *,
        window: int,
        ack_wait: float,
        deadline: Deadline | None,
        refused: Mapping[int, LiftbridgeError] | None = None,
    ) -> None:
        self._config = config
        self._requests = requests
        self._subjects = subjects
        self._deadline = deadline
        self._expects_ack = requests[0].ackPolicy != api.NONE
        self._window = PublishWindow(len(requests), window=window, ack_wait=ack_wait, expects_ack=self._expects_ack)
        for index, error in (refused or {}).items():
            self._window.refuse(index, error)
        self._ack_wait = ack_wait
        self._stream = requests[0].stream
        self._errors = BatchErrors(self._stream, lambda index: requests[index].partition)
        self._wakeup: asyncio.Event | None = None
        self._lost: str | None = None  # why the current connection ended
        self._lost_for_good = False  # and trying again cannot help (NATS denied the ack inbox)
        self._inbox = ""  # the current connection's ack inbox, lower-cased as NATS errors arrive
        self._denied: set[int] = set()  # partitions whose subject NATS denied this user publishing to
        self._denied_failed: set[int] = set()  # of those, the ones whose messages awaiting an ack were failed
        self._closed = asyncio.Event()  # set when nats-py has closed the current connection
        self._sizes_checked = False

    def run(self, closed: Callable[[], bool] = lambda: False) -> BatchResult:
        """Publish the batch (blocking) and return the result; ClientClosedError once ``closed()`` (the client's)."""
        # Plain asyncio: with uvloop, nats-py's close after a lost connection fails on the closed transport and
        # skips its cleanup; uvloop saves little CPU on this path, not worth that.
        return run_in_private_loop(self._run(), name="liftbridge-publish-nats", use_uvloop=False, closed=closed)

    async def _run(self) -> BatchResult:
        self._wakeup = asyncio.Event()
        attempt = 0
        broken: _ConnectionBroken | None = None  # the last failure, while connections fail in a row
        while not self._window.done:
            acked_before = self._window.acked
            try:
                await self._publish_over_one_connection()
            except _DeadlineReached:
                # Cut short by the deadline: the deadline's doing, unless connecting had failed before it.
                if broken is None:
                    self._end_at_deadline()
                else:
                    self._window.fail_unsent(self._not_sent_error(broken))
                break
            except _ConnectionBroken as failure:
                broken = failure
                lost = self._window.lose_in_flight(self._lost_error_for(broken))
                attempt = 0 if self._window.acked > acked_before else attempt + 1
                log.warning("NATS connection broke (%s); %d awaiting an ack failed", broken.reason, lost)
                if broken.final or attempt >= MAX_CONNECT_ATTEMPTS or self._deadline_passed():
                    self._window.fail_unsent(self._not_sent_error(broken))
                    break
                broken = broken if attempt else None
                await asyncio.sleep(self._bounded(backoff_delay(attempt)))
        return self._window.result()

    async def _publish_over_one_connection(self) -> None:
        client = await self._connect()
        try:
            if not self._sizes_checked:
                self._check_sizes(client.max_payload)
            inbox = client.new_inbox()
            self._inbox = inbox.lower()
            if self._expects_ack:
                subscription = await client.subscribe(inbox, cb=self._on_ack)
                deliver_directly(client, subscription, self._on_ack_data)  # else the callback gets them
                await self._confirm(client)  # the SUB reached the server before any message it acks
            await self._send_all(client, inbox)
            if not self._expects_ack:
                await self._confirm(client)
        finally:
            await self._close(client)

    async def _send_all(self, client: NatsClient, inbox: str) -> None:
        """Send while the window has room; between sends, wait for acks, expiries, the deadline or a loss."""
        assert self._wakeup is not None
        window = self._window
        while not window.done:
            now = time.monotonic()
            window.expire(now, self._errors.ack_timeout(self._ack_wait))
            if self._deadline_passed():
                self._end_at_deadline()
                return
            if self._lost is not None:
                raise _ConnectionBroken(self._lost, final=self._lost_for_good)
            if self._denied:
                self._fail_denied()
            sent = 0
            while sent < SEND_CHUNK and (index := window.take(now)) is not None:
                partition = self._requests[index].partition
                if partition in self._denied:  # NATS would drop it: not sent
                    window.on_error(index, self._denied_error(partition))
                    continue
                await self._publish(client, index, inbox)
                sent += 1
            if sent == SEND_CHUNK:
                await asyncio.sleep(0)  # let acks in, then check the clock again
            elif not window.done:
                await self._sleep(self._next_wake(now))  # the window is full, or every message is sent

    async def _publish(self, client: NatsClient, index: int, inbox: str) -> None:
        request = self._requests[index]
        try:
            await client.publish(self._subjects[request.partition], publish_envelope(request, inbox))
        except (nats.errors.Error, OSError) as exc:
            raise _ConnectionBroken(f"publish failed: {exc!r}") from exc
        except RuntimeError as exc:  # uvloop: a write to the transport the lost connection just closed
            if client.is_connected:
                raise
            raise _ConnectionBroken(f"publish failed: {exc!r}") from exc

    async def _on_ack(self, msg: Msg) -> None:
        self._on_ack_data(msg.data)

    def _on_ack_data(self, data: bytes) -> None:
        try:
            ack = decode_ack(data)
        except EnvelopeError as exc:
            log.warning("ignoring a malformed ack on the batch's inbox: %s", exc)
            return
        index = int(ack.correlationId) if ack.correlationId.isdigit() else -1
        if not 0 <= index < len(self._requests):
            log.warning("ignoring an ack with unknown correlation id %r", ack.correlationId)
            return
        partition = self._requests[index].partition
        error = ack_error(ack, self._stream, partition)
        if error is None:
            counted = self._window.on_ack(index, Ack(ack, partition))
        else:
            counted = self._window.on_error(index, error)
        if counted and self._wakeup is not None:
            self._wakeup.set()

    # -- connections -------------------------------------------------------------------

    async def _connect(self) -> NatsClient:
        self._lost = None
        self._closed = asyncio.Event()
        config = self._config
        try:
            return await within(
                self._bounded(config.connect_timeout * len(config.servers)),
                _connect(
                    config,
                    error_cb=self._on_nats_error,
                    disconnected_cb=self._on_disconnect,
                    closed_cb=self._on_closed,
                ),
            )
        except nats.errors.Error as exc:
            final = _refused(exc)
            raise _ConnectionBroken(f"could not connect to NATS {list(config.servers)}: {exc!r}", final=final) from exc
        except TimeoutError as exc:
            if self._deadline_passed():
                raise _DeadlineReached from exc
            raise _ConnectionBroken(f"could not connect to NATS {list(config.servers)}: {exc!r}") from exc
        except OSError as exc:
            raise _ConnectionBroken(f"could not connect to NATS {list(config.servers)}: {exc!r}") from exc

    async def _confirm(self, client: NatsClient) -> None:
        """A round trip to the NATS server: what was written before has reached it. It waits
        :data:`FLUSH_TIMEOUT` seconds, or exactly what is left of the batch deadline when that is less (then an
        unanswered round trip is the deadline's doing, not a broken connection)."""
        seconds = self._bounded(FLUSH_TIMEOUT)
        cut_by_deadline = seconds < FLUSH_TIMEOUT
        try:
            # nats-py annotates the timeout as int but hands it to asyncio.wait_for: fractions of a second hold.
            await client.flush(timeout=seconds)  # type: ignore[arg-type]
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            timed_out = isinstance(exc, (TimeoutError, nats.errors.TimeoutError))
            if timed_out and (cut_by_deadline or self._deadline_passed()):
                raise _DeadlineReached from exc
            raise _ConnectionBroken(f"NATS flush failed: {exc!r}") from exc
        except RuntimeError as exc:  # uvloop, as in _publish
            if client.is_connected:
                raise
            raise _ConnectionBroken(f"NATS flush failed: {exc!r}") from exc

    async def _on_nats_error(self, exc: Exception) -> None:
        if isinstance(exc, nats.errors.Error) and _refused(exc):
            self._lost = f"NATS refused this client: {exc}"
        denial = _denial(exc)
        if denial is not None:
            self._on_denial(*denial)
        log.debug("NATS error: %r", exc)

    def _on_denial(self, kind: str, subject: str) -> None:
        """NATS denied this user ``subject``: publishing to it (those partitions' messages were dropped, and so
        will be every later one), or subscribing to it (the ack inbox: no ack can come, the batch ends)."""
        if kind == "publish":
            denied = {p for p, s in self._subjects.items() if s.lower() == subject}
            if denied - self._denied:
                log.warning("NATS denies this client publishing to %r: partitions %s fail", subject, sorted(denied))
            self._denied |= denied
        elif subject == self._inbox:
            self._lost = f"NATS denied this client the subscription to its ack inbox ({subject})"
            self._lost_for_good = True
        if self._wakeup is not None:
            self._wakeup.set()

    def _denied_error(self, partition: int) -> PermissionDeniedError:
        return PermissionDeniedError(
            f"NATS denies this client publishing to {self._subjects[partition]!r}; the message was not stored",
            stream=self._stream,
            partition=partition,
        )

    def _fail_denied(self) -> None:
        """Fail the messages of newly denied partitions that await an ack: NATS dropped them."""
        for partition in self._denied - self._denied_failed:
            self._denied_failed.add(partition)
            for index, request in enumerate(self._requests):
                if request.partition == partition and self._window.is_waiting(index):
                    self._window.on_error(index, self._denied_error(partition))

    async def _on_disconnect(self) -> None:
        if self._lost is None:
            self._lost = "the NATS connection was lost"
        if self._wakeup is not None:
            self._wakeup.set()

    async def _on_closed(self) -> None:
        await self._on_disconnect()
        self._closed.set()

    async def _close(self, client: NatsClient) -> None:
        """Close the connection and wait until nats-py has stopped its tasks (also when it closed by itself),
        within the batch deadline plus :data:`CLOSE_GRACE` at most; past it the close is left unfinished."""
        ends = time.monotonic() + max(self._bounded(CLOSE_TIMEOUT), CLOSE_GRACE)
        try:
            if not client.is_closed:
                await within(max(ends - time.monotonic(), 0.001), client.close())
            await within(max(ends - time.monotonic(), 0.001), self._closed.wait())
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            log.debug("closing the NATS connection: %r", exc)

    # -- checks and errors ---------------------------------------------------------------

    def _check_sizes(self, max_payload: int) -> None:
        """Refuse, before anything is sent, each message over the NATS server's ``max_payload``.

        The others go on, as on the gRPC path (where the server refuses such a message alone).
        """
        for index, request in enumerate(self._requests):
            if request.ByteSize() + _ENVELOPE_SLACK + 64 <= max_payload:  # an inbox is under 64 bytes
                continue
            size = len(publish_envelope(request, "_INBOX." + "x" * 40))
            if size > max_payload:
                too_large = MessageTooLargeError(
                    f"message #{index} is {size} bytes as a NATS message, over the NATS server's max_payload "
                    f"({max_payload} bytes); it was not sent",
                    stream=request.stream,
                    partition=request.partition,
                )
                too_large.size = size
                self._window.refuse(index, too_large)
        self._sizes_checked = True

    def _lost_error_for(self, broken: _ConnectionBroken) -> Callable[[int], LiftbridgeError]:
        """The error of each message awaiting an ack when the connection ended (``broken``): may be stored."""
        if not self._lost_for_good:
            return self._errors.lost(broken.reason)
        return lambda index: PermissionDeniedError(
            f"{broken.reason}: the message was published but its ack cannot come; it may have been stored",
            stream=self._stream,
            partition=self._requests[index].partition,
            may_be_stored=True,
        )

    def _not_sent_error(self, broken: _ConnectionBroken) -> LiftbridgeError:
        kind = PermissionDeniedError if broken.final else UnavailableError
        return kind(f"not sent: {broken.reason}", stream=self._stream)

    # -- time ----------------------------------------------------------------------------

    def _end_at_deadline(self) -> None:
        """The batch deadline passed: what awaits an ack may be stored, the rest was not sent."""
        self._window.end_at_deadline(self._errors, self._deadline.timeout if self._deadline is not None else 0.0)

    def _deadline_passed(self) -> bool:
        return self._deadline is not None and self._deadline.expired

    def _bounded(self, seconds: float) -> float:
        """``seconds``, or less when the batch deadline comes first."""
        if self._deadline is None:
            return seconds
        return max(min(seconds, self._deadline.remaining()), 0.001)

    def _next_wake(self, now: float) -> float:
        expiry = self._window.next_expiry(now)
        return self._bounded(self._ack_wait if expiry is None else expiry)

    async def _sleep(self, seconds: float) -> None:
        """Until an ack or a loss sets the wake-up event, or ``seconds`` pass."""
        assert self._wakeup is not None
        self._wakeup.clear()
        timer = asyncio.get_running_loop().call_later(seconds, self._wakeup.set)
        try:
            await self._wakeup.wait()
        finally:
            timer.cancel()
