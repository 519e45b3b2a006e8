"""The column builders read the wire format exactly as protobuf's parser (upb, protobuf's default) does.

The compiled builder parses the bytes itself; the pure-Python one asks protobuf. Where the wire format
leaves room (how long a tag may be, groups, map entries with fields a map entry does not have, a string
field sent twice) both must land where protobuf lands, so the two read the same rows from the same bytes.
Each case here is bytes a server (or anything answering on its port) could send.
"""

from __future__ import annotations

import pytest
from google.protobuf.internal import api_implementation
from google.protobuf.message import DecodeError

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import columns
from tests.unit.column_builders import BUILDERS, UPB_RULES_OF_7_34, columns_of, rows
from tests.unit.wire_cases import entry, field, group, tag, varint

pytestmark = pytest.mark.skipif(
    api_implementation.Type() != "upb",
    reason="the builders follow protobuf's default parser (upb); this protobuf runs another one",
)


def row_of(builder: type[columns.ColumnBuilder], data: bytes) -> dict[str, object]:
    (batch,) = columns_of(builder, [data])
    (row,) = rows(batch)
    return row


def refused(builder: type[columns.ColumnBuilder], data: bytes) -> bool:
    made = builder(max_rows=10, max_bytes=100)
    with pytest.raises(ValueError, match="malformed Liftbridge message"):
        made.add(data)
    with pytest.raises(DecodeError):
        api.Message.FromString(data)  # protobuf refuses them too
    return made.rows == 0


@pytest.mark.parametrize("builder", BUILDERS)
@pytest.mark.parametrize(
    "data",
    [
        pytest.param(varint(((1 << 32) | 1) << 3) + varint(5), id="tag above 32 bits, low bits field 1"),
        pytest.param(bytes([0x88, 0x80, 0x80, 0x80, 0x10, 0x05]), id="tag of 2**32 + field 1"),
        pytest.param(bytes([0x88, 0x80, 0x80, 0x80, 0x80, 0x00, 0x05]), id="tag of six bytes"),
        pytest.param(tag(99, 3) + tag(98, 4), id="group ended by another number"),
        pytest.param(tag(99, 3) + field(1, 1), id="group never ended"),
        pytest.param(tag(99, 3) + varint(0) + tag(99, 4), id="varint in a group swallowing its end"),
        pytest.param(field(9, varint(0) + varint(0) + field(1, b"k")), id="field number 0 in a header entry"),
        pytest.param(tag(5, 4), id="end of a group never started"),
        pytest.param(field(9, field(1, b"k") + tag(1, 4)), id="end of a group in a header entry"),
        pytest.param(tag(99, 3) * 101 + tag(99, 4) * 101, id="groups 101 deep"),
        pytest.param(field(9, tag(50, 3) * 100 + tag(50, 4) * 100), id="groups 100 deep in a header entry"),
        pytest.param(field(9, field(1, b"\xff") + field(1, b"fine")), id="header name not UTF-8, then UTF-8"),
        pytest.param(field(9, field(1, b"\xc0\xaf") + field(3, 1)), id="header name not UTF-8, entry left out"),
    ],
)
def test_bytes_protobuf_refuses_are_refused(builder: type[columns.ColumnBuilder], data: bytes) -> None:
    assert refused(builder, data)


@pytest.mark.parametrize("builder", BUILDERS)
def test_tags_of_up_to_five_bytes_are_read(builder: type[columns.ColumnBuilder]) -> None:
    """A tag may be padded with zero bits up to five bytes, and name any field number up to 2**29 - 1."""
    assert row_of(builder, bytes([0x88, 0x80, 0x80, 0x00, 0x05]))["offset"] == 5
    largest = bytes([0xF8, 0xFF, 0xFF, 0xFF, 0x0F, 0x01])  # field 2**29 - 1, a varint: unknown, skipped
    assert row_of(builder, largest + field(1, 6))["offset"] == 6


@UPB_RULES_OF_7_34
@pytest.mark.parametrize("builder", BUILDERS)
def test_unknown_groups_are_skipped_up_to_protobufs_nesting_limit(builder: type[columns.ColumnBuilder]) -> None:
    """A group is no field of Message; protobuf skips it as an unknown field, nested up to 100 deep in a
    message and 99 in a header entry (itself one level). Inside a group it checks only the wire format."""
    inside = field(1, 7) + field(3, b"in a group") + field(7, b"\xff") + group(98, field(2, b"x"))
    inside += varint(0) + varint(0) + group(0)  # field number 0: refused in a message, skipped in a group
    row = row_of(builder, field(1, 9) + group(99, inside) + group(3) + varint(5 << 3 | 3) + tag(5, 4))
    assert (row["offset"], row["value"], row["subject"]) == (9, b"", b""), "nothing in a group is a field"
    deepest = tag(99, 3) * 100 + tag(99, 4) * 100
    assert row_of(builder, field(1, 4) + deepest + field(3, b"v"))["value"] == b"v"
    in_entry = field(9, field(1, b"k") + tag(50, 3) * 99 + tag(50, 4) * 99)
    assert row_of(builder, in_entry)["headers"] == [], "an entry with a group is left out of the map"


@pytest.mark.parametrize("builder", BUILDERS)
def test_header_entries_with_other_fields_are_left_out_of_the_map(builder: type[columns.ColumnBuilder]) -> None:
    """protobuf keeps a map entry that has any field besides key (1) and value (2), both as bytes, among the
    message's unknown fields, not in the map: an earlier entry of the same name stays."""
    data = (
        entry(b"a", b"1")
        + field(9, field(1, b"a") + field(2, b"2") + field(3, 1))  # a third field
        + field(9, field(1, b"b") + field(2, 5))  # the value as a varint
        + field(9, field(1, 1) + field(1, b"c"))  # the name once as a varint
        + field(9, field(1, b"d") + tag(7, 5) + b"1234")  # a fixed32
        + field(9, field(1, b"e") + tag(2, 1) + b"12345678")  # the value as a fixed64
        + entry(b"f", b"6")
    )
    assert row_of(builder, data)["headers"] == [(b"a", b"1"), (b"f", b"6")]
    assert dict(api.Message.FromString(data).headers) == {"a": b"1", "f": b"6"}
