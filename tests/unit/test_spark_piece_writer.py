"""The function each staging task runs (spark/piece_writer.stage_pieces), fed Arrow batches as Spark's
``mapInArrow`` feeds them, writing to a temporary folder: each piece becomes one whole Parquet object of its
own attempt's name, with exactly its rows, and what it returns matches what it wrote. No Spark here; the ingest
tests run it inside Spark against the lake."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from liftbridge_provider.spark.piece_writer import StagingTarget, piece_runs, stage_pieces


def batch(rows: list[tuple[int, int, int]]) -> pa.RecordBatch:
    """Rows of (partition, claim tag, offset), with a value column as the source has."""
    return pa.RecordBatch.from_pydict(
        {
            "value": [b"v%d" % offset for _, _, offset in rows],
            "partition": pa.array([p for p, _, _ in rows], pa.int32()),
            "offset": pa.array([o for _, _, o in rows], pa.int64()),
            "claim": pa.array([c for _, c, _ in rows], pa.int64()),
        }
    )


def target(folder: Path) -> StagingTarget:
    return StagingTarget(str(folder), "_staging/run1", "claim")


def visible(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_each_piece_is_one_object_with_its_rows_and_the_returned_stats_match_it(tmp_path: Path) -> None:
    """Two pieces of partition 0 and one of 1, the first spread over two batches and one batch holding two
    pieces: three objects, the tag column not written, every offset in the object of its own piece."""
    batches = [
        batch([(0, 7, 0), (0, 7, 1)]),
        batch([(0, 7, 2), (0, 8, 3), (0, 8, 4)]),
        batch([]),
        batch([(1, 7, 10)]),
    ]
    (out,) = list(stage_pieces(target(tmp_path))(iter(batches)))
    returned = {(r["partition"], r["claim"]): r for r in out.to_pylist()}
    assert set(returned) == {(0, 7), (0, 8), (1, 7)}
    expected = {(0, 7): [0, 1, 2], (0, 8): [3, 4], (1, 7): [10]}
    for key, offsets in expected.items():
        row = returned[key]
        assert row["path"].startswith(f"_staging/run1/p={key[0]}-claim={key[1]}-")
        local = tmp_path / row["path"].removeprefix("_staging/run1/")
        table = pq.read_table(local)
        assert table.column_names == ["value", "partition", "offset"], "the tag column is not written"
        assert table.column("offset").to_pylist() == offsets
        assert (row["rows"], row["min_offset"], row["max_offset"]) == (len(offsets), min(offsets), max(offsets))
        assert row["bytes"] == local.stat().st_size
    assert len(visible(tmp_path)) == 3, f"one object per piece, nothing else: {visible(tmp_path)}"


def test_a_task_that_fails_part_way_leaves_no_object_and_returns_nothing(tmp_path: Path) -> None:
    """A task whose read breaks after it began writing: the error reaches Spark (which retries the task), the
    half-written object is not left under a name a listing or the driver would take."""

    def breaking() -> Iterator[pa.RecordBatch]:
        yield batch([(0, 7, 0), (0, 7, 1)])
        raise ConnectionError("the read broke")

    with pytest.raises(ConnectionError):
        list(stage_pieces(target(tmp_path))(breaking()))
    assert visible(tmp_path) == []


def test_two_attempts_of_a_task_write_objects_of_their_own_names(tmp_path: Path) -> None:
    """A retried or speculative attempt never overwrites what another attempt wrote: the driver commits the
    object named in the returned row of the attempt Spark kept."""
    rows = [(0, 7, 0), (0, 7, 1)]
    (first,) = list(stage_pieces(target(tmp_path))(iter([batch(rows)])))
    (second,) = list(stage_pieces(target(tmp_path))(iter([batch(rows)])))
    assert first.to_pylist()[0]["path"] != second.to_pylist()[0]["path"]
    assert len(visible(tmp_path)) == 2


def test_a_task_with_no_rows_writes_and_returns_nothing(tmp_path: Path) -> None:
    assert list(stage_pieces(target(tmp_path))(iter([batch([])]))) == []
    assert visible(tmp_path) == []


def test_a_batch_is_cut_where_its_partition_or_its_piece_changes() -> None:
    """The runs are found over whole columns: a change of partition alone, of piece alone, or of both, and a
    batch of one row."""
    rows = [(0, 7, 0), (0, 7, 1), (1, 7, 5), (1, 8, 6), (2, 9, 9), (2, 9, 10)]
    runs = [(key, part.column("offset").to_pylist()) for key, part in piece_runs(batch(rows), "claim")]
    assert runs == [((0, 7), [0, 1]), ((1, 7), [5]), ((1, 8), [6]), ((2, 9), [9, 10])]
    assert all("claim" not in part.schema.names for _, part in piece_runs(batch(rows), "claim"))
    assert [key for key, _ in piece_runs(batch([(3, 1, 4)]), "claim")] == [(3, 1)]
