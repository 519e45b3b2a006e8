"""Liftbridge messages as column buffers, decoded from the Subscribe stream's serialized responses.

A :class:`ColumnBuilder` takes one serialized ``Message`` at a time (``add``),
keeps the ones inside its offset window and its budgets, and hands the rows
out as :class:`Columns`: plain buffers laid out as Arrow lays out its arrays
(little-endian int64 values, int32 offsets followed by the bytes), so the
Spark source wraps them as Arrow arrays without touching a row. No Python
object is made per message or field.

Two builders give the same bytes: the compiled one (``_wire_columns.c``, built
by the package's own build) and the pure-Python one (``_columns_py.py``,
protobuf's parser and flat lists). The compiled one is used when it imports;
``LIFTBRIDGE_PURE_PYTHON=1`` in the environment picks the pure-Python one
(read once, at import). :data:`NATIVE` says which one this process uses.

What ``add`` returns (module constants):

- ``TAKEN``: the message is a row now.
- ``SKIPPED``: its offset is below the window (already delivered, or before the start).
- ``LAST``: taken, and its offset is the window's high end (the stop offset).
- ``END``: its offset is above the window: not taken, the read is over.
- ``FULL``: not taken: the batch is full by ``max_rows`` or ``max_bytes``
  (key + value + header names and values); finish it, then add the same bytes again.

``take(buffer, spans, index)`` adds many messages in one call, straight from the bytes the data plane read
(``spans``: ``[start0, end0, start1, end1, ...]`` of messages in ``buffer``, as
:mod:`~liftbridge_provider.client.h2.inbound` cuts them, without a copy per message): from ``index`` on, it
stops at the first LAST, END or FULL and returns that status with the message's index in ``spans``, or
(TAKEN, ``len(spans)``) once every message was taken or skipped.

Header maps come sorted by name, one entry per name (the last one sent wins, as in protobuf).
"""

from __future__ import annotations

import os
from typing import NamedTuple, Protocol

from liftbridge_provider.client import _columns_py

TAKEN, SKIPPED, LAST, END, FULL = 0, 1, 2, 3, 4


class Columns(NamedTuple):
    """One batch's rows as Arrow buffers (int32 offsets: ``rows + 1`` of them, starting at 0)."""

    rows: int
    offsets: bytes  # int64 per row
    timestamps: bytes  # int64 microseconds since the epoch per row
    key_offsets: bytes
    key_data: bytes
    value_offsets: bytes
    value_data: bytes
    subject_offsets: bytes
    subject_data: bytes  # UTF-8
    header_offsets: bytes  # int32 entries before each row's map: the map column's offsets
    name_offsets: bytes
    name_data: bytes  # UTF-8
    header_value_offsets: bytes
    header_value_data: bytes

    def offsets_list(self) -> list[int]:
        """The rows' offsets as Python ints (for checks and logs; the read itself never needs them)."""
        return list(memoryview(self.offsets).cast("q"))


class ColumnBuilder(Protocol):
    """What both builders offer (see the module docstring)."""

    def __init__(self, *, max_rows: int, max_bytes: int) -> None: ...
    @property
    def rows(self) -> int: ...
    @property
    def last_offset(self) -> int | None: ...
    def window(self, low: int, high: int) -> None: ...
    def add(self, data: bytes) -> int: ...
    def take(self, buffer: bytes | bytearray, spans: list[int], index: int) -> tuple[int, int]: ...
    def finish(self) -> _columns_py.Buffers: ...


def _compiled() -> type[ColumnBuilder] | None:
    """The compiled builder, unless it is missing (a build without a C compiler) or turned off."""
    if os.environ.get("LIFTBRIDGE_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from liftbridge_provider.client import _wire_columns  # noqa: PLC0415 - optional compiled module
    except ImportError:
        return None
    return _wire_columns.ColumnBuilder


_COMPILED = _compiled()
NATIVE: bool = _COMPILED is not None
"""True when this process decodes with the compiled builder."""

PYTHON_BUILDER: type[ColumnBuilder] = _columns_py.ColumnBuilder
COMPILED_BUILDER: type[ColumnBuilder] | None = _COMPILED


def new_builder(*, max_rows: int, max_bytes: int) -> ColumnBuilder:
    """A builder of the kind this process uses (see :data:`NATIVE`)."""
    kind = _COMPILED if _COMPILED is not None else PYTHON_BUILDER
    return kind(max_rows=max_rows, max_bytes=max_bytes)


def finish(builder: ColumnBuilder) -> Columns:
    """The builder's rows as :class:`Columns`; the builder starts empty again."""
    return Columns(*builder.finish())
