"""The pure parts of the stream watchers behind event-driven DAG runs (no Airflow, no I/O).

A watcher follows a stream and turns what arrives into Airflow asset events,
in one of two modes:

* ``message``: one event per message (:func:`message_payload`);
* ``batch``: one event per batch of frozen offset ranges, fired when at least
  ``max_messages`` offsets arrived or ``max_wait`` seconds passed since the
  first of them was seen (:func:`batch_due`).

The watcher's position lives in Liftbridge cursors named after its
``cursor_id`` (:class:`CursorNames`). A batch is planned in one of two slots
before it is sent and recorded after Airflow stored it, so a restart either
sends the very same batch again or continues after it (:func:`resume_point`).

Airflow reports how the watchers of a group resolved each event (stored,
failed to store, refused); :func:`decide_advance` turns those outcomes into
what the reader may store, what it dead-letters, and where it must stop.

The events of ``value_format="activity"`` decode the client's protobuf, so
they are built in :mod:`liftbridge_provider.triggers.activity`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from liftbridge_provider.core.checks import (
    check_cursor_id,
    check_partition,
    check_poll_interval,
    check_seconds,
    check_stream_name,
)
from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.ranges import RangesDocument, ranges_from_offsets


class MessageView(Protocol):
    """What a watcher's payloads and dead letters read of a message (the client's ``Message`` has it)."""

    @property
    def stream(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes: ...

    @property
    def value(self) -> bytes: ...

    @property
    def headers(self) -> Mapping[str, bytes]: ...

    @property
    def timestamp(self) -> int: ...


MODES = ("message", "batch")
START_FROM = ("earliest", "latest")
VALUE_FORMATS = ("text", "base64", "activity")


def _choice(value: object, name: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InvalidArgumentError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return str(value)


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be a whole number >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class WatchSettings:
    """What one watcher follows and how; validated on creation.

    :param stream: the stream.
    :param partitions: partitions to watch (None: all of them).
    :param liftbridge_conn_id: the ``liftbridge`` connection.
    :param cursor_id: the cursor that stores the watcher's position (default
        ``airflow-<mode>-watcher``).
    :param mode: ``message`` or ``batch``.
    :param start_from: where a watcher without a stored position starts:
        ``earliest`` (default) or ``latest`` (only messages that arrive later).
    :param max_in_flight: message mode: events per partition sent to Airflow
        and not yet stored (default 1: at most one event repeated after a crash).
    :param max_messages: batch mode: offsets that fire a batch (default 1000).
    :param max_wait: batch mode: seconds after which a non-empty batch fires, > 0 and at most 1e9 (default 60).
    :param poll_interval: batch mode: seconds between high-watermark checks, from 0.1 to 1e9 (default 2).
    :param dlq_stream: message mode: the stream that messages a watcher refuses are
        published to before the cursor passes them (None: a refused message stops the watcher).
    """

    stream: str
    partitions: tuple[int, ...] | None = None
    liftbridge_conn_id: str = "liftbridge_default"
    cursor_id: str | None = None
    mode: str = "message"
    start_from: str = "earliest"
    max_in_flight: int = 1
    max_messages: int = 1000
    max_wait: float = 60.0
    poll_interval: float = 2.0
    dlq_stream: str | None = None

    def __post_init__(self) -> None:
        check_stream_name(self.stream)
        _choice(self.mode, "mode", MODES)
        _choice(self.start_from, "start_from", START_FROM)
        if not isinstance(self.liftbridge_conn_id, str) or not self.liftbridge_conn_id:
            raise InvalidArgumentError(f"liftbridge_conn_id must be a connection id, got {self.liftbridge_conn_id!r}")
        if self.partitions is not None:
            partitions = tuple(check_partition(p, stream=self.stream) for p in self.partitions)
            if not partitions or len(set(partitions)) != len(partitions):
                raise InvalidArgumentError(f"partitions must list distinct partitions, got {list(self.partitions)}")
            object.__setattr__(self, "partitions", tuple(sorted(partitions)))
        object.__setattr__(self, "cursor_id", check_cursor_id(self.cursor_id or f"airflow-{self.mode}-watcher"))
        _positive_int(self.max_in_flight, "max_in_flight")
        _positive_int(self.max_messages, "max_messages")
        object.__setattr__(self, "max_wait", check_seconds("max_wait", self.max_wait))
        object.__setattr__(self, "poll_interval", check_poll_interval("poll_interval", self.poll_interval))
        if self.dlq_stream is not None:
            check_stream_name(self.dlq_stream)
            if self.mode != "message":
                raise InvalidArgumentError("dlq_stream works on single messages; it cannot be used with mode='batch'")
            if self.dlq_stream == self.stream:
                raise InvalidArgumentError(f"dlq_stream must be another stream than {self.stream!r}")

    @property
    def cursor(self) -> str:
        assert self.cursor_id is not None  # set in __post_init__
        return self.cursor_id

    def group_key(self) -> Hashable:
        """Watchers with equal keys share one reader (one subscription per partition) in a triggerer."""
        common = ("liftbridge", self.liftbridge_conn_id, self.stream, self.partitions, self.cursor, self.start_from)
        if self.mode == "message":
            return (*common, "message", self.max_in_flight, self.dlq_stream)
        return (*common, "batch", self.max_messages, self.max_wait, self.poll_interval)

    def position_key(self) -> tuple[str, str, str]:
        """Watchers with the same position key move the same cursors."""
        return (self.liftbridge_conn_id, self.stream, self.cursor)


@dataclass(frozen=True)
class CursorNames:
    """The cursors of one watcher, all on the watched stream.

    ``position``: per partition, the last offset Airflow has stored an event for.
    ``start``: per partition, the first offset of a watcher that started with no
    position (``start_from``), kept until ``position`` is set. Batch mode adds
    ``planned``/``recorded`` batch numbers (on the first watched partition) and, per
    partition, the start and end offset of a batch in slot 0 or 1. Without shared
    streams (Airflow < 3.3), ``handover`` and ``handed_by`` record an event a trigger
    run handed to Airflow until the next run confirms it
    (:mod:`liftbridge_provider.triggers.handover`).
    """

    cursor_id: str

    @property
    def position(self) -> str:
        return self.cursor_id

    @property
    def start(self) -> str:
        return f"{self.cursor_id}.start"

    @property
    def planned(self) -> str:
        return f"{self.cursor_id}.batch-planned"

    @property
    def recorded(self) -> str:
        return f"{self.cursor_id}.batch-recorded"

    def slot_start(self, batch: int) -> str:
        return f"{self.cursor_id}.batch-slot{batch % 2}-start"

    def slot_end(self, batch: int) -> str:
        return f"{self.cursor_id}.batch-slot{batch % 2}-end"

    @property
    def handover(self) -> str:
        """Without shared streams, message mode: per partition, the offset a trigger run handed to Airflow."""
        return f"{self.cursor_id}.handover"

    @property
    def handed_by(self) -> str:
        """Without shared streams: the triggerer process that handed the event over (message mode: per
        partition; batch mode: on the first watched partition); 0 or -1: none waits to be confirmed."""
        return f"{self.cursor_id}.handed-by"


def encode_bytes(data: bytes, value_format: str) -> tuple[str, str]:
    """``(text, "text")`` for UTF-8 data when ``value_format`` is text, else ``(base64, "base64")``."""
    if value_format == "text":
        try:
            return data.decode("utf-8"), "text"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(data).decode("ascii"), "base64"


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def message_payload(message: MessageView, value_format: str = "text") -> dict[str, Any]:
    """The JSON event for one message: stream, partition, offset, key, value, headers, timestamp (ns).

    Bytes come as text when ``value_format`` is ``text`` and they are UTF-8, else
    as base64; ``key_encoding``, ``value_encoding`` and ``headers_encoding`` say which.
    """
    key, key_encoding = encode_bytes(message.key, value_format)
    value, value_encoding = encode_bytes(message.value, value_format)
    headers = dict(message.headers)
    headers_format = value_format if all(_is_utf8(data) for data in headers.values()) else "base64"
    return {
        "stream": message.stream,
        "partition": message.partition,
        "offset": message.offset,
        "key": key,
        "key_encoding": key_encoding,
        "value": value,
        "value_encoding": value_encoding,
        "headers": {name: encode_bytes(data, headers_format)[0] for name, data in headers.items()},
        "headers_encoding": headers_format,
        "timestamp": message.timestamp,
    }


def batch_due(pending: int, first_seen: float | None, now: float, max_messages: int, max_wait: float) -> bool:
    """Whether a batch of ``pending`` offsets, the first seen at ``first_seen`` (monotonic s), should fire now."""
    if pending <= 0:
        return False
    return pending >= max_messages or (first_seen is not None and now - first_seen >= max_wait)


def batch_document(
    stream: str, starts: Mapping[int, int], ends: Mapping[int, int], *, batch: int, cursor_id: str
) -> RangesDocument:
    """The event payload of batch number ``batch``: one ``[start, end)`` range per partition."""
    document = ranges_from_offsets(stream, starts, ends)
    metadata = {"mode": "batch", "batch": batch, "offsets": document.total, "watcher_cursor": cursor_id}
    return dataclasses.replace(document, metadata=metadata)


@dataclass(frozen=True)
class ResumePoint:
    """Where a batch watcher goes on after a restart.

    ``resend``: the batch that was planned and maybe stored but not recorded (send it
    again, identical); ``next_starts``: the first offset of the next batch per
    partition (None: nothing stored yet); ``next_batch``: the next batch number.
    """

    resend: RangesDocument | None
    next_starts: dict[int, int] | None
    next_batch: int


def resume_point(
    stream: str,
    cursor_id: str,
    *,
    planned: int,
    recorded: int,
    slots: Mapping[int, tuple[Mapping[int, int], Mapping[int, int]]],
) -> ResumePoint:
    """Work out the resume point from the stored cursors (-1 where a cursor was never set).

    ``slots[0|1]`` holds ``(starts, ends)`` per partition as stored in that slot.
    A batch is planned (slot written, then ``planned`` set) before it is sent and
    recorded (``recorded`` set) after Airflow stored its event, so the slot of
    ``planned`` is complete whenever ``planned > recorded``.
    """
    if planned > recorded:
        starts, ends = slots[planned % 2]
        document = batch_document(stream, starts, ends, batch=planned, cursor_id=cursor_id)
        return ResumePoint(document, dict(ends), planned + 1)
    if recorded >= 0:
        _, ends = slots[recorded % 2]
        return ResumePoint(None, {p: end for p, end in ends.items() if end >= 0}, recorded + 1)
    return ResumePoint(None, None, 0)


@dataclass(frozen=True)
class Outcome:
    """How the watchers of a group resolved the event for one offset (Airflow's ``AdvanceOutcome``)."""

    offset: int
    acked: int
    failed: int
    rejected: int = 0


@dataclass(frozen=True)
class AdvanceDecision:
    """What a reader does with a lane's resolved events.

    ``dead_letter``: offsets to publish to the dead-letter stream, then store as passed;
    ``last``: the offset to store (None: nothing new); ``stop``: why the reader must stop
    at the offset after ``last`` (None: every event may be passed).
    """

    last: int | None
    dead_letter: tuple[int, ...]
    stop: str | None


def decide_advance(outcomes: list[Outcome], *, can_dead_letter: bool) -> AdvanceDecision:
    """Pass events in order while each was stored by every watcher or refused and dead-lettered.

    Stops at the first event that a watcher failed to store (Airflow redelivers it), that
    was refused with no dead-letter stream, or that no watcher was subscribed for.
    """
    last: int | None = None
    dead_letter: list[int] = []
    for outcome in outcomes:
        stop = _stop_reason(outcome, can_dead_letter)
        if stop is not None:
            return AdvanceDecision(last, tuple(dead_letter), f"offset {outcome.offset}: {stop}")
        if outcome.rejected:
            dead_letter.append(outcome.offset)
        last = outcome.offset
    return AdvanceDecision(last, tuple(dead_letter), None)


def _stop_reason(outcome: Outcome, can_dead_letter: bool) -> str | None:
    if outcome.failed:
        return "Airflow did not store its event (ack timeout or a watcher that fell behind)"
    if outcome.rejected and not can_dead_letter:
        return "a watcher refused it and there is no dlq_stream"
    if not outcome.acked and not outcome.rejected:
        return "no watcher was subscribed when it was read"
    return None


DEAD_LETTER_ERROR_BYTES = 4096  # the error text kept in a dead letter's header, at most
_SERVER_HEADERS = ("subject", "reply")  # set by the server on every message; it sets them again


def dead_letter_headers(message: MessageView, *, cursor_id: str, error: str) -> dict[str, bytes]:
    """A refused message's own headers plus ``lb-dlq-*`` headers naming where it came from and why."""
    headers = {name: data for name, data in message.headers.items() if name not in _SERVER_HEADERS}
    headers.update(
        {
            "lb-dlq-stream": message.stream.encode(),
            "lb-dlq-partition": str(message.partition).encode(),
            "lb-dlq-offset": str(message.offset).encode(),
            "lb-dlq-timestamp": str(message.timestamp).encode(),
            "lb-dlq-cursor-id": cursor_id.encode(),
            "lb-dlq-error": utf8_prefix(error, DEAD_LETTER_ERROR_BYTES),
        }
    )
    return headers


def utf8_prefix(text: str, limit: int) -> bytes:
    """The longest prefix of ``text`` whose UTF-8 encoding fits in ``limit`` bytes, encoded: whole characters
    only, so the bytes still decode (a header cut inside a character would make the whole message's headers
    undecodable as text)."""
    data = text.encode()
    if len(data) <= limit:
        return data
    return data[:limit].decode("utf-8", errors="ignore").encode()


def check_payload(payload: object, function: str) -> dict[str, Any] | None:
    """``payload`` if it is None or a dict of JSON values (what an asset event can hold); else a clear error."""
    if payload is None:
        return None
    if not isinstance(payload, dict):
        raise InvalidArgumentError(
            f"apply_function {function} must return a dict of JSON values or None, got {type(payload).__name__}"
        )
    try:
        json.dumps(payload)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"apply_function {function} returned a dict that is not JSON: {exc}") from exc
    return payload
