"""What each kind of step does to the world; each returns a one-line summary and what it found broken.

A step's own findings are failures the oracle cannot see in the data: a
permanent error (bad-input class) where none is due, a call that failed on a
healthy cluster, a sensor that never saw a high watermark it should.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from liftbridge_provider.client import (
    BatchResult,
    InvalidArgumentError,
    PublishMessage,
    ReadonlyPartitionError,
    partition_by_key,
)
from tests.chaos.batch import BatchRun
from tests.chaos.lake import IngestFailed
from tests.chaos.ledger import Sent
from tests.chaos.oracle import Finding
from tests.chaos.plan import Step
from tests.chaos.timing import Outcome
from tests.chaos.world import World

PERMANENT_NAMES = ("InvalidArgumentError", "AirflowFailException")


@dataclass
class StepReport:
    summary: str
    findings: list[Finding] = field(default_factory=list)


def execute(world: World, step: Step, index: int) -> StepReport:
    """Do ``step`` (the ``index``-th of the seed) and say what happened."""
    handlers: dict[str, Callable[[World, Step, int], StepReport]] = {
        "publish": publish,
        "kill_leader": kill_leader,
        "restart": restart,
        "freeze": freeze,
        "thaw": thaw,
        "readonly": readonly,
        "pause": pause,
        "wait": wait,
        "run": advance_run,
        "fail_commit": fail_commit,
        "clear": clear_run,
        "concurrent": concurrent_runs,
    }
    return handlers[step.kind](world, step, index)


# -- publishing ------------------------------------------------------------------


def _messages(world: World, step: Step, index: int) -> list[Sent]:
    shape = world.shapes[step.stream]
    rng = random.Random(f"{world.seed}/{index}")
    keys = shape.keys or 10
    return [
        Sent(
            step.stream,
            f"k{rng.randrange(keys)}".encode() if step.flag else None,
            f"s{world.seed}/{index}/{i}".encode(),
        )
        for i in range(step.count)
    ]


def publish(world: World, step: Step, index: int) -> StepReport:
    messages = _messages(world, step, index)
    for message in messages:
        world.ledger.record_sent(message)
    if step.mode == "sync":
        acked, problem = _publish_sync(world, step, messages)
    else:
        acked, problem = _publish_batch(world, step, messages)
    summary = f"{acked}/{len(messages)} acked" + (f"; {problem.describe()}" if problem else "")
    report = StepReport(summary)
    if problem is not None and problem.error is not None and not _readonly_only(world, step, problem.error):
        _judge(world, report, problem)
    return report


def _readonly_only(world: World, step: Step, error: BaseException) -> bool:
    """Whether every failure of a publish is "readonly partition" on a partition made readonly by a step."""
    result = getattr(error, "result", None)
    errors = [f.error for f in result.failures] if isinstance(result, BatchResult) else [error]
    return all(isinstance(e, ReadonlyPartitionError) and (step.stream, e.partition) in world.readonly for e in errors)


def _publish_sync(world: World, step: Step, messages: list[Sent]) -> tuple[int, Outcome[Any] | None]:
    shape, t = world.shapes[step.stream], world.timeouts
    acked = 0
    for message in messages:

        def send(message: Sent = message) -> Any:
            return world.client.publish(
                step.stream,
                message.value,
                key=message.key,
                partition=None if step.flag else step.partition,
                partitioner=partition_by_key if step.flag else None,
                ack_policy=shape.ack_policy,
                timeout=t.publish,
            )

        outcome = world.timer.call(f"publish {step.stream}", t.publish, send)
        if not outcome.ok:
            if outcome.hung or getattr(outcome.error, "may_be_stored", False):
                world.ledger.record_maybe(message)
            return acked, outcome  # the rest is not sent
        ack = outcome.value
        assert ack is not None, f"no ack with ack policy {shape.ack_policy}"
        world.ledger.record_ack(message, ack.partition, ack.offset)
        acked += 1
    return acked, None


def _publish_batch(world: World, step: Step, messages: list[Sent]) -> tuple[int, Outcome[Any] | None]:
    shape, t = world.shapes[step.stream], world.timeouts
    batch = [PublishMessage(m.value, key=m.key, partition=None if step.flag else step.partition) for m in messages]

    def send() -> BatchResult:
        return world.client.publish_batch(
            step.stream,
            batch,
            partitioner=partition_by_key if step.flag else None,
            ack_policy=shape.ack_policy,
            ack_wait=t.ack_wait,
            timeout=t.batch,
        )

    outcome = world.timer.call(f"publish_batch {step.stream}", t.batch, send)
    result = outcome.value if outcome.ok else getattr(outcome.error, "result", None)
    if not isinstance(result, BatchResult):
        for message in messages:  # nothing known about any message
            if outcome.hung or getattr(outcome.error, "may_be_stored", True):
                world.ledger.record_maybe(message)
        return 0, outcome
    acked = 0
    for message, ack in zip(messages, result.acks, strict=True):
        if ack is not None:
            world.ledger.record_ack(message, ack.partition, ack.offset)
            acked += 1
    for failure in result.failures:
        if failure.error.may_be_stored:
            world.ledger.record_maybe(messages[failure.index])
    return acked, None if outcome.ok else outcome


# -- faults ----------------------------------------------------------------------


def _leader(world: World, stream: str, partition: int) -> str | None:
    try:
        return world.cluster.partition_leaders(stream).get(partition)
    except Exception:
        return None


def kill_leader(world: World, step: Step, index: int) -> StepReport:
    if world.killed or world.cluster.frozen:
        return StepReport("skipped: a node is already down or frozen")
    leader = _leader(world, step.stream, step.partition or 0)
    if leader is None:
        return StepReport("skipped: no leader known")
    world.cluster.kill(leader)
    world.killed.append(leader)
    return StepReport(f"SIGKILL {leader} (leader of {step.stream}/{step.partition})")


def restart(world: World, step: Step, index: int) -> StepReport:
    report = StepReport("")
    for server_id in list(world.killed):
        started = time.monotonic()
        try:
            world.cluster.restart(server_id, timeout=60)
        except Exception as exc:
            report.findings.append(Finding("restart", f"{server_id} did not rejoin: {exc}"))
            continue
        world.killed.remove(server_id)
        report.summary += f"restarted {server_id} in {time.monotonic() - started:.1f}s "
    world.calm_since = time.monotonic()
    report.summary = report.summary.strip() or "nothing to restart"
    return report


def freeze(world: World, step: Step, index: int) -> StepReport:
    if world.killed or world.cluster.frozen:
        return StepReport("skipped: a node is already down or frozen")
    leader = _leader(world, step.stream, step.partition or 0)
    if leader is None:
        return StepReport("skipped: no leader known")
    others = sorted(n.server_id for n in world.cluster.nodes if n.server_id != leader)
    target = leader if step.flag else random.Random(f"{world.seed}/{index}").choice(others)
    world.cluster.freeze(target)
    role = "leader" if target == leader else "not the leader"
    return StepReport(f"SIGSTOP {target} ({role} of {step.stream}/{step.partition})")


def thaw(world: World, step: Step, index: int) -> StepReport:
    frozen = world.cluster.frozen
    for server_id in frozen:
        world.cluster.thaw(server_id)
    world.calm_since = time.monotonic()
    return StepReport(f"SIGCONT {', '.join(frozen)}" if frozen else "nothing frozen")


def readonly(world: World, step: Step, index: int) -> StepReport:
    partition = step.partition or 0

    def call() -> None:
        world.client.set_stream_readonly(
            step.stream, partitions=[partition], readonly=step.flag, timeout=world.timeouts.request
        )

    outcome = world.timer.call(f"set_stream_readonly {step.stream}", world.timeouts.request, call)
    report = StepReport(outcome.describe())
    if step.flag:
        world.readonly.add((step.stream, partition))  # a failed call may have been applied all the same
    elif outcome.ok:
        world.readonly.discard((step.stream, partition))
    if not outcome.ok:
        _judge(world, report, outcome)
    return report


def pause(world: World, step: Step, index: int) -> StepReport:
    partitions = None if step.partition is None else [step.partition]

    def call() -> None:
        world.client.pause_stream(step.stream, partitions=partitions, timeout=world.timeouts.request)

    outcome = world.timer.call(f"pause_stream {step.stream}", world.timeouts.request, call)
    report = StepReport(outcome.describe())
    if not outcome.ok:
        _judge(world, report, outcome)
    return report


def wait(world: World, step: Step, index: int) -> StepReport:
    time.sleep(step.seconds)
    return StepReport(f"slept {step.seconds:g}s (compaction, retention, auto-pause)")


# -- the batch path ---------------------------------------------------------------


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
        if report.summary.endswith("FAILED"):
            break
    return reports


def _task(world: World, run: BatchRun) -> StepReport:
    task = run.next_task
    outcome = world.batch.run_task(run)
    if outcome.ok:
        return StepReport(f"{run.run_id} {task}: {_result(task, run, outcome)} [{outcome.seconds:.1f}s]")
    report = StepReport(f"{outcome.describe()} FAILED")
    _judge(world, report, outcome, batch_task=task)
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


# -- judging failed calls -------------------------------------------------------------


def _judge(
    world: World,
    report: StepReport,
    outcome: Outcome[Any],
    *,
    batch_task: str | None = None,
) -> None:
    """A failed call is a finding when its error says "bad input", when the ingest job's own checks
    failed, or when the cluster was healthy; otherwise a fault explains it."""
    error = outcome.error
    if outcome.hung or error is None:
        return  # hung calls are reported by the timer
    if _permanent(error):
        report.findings.append(Finding("permanent", f"{outcome.describe()} (a bad-input error; nothing was bad)"))
    elif batch_task and _named(error, "PartitionPausedError"):
        report.findings.append(
            Finding("paused", f"the {batch_task} task failed on a paused partition: {outcome.describe()}")
        )
    elif isinstance(error, IngestFailed):
        report.findings.append(Finding("ingest-check", f"{outcome.describe()}"))
    elif world.impaired is None:
        what = f"the {batch_task} task" if batch_task else "a call"
        report.findings.append(Finding("failed-healthy", f"{what} failed on a healthy cluster: {outcome.describe()}"))


def _permanent(error: BaseException) -> bool:
    return isinstance(error, InvalidArgumentError) or any(_named(error, name) for name in PERMANENT_NAMES)


def _named(error: BaseException, name: str) -> bool:
    """Whether ``error`` or one of its causes is a ``name``, raised here or inside Spark's Python workers."""
    seen: BaseException | None = error
    while seen is not None:
        if type(seen).__name__ == name or name in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
