"""A task's state per DAG run, kept in Liftbridge cursors: for Airflow without a task state store (< 3.3).

Airflow 3.3 gives tasks ``context["task_state_store"]``, which survives a
task's retries and clears within one DAG run; the freeze operator keeps its
ranges there so a retry reads the same ranges. Older Airflow has no such
store, and a task's own XComs are deleted when a new try starts. This store
keeps the same promise in the cursors of the stream the task works on, with
the same ``get(key)`` / ``set(key, value)`` faces for JSON values.

Layout, on partition 0 of the stream, for one task (DAG id, task id, map
index) and key: :data:`SLOTS` slots, the DAG run's slot chosen by a hash of
its run id. A slot holds the run's 63-bit hash (``.run``: 0 while a value is
being written), the value's byte length (``.size``), and the zlib-compressed
JSON in 7-byte pieces, one cursor each (``.0``, ``.1``, ...). ``set`` clears
``.run``, writes the pieces and the size, then ``.run``: a value is read
only when ``.run`` names the reader's run, so a write cut short is never read.
A run whose slot a later run took (``SLOTS`` runs apart, or a hash clash)
finds nothing, as a new run would. The cursors stay (Liftbridge has no cursor
deletion), bounded by the slots.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from typing import Any

from liftbridge_provider.client import LiftbridgeClient

SLOTS = 16  # DAG runs of one task whose state is kept side by side
PIECE = 7  # bytes per cursor value: below 2**56, so never negative
PARTITION = 0  # every stream has partition 0


def _digest(*parts: object) -> bytes:
    return hashlib.sha256("\0".join(str(p) for p in parts).encode()).digest()


class CursorStateStore:
    """``get``/``set`` JSON values of one task in one DAG run (see the module docstring).

    :param client: the client to the cluster.
    :param stream: the stream whose cursors hold the state (the one the task works on).
    :param dag_id: the DAG.
    :param task_id: the task.
    :param run_id: the DAG run.
    :param map_index: the mapped task's index (-1: not mapped).
    """

    def __init__(
        self, client: LiftbridgeClient, stream: str, *, dag_id: str, task_id: str, run_id: str, map_index: int = -1
    ) -> None:
        self.client = client
        self.stream = stream
        self._task = _digest(dag_id, task_id, map_index).hex()[:20]
        run = _digest(dag_id, task_id, map_index, run_id)
        self._run = 1 + int.from_bytes(run[:8], "big") % (2**62)
        self._slot = int.from_bytes(run[8:12], "big") % SLOTS

    def _cursor(self, key: str, field: str) -> str:
        return f"airflow-task-state.{self._task}.{key}.{self._slot}.{field}"

    def _fetch(self, key: str, field: str) -> int:
        return self.client.fetch_cursor(self._cursor(key, field), self.stream, PARTITION)

    def _store(self, key: str, field: str, value: int) -> None:
        self.client.set_cursor(self._cursor(key, field), self.stream, PARTITION, value)

    def get(self, key: str) -> Any | None:
        """The value this run set for ``key``, or None."""
        if self._fetch(key, "run") != self._run:
            return None
        size = self._fetch(key, "size")
        pieces = [self._fetch(key, str(i)) for i in range(-(-size // PIECE))]
        data = b"".join(p.to_bytes(PIECE, "big") for p in pieces)[:size]
        return json.loads(zlib.decompress(data))

    def set(self, key: str, value: Any) -> None:
        """Keep ``value`` (JSON) for ``key`` in this run; a cut-short write leaves nothing to read."""
        data = zlib.compress(json.dumps(value, sort_keys=True, separators=(",", ":")).encode(), 9)
        self._store(key, "run", 0)
        for i in range(0, len(data), PIECE):
            self._store(key, str(i // PIECE), int.from_bytes(data[i : i + PIECE].ljust(PIECE, b"\0"), "big"))
        self._store(key, "size", len(data))
        self._store(key, "run", self._run)
