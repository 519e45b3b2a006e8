"""The batch-path steps: advance a run by one task, fail its commit, clear and rerun it, run two at once."""

from __future__ import annotations

import threading
from typing import Any

from tests.chaos.batch import BatchRun
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
