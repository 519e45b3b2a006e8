"""The compiled column builder against its pure-Python twin on made-up bytes: the fuzzer's share in `make test`.

tools/fuzz_wire_columns.py runs the same check (tests/unit/wire_cases.check), coverage-guided and under
sanitizers, for as long as it is given; here a fixed set of inputs from fixed seeds keeps guarding it:
random bytes, messages serialized by protobuf with bytes flipped, cut, inserted or spliced, and scripts of
several messages, windows and budgets. Both builders must give the same answers, errors and buffers.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from google.protobuf.internal import api_implementation
from google.protobuf.message import DecodeError

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import columns
from tests.unit import wire_cases
from tests.unit.column_builders import UPB_RULES_OF_7_34
from tests.unit.wire_cases import field, group, tag

pytestmark = [
    pytest.mark.skipif(
        columns.COMPILED_BUILDER is None,
        reason="the compiled builder is not built here (test_the_compiled_builder_is_built says why)",
    ),
    pytest.mark.skipif(
        api_implementation.Type() != "upb",
        reason="the builders follow protobuf's default parser (upb); this protobuf runs another one",
    ),
]


FOUND_BY_FUZZING = [
    # a group holding field number 0 (refused at the top of a message, skipped inside a group)
    b"\x9b\x06\x00\x00\x00\x00\x00\x00\x00\x80\x08\x05\x93\x06\x94\x06\x9c\x06\x08\x03",
]
"""Inputs on which tools/fuzz_wire_columns.py found the builders disagreeing, kept as they were found."""


@UPB_RULES_OF_7_34
@pytest.mark.parametrize("data", FOUND_BY_FUZZING)
def test_inputs_the_fuzzer_found_are_answered_alike(data: bytes) -> None:
    wire_cases.check(data)


def padded_varint(value: int, size: int) -> bytes:
    """``value`` as a varint of exactly ``size`` bytes: its own bytes, then continuation bytes of zero bits (an
    overlong encoding, which the wire format allows; protobuf reads a length of at most five bytes)."""
    out = bytearray()
    for at in range(size):
        out.append(value & 0x7F | (0x80 if at < size - 1 else 0))
        value >>= 7
    assert value == 0, "the value does not fit"
    return bytes(out)


def delimited(number: int, body: bytes, size: int, length: int | None = None) -> bytes:
    """Field ``number`` (length-delimited) holding ``body``, its length (``length``, else the body's) sent in
    ``size`` bytes."""
    return tag(number, 2) + padded_varint(len(body) if length is None else length, size) + body


LENGTH_PLACES = {
    "value": lambda size: delimited(3, b"v", size) + field(1, 5),
    "empty key": lambda size: delimited(2, b"", size) + field(1, 5),
    "subject": lambda size: field(1, 5) + delimited(7, b"s", size),
    "a string not kept (stream)": lambda size: delimited(5, b"s", size) + field(1, 5),
    "unknown field": lambda size: delimited(20, b"x", size) + field(1, 5),
    "unknown field in a group": lambda size: field(1, 5) + group(99, delimited(2, b"x", size)),
    "header entry": lambda size: delimited(9, field(1, b"k") + field(2, b"v"), size),
    "header name": lambda size: field(9, delimited(1, b"k", size) + field(2, b"v")),
    "header value": lambda size: field(9, field(1, b"k") + delimited(2, b"v", size)),
    "other field of a header entry": lambda size: field(9, field(1, b"k") + delimited(5, b"x", size)),
}
"""Every place a length is read, as bytes whose length prefix is ``size`` bytes long."""


def protobuf_takes(data: bytes) -> bool:
    try:
        api.Message.FromString(data)
    except DecodeError:
        return False
    return True


def builder_takes(builder: type[columns.ColumnBuilder], data: bytes) -> bool:
    try:
        builder(max_rows=10, max_bytes=1000).add(data)
    except ValueError:
        return False
    return True


@UPB_RULES_OF_7_34
@pytest.mark.parametrize("size", range(1, 11))
@pytest.mark.parametrize("place", LENGTH_PLACES)
def test_lengths_of_more_than_five_bytes_are_refused_as_protobuf_refuses_them(place: str, size: int) -> None:
    """protobuf (upb) reads a length prefix of at most five bytes, overlong ones included (a length of 1 sent
    as 0x81 0x80 0x80 0x80 0x00), and refuses a longer one, whatever its value. The compiled builder read
    lengths of up to ten bytes: it took messages the pure-Python one (protobuf's parser) refuses."""
    data = LENGTH_PLACES[place](size)
    assert protobuf_takes(data) == (size <= 5), "protobuf's own rule changed: the builders must follow it"
    compiled = columns.COMPILED_BUILDER
    assert compiled is not None
    assert (builder_takes(columns.PYTHON_BUILDER, data), builder_takes(compiled, data)) == (size <= 5,) * 2
    wire_cases.check(data)


@pytest.mark.parametrize("size", [5, 6, 10])
@pytest.mark.parametrize("length", [2**31 - 2, 2**31 - 1, 2**31, 2**32 - 1, 2**32 + 1, 2**34 + 1])
def test_lengths_of_two_gigabytes_and_more_are_refused_as_protobuf_refuses_them(length: int, size: int) -> None:
    """A length from 2**31 - 1 up is refused (protobuf's limit), however it is sent: no length is cut to 32
    bits, none wraps around to a small one. (Every one of these is also longer than the bytes that follow.)"""
    data = delimited(3, b"v", size, length) + field(1, 5)
    assert not protobuf_takes(data)
    wire_cases.check(data)
    compiled = columns.COMPILED_BUILDER
    assert compiled is not None
    assert not builder_takes(compiled, data)
    assert not builder_takes(columns.PYTHON_BUILDER, data)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_both_builders_answer_random_and_mutated_bytes_alike(seed: int) -> None:
    for data in wire_cases.inputs(seed, 2_000):
        wire_cases.check(data)


def test_inputs_reach_every_answer_and_error() -> None:
    """The generated inputs are not all refused: they reach each answer of add and each kind of error."""
    seen: set[object] = set()
    for data in wire_cases.inputs(1, 2_000):
        for observation in wire_cases.observe(columns.PYTHON_BUILDER, data):
            if observation[0] in ("add", "add again"):
                seen.add(observation[1])
    assert seen >= {
        columns.TAKEN,
        columns.SKIPPED,
        columns.LAST,
        columns.END,
        columns.FULL,
        ("ValueError", "malformed Liftbridge message"),
    }


def test_the_compiled_builder_keeps_no_memory_after_it_is_gone() -> None:
    """Builders made, filled, refused bad bytes and dropped, over and over: nothing of theirs stays."""
    compiled = columns.COMPILED_BUILDER
    assert compiled is not None
    data = list(wire_cases.inputs(4, 300))

    def churn() -> None:
        for _ in range(3):
            made = compiled(max_rows=3, max_bytes=200)
            for item in data:
                try:
                    if made.add(item) == columns.FULL:
                        made.finish()
                except ValueError:
                    pass
            made.finish()
            del made

    churn()  # first use: caches and interned objects
    gc.collect()
    # Only what the builders' calls allocate (attributed to this file's lines that call them): threads that
    # earlier tests of the session left running allocate meanwhile too (7 KB once in a full run).
    ours = [tracemalloc.Filter(True, __file__), tracemalloc.Filter(True, columns.__file__)]
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces(ours)
        churn()
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(ours)
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename") if stat.size_diff > 0)
    assert grown < 4096, f"{grown} bytes more after the builders were dropped"
