"""Pure parts of the Spark source: slicing ranges into input partitions, and option parsing."""

from __future__ import annotations

import re

import pytest

from liftbridge_provider.client import InvalidArgumentError
from liftbridge_provider.core.ranges import OffsetRange
from liftbridge_provider.core.spark_planning import Slice, pack_slices, plan_slices, rate_limit
from liftbridge_provider.spark.options import parse_options, parse_write_options

RANGES = [OffsetRange(0, 0, 10), OffsetRange(1, 5, 5), OffsetRange(2, 100, 103)]


def covered(slices: list[Slice]) -> dict[int, list[int]]:
    offsets: dict[int, list[int]] = {}
    for s in slices:
        offsets.setdefault(s.partition, []).extend(range(s.start, s.end))
    return offsets


def test_one_slice_per_non_empty_range_by_default() -> None:
    assert plan_slices(RANGES) == [Slice(0, 0, 10), Slice(2, 100, 103)]


def test_max_partitions_packs_whole_slices_into_balanced_tasks() -> None:
    """256 small slices and two big ones into 4 tasks: each slice whole, in exactly one task, the big ones apart,
    the offsets spread evenly; fewer slices than the limit stay one task each."""
    slices = [Slice(p, 0, 10) for p in range(256)] + [Slice(300, 0, 1000), Slice(301, 0, 1000)]
    tasks = pack_slices(slices, 4)
    assert len(tasks) == 4
    assert sorted(s for task in tasks for s in task) == sorted(slices), "each slice once, whole"
    loads = sorted(sum(s.count for s in task) for task in tasks)
    assert loads[-1] - loads[0] <= 1000, loads
    assert [task for task in tasks if Slice(300, 0, 1000) in task and Slice(301, 0, 1000) in task] == []
    assert all(list(task) == sorted(task) for task in tasks)
    assert pack_slices(slices[:3], 4) == [(s,) for s in sorted(slices[:3])]
    assert pack_slices(slices, None) == [(s,) for s in sorted(slices)]
    assert parse_options({"brokers": "h:1", "ranges": "{}", "maxPartitions": "4"}).max_partitions == 4
    with pytest.raises(InvalidArgumentError, match="maxPartitions must be a whole number >= 1"):
        pack_slices(slices, 0)


def test_max_records_per_partition_cuts_ranges() -> None:
    slices = plan_slices(RANGES, max_records_per_partition=4)
    assert slices == [Slice(0, 0, 4), Slice(0, 4, 8), Slice(0, 8, 10), Slice(2, 100, 103)]
    assert covered(slices) == {0: list(range(10)), 2: [100, 101, 102]}


@pytest.mark.parametrize("minimum", [1, 2, 5, 13, 50])
def test_min_partitions_splits_the_largest_slices(minimum: int) -> None:
    slices = plan_slices(RANGES, min_partitions=minimum)
    assert len(slices) >= min(minimum, 13), "enough slices, up to one per offset"
    assert covered(slices) == {0: list(range(10)), 2: [100, 101, 102]}, "exact cover, no overlap"
    assert all(s.count >= 1 for s in slices)


def test_a_huge_min_partitions_plans_one_slice_per_offset_without_hanging() -> None:
    """minPartitions=2**40 split the largest slice with a scan of the whole list each time: quadratic in the
    slices made (8,000 offsets took 4.2 s, 100,000 would take about ten minutes) on the driver, with no
    deadline. Splitting stops at one offset per slice, and now takes a heap."""
    slices = plan_slices([OffsetRange(0, 0, 60_000), OffsetRange(3, 7, 40_007)], min_partitions=2**40)
    assert len(slices) == 100_000
    assert all(s.count == 1 for s in slices)
    assert covered(slices) == {0: list(range(60_000)), 3: list(range(7, 40_007))}
    assert plan_slices([OffsetRange(0, 5, 5), OffsetRange(1, 9, 9)], min_partitions=4) == [], "nothing to split"


def test_bad_planning_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="minPartitions must be a whole number >= 1, got 0"):
        plan_slices(RANGES, min_partitions=0)
    with pytest.raises(InvalidArgumentError, match="maxRecordsPerPartition must be a whole number >= 1"):
        plan_slices(RANGES, max_records_per_partition=-2)


def test_timestamp_options_become_bounds_of_times() -> None:
    options = parse_options(
        {"brokers": "a", "stream": "s", "startingTimestamp": "1700000000000", "endingOffsetsByTimestamp": '{"1": 5}'}
    )
    assert options.starting_offsets is not None
    assert options.ending_offsets is not None
    assert (options.starting_offsets.name, options.starting_offsets.time_of(3)) == ("startingTimestamp", 1700000000000)
    assert (options.ending_offsets.time_of(1), options.ending_offsets.time_of(0)) == (5, None)


def test_options_are_parsed_and_checked() -> None:
    options = parse_options(
        {"brokers": "a:1,b", "ranges": "{}", "minPartitions": "4", "readFromReplica": "TRUE", "requestTimeout": "3"}
    )
    assert options.config.brokers == ("a:1", "b:9292")
    assert options.config.request_timeout == 3.0
    assert (options.min_partitions, options.read_from_replica, options.fail_on_data_loss) == (4, True, True)
    assert options.batch_size == 10_000
    assert options.check_ranges is True  # planning checks each range unless the caller says it did


def test_check_ranges_is_a_flag_of_batch_reads_only() -> None:
    """checkRanges=false is the ingest's: it checked the ranges before it claimed them. A stream's
    micro-batches come from high watermarks read just before, so the option is refused there, not ignored."""
    assert parse_options({"brokers": "a", "ranges": "{}", "checkRanges": "False"}).check_ranges is False
    with pytest.raises(InvalidArgumentError, match="checkRanges must be true or false, got 'no'"):
        parse_options({"brokers": "a", "ranges": "{}", "checkRanges": "no"})
    with pytest.raises(InvalidArgumentError, match=r"option checkRanges is for spark\.read only"):
        parse_options({"brokers": "a", "stream": "s", "checkRanges": "false"}, "stream")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"ranges": "{}"}, "option brokers is required"),
        ({"brokers": "a", "ranges": "{}", "startingOffsets": "earliest"}, "either ranges or"),
        ({"brokers": "a", "stream": "s"}, "give ranges, or a start (startingOffsets, startingTimestamp or"),
        ({"brokers": "a", "stream": "s", "startingTimestamp": "5"}, "and an end (endingOffsets, endingTimestamp"),
        (
            {"brokers": "a", "stream": "s", "startingOffsets": "earliest", "startingTimestamp": "5"},
            "give one of startingOffsets, startingTimestamp, not several",
        ),
        ({"brokers": "a", "stream": "s", "startingTimestamp": "-1", "endingOffsets": "latest"}, "from 0 to"),
        # a time past 2262 overflows the server's int64 nanoseconds: refused naming the option and its unit
        (
            {"brokers": "a", "stream": "s", "startingTimestamp": "1" + "0" * 30, "endingOffsets": "latest"},
            "option startingTimestamp must be milliseconds since the epoch (digits, from 0 to 9223372036854",
        ),
        (
            {"brokers": "a", "stream": "s", "startingTimestamp": "\uff11\uff12", "endingOffsets": "latest"},
            "option startingTimestamp must be milliseconds since the epoch (digits",
        ),
        (
            {"brokers": "a", "stream": "s", "startingOffsets": "earliest", "endingOffsetsByTimestamp": '{"1": 1e3}'},
            "endingOffsetsByTimestamp time in milliseconds since the epoch of partition 1 must be a whole number",
        ),
        (
            {
                "brokers": "a",
                "stream": "s",
                "startingOffsets": "earliest",
                "endingOffsetsByTimestamp": '{"1": 9223372036855}',
            },
            "endingOffsetsByTimestamp time in milliseconds since the epoch of partition 1 must be at most 922337203685",
        ),
        (
            {"brokers": "a", "stream": "s", "startingTimestamp": "yesterday", "endingOffsets": "latest"},
            "startingTimestamp must be milliseconds since the epoch",
        ),
        (
            {"brokers": "a", "stream": "s", "startingOffsets": "earliest", "endingOffsetsByTimestamp": '{"x": 1}'},
            "endingOffsetsByTimestamp: partition 'x' is not a number",
        ),
        ({"brokers": "a", "startingOffsets": "earliest", "endingOffsets": "latest"}, "option stream is required"),
        ({"brokers": "a", "ranges": "{}", "failOnDataLoss": "maybe"}, "failOnDataLoss must be true or false"),
        ({"brokers": "a", "ranges": "{}", "batchSize": "ten"}, "batchSize must be a int, got 'ten'"),
        ({"brokers": "a", "ranges": "{}", "partitions": "0,x"}, "partitions must be numbers"),
        # int() reads "1_0" as 10 and "+1" as 1; an empty list read nothing and succeeded; "0,0" failed later
        ({"brokers": "a", "ranges": "{}", "partitions": "1_0"}, "partitions must be numbers"),
        ({"brokers": "a", "ranges": "{}", "partitions": "+1"}, "partitions must be numbers"),
        ({"brokers": "a", "ranges": "{}", "partitions": " , "}, "partitions must name at least one"),
        ({"brokers": "a", "ranges": "{}", "partitions": "0,0"}, "partitions names partition 0 twice"),
        ({"brokers": "a", "ranges": "{}", "batchSize": "1_000"}, "batchSize must be a int, got '1_000'"),
        ({"brokers": "a", "ranges": "{}", "startOffset": "1"}, "unknown liftbridge source option(s) ['startoffset']"),
    ],
)
def test_bad_options_are_named(raw: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        parse_options(raw)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("start", "available", "max_rows", "end"),
    [
        ({0: 0, 1: 0, 2: 0}, {0: 100, 1: 100, 2: 100}, None, {0: 100, 1: 100, 2: 100}),
        ({0: 0, 1: 0, 2: 0}, {0: 100, 1: 100, 2: 100}, 30, {0: 10, 1: 10, 2: 10}),
        ({0: 0, 1: 0, 2: 0}, {0: 300, 1: 100, 2: 0}, 40, {0: 30, 1: 10, 2: 0}),  # in proportion to the backlog
        ({0: 5, 1: 7}, {0: 6, 1: 8}, 1, {0: 6, 1: 7}),  # equal remainders: the lower partition first
        ({0: 0, 1: 0}, {0: 1000, 1: 1}, 10, {0: 10, 1: 0}),
        ({0: 0, 1: 0}, {0: 3, 1: 2}, 100, {0: 3, 1: 2}),  # under the limit: everything
        ({0: 10}, {0: 4}, 5, {0: 10}),  # never before the start (a lagging high watermark)
    ],
)
def test_micro_batches_take_at_most_max_rows_shared_by_backlog(
    start: dict[int, int], available: dict[int, int], max_rows: int | None, end: dict[int, int]
) -> None:
    result = rate_limit(start, available, max_rows)
    assert result == end
    if max_rows is not None:
        assert sum(result[p] - start[p] for p in start) <= max_rows


def test_the_sink_accepts_the_checkpoint_option_spark_hands_a_stream_sink() -> None:
    """writeStream.format("liftbridge").option("checkpointLocation", ...) is how a streaming query names its
    checkpoint; Spark passes that option to the sink too, which must take it (and leave it to Spark)."""
    options = parse_write_options({"brokers": "127.0.0.1:9292", "stream": "s", "checkpointLocation": "/tmp/ck"})
    assert options.stream == "s"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"0": 1, "0": 2}', "names partition 0 twice"),
        ('{"0": 1, "00": 2}', "names partition 0 twice (key '00')"),
        ('{"0_0": 3}', "partition '0_0' is not a number (digits only)"),
        ('{"+1": 3}', "partition '+1' is not a number"),
        ('{"-0": 3}', "partition '-0' is not a number"),
        ('{"-2": 3}', "partition must be a whole number >= 0, got -2"),
        ("[]", "must map partitions to offsets, got '[]'"),
        ('{"0": {"a": 1}}', "offset of partition 0 must be a whole number"),
        ("earliestt", "must be earliest, latest or"),
    ],
)
def test_offsets_json_names_each_partition_once_by_its_digits(value: str, message: str) -> None:
    """JSON keeps the last of two equal keys, and int() reads "00", "0_0" and "+0" as 0: a read given
    {"0": 1, "00": 2} started partition 0 at 2, and offset 1 was never read. Refused before any broker is
    asked, naming the option."""
    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        parse_options({"brokers": "a", "stream": "s", "startingOffsets": value, "endingOffsets": "latest"})
