"""Run one seed: start a cluster, create the streams, do the plan's steps with the oracle after each, then drain.

The seed stops at its first finding. Its step log goes to
``artifacts/chaos/<seed>.log`` when it fails, with the command that replays it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import DevServer, DevServerError, start_cluster
from liftbridge_provider.devserver.s3 import S3Server
from liftbridge_provider.hooks.liftbridge import CLIENTS
from tests.chaos import faults, runs, steps
from tests.chaos.batch import CONN_ID, BatchPath, BatchRun
from tests.chaos.delta import DeltaLake
from tests.chaos.lake import Lake
from tests.chaos.ledger import Ledger
from tests.chaos.observe import observe
from tests.chaos.oracle import Finding
from tests.chaos.plan import Plan, Step, make_plan
from tests.chaos.store import SeedStore, local_store, s3_store, store_of
from tests.chaos.timing import CallTimer
from tests.chaos.world import Timeouts, World

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "chaos"
DRAIN_RUN = 1000  # run numbers of the final drain runs
DRAIN_ATTEMPTS = 4


@dataclass
class SeedSettings:
    """Defaults are the bounded CI part: two such seeds take about 4 minutes with Spark's start."""

    steps: int = 24
    streams: int = 3
    wall_clock: float = 60.0  # seconds for the steps; the drain and final check come on top
    keep_going: bool = False  # record findings and go on (to list every failure a seed shows)
    store: str = "seed"  # where the lakes live: "seed" (even seeds on S3), "local" or "s3" (tests/chaos/store.py)
    timeouts: Timeouts = field(default_factory=Timeouts)


@dataclass
class SeedResult:
    seed: int
    findings: list[tuple[str, Finding]]  # (step, finding), in order
    failed_step: str | None
    steps_run: int
    seconds: float
    planned: int  # steps in the plan (a replay needs the same number)
    step_seconds: dict[str, list[float]]
    call_seconds: dict[str, list[float]]
    log: list[str]
    log_path: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.findings


def replay_command(seed: int, steps: int) -> str:
    return (
        f"make chaos SEED={seed} STEPS={steps}   "
        f"(or: .venv/bin/pytest tests/chaos --chaos-seed {seed} --chaos-steps {steps})"
    )


def run_seed(seed: int, settings: SeedSettings, spark: SparkSession, s3: S3Server) -> SeedResult:
    """Run ``seed`` start to end, its lakes on ``s3`` (a bucket of its own) or a local folder as
    :func:`~tests.chaos.store.store_of` says; never raises for what the oracle finds (``SeedResult.findings``)."""
    plan = make_plan(seed, settings.steps, streams=settings.streams)
    log: list[str] = []
    started = time.monotonic()
    step_seconds: dict[str, list[float]] = defaultdict(list)
    timer = CallTimer()
    findings: list[tuple[str, Finding]] = []
    index = 0
    with (
        tempfile.TemporaryDirectory(prefix=f"chaos-{seed}-") as folder,
        _cluster(Path(folder), log) as cluster,
    ):
        where = store_of(seed, settings.store)
        store = s3_store(s3) if where == "s3" else local_store(Path(folder) / "lakes")
        world = _new_world(seed, plan, settings=settings, cluster=cluster, store=store, spark=spark, timer=timer)
        try:
            _say(log, f"seed {seed}: {_describe(plan)}; brokers {cluster.brokers}; lakes {store.uri('*')}")
            for index, step in enumerate(plan.steps, start=1):
                if time.monotonic() - started > settings.wall_clock:
                    _say(log, f"wall-clock cap of {settings.wall_clock:g}s reached before step #{index}: draining")
                    break
                found = _do_step(world, step, index, log, step_seconds)
                findings += [(f"#{index:03d} {step}", f) for f in found]
                if found and not settings.keep_going:
                    break
            else:
                index = len(plan.steps) + 1
            if not findings or settings.keep_going:
                findings += [("final drain", f) for f in _drain(world, index, log, step_seconds)]
        finally:
            CLIENTS.close_all()
            world.client.close()
            if findings:
                _keep_node_logs(seed, Path(folder))
    seconds = time.monotonic() - started
    failed_step = findings[0][0] if findings else None
    result = SeedResult(
        seed,
        findings,
        failed_step,
        index,
        seconds,
        settings.steps,
        dict(step_seconds),
        dict(timer.seconds_by_kind),
        log,
    )
    _conclude(result)
    return result


def _cluster(folder: Path, log: list[str]) -> DevServer:
    """A fresh three-node cluster; a start that fails is tried once more (and logged): the launcher's
    readiness sometimes waits in vain for a node to join on a loaded machine."""
    try:
        return start_cluster(data_dir=folder / "cluster")
    except DevServerError as exc:
        _say(log, f"cluster start failed, trying once more: {str(exc).splitlines()[0]}")
        return start_cluster(data_dir=folder / "cluster-again")


def _new_world(
    seed: int,
    plan: Plan,
    *,
    settings: SeedSettings,
    cluster: DevServer,
    store: SeedStore,
    spark: SparkSession,
    timer: CallTimer,
) -> World:
    t = settings.timeouts
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(
        {
            "conn_type": "liftbridge",
            "host": ",".join(cluster.brokers),
            "extra": {"request_timeout": t.request, "resubscribe_wait": t.resubscribe_wait},
        }
    )
    client = LiftbridgeClient(
        cluster.brokers, request_timeout=t.request, resubscribe_wait=t.resubscribe_wait, ack_wait=t.ack_wait
    )
    lake = Lake(store, spark)
    shapes = {s.name: s for s in plan.shapes}
    for shape in plan.shapes:
        client.create_stream(shape.subject, shape.name, timeout=30, **shape.create_options())
    batch = BatchPath(cluster.brokers, timer, lake, t.request)
    delta = DeltaLake(store, spark)
    world = World(seed, cluster, client, timer, Ledger(), lake, batch, shapes, t, delta)
    world.calm_since = time.monotonic() - t.settle  # a fresh cluster is healthy
    return world


def _do_step(
    world: World, step: Step, index: int, log: list[str], step_seconds: dict[str, list[float]]
) -> list[Finding]:
    late_before = len(world.timer.late)
    started = time.monotonic()
    report = steps.execute(world, step, index)
    seconds = time.monotonic() - started
    step_seconds[step.kind].append(seconds)
    _say(log, f"#{index:03d} {step} -> {report.summary} [{seconds:.2f}s]")
    checked = time.monotonic()
    verdict = observe(world, index)
    step_seconds["oracle"].append(time.monotonic() - checked)
    findings = report.findings + verdict.findings
    findings += [Finding("deadline", o.describe()) for o in world.timer.late[late_before:]]
    removed = len(verdict.removed)
    _say(
        log,
        f"     oracle: {len(findings)} finding(s); {removed} acked offset(s) removed so far"
        + (f" ({_causes(verdict.removed)})" if removed else ""),
    )
    for note in verdict.notes + _crashes(world):
        _say(log, f"     note {note}")
    for finding in findings:
        _say(log, f"     FINDING {finding}")
    return findings


def _crashes(world: World) -> list[str]:
    """Notes for the servers that died on their own since the last step (a server defect, not a finding)."""
    world.impaired  # noqa: B018 - notices crashes that no call has run into yet
    notes = []
    for server_id in world.crashed:
        process = world.cluster.node(server_id).process
        lines = process.log_path.read_text(errors="replace").splitlines()
        fatal = [line for line in lines if line.startswith(("fatal error", "panic:", "[signal"))][:2]
        cause = " ".join(fatal) or "see its log"
        notes.append(f"SERVER CRASH {server_id} (exit {process.exit_code}): {cause}; restarted like a killed node")
    world.crashed.clear()
    return notes


def _drain(world: World, index: int, log: list[str], step_seconds: dict[str, list[float]]) -> list[Finding]:
    """Recover every node, then one run per stream to the end; the final oracle check must be clean."""
    started = time.monotonic()
    late_before = len(world.timer.late)
    findings: list[Finding] = []
    for report in (faults.thaw(world, Step("thaw"), index), faults.restart(world, Step("restart"), index)):
        findings += report.findings
        _say(log, f"drain: {report.summary}")
    time.sleep(world.timeouts.settle)
    for shape in world.shapes.values():
        run = world.run(shape.name, DRAIN_RUN)
        findings += _drain_run(world, run, index, log)
    for shape in world.shapes.values():  # every frozen range into the Delta table once more, shuffled
        report = runs.replay_delta(world, Step("delta", shape.name, mode="all"), index)
        findings += report.findings
        _say(log, f"drain: {report.summary}")
    verdict = observe(world, index, final=True)
    findings += verdict.findings
    findings += [Finding("deadline", o.describe()) for o in world.timer.late[late_before:]]
    step_seconds["drain"].append(time.monotonic() - started)
    _say(
        log,
        f"final: {len(world.ledger.acked)} acked, {len(verdict.removed)} removed"
        + (f" ({_causes(verdict.removed)})" if verdict.removed else "")
        + f", cursors {_cursors(world)}",
    )
    for note in verdict.notes:
        _say(log, f"     note {note}")
    for finding in findings:
        _say(log, f"     FINDING {finding}")
    return findings


def _drain_run(world: World, run: BatchRun, index: int, log: list[str]) -> list[Finding]:
    failures, restarts = 0, 0
    findings: list[Finding] = []
    while not run.done:
        task = run.next_task
        outcome = world.batch.run_task(run)
        _say(log, f"drain {run.run_id} {task}: {outcome.describe()}")
        if not outcome.ok:
            if world.impaired is not None and world.killed and restarts < faults.RESTART_ROUNDS:
                # a server died on its own after the drain's restart (seed 392: a v1.9.0 panic when it lost the
                # metadata leadership it had just won): restart it as a crash, and the cluster is healthy again
                restarts += 1
                report = faults.restart(world, Step("restart"), index)
                findings += report.findings
                _say(log, f"drain: {report.summary} (a server died during the drain)")
                time.sleep(world.timeouts.settle)
                continue
            failures += 1
            if failures >= DRAIN_ATTEMPTS:
                return [
                    *findings,
                    Finding(
                        "drain",
                        f"{run.run_id} {task} failed {failures} times on a healthy cluster: {outcome.describe()}",
                    ),
                ]
            time.sleep(1.0)
    return findings


def _conclude(result: SeedResult) -> None:
    """End the seed's log and keep it (passing seeds too: their notes say what was excused and why)."""
    if result.ok:
        _say(result.log, f"seed {result.seed}: passed in {result.seconds:.0f}s ({result.steps_run - 1} steps)")
    else:
        _say(result.log, f"seed {result.seed}: FAILED at {result.failed_step}: {result.findings[0][1]}")
        for step, finding in result.findings[1:]:
            _say(result.log, f"    also at {step}: {finding}")
        _say(result.log, f"replay: {replay_command(result.seed, result.planned)}")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    result.log_path = ARTIFACTS / f"{result.seed}.log"
    result.log_path.write_text("\n".join(result.log) + "\n")


def _keep_node_logs(seed: int, folder: Path) -> None:
    """Copy the servers' logs of a failing seed to ``artifacts/chaos/<seed>-nodes/`` (the cluster folder goes)."""
    target = ARTIFACTS / f"{seed}-nodes"
    shutil.rmtree(target, ignore_errors=True)
    for log_file in sorted(folder.glob("cluster*/*/*.log")):
        destination = target / log_file.parent.parent.name / log_file.parent.name / log_file.name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log_file, destination)


def _describe(plan: Plan) -> str:
    shapes = ", ".join(f"{s.name}({s.partitions}p RF{s.replication})" for s in plan.shapes)
    return f"streams {shapes}; {len(plan.steps)} steps"


def _causes(removed: dict[tuple[str, int, int], str]) -> str:
    counts: dict[str, int] = defaultdict(int)
    for cause in removed.values():
        counts[cause.split(" ", 1)[0]] += 1
    return ", ".join(f"{n} by {c}" for c, n in sorted(counts.items()))


def _cursors(world: World) -> str:
    return " ".join(f"{s}/{p}={o}" for (s, p), o in sorted(world.cursors.items()))


def _say(log: list[str], line: str) -> None:
    log.append(f"{time.strftime('%H:%M:%S')} {line}")
