"""Partitioners: choose the partition of a message when none is given.

A partitioner is any callable ``(stream, key, value, partitions) -> int``.
:func:`partition_by_key` gives the same partition as go-liftbridge's
``PartitionByKey`` for every key: CRC-32 (IEEE) of the key as an unsigned
32-bit number, modulo the partition count; a missing key counts as empty.
"""

from __future__ import annotations

import itertools
import threading
import zlib
from collections.abc import Callable

Partitioner = Callable[[str, bytes | None, bytes, int], int]


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
