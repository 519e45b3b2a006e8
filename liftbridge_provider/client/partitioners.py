"""Partitioners: choose the partition of a message when none is given.

A partitioner is any callable ``(stream, key, value, partitions) -> int``, or
one of the names ``"key"`` and ``"round_robin"``.
:func:`partition_by_key` gives the same partition as go-liftbridge's
``PartitionByKey`` for every key: CRC-32 (IEEE) of the key as an unsigned
32-bit number, modulo the partition count; a missing key counts as empty.
"""

from __future__ import annotations

import itertools
import threading
import zlib
from collections.abc import Callable
from typing import Literal

from liftbridge_provider.core.errors import InvalidArgumentError

Partitioner = Callable[[str, bytes | None, bytes, int], int]
PartitionerName = Literal["key", "round_robin"]


def partition_by_key(stream: str, key: bytes | None, value: bytes, partitions: int) -> int:
    """CRC-32 IEEE of the key (empty when None) modulo ``partitions``."""
    return zlib.crc32(key or b"") % partitions


class RoundRobinPartitioner:
    """Cycles through the partitions, with one counter per stream; thread-safe."""

    def __init__(self) -> None:
        self._counters: dict[str, itertools.count[int]] = {}
        self._lock = threading.Lock()

    def __call__(self, stream: str, key: bytes | None, value: bytes, partitions: int) -> int:
        with self._lock:
            counter = self._counters.setdefault(stream, itertools.count())
            return next(counter) % partitions


def partition_by_round_robin() -> RoundRobinPartitioner:
    """A new round-robin partitioner (each instance keeps its own counters)."""
    return RoundRobinPartitioner()


_SHARED_ROUND_ROBIN = RoundRobinPartitioner()


def resolve_partitioner(partitioner: Partitioner | PartitionerName | None) -> Partitioner | None:
    """The partitioner a name or callable stands for: ``"key"`` is :func:`partition_by_key`,
    ``"round_robin"`` one process-wide round-robin partitioner (counters per stream), None none."""
    if partitioner == "key":
        return partition_by_key
    if partitioner == "round_robin":
        return _SHARED_ROUND_ROBIN
    if partitioner is None or (callable(partitioner) and not isinstance(partitioner, str)):
        return partitioner
    raise InvalidArgumentError(
        "partitioner must be 'key', 'round_robin' or a callable (stream, key, value, partitions) -> int, "
        f"got {partitioner!r}"
    )
