"""Arrow record batches from Liftbridge messages, budgeted by rows and by bytes.

A batch holds at most ``max_rows`` rows and at most ``max_bytes`` bytes of
keys, values and headers (names and values), unless one message alone is
larger: then it is a batch of its own. Budgeting by bytes keeps a batch of
large messages far below Arrow's 2 GiB limit per binary column and keeps the
task's memory flat; budgeting by rows keeps batches of tiny messages small.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc


class RawMessage(Protocol):
    """The fields of a received message that a row needs (``liftbridge_api_pb2.Message`` has them)."""

    @property
    def key(self) -> bytes: ...
    @property
    def value(self) -> bytes: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def subject(self) -> str: ...
    @property
    def headers(self) -> Any: ...  # a mapping of str -> bytes


def message_bytes(raw: RawMessage) -> int:
    """Bytes a message adds to a batch: key + value + header names and values."""
    return _fields(raw)[4]


def _fields(raw: RawMessage) -> tuple[bytes, bytes, list[str], list[bytes], int]:
    """Key, value, header names, header values and their bytes in all: each read once (a read copies it)."""
    headers = raw.headers
    key, value = raw.key, raw.value
    names = list(headers)
    values = list(map(headers.__getitem__, names))
    return key, value, names, values, len(key) + len(value) + sum(map(len, names)) + sum(map(len, values))


class BatchBuilder:
    """Collects the messages of one partition into record batches of ``schema``.

    Each message is read once (its key, value and headers are copied out of
    the protobuf on every access) into flat lists; a full batch is then built
    column by column, Arrow arrays from those lists and the header maps from
    flat name and value lists with offsets, rather than row by row.

    :param max_rows: at most this many rows per batch (>= 1).
    :param max_bytes: at most this many key + value + header bytes per batch (>= 1).
    """

    def __init__(self, schema: pa.Schema, stream: str, partition: int, *, max_rows: int, max_bytes: int) -> None:
        self.schema = schema
        self.stream = stream
        self.partition = partition
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._reset()

    def _reset(self) -> None:
        self._messages: list[RawMessage] = []  # offset, timestamp and subject are read at flush
        self._keys: list[bytes] = []
        self._values: list[bytes] = []
        self._header_names: list[str] = []
        self._header_values: list[bytes] = []
        self._header_counts: list[int] = []
        self._bytes = 0

    def add(self, raw: RawMessage) -> pa.RecordBatch | None:
        """Add one message; returns the previous messages' batch when this one does not fit in it."""
        key, value, names, values, size = _fields(raw)
        full = None
        rows = len(self._messages)
        if rows >= self.max_rows or (rows and self._bytes + size > self.max_bytes):
            full = self.flush()
        self._messages.append(raw)
        self._keys.append(key)
        self._values.append(value)
        self._header_names.extend(names)
        self._header_values.extend(values)
        self._header_counts.append(len(names))
        self._bytes += size
        return full

    def flush(self) -> pa.RecordBatch | None:
        """The batch of the messages added since the last one, or None when there are none."""
        messages = self._messages
        if not messages:
            return None
        rows = len(messages)
        header_offsets = pa.array([0, *accumulate(self._header_counts)], pa.int32())
        columns = {
            "key": pa.array(self._keys, pa.binary()),
            "value": pa.array(self._values, pa.binary()),
            "stream": pa.array([self.stream] * rows, pa.string()),
            "partition": pa.array([self.partition] * rows, pa.int32()),
            "offset": pa.array([m.offset for m in messages], pa.int64()),
            # nanoseconds -> microseconds, then the schema's timestamp type
            "timestamp": pc.divide(pa.array([m.timestamp for m in messages], pa.int64()), 1000),
            "subject": pa.array([m.subject for m in messages], pa.string()),
            "headers": pa.MapArray.from_arrays(
                header_offsets, pa.array(self._header_names, pa.string()), pa.array(self._header_values, pa.binary())
            ),
        }
        self._reset()
        arrays = [columns[field.name].cast(field.type) for field in self.schema]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)
