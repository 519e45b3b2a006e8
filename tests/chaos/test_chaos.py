"""The randomized fault harness against a real three-node cluster and real Spark.

Each seed starts a cluster with cursors on, creates a few streams of
different shapes, and runs a plan of steps drawn from the seed: publishes,
leader kills and restarts, frozen nodes, readonly, pause, waits for the
cleaner, and the batch path (freeze, wait, Spark ingest into a Parquet lake,
commit), including concurrent runs, a cleared re-run after a failed commit and
drivers that die at each step of an ingest; even seeds keep their lakes on a
real S3 gateway (tests/chaos/store.py). The oracle (tests/chaos/oracle.py) checks after every step. A failing
seed prints itself, its step and how to replay it; its log is kept in
artifacts/chaos/<seed>.log. How to run: docs/reliability.md.
"""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from liftbridge_provider.devserver.s3 import S3Server
from tests.chaos.conftest import RESULTS
from tests.chaos.runner import SeedSettings, replay_command, run_seed


@pytest.mark.cluster
def test_chaos_seed(
    chaos_seed: int, chaos_settings: SeedSettings, chaos_spark: SparkSession, s3_server: S3Server
) -> None:
    """Every fault the batch path can meet (lost leaders, frozen nodes, paused, readonly and compacted partitions,
    failed commits, re-runs, drivers killed at each step of an ingest, lakes on a local disk or an S3 store
    whose rename is a copy): the oracle stays clean through the seed's faults."""
    result = run_seed(chaos_seed, chaos_settings, chaos_spark, s3_server)
    RESULTS.append(result)
    if not result.ok:
        shown = "\n  ".join(f"{step}: {finding}" for step, finding in result.findings[:10])
        pytest.fail(
            f"seed {chaos_seed} failed at {result.failed_step}:\n  {shown}\n"
            f"replay: {replay_command(chaos_seed, result.planned)}\nstep log: {result.log_path}",
            pytrace=False,
        )
