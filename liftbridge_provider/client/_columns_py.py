"""The pure-Python :class:`ColumnBuilder`: the fallback of the compiled ``_wire_columns`` module.

Same interface and same output bytes as the C builder (``_wire_columns.c``);
``columns.py`` picks one at import time. Each serialized message is parsed by
protobuf (``Message.FromString``) and its fields kept in flat lists until
:meth:`ColumnBuilder.finish` packs them into the buffers Arrow reads.
"""

from __future__ import annotations

import operator
from array import array
from itertools import accumulate

from google.protobuf.message import DecodeError

from liftbridge_provider._proto import liftbridge_api_pb2 as api

TAKEN, SKIPPED, LAST, END, FULL = 0, 1, 2, 3, 4
Buffers = tuple[int, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes]
"""The row count, then the thirteen buffers of ``columns.Columns``, in its order."""
_INT32_MAX = 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _packed_offsets(lengths: list[int]) -> bytes:
    """Arrow's int32 offsets of a binary or string column: 0, then the running total of lengths."""
    return array("i", [0, *accumulate(lengths)]).tobytes()


def _micros(nanoseconds: int) -> int:
    """Nanoseconds to microseconds, truncated toward zero (as Arrow's integer divide and the C builder)."""
    return nanoseconds // 1000 if nanoseconds >= 0 else -(-nanoseconds // 1000)


class ColumnBuilder:
    """Arrow column buffers from serialized Liftbridge messages, budgeted by rows and bytes.

    :param max_rows: at most this many rows per batch (>= 1).
    :param max_bytes: at most this many key + value + header bytes per batch (>= 1), unless one
        message alone is larger: it then fills a batch of its own.
    """

    def __init__(self, *, max_rows: int, max_bytes: int) -> None:
        max_rows, max_bytes = operator.index(max_rows), operator.index(max_bytes)  # TypeError as the C builder
        if max_rows < 1 or max_bytes < 1:
            raise ValueError("max_rows and max_bytes must be >= 1")
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._low = _INT64_MIN
        self._high = _INT64_MAX
        self._size = 0
        self._last: int | None = None
        self._offsets: list[int] = []
        self._micros: list[int] = []
        self._keys: list[bytes] = []
        self._values: list[bytes] = []
        self._subjects: list[bytes] = []
        self._names: list[bytes] = []
        self._header_values: list[bytes] = []
        self._entries: list[int] = [0]
        self._data = 0  # bytes of keys, values, subjects, header names and values: Arrow's int32 offsets bound it

    @property
    def rows(self) -> int:
        """Rows taken since the last :meth:`finish`."""
        return len(self._offsets)

    @property
    def last_offset(self) -> int | None:
        """Offset of the last message taken (None before one)."""
        return self._last

    def window(self, low: int, high: int) -> None:
        """Take only messages with ``low <= offset <= high`` (any ints: beyond int64 no offset reaches them)."""
        self._low, self._high = operator.index(low), operator.index(high)

    def add(self, data: bytes) -> int:
        """Decode one serialized ``Message``; returns TAKEN, SKIPPED (below the window), LAST (taken: it is
        the window's high end), END (above the window, not taken) or FULL (not taken: finish the batch and
        add it again). Raises ValueError for bytes that are not a Message."""
        if not isinstance(data, bytes):
            raise TypeError("a serialized message must be bytes")
        return self._add(data)

    def take(self, buffer: bytes | bytearray, spans: list[int], index: int) -> tuple[int, int]:
        """Add the messages ``buffer[spans[i]:spans[i + 1]]`` for ``i = index, index + 2, ...`` (the spans the
        data plane cuts from what it read) in turn; at the first LAST, END or FULL, that status and its ``i``;
        (TAKEN, ``len(spans)``) once every one was taken or skipped. Errors as :meth:`add`."""
        if not isinstance(buffer, bytes | bytearray) or not isinstance(spans, list):
            raise TypeError("take needs a bytes or bytearray buffer and a list of spans")
        count = len(spans)
        if index < 0 or index > count or (count - index) % 2:
            raise ValueError("spans must be (start, end) pairs from index on")
        add = self._add
        for i in range(index, count, 2):
            start, end = spans[i], spans[i + 1]
            if start < 0 or end < start or end > len(buffer):
                raise ValueError("a span outside its buffer")
            status = add(bytes(buffer[start:end]))
            if status >= LAST:
                return status, i
        return TAKEN, count

    def _add(self, data: bytes) -> int:
        try:
            message = api.Message.FromString(data)
        except DecodeError as exc:
            raise ValueError(f"malformed Liftbridge message: {exc}") from exc
        offset = message.offset
        if offset < self._low:
            return SKIPPED
        if offset > self._high:
            return END
        headers = message.headers
        key, value, subject = message.key, message.value, message.subject.encode()
        if headers:
            names = [name.encode() for name in sorted(headers)]
            values = [headers[name] for name in sorted(headers)]
            header_bytes = sum(map(len, names)) + sum(map(len, values))
        else:
            names, values, header_bytes = [], [], 0
        added = len(key) + len(value) + header_bytes
        entries = self._entries[-1] + len(names)
        fits = self._data + added + len(subject) <= _INT32_MAX and entries <= _INT32_MAX
        if self._offsets and (len(self._offsets) >= self._max_rows or self._size + added > self._max_bytes or not fits):
            return FULL
        if not fits:
            raise OverflowError("a message larger than an Arrow binary column holds (2 GiB)")
        self._offsets.append(offset)
        self._micros.append(_micros(message.timestamp))
        self._keys.append(key)
        self._values.append(value)
        self._subjects.append(subject)
        if names:
            self._names.extend(names)
            self._header_values.extend(values)
        self._entries.append(entries)
        self._data += added + len(subject)
        self._size += added
        self._last = offset
        self._low = offset + 1
        return LAST if offset == self._high else TAKEN

    def finish(self) -> Buffers:
        """The columns' buffers (see ``columns.Columns``); the builder starts empty again."""
        out = (
            len(self._offsets),
            array("q", self._offsets).tobytes(),
            array("q", self._micros).tobytes(),
            _packed_offsets(list(map(len, self._keys))),
            b"".join(self._keys),
            _packed_offsets(list(map(len, self._values))),
            b"".join(self._values),
            _packed_offsets(list(map(len, self._subjects))),
            b"".join(self._subjects),
            array("i", self._entries).tobytes(),
            _packed_offsets(list(map(len, self._names))),
            b"".join(self._names),
            _packed_offsets(list(map(len, self._header_values))),
            b"".join(self._header_values),
        )
        for column in (self._offsets, self._micros, self._keys, self._values, self._subjects, self._names):
            column.clear()
        self._header_values.clear()
        self._entries[:] = [0]
        self._data = 0
        self._size = 0
        return out
