"""The batch path of one DAG run, task by task, in-process: freeze, wait, ingest, commit.

Each task is the real operator (or sensor, or the ingest job's functions)
called with a minimal context, as a worker would call it: ``run_id`` and a
dict-backed ``task_state_store`` per task that survives retries and clears
of the same run (Airflow 3.3's task state store). A failed task is retried by
the next step that advances the run; a cleared run runs every task again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from liftbridge_provider.core.ranges import RangesDocument
from liftbridge_provider.operators.ranges import LiftbridgeCommitCursorOperator, LiftbridgeOffsetRangesOperator
from liftbridge_provider.sensors.offset import LiftbridgePartitionOffsetSensor
from tests.chaos.lake import Lake
from tests.chaos.streams import StreamShape
from tests.chaos.timing import CallTimer, Outcome

TASKS = ("freeze", "wait", "ingest", "commit")
CURSOR_ID = "chaos"
CONN_ID = "chaos"
SENSOR_TIMEOUT = 20.0  # seconds the sensor waits for the high watermark
SPARK_OVERHEAD = 30.0  # seconds of Spark work per ingest besides reading (jobs, Parquet, manifest)
PROBE = 2.0  # seconds LiftbridgeClient.earliest_offset listens for the first message


class StateStore:
    """A dict-backed ``task_state_store`` (``get``/``set``/``delete``, as Airflow 3.3 offers)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, **_options: Any) -> None:
        self.values[key] = value

    def delete(self, key: str) -> None:
        self.values.pop(key, None)


@dataclass
class BatchRun:
    """One DAG run over one stream: the next task to run, and what earlier tasks returned."""

    shape: StreamShape
    number: int
    stage: int = 0  # index into TASKS of the next task; len(TASKS) when done
    document: RangesDocument | None = None
    committed: dict[str, int] | None = None
    stores: dict[str, StateStore] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return f"chaos__{self.shape.name}__{self.number}"

    @property
    def done(self) -> bool:
        return self.stage >= len(TASKS)

    @property
    def next_task(self) -> str:
        return TASKS[self.stage] if not self.done else "none"

    def context(self, task: str) -> dict[str, Any]:
        return {"run_id": self.run_id, "task_state_store": self.stores.setdefault(task, StateStore())}

    def clear(self) -> None:
        """Clear every task of the run (its task state stores survive, as in Airflow)."""
        self.stage = 0
        self.document = None
        self.committed = None


class BatchPath:
    """Runs the tasks of batch runs against one cluster, every task timed against its deadline."""

    def __init__(self, brokers: list[str], timer: CallTimer, lake: Lake, request_timeout: float) -> None:
        self.brokers = brokers
        self.timer = timer
        self.lake = lake
        self.request_timeout = request_timeout
        self.frozen: dict[str, list[RangesDocument]] = {}  # every document a freeze returned, by stream

    def run_task(self, run: BatchRun) -> Outcome[Any]:
        """Run the run's next task; on success the run moves to the following one."""
        task = run.next_task
        work: dict[str, Callable[[BatchRun], tuple[float, Callable[[], Any]]]] = {
            "freeze": self._freeze,
            "wait": self._wait,
            "ingest": self._ingest,
            "commit": self._commit,
        }
        deadline, function = work[task](run)
        outcome = self.timer.call(f"{task} {run.run_id}", deadline, function)
        if outcome.ok:
            if task == "freeze":
                run.document = RangesDocument.parse(outcome.value)  # type: ignore[arg-type]
                self.frozen.setdefault(run.shape.name, []).append(run.document)
            elif task == "commit":
                run.committed = outcome.value
            run.stage += 1
        elif outcome.hung and task == "ingest":
            self.lake.cancel()
        return outcome

    def _freeze(self, run: BatchRun) -> tuple[float, Callable[[], Any]]:
        shape = run.shape
        # Per partition: high watermark, cursor, and up to two earliest-offset probes.
        deadline = self.request_timeout + shape.partitions * (4 * self.request_timeout + 2 * PROBE)
        operator = LiftbridgeOffsetRangesOperator(
            task_id="freeze",
            stream=shape.name,
            cursor_id=CURSOR_ID,
            liftbridge_conn_id=CONN_ID,
            execution_timeout=timedelta(seconds=deadline),
            compacted=shape.compacted,
            on_data_loss="skip" if shape.removal == "retention" else "fail",
        )
        return deadline, lambda: operator.execute(run.context("freeze"))

    def _wait(self, run: BatchRun) -> tuple[float, Callable[[], Any]]:
        assert run.document is not None
        sensor = LiftbridgePartitionOffsetSensor(
            task_id="wait",
            ranges=run.document,
            deferrable=False,
            mode="poke",
            poke_interval=1,
            timeout=SENSOR_TIMEOUT,
            liftbridge_conn_id=CONN_ID,
        )
        deadline = SENSOR_TIMEOUT + 1 + run.shape.partitions * self.request_timeout  # a poke may be in flight
        return deadline, lambda: sensor.execute(run.context("wait"))

    def _ingest(self, run: BatchRun) -> tuple[float, Callable[[], Any]]:
        document = run.document
        assert document is not None
        ranges = sum(1 for r in document.ranges if r.count > 0)
        # Per range: resolving on the driver (high watermark, earliest probe) and a read that may resubscribe.
        deadline = SPARK_OVERHEAD + ranges * (6 * self.request_timeout + PROBE)

        def ingest() -> Any:
            return self.lake.ingest(
                self.brokers,
                document,
                compacted=run.shape.compacted,
                skip_data_loss=run.shape.removal == "retention",
                request_timeout=self.request_timeout,
            )

        return deadline, ingest

    def _commit(self, run: BatchRun) -> tuple[float, Callable[[], Any]]:
        assert run.document is not None
        operator = LiftbridgeCommitCursorOperator(
            task_id="commit", ranges=run.document, cursor_id=CURSOR_ID, liftbridge_conn_id=CONN_ID
        )
        deadline = run.shape.partitions * 2 * self.request_timeout
        return deadline, lambda: operator.execute(run.context("commit"))
