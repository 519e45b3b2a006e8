"""The randomized fault harness against a real three-node cluster and real Spark.

Each seed starts a cluster with cursors on, creates a few streams of
different shapes, and runs a plan of steps drawn from the seed: publishes,
leader kills and restarts, frozen nodes, readonly, pause, waits for the
cleaner, and the batch path (freeze, wait, Spark ingest into a Parquet lake,
commit), including concurrent runs and a cleared re-run after a failed
commit. The oracle (tests/chaos/oracle.py) checks after every step. A failing
seed prints itself, its step and how to replay it; its log is kept in
artifacts/chaos/<seed>.log. How to run: docs/reliability.md.
"""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from tests.chaos.conftest import RESULTS
from tests.chaos.runner import SeedSettings, replay_command, run_seed


@pytest.mark.cluster
def test_chaos_seed(chaos_seed: int, chaos_settings: SeedSettings, chaos_spark: SparkSession) -> None:
    """Every fault the batch path can meet (lost leaders, frozen nodes, paused, readonly and compacted partitions,
    failed commits, re-runs): the oracle stays clean through the seed's faults."""
    result = run_seed(chaos_seed, chaos_settings, chaos_spark)
    RESULTS.append(result)
    if not result.ok:
        shown = "\n  ".join(f"{step}: {finding}" for step, finding in result.findings[:10])
        pytest.fail(
            f"seed {chaos_seed} failed at {result.failed_step}:\n  {shown}\n"
            f"replay: {replay_command(chaos_seed, result.planned)}\nstep log: {result.log_path}",
            pytrace=False,
        )
