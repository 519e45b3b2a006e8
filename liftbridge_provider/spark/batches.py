"""Arrow record batches from Liftbridge messages, budgeted by rows and by bytes.

A batch holds at most ``max_rows`` rows and at most ``max_bytes`` bytes of
keys, values and headers (names and values), unless one message alone is
larger: then it is a batch of its own. Budgeting by bytes keeps a batch of
large messages far below Arrow's 2 GiB limit per binary column and keeps the
task's memory flat; budgeting by rows keeps batches of tiny messages small.
"""

from __future__ import annotations

from typing import Any, Protocol

import pyarrow as pa


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
    return len(raw.key) + len(raw.value) + sum(len(name) + len(value) for name, value in raw.headers.items())


class BatchBuilder:
    """Collects the messages of one partition into record batches of ``schema``.

    :param max_rows: at most this many rows per batch (>= 1).
    :param max_bytes: at most this many key + value + header bytes per batch (>= 1).
    """

    def __init__(self, schema: pa.Schema, stream: str, partition: int, *, max_rows: int, max_bytes: int) -> None:
        self.schema = schema
        self.stream = stream
        self.partition = partition
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self._rows = 0
        self._bytes = 0

    def add(self, raw: RawMessage) -> pa.RecordBatch | None:
        """Add one message; returns the previous messages' batch when this one does not fit in it."""
        size = message_bytes(raw)
        full = None
        if self._rows >= self.max_rows or (self._rows and self._bytes + size > self.max_bytes):
            full = self.flush()
        columns = self._columns
        columns["key"].append(raw.key)
        columns["value"].append(raw.value)
        columns["offset"].append(raw.offset)
        columns["timestamp"].append(raw.timestamp // 1000)  # nanoseconds -> microseconds
        columns["subject"].append(raw.subject)
        columns["headers"].append(list(raw.headers.items()))
        self._rows += 1
        self._bytes += size
        return full

    def flush(self) -> pa.RecordBatch | None:
        """The batch of the messages added since the last one, or None when there are none."""
        if not self._rows:
            return None
        columns, rows = self._columns, self._rows
        columns["stream"] = [self.stream] * rows
        columns["partition"] = [self.partition] * rows
        arrays = [pa.array(columns[field.name], type=field.type) for field in self.schema]
        self._columns = {name: [] for name in self.schema.names}
        self._rows = self._bytes = 0
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)
