"""The ``crash`` step: a Parquet ingest whose driver dies at one step of claim, stage, commit, publish, compact.

The run is the ingest job's own ``run`` on the seed's lake (a local folder or an S3 bucket). Its driver
"dies" at the drawn point: a fault point of the job (``fault_points.reached``) raises
:class:`~tests.chaos.delta.DriverDied`, and from then on no request of that run reaches the store (the
store is wrapped in :class:`DyingStore`), as after a SIGKILL; its other threads die at their next request.
``mid-rename`` dies inside the first publish, after the copy and before the delete: the state a crash in the
middle of S3A's rename leaves (CopyObject done, DeleteObject not), which on a local disk is a crash between
``link`` and ``unlink``. Half the steps run the same ranges again at once (the next run must finish what the
dead one left); otherwise the batch run that owns the ranges, or the drain, meets what it left. The oracle then
checks, as after every step, that no offset is in the lake twice, every row is what was published and lies in
its range, and nothing below a committed cursor is missing.
"""

from __future__ import annotations

import random
import threading
from contextlib import ExitStack, suppress
from functools import partial
from typing import Any

from liftbridge_provider import fault_points
from liftbridge_provider.core.ranges import RangesDocument
from liftbridge_provider.spark.lake_store import CountingStore, HadoopStore
from tests.chaos.batch import TASKS, BatchRun
from tests.chaos.delta import DriverDied, deadline
from tests.chaos.judging import StepReport, judge
from tests.chaos.plan import CRASH_JOB_POINTS as JOB_POINTS
from tests.chaos.plan import MID_RENAME, Step
from tests.chaos.store import SeedStore
from tests.chaos.world import World

INGEST = TASKS.index("ingest")


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
    """Ingest ranges of ``step.stream`` with the driver dying at ``step.mode``; then maybe the next run."""
    shape = world.shapes[step.stream]
    rng = random.Random(world.seed * 100_019 + index)  # the same choice when the seed replays
    document = _pick(rng, world, step.stream)
    if document is None:
        return StepReport(f"crash {step.mode}: nothing frozen yet for {shape.name}")
    ranges = " ".join(f"{r.partition}:[{r.start},{r.end})" for r in document.ranges if r.count)
    options: dict[str, Any] = {
        "compacted": shape.compacted,
        "skip_data_loss": shape.removal == "retention",
        "request_timeout": world.timeouts.request,
    }
    seconds = deadline(document, world.timeouts.request)
    dying = partial(_dying_run, world, document, step.mode, options)
    outcome = world.timer.call(f"crash {shape.name} at {step.mode} {ranges}", seconds, dying)
    if outcome.hung:
        world.lake.cancel()
    if not outcome.ok:
        report = StepReport(f"crash {step.mode} {ranges}: {outcome.describe()} FAILED before it died", failed=True)
        judge(world, report, outcome, batch_task="ingest", replication=shape.replication, stream=shape.name)
        return report
    died = outcome.value or "the end (the point was not reached)"
    summary = f"crash {shape.name} {ranges}: died at {died} [{outcome.seconds:.1f}s]"
    if not step.flag:
        return StepReport(summary)
    again = partial(world.lake.ingest, world.cluster.brokers, document, **options)
    rerun = world.timer.call(f"after crash {shape.name} {ranges}", seconds, again)
    if rerun.hung:
        world.lake.cancel()
    if rerun.ok:
        rows = sum(e["rows"] for e in rerun.value or [])
        return StepReport(f"{summary} | next run: {rows} rows [{rerun.seconds:.1f}s]")
    report = StepReport(f"{summary} | next run: {rerun.describe()} FAILED", failed=True)
    judge(world, report, rerun, batch_task="ingest", replication=shape.replication, stream=shape.name)
    return report


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


def _pick(rng: random.Random, world: World, stream: str) -> RangesDocument | None:
    """A frozen document of ``stream`` whose run has not ingested it yet if there is one (the crash then
    claims offsets nobody wrote), else any frozen one (the crash then finds them written)."""
    pending = [run.document for run in _runs(world, stream) if run.document is not None and run.stage <= INGEST]
    pending = [d for d in pending if d.total > 0]
    frozen = [d for d in world.batch.frozen.get(stream, []) if d.total > 0]
    choices = pending or frozen
    return rng.choice(choices) if choices else None


def _runs(world: World, stream: str) -> list[BatchRun]:
    return [run for (name, _), run in sorted(world.runs.items()) if name == stream]
