"""The ``crash`` step: a batch run's ingest task whose driver dies at one step of claim, stage, commit, publish,
compact.

The step takes run N of a stream (the plan's, as for ``run`` steps), freezes and waits first if it has not,
then runs its ingest task, the ingest job's own ``run`` on the seed's lake (a local folder or an S3 bucket),
with the driver dying at the drawn point: a fault point of the job (``fault_points.reached``) raises
:class:`~tests.chaos.delta.DriverDied`, and from then on no request of that run reaches the store (the store
is wrapped in :class:`DyingStore`), as after a SIGKILL; its other threads die at their next request.
``mid-rename`` dies inside the first publish, after the copy and before the delete: the state a crash in the
middle of S3A's rename leaves (CopyObject done, DeleteObject not), which on a local disk is a crash between
``link`` and ``unlink``. The task stays failed: half the steps retry it at once (as Airflow's retry would),
the others leave the retry to a later ``run`` step of the same run, or the drain's run meets what it left. The
oracle then checks, as after every step, that no offset is in the lake twice, every row is what was
published and lies in its range, and nothing below a committed cursor is missing.
"""

from __future__ import annotations

import dataclasses
import threading
from contextlib import ExitStack, suppress
from functools import partial
from typing import Any

from liftbridge_provider import fault_points
from liftbridge_provider.core.ranges import RangesDocument
from liftbridge_provider.spark.lake_store import CountingStore, HadoopStore
from tests.chaos import runs
from tests.chaos.batch import TASKS
from tests.chaos.delta import DriverDied, deadline
from tests.chaos.judging import StepReport, judge
from tests.chaos.oracle import Finding
from tests.chaos.plan import CRASH_JOB_POINTS as JOB_POINTS
from tests.chaos.plan import MID_RENAME, Step
from tests.chaos.store import SeedStore
from tests.chaos.world import World

INGEST = TASKS.index("ingest")
# Run numbers of the crash steps' own runs (OWN_RUNS + the step's index; the drain's are 1000 on): a crash
# step whose planned run is past its ingest freezes a run of its own from the cursor and kills its ingest.
# Such a run never commits: its ranges overlap the next planned run's, which lands and commits them, so two
# runs never commit different ranges from one cursor (one writer per cursor).
OWN_RUNS = 500


class Death:
    """When the run died (the first point that fired), shared by its threads."""

    def __init__(self, point: str) -> None:
        self.point = point
        self.died: str | None = None
        self._lock = threading.Lock()

    def die(self, where: str) -> None:
        with self._lock:
            self.died = self.died or where
        raise DriverDied(where)

    def check(self, what: str) -> None:
        """Raise when the run died already: a dead driver makes no more requests."""
        if self.died is not None:
            raise DriverDied(f"{what} after the death at {self.died}")

    def at_point(self, name: str) -> None:
        if name == self.point:
            self.die(name)
        self.check(name)


class DyingStore(CountingStore):
    """The job's lake store in a driver that dies: no request after the death; ``mid-rename`` copies the first
    published object to its final key, then dies before the source is deleted."""

    def __init__(self, store: HadoopStore, seed_store: SeedStore, death: Death) -> None:
        super().__init__(store)
        self.seed_store = seed_store
        self.death = death

    def __getattr__(self, name: str) -> Any:
        self.death.check(name)
        return getattr(self.store, name)

    def list_names(self, folder: str) -> list[str]:
        self.death.check("list")
        return super().list_names(folder)

    def read(self, path: str) -> bytes:
        self.death.check("read")
        return super().read(path)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        self.death.check("create")
        return super().create_exclusive(path, data)

    def delete_files(self, folder: str, names: Any) -> None:
        self.death.check("delete")
        super().delete_files(folder, names)

    def object_size(self, path: str) -> int | None:
        self.death.check("size")
        return super().object_size(path)

    def rename(self, source: str, target: str) -> bool:
        self.death.check("rename")
        if self.death.point == MID_RENAME:
            size = self.store.object_size(source)
            if size is not None and size >= 0:
                self.seed_store.copy(source, target)
                self.death.die(MID_RENAME)
        return super().rename(source, target)


def crash_ingest(world: World, step: Step, index: int) -> StepReport:
    """Run ``step.run`` of ``step.stream`` up to its ingest (freeze and wait first, if not done yet), then its
    ingest task with the driver dying at ``step.mode``; with ``step.flag``, the task's retry at once. When that
    run is past its ingest, a run of the step's own takes its place."""
    shape = world.shapes[step.stream]
    run = world.run(step.stream, step.run)
    if run.stage > INGEST:  # past its ingest: a run of the step's own, which never commits (see OWN_RUNS)
        step = dataclasses.replace(step, run=OWN_RUNS + index)
        run = world.run(step.stream, step.run)
    before: list[StepReport] = []
    while run.next_task in ("freeze", "wait"):
        before.append(runs.advance_run(world, step, index))
        if before[-1].failed:
            return StepReport(" | ".join(r.summary for r in before), _findings(before))
    assert run.document is not None
    document = run.document
    ranges = " ".join(f"{r.partition}:[{r.start},{r.end})" for r in document.ranges if r.count) or "nothing"
    options: dict[str, Any] = {
        "compacted": shape.compacted,
        "skip_data_loss": shape.removal == "retention",
        "request_timeout": world.timeouts.request,
    }
    dying = partial(_dying_run, world, document, step.mode, options)
    seconds = deadline(document, world.timeouts.request)
    outcome = world.timer.call(f"crash {run.run_id} at {step.mode} {ranges}", seconds, dying)
    if outcome.hung:
        world.lake.cancel()
    done = [r.summary for r in before]
    if not outcome.ok:
        died_early = f"crash {ranges}: {outcome.describe()} FAILED before it died"
        report = StepReport(" | ".join([*done, died_early]), failed=True)
        judge(world, report, outcome, batch_task="ingest", replication=shape.replication, stream=shape.name)
        return report
    died = outcome.value or "the end (the point was not reached)"
    done.append(f"{run.run_id} ingest {ranges}: driver died at {died} [{outcome.seconds:.1f}s]")
    if not step.flag:
        return StepReport(" | ".join(done), _findings(before))
    retry = runs.advance_run(world, step, index)  # the ingest task's retry (its stage did not move)
    return StepReport(" | ".join([*done, f"retry: {retry.summary}"]), _findings([*before, retry]), retry.failed)


def _findings(reports: list[StepReport]) -> list[Finding]:
    return [f for r in reports for f in r.findings]


def _dying_run(world: World, document: RangesDocument, point: str, options: dict[str, Any]) -> str | None:
    """The ingest with the driver dying at ``point``: where it died, or None when it ended first."""
    death = Death(point)
    store = DyingStore(HadoopStore(world.lake.spark, world.lake.root), world.lake.store, death)
    with ExitStack() as armed:
        for name in JOB_POINTS:
            armed.enter_context(fault_points.armed(name, death.at_point))
        with suppress(DriverDied):
            world.lake.ingest(world.cluster.brokers, document, lake_store=store, **options)
    return death.died
