"""Arrow batches budgeted by rows and by bytes (liftbridge_provider/spark/batches.py).

Defect 11 (issue 11): ``batchSize`` counted rows only, so large messages made
batches of gigabytes (Arrow's binary columns hold 2 GiB). Messages here are
plain objects with a received message's fields: pure logic, no server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import columns
from liftbridge_provider.spark.batches import arrow_batch, message_bytes, record_batches
from liftbridge_provider.spark.source import arrow_schema

MIB = 1024 * 1024


@dataclass
class Raw:
    offset: int
    value: bytes
    key: bytes = b"k"
    timestamp: int = 1_700_000_000_000_000_000
    subject: str = "s"
    headers: dict[str, bytes] = field(default_factory=dict)


def build(messages: list[Raw], *, max_rows: int, max_bytes: int) -> list[pa.RecordBatch]:
    return list(record_batches(messages, arrow_schema(), "s", 3, max_rows=max_rows, max_bytes=max_bytes))


def payload(batch: pa.RecordBatch) -> int:
    return sum(message_bytes(Raw(0, v, k, headers=dict(h))) for k, v, h in zip(*_columns(batch), strict=True))


def _columns(batch: pa.RecordBatch) -> tuple[list[bytes], list[bytes], list[list[tuple[str, bytes]]]]:
    table = batch.to_pydict()
    return table["key"], table["value"], table["headers"]


def test_messages_of_several_mib_make_several_batches_under_batch_bytes() -> None:
    """Defect 11 (issue 11): 12 messages of 3 MiB under an 8 MiB budget: batches of 2, none above the budget."""
    messages = [Raw(i, bytes([i]) * 3 * MIB, headers={"h": b"x" * 10}) for i in range(12)]
    batches = build(messages, max_rows=10_000, max_bytes=8 * MIB)
    assert [b.num_rows for b in batches] == [2] * 6
    assert all(payload(b) <= 8 * MIB for b in batches)
    offsets = [o for b in batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(12)), "every message once, in order"
    assert all(b.schema.equals(arrow_schema()) for b in batches), "the schema Spark checks exactly"


def test_a_message_larger_than_the_budget_is_a_batch_of_its_own() -> None:
    messages = [Raw(0, b"a" * 10), Raw(1, b"b" * (3 * MIB)), Raw(2, b"c" * 10)]
    batches = build(messages, max_rows=100, max_bytes=MIB)
    assert [b.column("offset").to_pylist() for b in batches] == [[0], [1], [2]]


def test_rows_still_bound_batches_of_small_messages() -> None:
    batches = build([Raw(i, b"v") for i in range(25)], max_rows=10, max_bytes=64 * MIB)
    assert [b.num_rows for b in batches] == [10, 10, 5]


def test_no_messages_make_no_batch_and_header_maps_keep_their_rows() -> None:
    assert build([], max_rows=10, max_bytes=MIB) == []
    messages = [Raw(0, b"a", headers={"x": b"1", "y": b"2"}), Raw(1, b"b"), Raw(2, b"c", headers={"z": b"3"})]
    (batch,) = build(messages, max_rows=10, max_bytes=MIB)
    assert batch.column("headers").to_pylist() == [[("x", b"1"), ("y", b"2")], [], [("z", b"3")]]


def test_rows_of_a_batch_carry_the_message_fields() -> None:
    (batch,) = build([Raw(7, b"value", b"key", 2_500_000, "subj", {"n": b"1"})], max_rows=5, max_bytes=MIB)
    row = batch.to_pylist()[0]
    assert (row["key"], row["value"], row["offset"], row["subject"], row["headers"]) == (
        b"key",
        b"value",
        7,
        "subj",
        [("n", b"1")],
    )
    assert (row["stream"], row["partition"]) == ("s", 3)
    assert row["timestamp"].timestamp() == pytest.approx(0.0025), "nanoseconds become microseconds"
    assert message_bytes(Raw(0, b"vv", b"k", headers={"ab": b"cde"})) == 1 + 2 + 2 + 3


BUILDERS = [pytest.param(columns.PYTHON_BUILDER, id="python")]
if columns.COMPILED_BUILDER is not None:
    BUILDERS.append(pytest.param(columns.COMPILED_BUILDER, id="compiled"))


@pytest.mark.parametrize("builder", BUILDERS)
def test_arrow_batch_of_decoded_columns_equals_the_batch_built_from_messages(
    builder: type[columns.ColumnBuilder],
) -> None:
    """The Spark task's path (serialized responses -> column builder -> arrow_batch) gives the batch
    record_batches builds from the same messages: same schema, same rows, exactly."""
    sent = []
    for offset in range(40):
        message = api.Message(offset=offset, key=b"k%d" % offset, value=bytes([offset]) * offset, subject="s.é")
        message.timestamp = 1_700_000_000_000_000_000 + offset * 1_001
        if offset % 3:
            message.headers["subject"] = b"s"  # one header or none: the order of a map's entries is not compared
        sent.append(message.SerializeToString())
    made = builder(max_rows=16, max_bytes=MIB)
    decoded = []
    for data in sent:
        if made.add(data) == columns.FULL:
            decoded.append(arrow_batch(columns.finish(made), arrow_schema(), "s", 3))
            made.add(data)
    decoded.append(arrow_batch(columns.finish(made), arrow_schema(), "s", 3))
    built = build([api.Message.FromString(data) for data in sent], max_rows=16, max_bytes=MIB)  # type: ignore[misc]
    assert [b.num_rows for b in decoded] == [16, 16, 8]
    for mine, theirs in zip(decoded, built, strict=True):
        assert mine.schema.equals(arrow_schema())
        mine.validate(full=True)
        assert mine.equals(theirs)
