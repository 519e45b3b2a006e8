"""Peak memory of one Spark task's read path, in its own process; started by ``bench_spark.py``, prints one JSON line.

    python bench/_spark_memory_worker.py --brokers 127.0.0.1:PORT --stream S --partition 0 --start 0 --end N

Runs ``liftbridge_provider.spark.reader.read_slice`` (what a Spark task of the
``liftbridge`` source runs) over ``[start, end)`` of one partition, consuming
and discarding the Arrow record batches. Reports ``ru_maxrss`` (peak resident
set, MiB) right after the imports and the Arrow schema (``baseline``) and
after the read (``peak``), and the resident set at both points, from
/proc/self/statm. A read whose memory does not grow with the range has about
the same peak for 100,000 and 1,000,000 messages.

Linux keeps a process's peak resident set across fork and exec, so a worker
started from the (large) benchmark process would report the benchmark's peak.
The worker therefore forks once more from its own small interpreter, before
importing anything heavy, and measures in that child.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1024 * 1024


def max_rss_mib() -> float:
    """Peak resident set of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    """Current resident set of this process."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE / MIB


def measure() -> None:
    # Imported here, in the forked child, so that they count towards its memory (see the module doc).
    from liftbridge_provider.core.spark_planning import Slice  # noqa: PLC0415
    from liftbridge_provider.spark.options import parse_options  # noqa: PLC0415
    from liftbridge_provider.spark.reader import arrow_schema, read_slice  # noqa: PLC0415

    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--end", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=None, help="batchSize option (source default 10000)")
    args = parser.parse_args()

    raw = {"brokers": args.brokers, "ranges": "{}"}
    if args.batch_size is not None:
        raw["batchSize"] = str(args.batch_size)
    options = parse_options(raw)
    schema = arrow_schema()
    baseline_max, baseline_rss = max_rss_mib(), rss_mib()

    rows = batches = largest = value_bytes = 0
    started = time.perf_counter()
    for batch in read_slice(options, args.stream, Slice(args.partition, args.start, args.end), schema):
        rows += batch.num_rows
        batches += 1
        largest = max(largest, batch.num_rows)
        value_bytes += batch.column(1).nbytes  # the value column's buffers (payload + offsets)
        del batch
    seconds = time.perf_counter() - started

    print(
        json.dumps(
            {
                "rows": rows,
                "batches": batches,
                "largest_batch": largest,
                "value_column_bytes": value_bytes,
                "seconds": seconds,
                "baseline_maxrss_mib": baseline_max,
                "baseline_rss_mib": baseline_rss,
                "peak_maxrss_mib": max_rss_mib(),
                "end_rss_mib": rss_mib(),
            }
        ),
        flush=True,
    )


def main() -> int:
    """Run :func:`measure` in a child forked from this small process; return its exit status."""
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            measure()
        except BaseException:
            import traceback  # noqa: PLC0415

            traceback.print_exc()
            status = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


if __name__ == "__main__":
    sys.exit(main())
