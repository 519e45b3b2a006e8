"""Judging a step: its one-line summary, and whether a failed call is a finding or explained by a fault.

A step's own findings are failures the oracle cannot see in the data: a
bad-input error where no input was bad, the batch path failing on a paused
partition, the ingest job's own checks failing, a call failing on a healthy
cluster (every node up and unfrozen for ``Timeouts.settle`` seconds before the call began).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from liftbridge_provider.client import AckTimeoutError, BatchResult, InvalidArgumentError
from tests.chaos.lake import IngestFailed
from tests.chaos.oracle import Finding
from tests.chaos.timing import Outcome
from tests.chaos.world import World

PERMANENT_NAMES = ("InvalidArgumentError", "AirflowFailException")


@dataclass
class StepReport:
    summary: str
    findings: list[Finding] = field(default_factory=list)
    failed: bool = False  # the step's call failed (a finding or not: an excused failure still ends a run)


def judge(
    world: World,
    report: StepReport,
    outcome: Outcome[Any],
    *,
    batch_task: str | None = None,
    replication: int | None = None,
    stream: str | None = None,
) -> None:
    """A failed call is a finding when its error says "bad input", when the ingest job's own checks
    failed, or when the cluster was healthy; otherwise a fault explains it (or, at RF 1, a promise
    that is not made: see :func:`_unpromised_at_rf1`)."""
    error = outcome.error
    if outcome.hung or error is None:
        return  # hung calls are reported by the timer
    if permanent(error):
        report.findings.append(Finding("permanent", f"{outcome.describe()} (a bad-input error; nothing was bad)"))
    elif batch_task and _named(error, "PartitionPausedError"):
        report.findings.append(
            Finding("paused", f"the {batch_task} task failed on a paused partition: {outcome.describe()}")
        )
    elif replication == 1 and (why := _unpromised_at_rf1(world, error, batch_task, stream)):
        report.summary += f" (not promised at RF 1: {why})"
    elif isinstance(error, IngestFailed):
        report.findings.append(Finding("ingest-check", f"{outcome.describe()}"))
    elif not batch_task and stream and (why := _acks_dropped_by_a_pause(world, error, stream, outcome.seconds)):
        report.summary += f" (the server's: {why})"
    elif world.impaired_during(outcome.seconds) is None:
        what = f"the {batch_task} task" if batch_task else "a call"
        report.findings.append(Finding("failed-healthy", f"{what} failed on a healthy cluster: {outcome.describe()}"))


def _unpromised_at_rf1(world: World, error: BaseException, task: str | None, stream: str | None) -> str | None:
    """Why a failure on a single-replica stream is outside the promise (RF 3, ack ALL, min ISR 2), or None.

    A restarted single replica takes its last checkpointed high watermark (seed 82), and moves it only
    with the next write: the offsets above it stay invisible until someone publishes (seed 155, a paused
    partition whose leader was SIGKILLed right after a publish). A read past it, or an offset sensor
    waiting for it, fails until then.
    """
    if _named(error, "BeyondHighWatermarkError"):
        return "a read beyond a restarted replica's checkpointed high watermark"
    lowered = sorted(p for s, p in world.hw_back if s == stream)
    if task == "wait" and lowered and _named(error, "AirflowSensorTimeout"):
        return f"the high watermark of {stream} partition(s) {lowered} moved back and waits for a new write"
    return None


def _acks_dropped_by_a_pause(world: World, error: BaseException, stream: str, seconds: float) -> str | None:
    """Why every missing ack of a publish that lasted ``seconds`` is the server's, or None.

    A partition that auto-pauses drops the acks it has not sent yet, and the
    messages commit later without one (server v1.9.0: pausing stops the
    leader, which discards its commit queue; seeds 5 and 92). So with ack ALL,
    a message whose commit takes longer than the stream's auto-pause time
    gets no ack; the client reports it as a timeout that may be stored, and
    the ledger counts it as such.
    """
    shape = world.shapes.get(stream)
    if shape is None or shape.ack_policy != "all":
        return None
    pause = shape.options.get("auto_pause_time")
    if not pause or seconds < pause:
        return None
    errors = publish_errors(error)
    if not all(isinstance(e, AckTimeoutError) and e.may_be_stored for e in errors):
        return None
    return f"no ack for {len(errors)} message(s) on a stream that auto-pauses after {pause}s: a pause drops acks"


def publish_errors(error: BaseException) -> list[BaseException]:
    """The error of each failed message of a publish (a batch's failures, or a sync publish's one error)."""
    result = getattr(error, "result", None)
    return [f.error for f in result.failures] if isinstance(result, BatchResult) else [error]


def permanent(error: BaseException) -> bool:
    return isinstance(error, InvalidArgumentError) or any(_named(error, name) for name in PERMANENT_NAMES)


def _named(error: BaseException, name: str) -> bool:
    """Whether ``error`` or one of its causes is a ``name``, raised here or inside Spark's Python workers."""
    seen: BaseException | None = error
    while seen is not None:
        if type(seen).__name__ == name or name in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
