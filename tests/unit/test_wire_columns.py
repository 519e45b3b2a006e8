"""Both column builders (liftbridge_provider/client/columns.py): the compiled one and its pure-Python twin.

Every test runs once per builder on the same bytes: wire bytes written by hand here (from the protobuf
wire format's rules and the field numbers of proto/liftbridge_api.proto) and messages serialized by
protobuf itself. Both must give the same buffers, the same answers and the same errors.
"""

from __future__ import annotations

import itertools
import os
import random
import struct

import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import columns
from liftbridge_provider.client.columns import END, FULL, LAST, SKIPPED, TAKEN, Columns
from liftbridge_provider.client.stream_reader import STOP

BUILDERS = [pytest.param(columns.PYTHON_BUILDER, id="python")]
if columns.COMPILED_BUILDER is not None:
    BUILDERS.append(pytest.param(columns.COMPILED_BUILDER, id="compiled"))


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 values are sent as 10-byte varints
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    return varint(number << 3 | 2) + varint(len(value)) + value


def entry(name: bytes | None, value: bytes | None) -> bytes:
    body = (field(1, name) if name is not None else b"") + (field(2, value) if value is not None else b"")
    return field(9, body)


def columns_of(builder: type[columns.ColumnBuilder], messages: list[bytes], **budget: int) -> list[Columns]:
    made = builder(max_rows=budget.get("max_rows", 1000), max_bytes=budget.get("max_bytes", 1 << 20))
    batches = []
    for data in messages:
        status = made.add(data)
        if status == FULL:
            batches.append(Columns(*made.finish()))
            status = made.add(data)
        assert status in (TAKEN, SKIPPED, LAST, END)
    if made.rows:
        batches.append(Columns(*made.finish()))
    return batches


def column(values: bytes, fmt: str) -> list[int]:
    return [v for (v,) in struct.iter_unpack(fmt, values)]


def strings(offsets: bytes, data: bytes) -> list[bytes]:
    bounds = column(offsets, "<i")
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def rows(batch: Columns) -> list[dict[str, object]]:
    """The batch read back row by row (headers as (name, value) lists in the batch's order)."""
    names = strings(batch.name_offsets, batch.name_data)
    values = strings(batch.header_value_offsets, batch.header_value_data)
    entries = column(batch.header_offsets, "<i")
    return [
        {
            "offset": offset,
            "micros": micros,
            "key": key,
            "value": value,
            "subject": subject,
            "headers": list(zip(names[entries[i] : entries[i + 1]], values[entries[i] : entries[i + 1]], strict=True)),
        }
        for i, (offset, micros, key, value, subject) in enumerate(
            zip(
                column(batch.offsets, "<q"),
                column(batch.timestamps, "<q"),
                strings(batch.key_offsets, batch.key_data),
                strings(batch.value_offsets, batch.value_data),
                strings(batch.subject_offsets, batch.subject_data),
                strict=True,
            )
        )
    ]


@pytest.mark.parametrize("builder", BUILDERS)
def test_hand_written_message_gives_its_fields(builder: type[columns.ColumnBuilder]) -> None:
    data = (
        field(1, 42)
        + field(2, b"key")
        + field(3, b"value")
        + field(4, 1_700_000_000_123_456_789)
        + field(5, b"orders")
        + field(6, 3)
        + field(7, "sübject".encode())
        + entry(b"b", b"2")
        + entry(b"a", b"1")
        + field(12, 1)
    )
    (batch,) = columns_of(builder, [data])
    assert rows(batch) == [
        {
            "offset": 42,
            "micros": 1_700_000_000_123_456,
            "key": b"key",
            "value": b"value",
            "subject": "sübject".encode(),
            "headers": [(b"a", b"1"), (b"b", b"2")],
        }
    ], "header maps come sorted by name"


@pytest.mark.parametrize("builder", BUILDERS)
def test_wire_rules_last_value_wins_unknown_fields_skipped_defaults_empty(
    builder: type[columns.ColumnBuilder],
) -> None:
    data = (
        field(3, b"first")
        + field(99, b"unknown bytes")
        + field(98, 7)
        + varint(97 << 3 | 1)
        + b"\x00" * 8  # unknown fixed64
        + varint(96 << 3 | 5)
        + b"\x00" * 4  # unknown fixed32
        + field(1, 5)
        + field(3, b"second")
        + entry(b"h", b"old")
        + entry(b"h", b"new")
        + entry(b"k", None)
        + entry(None, b"v")
        + field(1, 6)
    )
    (batch,) = columns_of(builder, [b"", data])
    assert rows(batch) == [
        {"offset": 0, "micros": 0, "key": b"", "value": b"", "subject": b"", "headers": []},
        {
            "offset": 6,
            "micros": 0,
            "key": b"",
            "value": b"second",
            "subject": b"",
            "headers": [(b"", b"v"), (b"h", b"new"), (b"k", b"")],
        },
    ]


@pytest.mark.parametrize("builder", BUILDERS)
def test_negative_values_and_microseconds_truncate_toward_zero(builder: type[columns.ColumnBuilder]) -> None:
    (batch,) = columns_of(builder, [field(1, -1) + field(4, -1_999), field(1, 2**63 - 1) + field(4, 1_999)])
    assert column(batch.offsets, "<q") == [-1, 2**63 - 1]
    assert column(batch.timestamps, "<q") == [-1, 1]


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize(
    "data",
    [
        pytest.param(field(1, 1)[:-1] + b"\x80", id="truncated varint"),
        pytest.param(varint(3 << 3 | 2) + varint(10) + b"short", id="length past the end"),
        pytest.param(varint(3 << 3 | 3), id="group wire type"),
        pytest.param(varint(3 << 3 | 7), id="wire type 7"),
        pytest.param(varint(0 << 3 | 0) + b"\x01", id="field number 0"),
        pytest.param(field(7, b"\xff\xfe"), id="subject not UTF-8"),
        pytest.param(field(7, b"\xed\xa0\x80"), id="subject with a surrogate"),
        pytest.param(field(7, b"\xc0\x80"), id="overlong subject"),
        pytest.param(entry(b"\xff", b"v"), id="header name not UTF-8"),
        pytest.param(field(11, b"\x80"), id="correlation id not UTF-8"),
        pytest.param(field(9, b"\x0a\x05ab"), id="truncated header entry"),
    ],
)
def test_bytes_that_are_not_a_message_raise_value_error(builder: type[columns.ColumnBuilder], data: bytes) -> None:
    made = builder(max_rows=10, max_bytes=100)
    with pytest.raises(ValueError, match="malformed Liftbridge message"):
        made.add(data)
    assert made.rows == 0


@pytest.mark.parametrize("builder", BUILDERS)
def test_window_skips_below_delivers_the_stop_offset_last_and_ends_above(
    builder: type[columns.ColumnBuilder],
) -> None:
    made = builder(max_rows=100, max_bytes=1 << 20)
    made.window(3, 5)
    answers = [made.add(field(1, offset)) for offset in (1, 3, 3, 4, 5, 6)]
    assert answers == [SKIPPED, TAKEN, SKIPPED, TAKEN, LAST, END], "a repeated offset is skipped too"
    assert (made.rows, made.last_offset) == (3, 5)
    made.window(10, 12)
    assert [made.add(field(1, offset)) for offset in (13,)] == [END]
    assert made.last_offset == 5


@pytest.mark.parametrize("builder", BUILDERS)
def test_budgets_close_a_batch_before_the_message_that_does_not_fit(builder: type[columns.ColumnBuilder]) -> None:
    by_rows = columns_of(builder, [field(1, i) for i in range(25)], max_rows=10)
    assert [b.rows for b in by_rows] == [10, 10, 5]
    sized = [field(1, i) + field(3, b"v" * 40) + entry(b"hh", b"x" * 8) for i in range(7)]  # 50 bytes each
    by_bytes = columns_of(builder, sized, max_bytes=100)
    assert [b.rows for b in by_bytes] == [2, 2, 2, 1]
    big = columns_of(builder, [field(1, 0), field(1, 1) + field(3, b"x" * 500), field(1, 2)], max_bytes=100)
    assert [column(b.offsets, "<q") for b in big] == [[0], [1], [2]], "a message over the budget is alone"
    made = builder(max_rows=1, max_bytes=1 << 20)
    assert made.add(field(1, 0)) == TAKEN
    assert made.add(field(1, 1)) == FULL
    assert (made.rows, made.last_offset) == (1, 0), "a full answer takes nothing"


@pytest.mark.parametrize("builder", BUILDERS)
def test_a_finished_builder_starts_empty(builder: type[columns.ColumnBuilder]) -> None:
    made = builder(max_rows=10, max_bytes=100)
    empty = Columns(*made.finish())
    assert empty.rows == 0
    assert rows(empty) == []
    assert empty.key_offsets == b"\x00\x00\x00\x00"
    assert empty.header_offsets == b"\x00\x00\x00\x00"
    made.add(field(1, 1) + field(3, b"abc"))
    made.finish()
    made.add(field(1, 2))
    again = Columns(*made.finish())
    assert rows(again) == [{"offset": 2, "micros": 0, "key": b"", "value": b"", "subject": b"", "headers": []}]


@pytest.mark.parametrize("builder", BUILDERS)
def test_refuses_other_than_bytes_and_bad_budgets(builder: type[columns.ColumnBuilder]) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        builder(max_rows=0, max_bytes=10)
    with pytest.raises(TypeError):
        builder(max_rows=1, max_bytes=10).add(bytearray(b""))  # type: ignore[arg-type]


def random_messages(count: int, seed: int) -> list[bytes]:
    chance = random.Random(seed)
    out = []
    for offset in range(count):
        message = api.Message(
            offset=offset,
            key=os.urandom(chance.randrange(0, 9)),
            value=os.urandom(chance.randrange(0, 300)),
            timestamp=chance.randrange(-(2**62), 2**62),
            stream="orders",
            partition=chance.randrange(0, 4),
            subject=chance.choice(["", "orders", "naïve.日本"]),
            replySubject=chance.choice(["", "inbox.1"]),
            correlationId=str(offset),
        )
        for _ in range(chance.randrange(0, 5)):
            message.headers[chance.choice(["subject", "reply", "z", "é", "a"])] = os.urandom(chance.randrange(0, 6))
        out.append(message.SerializeToString())
    return out


def test_both_builders_give_the_same_bytes_for_protobuf_serialized_messages() -> None:
    if columns.COMPILED_BUILDER is None:
        pytest.skip("the compiled builder is not built here (test_the_compiled_builder_is_built says why)")
    messages = random_messages(3_000, seed=29)
    for budget in ({"max_rows": 1_000}, {"max_bytes": 20_000}):
        python = columns_of(columns.PYTHON_BUILDER, messages, **budget)
        compiled = columns_of(columns.COMPILED_BUILDER, messages, **budget)
        assert python == compiled
        assert sum(b.rows for b in python) == 3_000
    parsed = [api.Message.FromString(m) for m in messages[:50]]
    (first, *_) = columns_of(columns.PYTHON_BUILDER, messages[:50])
    for row, message in zip(rows(first), parsed, strict=True):
        assert row["headers"] == sorted((k.encode(), v) for k, v in message.headers.items())
        assert (row["offset"], row["key"], row["value"]) == (message.offset, message.key, message.value)


def test_the_compiled_builder_is_built() -> None:
    """The package's build compiles the decoder (setup.py, make setup); only LIFTBRIDGE_PURE_PYTHON turns it off."""
    if os.environ.get("LIFTBRIDGE_PURE_PYTHON", "") not in ("", "0"):
        assert not columns.NATIVE
        pytest.skip("LIFTBRIDGE_PURE_PYTHON is set: the pure-Python builder is chosen")
    assert columns.NATIVE, "liftbridge_provider.client._wire_columns is missing: run `make native` (needs gcc)"
    assert columns.COMPILED_BUILDER is not None
    made = columns.new_builder(max_rows=1, max_bytes=1)
    assert type(made) is columns.COMPILED_BUILDER


def test_stop_codes_end_the_receive_loop() -> None:
    """stream_reader.receive_into stops at LAST, END and FULL, never at TAKEN or SKIPPED."""
    assert TAKEN < STOP
    assert SKIPPED < STOP
    assert min(LAST, END, FULL) == STOP
