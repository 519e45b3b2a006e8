"""LiftbridgeConsumeOperator, run by `airflow dags test` against a real node.

The functions write each offset they see to a file, so the tests count how
often a message was handed over across tries.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import DevServer
from tests.airflow.airflow_runs import connection_env, run_dag, stream_name

FUNCTIONS = '''
import json, pathlib

def remember(message, log, fail_at=None, marker=None):
    """Append the message's partition and offset to ``log``; fail once (``marker``) at offset ``fail_at``."""
    if fail_at is not None and message.offset == fail_at and not pathlib.Path(marker).exists():
        pathlib.Path(marker).touch()
        raise ValueError(f"cannot handle offset {message.offset}")
    with open(log, "a") as out:
        out.write(json.dumps([message.partition, message.offset]) + "\\n")
    return message.value.decode()

def remember_batch(messages, log):
    with open(log, "a") as out:
        for message in messages:
            out.write(json.dumps([message.partition, message.offset]) + "\\n")
    return len(messages)
'''


@pytest.fixture
def functions(airflow_home: Path, tmp_path: Path) -> tuple[str, Path]:
    """A module of functions in the dags folder (importable by dotted path in `airflow dags test`), and a
    folder for what they write."""
    (airflow_home / "dags" / "consume_functions.py").write_text(FUNCTIONS)
    return "consume_functions", tmp_path


def seen(log: Path) -> Counter[tuple[int, int]]:
    if not log.exists():
        return Counter()
    return Counter(tuple(json.loads(line)) for line in log.read_text().splitlines())


def test_per_message_and_batch_functions_results_and_cursor(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient, functions: tuple[str, Path]
) -> None:
    module, tmp_path = functions
    stream = stream_name()
    client.create_stream(stream, stream, partitions=2)
    client.publish_batch(stream, [f"m{i}".encode() for i in range(10)], partitioner="round_robin", ack_policy="all")
    each, batches = tmp_path / "each.log", tmp_path / "batches.log"
    body = f"""
        LiftbridgeConsumeOperator(
            task_id="each", stream={stream!r}, cursor_id="each", apply_function="{module}.remember",
            apply_function_kwargs={{"log": {str(each)!r}}}, return_results=True,
        )
        LiftbridgeConsumeOperator(
            task_id="batches", stream={stream!r}, cursor_id="batches",
            apply_function_batch="{module}.remember_batch", apply_function_args=[{str(batches)!r}],
            max_batch_size=2, commit_cadence="end_of_batch",
            return_results=True,
        )
        LiftbridgeConsumeOperator(
            task_id="capped", stream={stream!r}, cursor_id="capped", apply_function="{module}.remember",
            apply_function_kwargs={{"log": {str(tmp_path / "capped.log")!r}}}, max_messages=4, commit_cadence="never",
        )
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert run.ok(), run.output[-3000:]
    everything = Counter((p, o) for p in (0, 1) for o in range(5))
    assert seen(each) == everything
    assert sorted(run.xcom["each"]["results"]) == sorted(f"m{i}" for i in range(10))
    assert run.xcom["each"]["committed"] == {"0": 4, "1": 4}
    assert seen(batches) == everything
    assert run.xcom["batches"]["results"] == [2, 2, 1, 2, 2, 1]  # per partition: batches of 2, 2, 1
    assert seen(tmp_path / "capped.log") == Counter({(0, 0): 1, (0, 1): 1, (1, 0): 1, (1, 1): 1})
    assert run.xcom["capped"]["committed"] == {}
    assert [client.fetch_cursor(c, stream, p) for c in ("each", "batches", "capped") for p in (0, 1)] == [
        4,
        4,
        4,
        4,
        -1,
        -1,
    ]


@pytest.mark.parametrize("cadence", ["end_of_operator", "end_of_batch"])
def test_a_function_that_fails_leaves_the_cursor_before_it_and_the_retry_sees_it_again(
    airflow_home: Path,
    liftbridge_server: DevServer,
    client: LiftbridgeClient,
    functions: tuple[str, Path],
    cadence: str,
) -> None:
    stream = stream_name()
    client.create_stream(stream, stream)
    client.publish_batch(stream, [f"m{i}".encode() for i in range(10)], ack_policy="all")
    module, tmp_path = functions
    log, marker = tmp_path / "seen.log", tmp_path / "failed-once"
    body = f"""
        LiftbridgeConsumeOperator(
            task_id="consume", stream={stream!r}, cursor_id="c", apply_function="{module}.remember",
            apply_function_kwargs={{"log": {str(log)!r}, "fail_at": 6, "marker": {str(marker)!r}}},
            max_batch_size=4, commit_cadence={cadence!r}, retries=1, retry_delay=0,
        )
    """
    run = run_dag(airflow_home, body, connection_env(liftbridge_server))
    assert marker.exists(), "the first try failed at offset 6"
    assert "cannot handle offset 6" in run.output
    assert run.states == {"consume": "success"}, run.output[-3000:]
    assert run.tries["consume"] == 2
    counts = seen(log)
    assert sorted(counts) == [(0, o) for o in range(10)], "every message succeeded once in the end"
    # The first try handled 0-5 before failing at 6. end_of_operator committed nothing, so the retry repeats
    # 0-5; end_of_batch committed the batch 0-3, so only 4-5 (the failed batch) come again.
    repeated = {o for (_, o), n in counts.items() if n > 1}
    assert repeated == (set(range(6)) if cadence == "end_of_operator" else {4, 5})
    assert client.fetch_cursor("c", stream, 0) == 9


def test_consume_and_publish_report_the_stream_to_hook_lineage(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient, functions: tuple[str, Path]
) -> None:
    """Lineage: with the OpenLineage provider writing events to a file, the consume task's
    event has the stream as its input and the publish task's as its output, named as documented."""
    module, tmp_path = functions
    stream = stream_name()
    client.create_stream(stream, stream)
    lineage = tmp_path / "openlineage.jsonl"
    transport = json.dumps({"type": "file", "log_file_path": str(lineage), "append": True})
    body = f"""
        publish = LiftbridgePublishOperator(task_id="publish", stream={stream!r}, messages=["a", "b"])
        consume = LiftbridgeConsumeOperator(
            task_id="consume", stream={stream!r}, cursor_id="c", apply_function="{module}.remember",
            apply_function_kwargs={{"log": {str(tmp_path / "seen.log")!r}}},
        )
        publish >> consume
    """
    run = run_dag(
        airflow_home, body, {**connection_env(liftbridge_server), "AIRFLOW__OPENLINEAGE__TRANSPORT": transport}
    )
    assert run.ok(), run.output[-3000:]
    dataset = {"namespace": f"liftbridge://{liftbridge_server.brokers[0]}", "name": stream}
    completed = {}
    for line in lineage.read_text().splitlines():
        event = json.loads(line)
        if event.get("eventType") == "COMPLETE" and event["job"]["name"].endswith((".publish", ".consume")):
            completed[event["job"]["name"].rsplit(".", 1)[1]] = event
    assert [{k: d[k] for k in ("namespace", "name")} for d in completed["consume"]["inputs"]] == [dataset]
    assert [{k: d[k] for k in ("namespace", "name")} for d in completed["publish"]["outputs"]] == [dataset]
