"""CPU per message of the read paths, next to go-liftbridge ``Subscribe`` (issue 29's figure).

    .venv/bin/python bench/bench_read_cpu.py [--messages 200000] [--size 256] [--rounds 5] [--no-python-decoder]
                                             [--base CHECKOUT]

Starts one Liftbridge node on 127.0.0.1, publishes ``--messages`` values of ``--size`` random bytes
to one partition, then runs ``--rounds`` interleaved rounds of, each reader in its own process:

- go-liftbridge ``Subscribe`` (``golbbench subscribe``, tools/golbbench; ``make golbbench``);
- ``receive_only``: the floor of any reader on the data plane (the client's own HTTP/2 call, client/h2): one
  Subscribe call whose messages are only counted as they are cut (no decoding, no subscription);
- ``read_range`` (``Message`` objects, offsets checked);
- ``read_slice`` (the Spark task's Arrow batches of the source's schema), with the compiled decoder;
- ``read_slice`` with the pure-Python decoder (``LIFTBRIDGE_PURE_PYTHON=1``), unless ``--no-python-decoder``;
- with ``--base CHECKOUT`` (another checkout of this repository with its ``_proto`` generated, e.g. a
  worktree of main): ``read_range`` and ``read_slice`` of that checkout too (its package first on
  ``PYTHONPATH``, this interpreter), for before/after figures from one run.

The figure is CPU seconds (user + system, every thread of the reading process) per message read,
best of the rounds (the least disturbed by other work on the machine); the median is printed
beside it. "vs go" divides by go's best. Unlike a rate, this figure barely moves with the load
of a shared machine; the 1-minute load average at start and end and the CPU model are printed.
A benchmark, not a test: it asserts nothing about time and exits 1 only on a wrong read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _golbbench import find_golbbench, run_golbbench
from _machine import machine_line

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import start_single

WORKER = Path(__file__).with_name("_read_cpu_worker.py")
GO = "go Subscribe"


def publish(client: LiftbridgeClient, stream: str, count: int, size: int) -> None:
    client.create_stream(stream, stream)
    client.wait_for_high_watermark(stream, 0, -1, timeout=10)
    value = os.urandom(size)
    for start in range(0, count, 50_000):
        client.publish_batch(stream, [value] * min(50_000, count - start))
    client.wait_for_high_watermark(stream, 0, count - 1, timeout=30)


def python_reader(
    path: str, broker: str, stream: str, count: int, *, pure: bool, base: str | None
) -> dict[str, object]:
    env = dict(os.environ, LIFTBRIDGE_PURE_PYTHON="1" if pure else "0")
    if base is not None:
        env["PYTHONPATH"] = os.pathsep.join([base, *filter(None, [env.get("PYTHONPATH")])])
    argv = [sys.executable, str(WORKER), path, "--brokers", broker, "--stream", stream, "--count", str(count)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{path} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    if base is None and bool(result["native"]) == pure:
        raise SystemExit(f"{path}: wanted the {'pure-Python' if pure else 'compiled'} decoder, got the other")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-python-decoder", action="store_true", help="skip read_slice with the pure-Python decoder")
    parser.add_argument("--base", help="another checkout whose read_range and read_slice run too (before/after)")
    args = parser.parse_args()
    golbbench = find_golbbench()
    print(machine_line())
    readers = [GO] if golbbench is not None else []
    readers += ["receive_only (data-plane floor)", "read_range", "read_slice (compiled decoder)"]
    if not args.no_python_decoder:
        readers.append("read_slice (pure-Python decoder)")
    if args.base:
        readers += ["read_range (base)", "read_slice (base)"]
    cpu: dict[str, list[float]] = {name: [] for name in readers}
    with start_single() as server, LiftbridgeClient(server.brokers) as client:
        broker, stream = server.brokers[0], "cpu"
        publish(client, stream, args.messages, args.size)
        for _ in range(args.rounds):
            for name in readers:
                if name == GO:
                    assert golbbench is not None
                    options: dict[str, object] = {"brokers": broker, "stream": stream, "count": args.messages}
                    outcome = run_golbbench(golbbench, "subscribe", options)
                    if outcome.data is None or outcome.problem is not None:
                        raise SystemExit(f"go Subscribe failed: {outcome.problem}")
                    result: dict[str, object] = outcome.data
                else:
                    path = name.split()[0]
                    base = args.base if "(base)" in name else None
                    result = python_reader(path, broker, stream, args.messages, pure="pure-Python" in name, base=base)
                if result["messages"] != args.messages:
                    raise SystemExit(f"{name} read {result['messages']} messages, expected {args.messages}")
                cpu[name].append(float(str(result["client_cpu"])) / args.messages * 1e6)
    print(f"{args.messages:,} messages x {args.size} B, one partition, best of {args.rounds} rounds (interleaved)")
    print(f"{'reader':36s} {'CPU us/msg (best)':>18s} {'median':>8s} {'vs go':>7s}")
    go_best = min(cpu[GO]) if GO in cpu else None
    for name, values in cpu.items():
        ratio = f"{min(values) / go_best:.2f}x" if go_best else ""
        print(f"{name:36s} {min(values):18.2f} {statistics.median(values):8.2f} {ratio:>7s}")
    one, five, fifteen = os.getloadavg()
    print(f"load average at the end: {one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min)")
    if args.base:
        print(f"base: {args.base}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
