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

from liftbridge_provider.client import columns
from tests.unit import wire_cases

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


@pytest.mark.parametrize("data", FOUND_BY_FUZZING)
def test_inputs_the_fuzzer_found_are_answered_alike(data: bytes) -> None:
    wire_cases.check(data)


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
