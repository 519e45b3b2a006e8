"""The ingest job reads every piece of a run in one Spark job whose tasks cover all of them side by side.

A job per piece (one after another) leaves all but one executor idle; a second job to count a piece's rows
back doubles the work. Guarded for both lake formats, on the real server and Spark ``local[2]``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import DevServer
from liftbridge_provider.spark import ingest

PARTITIONS = 4


@pytest.fixture(scope="module")
def stream(liftbridge_server: DevServer) -> str:
    """Four partitions, offsets 0-299 each."""
    name = f"par-{uuid.uuid4().hex[:8]}"
    with LiftbridgeClient(liftbridge_server.brokers) as client:
        client.create_stream(name, name, partitions=PARTITIONS)
        batch = [PublishMessage(f"{p}-{n}".encode(), partition=p) for n in range(300) for p in range(PARTITIONS)]
        client.publish_batch(name, batch, ack_policy="all")
    return name


def jobs_and_tasks(spark: SparkSession, group: str) -> tuple[int, int]:
    tracker = spark.sparkContext.statusTracker()
    jobs = tracker.getJobIdsForGroup(group)
    tasks = 0
    for job in jobs:
        info = tracker.getJobInfo(job)
        assert info is not None
        for stage in info.stageIds:
            stage_info = tracker.getStageInfo(stage)
            tasks += stage_info.numTasks if stage_info is not None else 0
    return len(jobs), tasks


def run_in_group(spark: SparkSession, group: str, argv: list[str]) -> Any:
    spark.sparkContext.setJobGroup(group, group)
    try:
        return ingest.run(spark, ingest.parse_args(argv))
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]


@pytest.mark.parametrize("lake_format", ["parquet", "delta"])
def test_every_piece_of_a_run_is_read_in_one_spark_job_with_a_task_per_core_at_least(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path, lake_format: str
) -> None:
    """Four partitions, then a second run whose ranges around held middles give two pieces per partition:
    each run is one Spark job (no job per piece, no job to count rows back), with at least one task per
    piece and per core, and lands every offset once."""
    brokers = ",".join(liftbridge_server.brokers)
    output = tmp_path / "lake"
    middles = RangesDocument(stream, tuple(OffsetRange(p, 100, 200) for p in range(PARTITIONS)))
    whole = RangesDocument(stream, tuple(OffsetRange(p, 0, 300) for p in range(PARTITIONS)))
    for number, (document, pieces) in enumerate(((middles, PARTITIONS), (whole, 2 * PARTITIONS))):
        group = f"{lake_format}-{number}-{uuid.uuid4().hex[:6]}"
        argv = ["--brokers", brokers, "--ranges", document.dumps(), "--output", str(output), "--format", lake_format]
        outcome = run_in_group(spark, group, argv)
        assert outcome.problems == []
        jobs, tasks = jobs_and_tasks(spark, group)
        assert jobs == 1, f"run {number}: {jobs} Spark jobs"
        assert tasks >= max(pieces, spark.sparkContext.defaultParallelism)
    if lake_format == "parquet":
        offsets = spark.read.parquet(str(output / f"stream={stream}")).select("partition", "offset").collect()
    else:
        from deltalake import DeltaTable  # noqa: PLC0415

        offsets = DeltaTable(str(output)).to_pyarrow_table(columns=["partition", "offset"]).to_pylist()
    seen = sorted((row["partition"], row["offset"]) for row in offsets)
    assert seen == [(p, o) for p in range(PARTITIONS) for o in range(300)]


def write_plans(spark: SparkSession, since: int) -> list[str]:
    """The physical plans of the file writes Spark ran after its first ``since`` SQL executions: Spark's own
    writes, and the Parquet staging job whose tasks write the pieces themselves (``MapInArrow``)."""
    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    plans = [executions.apply(i).physicalPlanDescription() for i in range(since, executions.size())]
    return [plan for plan in plans if "InsertIntoHadoopFsRelationCommand" in plan or "MapInArrow" in plan]


def executions_so_far(spark: SparkSession) -> int:
    return int(spark._jsparkSession.sharedState().statusStore().executionsList().size())


@pytest.mark.parametrize("lake_format", ["parquet", "delta"])
def test_a_run_writes_its_rows_unsorted_and_leaves_the_sessions_settings_as_they_were(
    spark: SparkSession, liftbridge_server: DevServer, stream: str, tmp_path: Path, lake_format: str
) -> None:
    """Every task of a run reads one piece, so its rows already share their partition folder: the write must
    not sort them first (a copy of every row, the job's largest cost above a plain read and write). The
    settings that turn the sort off hold only while the run writes: the session's own values come back."""
    brokers = ",".join(liftbridge_server.brokers)
    document = RangesDocument(stream, tuple(OffsetRange(p, 0, 300) for p in range(PARTITIONS)))
    argv = ["--brokers", brokers, "--ranges", document.dumps(), "--output", str(tmp_path / "lake")]
    writers = "spark.sql.maxConcurrentOutputFileWriters"
    assert spark.conf.get(writers, None) is None, "the session's own value: not set"
    since = executions_so_far(spark)
    outcome = ingest.run(spark, ingest.parse_args([*argv, "--format", lake_format]))
    assert outcome.problems == []
    plans = write_plans(spark, since)
    assert plans, "the run wrote no files"
    for plan in plans:
        assert "Sort" not in plan, f"the write sorted its rows:\n{plan}"
    assert spark.conf.get(writers, None) is None, "the session's own value came back"
