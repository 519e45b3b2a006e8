"""A task's state per DAG run, kept in Liftbridge cursors: for Airflow without a task state store (< 3.3).

Airflow 3.3 gives tasks ``context["task_state_store"]``, which survives a
task's retries and clears within one DAG run; the freeze operator keeps its
ranges there so a retry reads the same ranges. Older Airflow has no such
store, and a task's own XComs are deleted when a new try starts. This store
keeps the same promise in the cursors of the stream the task works on, with
the same ``get(key)`` / ``set(key, value)`` faces for JSON values.

Layout, on partition 0 of the stream: each (DAG id, task id, map index, run id,
key) has cursors of its own, named ``airflow-task-state.<h>.<field>`` where
``<h>`` is 96 bits of a SHA-256 of the five, so no two runs share a cursor
(until issue 47 runs shared 16 slots per task: two runs of a backfill could
interleave their writes there, and a run's retry read another run's ranges, or
a mix that no retry could decode). The value is JSON, deflated (raw, with a
preset dictionary of the ranges document's words: a one-partition document
takes about 65 bytes instead of 130), in 7-byte pieces, one cursor each (``.0``,
``.1``, ...); ``.size`` holds its byte length and ``.sum``, written last, 62 bits
of a SHA-256 over the run key and those bytes. ``get`` returns the value only
when the pieces it read match ``.sum``, and None otherwise: a write cut short,
or two tries of one run writing at once, read as nothing (the freeze then
freezes anew, as a new run would), never as a part of a value or another
run's value.

The cost: ``2 + ceil(bytes / 7)`` cursors per run, task and key (about 12 for a
one-partition ranges document, 19 for four partitions), each one message of
about 220 bytes in the compacted ``__cursors`` stream (key and value both name
the cursor and the stream): about 2.7 KB per run of a one-partition freeze,
4 KB for four, and ``set`` takes one acknowledged write per cursor (14 ms and
23 ms on the test machine). Liftbridge cannot delete a cursor: they stay as
long as the server's stream retention keeps ``__cursors`` segments
(``streams.retention.max.age``, 7 days by default, applies to ``__cursors``
too: a cursor last written longer ago may be gone, and the run then freezes
anew); without a retention limit, an hourly one-partition freeze adds some
24 MB a year. A run's first ``get`` asks for a cursor that does not exist
yet, which the server answers by reading its ``__cursors`` partition
backwards to the start (about 4 microseconds a message: 0.2 s at 50,000).

Runs frozen by the slot layout before the upgrade are not read: that layout is
the one that could hold another run's value, and trying it would cost every
new run a second lookup of a missing cursor. A retry of such a run freezes
anew, as a run whose slot was taken always did (the commit's cursor-advance
rule and the lake's ledger keep that safe; docs/airflow.md, "Exactly once").
"""

from __future__ import annotations

import hashlib
import json
import zlib
from typing import Any

from liftbridge_provider.client import LiftbridgeClient

PIECE = 7  # bytes per cursor value: below 2**56, so never negative
PARTITION = 0  # every stream has partition 0
PREFIX = "airflow-task-state"
# Preset deflate dictionary: the words of a ranges document (core/ranges.py), the likeliest last. Part of the
# layout: values written with it are read with it, so a change needs a new cursor prefix.
DICTIONARY = (
    b'"cursor_lag":{"0":"end":"frozen_cursors":{"0":"interval":{"end":"2026-01-01T00:00:00+00:00","start":'
    b'"metadata":{"partition":0,"ranges":[{"end":"start":"stream":"version":1}'
)


def _encode(value: Any) -> bytes:
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15, zdict=DICTIONARY)
    text = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return deflate.compress(text) + deflate.flush()


def _decode(data: bytes) -> Any:
    inflate = zlib.decompressobj(-15, zdict=DICTIONARY)
    return json.loads(inflate.decompress(data) + inflate.flush())


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
        self._run = (dag_id, task_id, map_index, run_id)

    def _key(self, key: str) -> bytes:
        return "\0".join(str(p) for p in (*self._run, key)).encode()

    def _cursor(self, key: str, field: str) -> str:
        return f"{PREFIX}.{hashlib.sha256(self._key(key)).hexdigest()[:24]}.{field}"

    def _sum(self, key: str, data: bytes) -> int:
        """62 bits over the run key and the value's bytes: what ``.sum`` holds for exactly these bytes."""
        return int.from_bytes(hashlib.sha256(self._key(key) + b"\0" + data).digest()[:8], "big") >> 2

    def _fetch(self, key: str, field: str) -> int:
        return self.client.fetch_cursor(self._cursor(key, field), self.stream, PARTITION)

    def _store(self, key: str, field: str, value: int) -> None:
        self.client.set_cursor(self._cursor(key, field), self.stream, PARTITION, value)

    def get(self, key: str) -> Any | None:
        """The value this run set for ``key``, or None (never set, or a write cut short or interleaved)."""
        if (expected := self._fetch(key, "sum")) < 0:
            return None
        size = self._fetch(key, "size")
        pieces = [self._fetch(key, str(i)) for i in range(-(-size // PIECE))]
        if any(p < 0 for p in pieces):
            return None
        data = b"".join(p.to_bytes(PIECE, "big") for p in pieces)[:size]
        return _decode(data) if self._sum(key, data) == expected else None

    def set(self, key: str, value: Any) -> None:
        """Keep ``value`` (JSON) for ``key`` in this run: the pieces, the size, then the sum that seals them."""
        data = _encode(value)
        for i in range(0, len(data), PIECE):
            self._store(key, str(i // PIECE), int.from_bytes(data[i : i + PIECE].ljust(PIECE, b"\0"), "big"))
        self._store(key, "size", len(data))
        self._store(key, "sum", self._sum(key, data))
