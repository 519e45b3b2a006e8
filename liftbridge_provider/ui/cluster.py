"""One bounded look at a cluster for the Liftbridge page: metadata, cursors, dead letters.

:func:`read_snapshot` asks, in this order and within the bounds of
:mod:`liftbridge_provider.ui.bounds`:

1. FetchMetadata (every stream and partition), within ``METADATA_TIMEOUT``: the
   client is made with its ``request_timeout`` lowered to it, and the call is
   waited for that long plus a second at most; a failure here is the snapshot's
   failure (the page shows its text);
2. concurrently, on a shared pool of ``WORKERS`` threads, all within one
   ``READ_TIMEOUT``: the newest ``CURSOR_SCAN_LIMIT`` messages of each
   ``__cursors`` partition (the positions of every cursor, ``ui/cursor_log.py``),
   and the newest ``DEAD_LETTER_SCAN_LIMIT`` of each partition of each
   dead-letter stream the connection's watchers name. A read that fails or is
   not done in time leaves an error text in its place; the rest is shown.

The reads are plain Subscribe reads: nothing is written. One side effect: a
``__cursors`` partition the server paused (it pauses it after a while
without cursor writes) is resumed to be read, as the next cursor write would.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from liftbridge_provider.client import ClientConfig, LiftbridgeClient, Metadata
from liftbridge_provider.client.requests import CURSORS_STREAM
from liftbridge_provider.ui import bounds
from liftbridge_provider.ui.cursor_log import CursorKey, CursorRecord, cursor_record, latest, scan_start
from liftbridge_provider.ui.views import DeadLetterRead, dead_letter_view, fold_dead_letters

_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=bounds.WORKERS, thread_name_prefix="liftbridge-ui")


@dataclass(frozen=True)
class CursorScan:
    """The cursors found in ``__cursors``, whether every partition was read whole, and what failed."""

    records: Mapping[CursorKey, CursorRecord]
    complete: bool
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """What one look at the cluster found, and how long it took (seconds)."""

    metadata: Metadata
    cursors: CursorScan
    dead_letters: Mapping[str, DeadLetterRead]
    elapsed: float


def page_config(config: ClientConfig) -> ClientConfig:
    """The connection's client configuration with the page's bound on each request (``METADATA_TIMEOUT``)."""
    return dataclasses.replace(config, request_timeout=bounds.ui_request_timeout(config.request_timeout))


def _waited(future: concurrent.futures.Future[Any], timeout: float, what: str) -> Any:
    try:
        return future.result(timeout=max(0.0, timeout))
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"no answer for {what} within {timeout:.0f} s") from None


def _scan_cursors(client: LiftbridgeClient, partition: int, high_watermark: int, timeout: float) -> tuple[Any, bool]:
    start = scan_start(high_watermark, bounds.CURSOR_SCAN_LIMIT)
    messages = client.read_range(
        CURSORS_STREAM,
        partition,
        start,
        high_watermark + 1,
        beyond_high_watermark="truncate",
        timeout=timeout,
        resume=True,
    )
    return latest(cursor_record(m.key, m.value) for m in messages), start == 0


def _scan_dead_letters(
    client: LiftbridgeClient, stream: str, partition: int, high_watermark: int, timeout: float
) -> tuple[list[Any], bool]:
    start = max(0, high_watermark + 1 - bounds.DEAD_LETTER_SCAN_LIMIT)
    messages = client.read_range(
        stream, partition, start, high_watermark + 1, beyond_high_watermark="truncate", timeout=timeout, resume=True
    )
    return [dead_letter_view(m.offset, m.timestamp, m.headers) for m in messages], start == 0


def read_snapshot(
    client: LiftbridgeClient,
    dlq_streams: Iterable[str] = (),
    *,
    describe: Callable[[BaseException], str] = str,
    clock: Callable[[], float] = time.monotonic,
) -> Snapshot:
    """Look at the cluster (see the module docstring); raises what the metadata call raised, or TimeoutError.

    :param client: a client made with :func:`page_config`.
    :param dlq_streams: the dead-letter streams to count (those missing from the metadata are skipped).
    :param describe: the text of a read's error (the caller redacts secrets with it).
    """
    began = clock()
    metadata: Metadata = _waited(
        _POOL.submit(client.fetch_metadata), bounds.METADATA_TIMEOUT + 1.0, "the cluster's metadata"
    )
    deadline = clock() + bounds.READ_TIMEOUT
    cursor_jobs = {}
    cursors = metadata.streams.get(CURSORS_STREAM)
    for pid, info in cursors.partitions.items() if cursors else ():
        if info.high_watermark >= 0:
            cursor_jobs[pid] = _POOL.submit(_scan_cursors, client, pid, info.high_watermark, bounds.READ_TIMEOUT)
    letter_jobs: dict[str, list[concurrent.futures.Future[Any]]] = {}
    for name in sorted(set(dlq_streams)):
        stream = metadata.streams.get(name)
        for pid, info in stream.partitions.items() if stream else ():
            if info.high_watermark >= 0:
                job = _POOL.submit(_scan_dead_letters, client, name, pid, info.high_watermark, bounds.READ_TIMEOUT)
                letter_jobs.setdefault(name, []).append(job)

    found: dict[CursorKey, CursorRecord] = {}
    complete, errors = True, []
    for pid, job in sorted(cursor_jobs.items()):
        try:
            records, whole = _waited(job, deadline - clock(), f"{CURSORS_STREAM} partition {pid}")
        except Exception as exc:
            complete = False
            errors.append(f"{CURSORS_STREAM} partition {pid}: {describe(exc)}")
            continue
        found.update(records)
        complete = complete and whole

    dead_letters: dict[str, DeadLetterRead] = {}
    for name in sorted(set(dlq_streams)):
        stream = metadata.streams.get(name)
        total = sum(max(0, p.high_watermark + 1) for p in stream.partitions.values()) if stream else 0
        letters, whole, error = [], True, None
        for job in letter_jobs.get(name, []):
            try:
                read, read_whole = _waited(job, deadline - clock(), f"dead-letter stream {name}")
            except Exception as exc:
                whole, error = False, describe(exc)
                continue
            letters.extend(read)
            whole = whole and read_whole
        dead_letters[name] = DeadLetterRead(fold_dead_letters(letters), total, whole, error)
    return Snapshot(metadata, CursorScan(found, complete, tuple(errors)), dead_letters, clock() - began)
