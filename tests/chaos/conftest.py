"""Options, seeds and the one SparkSession of the chaos harness; a summary of the seeds at the end.

Seeds: ``--chaos-seed S`` (or ``CHAOS_SEED``) replays one seed; otherwise
``--chaos-seeds N`` (``CHAOS_SEEDS``, default 2: the bounded CI part) seeds
from ``--chaos-base-seed B`` (``CHAOS_BASE_SEED``, default 1): B, B+1, ...
``--chaos-steps`` (``CHAOS_STEPS``) and ``--chaos-wall-clock``
(``CHAOS_WALL_CLOCK``, seconds) bound each seed. ``--chaos-store``
(``CHAOS_STORE``: ``seed``, the default, puts even seeds' lakes on the S3
gateway and odd seeds' on a local disk; ``local``; ``s3``) says where.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections import defaultdict

import pytest
from pyspark.sql import SparkSession

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import start_single
from tests.chaos.lake import Lake
from tests.chaos.runner import SeedResult, SeedSettings, replay_command
from tests.chaos.store import local_store

CI_SEEDS = 2
RESULTS: list[SeedResult] = []
OPTIONS = {
    "--chaos-seed": ("CHAOS_SEED", None, "replay this one seed"),
    "--chaos-seeds": ("CHAOS_SEEDS", CI_SEEDS, "how many seeds to run (default: the bounded CI part)"),
    "--chaos-base-seed": ("CHAOS_BASE_SEED", 1, "the first seed; the others follow it"),
    "--chaos-steps": ("CHAOS_STEPS", SeedSettings.steps, "steps per seed"),
    "--chaos-wall-clock": ("CHAOS_WALL_CLOCK", SeedSettings.wall_clock, "seconds of steps per seed"),
    "--chaos-keep-going": ("CHAOS_KEEP_GOING", 0, "1: record findings and go on to the end of the seed"),
    "--chaos-store": ("CHAOS_STORE", "seed", "where the lakes live: seed (even seeds on S3), local or s3"),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("chaos", "randomized fault harness (tests/chaos)")
    for flag, (env, default, text) in OPTIONS.items():
        group.addoption(flag, default=None, help=f"{text} (env {env}, default {default})")


def _text(config: pytest.Config, flag: str) -> str | None:
    env, default, _ = OPTIONS[flag]
    value = config.getoption(flag, default=None) or os.environ.get(env) or default
    return None if value is None else str(value)


def _option(config: pytest.Config, flag: str) -> float | None:
    value = _text(config, flag)
    return None if value is None else float(value)


def chaos_seeds(config: pytest.Config) -> list[int]:
    one = _option(config, "--chaos-seed")
    if one is not None:
        return [int(one)]
    base, count = int(_option(config, "--chaos-base-seed") or 1), int(_option(config, "--chaos-seeds") or 0)
    return list(range(base, base + count))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "chaos_seed" in metafunc.fixturenames:
        seeds = chaos_seeds(metafunc.config)
        metafunc.parametrize("chaos_seed", seeds, ids=[f"seed-{s}" for s in seeds])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A seed may take its wall clock, then drain (Spark ingests, retries, a hung call's wait): 10 minutes more."""
    wall_clock = _option(config, "--chaos-wall-clock") or SeedSettings.wall_clock
    for item in items:
        if "chaos_seed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(wall_clock + 600))


@pytest.fixture(scope="session")
def chaos_settings(pytestconfig: pytest.Config) -> SeedSettings:
    return SeedSettings(
        steps=int(_option(pytestconfig, "--chaos-steps") or SeedSettings.steps),
        wall_clock=float(_option(pytestconfig, "--chaos-wall-clock") or SeedSettings.wall_clock),
        keep_going=bool(_option(pytestconfig, "--chaos-keep-going")),
        store=_text(pytestconfig, "--chaos-store") or "seed",
    )


@pytest.fixture(scope="module")
def chaos_spark(s3a_spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SparkSession:
    """The session's SparkSession (tests/spark_session.py) with S3A on the session's gateway
    (tests/object_store.py), warmed up by a first real ingest.

    The first read through the Python data source starts Spark's Python workers
    and takes half a minute; warming up keeps that out of the seeds' deadlines.
    """
    session = s3a_spark
    session.sparkContext.setLogLevel("ERROR")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO lines at exit land on closed streams
    with start_single() as server, LiftbridgeClient(server.brokers) as client:
        client.create_stream("chaos.warmup", "warmup")
        client.publish("warmup", b"warm", timeout=10)
        document = RangesDocument("warmup", (OffsetRange(0, 0, 1),))
        Lake(local_store(tmp_path_factory.mktemp("chaos-warmup")), session).ingest(
            server.brokers, document, compacted=False, skip_data_loss=False, request_timeout=10
        )
    return session


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not RESULTS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("chaos seeds")
    for result in RESULTS:
        status = "ok" if result.ok else f"FAILED at {result.failed_step}: {result.findings[0][1]}"
        write(f"seed {result.seed}: {result.seconds:.0f}s, {result.steps_run - 1} steps, {status}")
        for step, finding in result.findings[1:]:
            write(f"    also at {step}: {finding}")
        if not result.ok:
            write(f"    replay: {replay_command(result.seed, result.planned)}; log {result.log_path}")
    write(_table("seconds per step kind", [r.step_seconds for r in RESULTS]))
    write(_table("seconds per call kind", [r.call_seconds for r in RESULTS]))


def _table(title: str, samples: list[dict[str, list[float]]]) -> str:
    merged: dict[str, list[float]] = defaultdict(list)
    for sample in samples:
        for kind, values in sample.items():
            merged[kind] += values
    lines = [f"{title}: kind count mean max"]
    for kind, values in sorted(merged.items()):
        lines.append(f"    {kind:<20} {len(values):>5} {statistics.fmean(values):>7.2f} {max(values):>7.2f}")
    return "\n".join(lines)
