"""Both column builders (liftbridge_provider/client/columns.py): the compiled one and its pure-Python twin.

Every test runs once per builder on the same bytes: wire bytes written by hand here (from the protobuf
wire format's rules and the field numbers of proto/liftbridge_api.proto) and messages serialized by
protobuf itself. Both must give the same buffers, the same answers and the same errors.
"""

from __future__ import annotations

import os
import random
import tracemalloc

import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import columns
from liftbridge_provider.client.columns import END, FULL, LAST, SKIPPED, TAKEN, Columns
from tests.unit.column_builders import BUILDERS, column, columns_of, rows
from tests.unit.wire_cases import INT64_MAX, entry, field, varint


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


@pytest.mark.parametrize("builder", BUILDERS)
def test_an_offset_at_the_int64_maximum_is_taken_once(builder: type[columns.ColumnBuilder]) -> None:
    """No offset follows the largest one: the same message again is below the window, as every other repeat."""
    made = builder(max_rows=10, max_bytes=100)
    assert made.add(field(1, INT64_MAX)) == LAST
    assert made.add(field(1, INT64_MAX)) == SKIPPED
    assert (made.rows, made.last_offset) == (1, INT64_MAX)
    made.window(INT64_MAX, INT64_MAX - 1)
    assert made.add(field(1, INT64_MAX)) == END, "a window set again starts from its own bounds"


@pytest.mark.parametrize("builder", BUILDERS)
def test_window_bounds_beyond_the_int64_range_are_taken_as_given(builder: type[columns.ColumnBuilder]) -> None:
    """The next offset after INT64_MAX is 2**63 (SubscriptionState.window gives it): no offset reaches it."""
    made = builder(max_rows=10, max_bytes=100)
    made.window(INT64_MAX + 1, INT64_MAX + 1)
    assert made.add(field(1, INT64_MAX)) == SKIPPED
    made.window(-(2**70), -(2**64))
    assert made.add(field(1, -(2**63))) == END
    made.window(-(2**70), 2**70)
    assert made.add(field(1, INT64_MAX)) == TAKEN, "not LAST: the high end is beyond every offset"
    assert made.add(field(1, -(2**63))) == SKIPPED, "and the low end moved past the offset taken"
    for bad in ("1", 1.0, None):
        with pytest.raises(TypeError):
            made.window(bad, 5)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            made.window(0, bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("builder", BUILDERS)
def test_budgets_are_whole_numbers_of_any_size(builder: type[columns.ColumnBuilder]) -> None:
    made = builder(max_rows=2**80, max_bytes=2**80)
    assert [made.add(field(1, i)) for i in range(3)] == [TAKEN] * 3, "a budget above any batch never fills"
    with pytest.raises(ValueError, match=">= 1"):
        builder(max_rows=-(2**80), max_bytes=10)
    with pytest.raises(ValueError, match=">= 1"):
        builder(max_rows=10, max_bytes=0)
    for bad in (1.5, "3", None):
        with pytest.raises(TypeError):
            builder(max_rows=bad, max_bytes=10)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            builder(max_rows=10, max_bytes=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("builder", BUILDERS)
def test_a_builder_whose_init_never_ran_refuses_to_add_or_finish(builder: type[columns.ColumnBuilder]) -> None:
    """Made by __new__ alone it has no starting 0 in its offsets: buffers from it would send Arrow past
    their end, so it answers AttributeError (as the pure-Python one, which lacks its attributes)."""
    made = builder.__new__(builder)
    with pytest.raises(AttributeError):
        made.add(field(3, b"abc"))
    with pytest.raises(AttributeError):
        made.finish()


@pytest.mark.parametrize("builder", BUILDERS)
def test_many_headers_sent_in_reverse_order_come_sorted(builder: type[columns.ColumnBuilder]) -> None:
    """A message may carry a great many header entries in any order (sorting them must not take the
    square of their number: one of 64 MiB holds millions)."""
    names = [f"{i:06d}".encode() for i in range(60_000, 0, -1)]
    data = field(1, 1) + b"".join(entry(name, name[-2:]) for name in names) + entry(b"000007", b"new")
    (batch,) = columns_of(builder, [data], max_bytes=1 << 30)
    (row,) = rows(batch)
    expected = [(name, name[-2:]) for name in reversed(names)]
    expected[6] = (b"000007", b"new")
    assert row["headers"] == expected


@pytest.mark.parametrize("builder", BUILDERS)
def test_header_entries_repeating_names_take_memory_by_name_not_by_entry(
    builder: type[columns.ColumnBuilder],
) -> None:
    """protobuf's map keeps one entry per name; the builder must not hold every entry sent (a 64 MiB
    message holds 8 million of 8 bytes) while reading a message, nor keep that room afterwards."""
    data = field(1, 1) + entry(b"h", b"v") * 100_000 + entry(b"i", b"w") * 100_000  # 1.6 MB
    made = builder(max_rows=10, max_bytes=1 << 30)
    tracemalloc.start()
    try:
        assert made.add(data) == TAKEN
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(data) // 4, f"{peak} bytes at most while reading a message of {len(data)}"
    assert kept < 64 * 1024, f"{kept} bytes kept after it"
    (row,) = rows(Columns(*made.finish()))
    assert row["headers"] == [(b"h", b"v"), (b"i", b"w")]


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


@pytest.mark.parametrize("builder", BUILDERS)
def test_take_adds_spans_of_one_buffer_and_stops_at_last_end_and_full(builder: type[columns.ColumnBuilder]) -> None:
    """``take`` (the data plane's way in: messages as spans of the bytes read, no copy each) adds them in turn,
    skips below the window, and stops at LAST, END and FULL with the index of the message that stopped it;
    after every message, TAKEN with the length of the spans. Bytes or a bytearray (a message put together
    from several frames), spans anywhere in it, a zero-length span (the handshake) a message at offset 0."""
    messages = [api.Message(offset=offset, value=b"v%d" % offset).SerializeToString() for offset in range(6)]
    buffer = b"junk" + b"".join(messages)
    spans, at = [], 4
    for data in messages:
        spans += [at, at + len(data)]
        at += len(data)
    made = builder(max_rows=3, max_bytes=1 << 20)
    made.window(1, 4)
    assert made.take(buffer, spans, 0) == (FULL, 8), "offset 0 skipped, 1-3 taken, the fourth does not fit"
    assert Columns(*made.finish()).offsets_list() == [1, 2, 3]
    assert made.take(bytearray(buffer), spans, 8) == (LAST, 8), "the stop offset, taken"
    assert made.take(buffer, spans, 10) == (END, 10), "above the window: not taken"
    made.window(0, 100)
    assert made.take(buffer, [4, 4, *spans[2:4]], 0) == (TAKEN, 4), "an empty message is offset 0"
    assert Columns(*made.finish()).offsets_list() == [4, 0, 1]
    assert made.take(buffer, [], 0) == (TAKEN, 0)
    for bad in ([5, 4], [0, len(buffer) + 1], [-1, 3]):
        with pytest.raises(ValueError, match="outside its buffer"):
            made.take(buffer, bad, 0)
    with pytest.raises(ValueError, match="pairs"):
        made.take(buffer, spans[:3], 0)
