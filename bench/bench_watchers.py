"""How fast asset watchers turn stream data into stored Airflow events, in the real `airflow triggerer`.

    .venv/bin/python bench/bench_watchers.py [--messages 300] [--batch-messages 30000] [--partitions 3]
                                             [--in-flight 1,4,32]

Starts one Liftbridge node on 127.0.0.1 and migrates one SQLite Airflow DB. For each
setting, in a fresh copy of that DB: a new stream with ``--partitions`` partitions gets its
messages (round robin) first, then a DAG with one asset watcher is registered
(``airflow dags reserialize``) and ``airflow triggerer`` started. The clock runs from the
first stored event to the moment every offset is covered by events stored in the DB (polled
every 0.2 s), so triggerer start-up is left out. Settings, side by side:

- message mode, ``max_in_flight`` from ``--in-flight`` (the first is the baseline), on
  ``--messages`` messages: stored events per second;
- batch mode (``max_messages`` 5000, ``poll_interval`` 0.2 s) on ``--batch-messages``
  messages: offsets covered per second, and events (batches) stored.

It checks every offset is covered (exit 1 if not) and asserts nothing about time.
About 2-3 minutes with the defaults on 2 CPUs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from liftbridge_provider.client import LiftbridgeClient, partition_by_round_robin  # noqa: E402
from liftbridge_provider.devserver import start_single  # noqa: E402
from tests.airflow.test_airflow_watchers import (  # noqa: E402
    AIRFLOW,
    Triggerer,
    _env,
    asset_payloads,
    register_dags,
)

DAG = """
from airflow.sdk import DAG, Asset, AssetWatcher, task
from liftbridge_provider.triggers.message import LiftbridgeMessageTrigger

watched = Asset(name="watched", uri="liftbridge://bench/{stream}", watchers=[
    AssetWatcher(name="watched", trigger=LiftbridgeMessageTrigger(stream="{stream}", {options})),
])
with DAG("on_watched", schedule=[watched]):
    task(lambda: None, task_id="noop")()
"""


def covered(payloads: list[dict[str, object]]) -> int:
    """Offsets covered: messages for message mode, the sum of distinct batches for batch mode."""
    if payloads and "ranges" in payloads[0]:
        batches = {p["metadata"]["batch"]: p for p in payloads}  # type: ignore[index]
        return sum(b["metadata"]["offsets"] for b in batches.values())  # type: ignore[index]
    return len({(p["partition"], p["offset"]) for p in payloads})


def measure(template: Path, brokers: list[str], options: str, messages: int, partitions: int) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    (home / "dags").mkdir()
    shutil.copy(template, home / "airflow.db")
    connection = {"conn_type": "liftbridge", "host": brokers[0]}
    env = _env(home, {"AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps(connection)})
    stream = f"bench-{home.name[-8:].lower().replace('_', '-')}"
    with LiftbridgeClient(brokers) as client:
        client.create_stream(stream, stream, partitions=partitions)
        values = [f"message {i}".encode() for i in range(messages)]
        client.publish_batch(stream, values, partitioner=partition_by_round_robin())
    register_dags(home, env, DAG.format(stream=stream, options=options))
    triggerer = Triggerer(home, env)
    triggerer.start()
    try:
        first = last = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            payloads = asset_payloads(home, "watched")
            if payloads and first is None:
                first = time.monotonic()
            if covered(payloads) >= messages:
                last = time.monotonic()
                break
            time.sleep(0.2)
    finally:
        triggerer.stop()
    if first is None or last is None:
        sys.exit(f"{options}: only {covered(asset_payloads(home, 'watched'))} of {messages} offsets covered")
    seconds = max(last - first, 0.2)
    events = len(asset_payloads(home, "watched"))
    shutil.rmtree(home, ignore_errors=True)
    return {"seconds": seconds, "events": events, "offsets_per_s": messages / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--batch-messages", type=int, default=30000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--in-flight", default="1,4,32")
    args = parser.parse_args()
    template_home = Path(tempfile.mkdtemp(prefix="bench-watch-template-"))
    subprocess.run([AIRFLOW, "db", "migrate"], env=_env(template_home, {}), check=True, capture_output=True)
    rows = []
    with start_single() as server:
        for in_flight in [int(n) for n in args.in_flight.split(",")]:
            result = measure(
                template_home / "airflow.db",
                server.brokers,
                f"max_in_flight={in_flight}",
                args.messages,
                args.partitions,
            )
            rows.append((f"message, max_in_flight={in_flight}", args.messages, result))
        batch = measure(
            template_home / "airflow.db",
            server.brokers,
            'mode="batch", max_messages=5000, poll_interval=0.2',
            args.batch_messages,
            args.partitions,
        )
        rows.append(("batch, max_messages=5000", args.batch_messages, batch))
    shutil.rmtree(template_home, ignore_errors=True)
    baseline = rows[0][2]["offsets_per_s"]
    print(f"\n{'setting':<30} {'offsets':>8} {'events':>7} {'seconds':>8} {'offsets/s':>10} {'vs first':>9}")
    for name, messages, result in rows:
        print(
            f"{name:<30} {messages:>8} {int(result['events']):>7} {result['seconds']:>8.1f} "
            f"{result['offsets_per_s']:>10.1f} {result['offsets_per_s'] / baseline:>8.1f}x"
        )


if __name__ == "__main__":
    main()
