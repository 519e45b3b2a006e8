"""Wall time of an ingest rerun that finds every range in the lake already (issue 50, item 5).

Lands one ranges document in a Parquet lake, a Delta table and an Iceberg table with spark-submit on
``local[2]``, then times reruns of the same document, each a whole spark-submit as Airflow runs it. With
``--before DIR`` (a checkout of an earlier commit, with its generated ``_proto``), each rerun runs once with
that checkout's code first on ``PYTHONPATH`` and once with this one's, interleaved, on the same lakes.

    .venv/bin/python bench/bench_noop_rerun.py --repeat 3 --before /tmp/noop-base
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _machine import machine_line

from liftbridge_provider.client import LiftbridgeClient, PublishMessage
from liftbridge_provider.core.ranges import OffsetRange, RangesDocument
from liftbridge_provider.devserver import start_single

ROOT = Path(__file__).resolve().parents[1]
SPARK_SUBMIT = str(Path(sys.executable).with_name("spark-submit"))
FORMATS = {"parquet": [], "delta": ["--format", "delta"], "iceberg": ["--format", "iceberg"]}


def submit(code: Path, argv: list[str]) -> tuple[float, str]:
    """One spark-submit of ``code``'s job on ``local[2]``; its wall time and output (status 0 checked)."""
    command = [SPARK_SUBMIT, "--master", "local[2]", "--conf", f"spark.pyspark.python={sys.executable}",
               "--conf", "spark.ui.enabled=false", str(code / "spark_jobs" / "ingest.py"), *argv]  # fmt: skip
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(code)}
    began = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - began
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise SystemExit(f"{code}: status {result.returncode}\n{output[-3000:]}")
    return took, output


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--messages", type=int, default=1000, help="offsets per partition (2 partitions)")
    parser.add_argument("--before", type=Path, help="a checkout of the code to compare with")
    args = parser.parse_args()
    print(machine_line())
    codes = {"before": args.before, "after": ROOT} if args.before else {"after": ROOT}
    with start_single() as server, tempfile.TemporaryDirectory() as folder:
        stream = f"noop-{uuid.uuid4().hex[:8]}"
        with LiftbridgeClient(server.brokers) as client:
            client.create_stream(stream, stream, partitions=2)
            batch = [PublishMessage(b"x" * 100, partition=p) for _ in range(args.messages) for p in range(2)]
            client.publish_batch(stream, batch, ack_policy="all")
        document = RangesDocument(stream, tuple(OffsetRange(p, 0, args.messages) for p in range(2)))
        for name, extra in FORMATS.items():
            argv = ["--brokers", ",".join(server.brokers), "--ranges", document.dumps(),
                    "--output", f"{folder}/{name}", *extra]  # fmt: skip
            landed, _ = submit(ROOT, argv)
            times: dict[str, list[float]] = {label: [] for label in codes}
            for _ in range(args.repeat):
                for label, code in codes.items():
                    took, output = submit(code, argv)
                    assert "the lake holds" in output, output[-2000:]
                    times[label].append(took)
            row = "  ".join(
                f"{label} median {statistics.median(t):.1f} s ({' / '.join(f'{x:.1f}' for x in t)})"
                for label, t in times.items()
            )
            print(f"{name:8} first run {landed:.1f} s; no-op rerun: {row}")
    print(machine_line().replace("at start", "at end"))


if __name__ == "__main__":
    main()
