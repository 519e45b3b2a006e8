"""What each kind of step does to the world: one handler per kind of :class:`~tests.chaos.plan.Step`."""

from __future__ import annotations

from collections.abc import Callable

from tests.chaos import crash, faults, publishing, runs
from tests.chaos.judging import StepReport
from tests.chaos.plan import Step
from tests.chaos.world import World

HANDLERS: dict[str, Callable[[World, Step, int], StepReport]] = {
    "publish": publishing.publish,
    "kill_leader": faults.kill_leader,
    "restart": faults.restart,
    "freeze": faults.freeze,
    "thaw": faults.thaw,
    "readonly": faults.readonly,
    "pause": faults.pause,
    "wait": faults.wait,
    "run": runs.advance_run,
    "fail_commit": runs.fail_commit,
    "clear": runs.clear_run,
    "concurrent": runs.concurrent_runs,
    "delta": runs.replay_delta,
    "crash": crash.crash_ingest,
}


def execute(world: World, step: Step, index: int) -> StepReport:
    """Do ``step`` (the ``index``-th of the seed) and say what happened."""
    return HANDLERS[step.kind](world, step, index)
