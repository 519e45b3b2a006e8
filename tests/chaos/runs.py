"""The batch-path steps: advance a run by one task, fail its commit, clear and rerun it, run two at once."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from liftbridge_provider.core.ranges import RangesDocument
from tests.chaos.batch import BatchRun
from tests.chaos.delta import deadline, draw_documents
from tests.chaos.judging import StepReport, judge
from tests.chaos.oracle import Finding
from tests.chaos.plan import Step
from tests.chaos.timing import Outcome
from tests.chaos.world import World


def advance_run(world: World, step: Step, index: int) -> StepReport:
    run = world.run(step.stream, step.run)
    if run.done:
        return StepReport(f"{run.run_id} already done")
    return _task(world, run)


def fail_commit(world: World, step: Step, index: int) -> StepReport:
    run = world.run(step.stream, step.run)
    if run.next_task != "commit":
        return advance_run(world, step, index)
    return StepReport(f"{run.run_id}: commit task failed (worker lost before it ran); cursor not moved")


def clear_run(world: World, step: Step, index: int) -> StepReport:
    run = world.run(step.stream, step.run)
    run.clear()
    reports = _run_to_end(world, run)
    return StepReport(f"cleared {run.run_id}: " + " | ".join(r.summary for r in reports), _all(reports))


def concurrent_runs(world: World, step: Step, index: int) -> StepReport:
    runs = [world.run(step.stream, step.run), world.run(step.stream, step.run + 1)]
    results: dict[str, list[StepReport]] = {}

    def drive(run: BatchRun) -> None:
        results[run.run_id] = _run_to_end(world, run)

    threads = [threading.Thread(target=drive, args=(run,), name=f"chaos-{run.run_id}", daemon=True) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()  # every task inside is bounded by the timer
    reports = [r for run in runs for r in results.get(run.run_id, [])]
    summary = " || ".join(f"{rid}: " + " | ".join(r.summary for r in rs) for rid, rs in results.items())
    return StepReport(f"concurrent: {summary}", _all(reports))


def _run_to_end(world: World, run: BatchRun) -> list[StepReport]:
    reports = []
    while not run.done:
        report = _task(world, run)
        reports.append(report)
        if report.failed:
            break
    return reports


def _task(world: World, run: BatchRun) -> StepReport:
    task = run.next_task
    outcome = world.batch.run_task(run)
    if outcome.ok:
        return StepReport(f"{run.run_id} {task}: {_result(task, run, outcome)} [{outcome.seconds:.1f}s]")
    report = StepReport(f"{outcome.describe()} FAILED", failed=True)
    judge(world, report, outcome, batch_task=task, replication=run.shape.replication, stream=run.shape.name)
    return report


def _result(task: str, run: BatchRun, outcome: Outcome[Any]) -> str:
    if task == "freeze" and run.document is not None:
        return " ".join(f"{r.partition}:[{r.start},{r.end})" for r in run.document.ranges)
    if task == "ingest":
        return f"{sum(e['rows'] for e in outcome.value or [])} rows"
    if task == "commit":
        return f"cursors {run.committed}"
    return "ok"


def _all(reports: list[StepReport]) -> list[Finding]:
    return [f for r in reports for f in r.findings]


def replay_delta(world: World, step: Step, index: int) -> StepReport:
    """Ingest frozen documents of a stream into the seed's Delta table: shuffled, two at once, twice, or
    once more after a run that died before its commit."""
    shape = world.shapes[step.stream]
    rng = random.Random(world.seed * 100_003 + index)  # the same choices when the seed replays
    documents = draw_documents(rng, world.batch.frozen.get(shape.name, []), step.mode)
    if not documents:
        return StepReport(f"delta {step.mode}: nothing frozen yet for {shape.name}")
    options: dict[str, Any] = {
        "compacted": shape.compacted,
        "skip_data_loss": shape.removal == "retention",
        "timeout": world.timeouts.request,
    }
    brokers = world.cluster.brokers
    calls: list[tuple[str, RangesDocument, Callable[[], Any]]] = []
    lake = world.delta
    for number, document in enumerate(documents):
        ranges = " ".join(f"{r.partition}:[{r.start},{r.end})" for r in document.ranges if r.count)
        if step.mode == "crash":
            dying = partial(lake.ingest_dying_before_commit, brokers, document, **options)
            calls.append((f"dies before commit {ranges}", document, dying))
        calls.append((f"#{number} {ranges}", document, partial(lake.ingest, brokers, document, **options)))
        if step.mode == "retry":
            calls.append((f"again {ranges}", document, partial(lake.ingest, brokers, document, **options)))
    if step.mode == "concurrent":
        reports = _at_once(world, shape.name, calls)
    else:
        reports = [_delta_call(world, shape.name, *call) for call in calls]
    return StepReport(f"delta {step.mode} {shape.name}: " + " | ".join(r.summary for r in reports), _all(reports))


def _at_once(world: World, stream: str, calls: list[tuple[str, RangesDocument, Callable[[], Any]]]) -> list[StepReport]:
    reports: list[StepReport] = []
    threads = [
        threading.Thread(target=lambda c=call: reports.append(_delta_call(world, stream, *c)), daemon=True)
        for call in calls
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()  # every call inside is bounded by the timer
    return reports


def _delta_call(world: World, stream: str, what: str, document: RangesDocument, call: Callable[[], Any]) -> StepReport:
    outcome = world.timer.call(f"delta {stream} {what}", deadline(document, world.timeouts.request), call)
    if outcome.hung:
        world.lake.cancel()
    if outcome.ok:
        written = outcome.value if isinstance(outcome.value, list) else []
        return StepReport(f"{what}: {sum(e['rows'] for e in written)} rows [{outcome.seconds:.1f}s]")
    report = StepReport(f"{outcome.describe()} FAILED", failed=True)
    shape = world.shapes[stream]
    judge(world, report, outcome, batch_task="ingest", replication=shape.replication, stream=stream)
    return report
