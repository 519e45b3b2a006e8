"""Both column builders as pytest parameters, and their batches read back row by row.

Shared by tests/unit/test_wire_columns.py and test_wire_protobuf_rules.py.
"""

from __future__ import annotations

import itertools
import struct

import google.protobuf
import pytest
from packaging.version import Version

from liftbridge_provider.client import columns
from liftbridge_provider.client.columns import END, FULL, LAST, SKIPPED, TAKEN, Columns

UPB_RULES_OF_7_34 = pytest.mark.skipif(
    Version(google.protobuf.__version__) < Version("7.34"),
    reason="protobuf before 7.34 takes length prefixes over five bytes and refuses field number 0 inside a group; "
    "the compiled builder follows 7.34 and later, the pure-Python one the protobuf installed "
    '(docs/troubleshooting.md, "protobuf before 7.34")',
)
"""For the cases where protobuf 7.34 changed how its parser (upb) reads malformed bytes: the two builders agree
on them only from that protobuf on (the package's floor is older: pyproject.toml)."""

BUILDERS = [pytest.param(columns.PYTHON_BUILDER, id="python")]
if columns.COMPILED_BUILDER is not None:
    BUILDERS.append(pytest.param(columns.COMPILED_BUILDER, id="compiled"))


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
