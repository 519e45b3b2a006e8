"""The offsets a task read reach its OpenLineage events: tasks run by `airflow dags test` on a real node, with
the OpenLineage provider writing its events to a file, which the tests read.

`airflow dags test` runs every task in its own process's place: in one process, whose hook lineage
collector Airflow keeps for the process, so a task's event would also list what the tasks (and tries)
before it reported. A real task try starts in a process of its own with an empty collector; the DAGs
here start each try the same way (``pre_execute=fresh_lineage``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from liftbridge_provider.assets.offsets import FACET_NAME, SCHEMA_URL
from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.devserver import DevServer
from tests.airflow.airflow_runs import connection_env, run_dag, stream_name

FUNCTIONS = '''
import pathlib

from airflow.providers.common.compat.sdk import get_hook_lineage_collector


def fresh_lineage(context):
    """Start the try with an empty hook lineage collector, as a task process of its own does."""
    get_hook_lineage_collector.cache_clear()

def fail_once_at(message, offset, marker):
    """Raise the first time ``offset`` comes (``marker`` remembers it), accept everything else."""
    if message.offset == offset and not pathlib.Path(marker).exists():
        pathlib.Path(marker).touch()
        raise ValueError(f"cannot handle offset {message.offset}")
'''


def lineage_env(server: DevServer, events: Path) -> dict[str, str]:
    transport = json.dumps({"type": "file", "log_file_path": str(events), "append": True})
    return {**connection_env(server), "AIRFLOW__OPENLINEAGE__TRANSPORT": transport}


def offsets_of(events: Path, task_id: str, event_type: str) -> list[dict[str, Any]]:
    """The ``liftbridge_offsets`` facets of the input datasets of ``task_id``'s events of ``event_type``
    (START, COMPLETE, FAIL), in the order they were written."""
    found = []
    for line in events.read_text().splitlines():
        event = json.loads(line)
        if event.get("eventType") != event_type or not event["job"]["name"].endswith(f".{task_id}"):
            continue
        found += [d["facets"][FACET_NAME] for d in event.get("inputs", []) if FACET_NAME in d.get("facets", {})]
    return found


def ranges(facet: dict[str, Any]) -> list[tuple[int, int, int]]:
    return [(r["partition"], r["start"], r["end"]) for r in facet["ranges"]]


def test_freeze_consume_and_commit_events_carry_the_exact_ranges(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """The freeze's and the commit's completed events carry the frozen ranges (as the freeze returned them),
    and the consume's carries what it read; each names the stream, the cursor, and our schema."""
    stream = stream_name()
    client.create_stream(stream, stream, partitions=2)
    client.publish_batch(stream, [f"m{i}".encode() for i in range(7)], partitioner="round_robin", ack_policy="all")
    (airflow_home / "dags" / "lineage_functions.py").write_text(FUNCTIONS)
    events = tmp_path / "openlineage.jsonl"
    body = f"""
        from lineage_functions import fresh_lineage
        freeze = LiftbridgeOffsetRangesOperator(
            task_id="freeze", stream={stream!r}, cursor_id="ingest", pre_execute=fresh_lineage
        )
        commit = LiftbridgeCommitCursorOperator(task_id="commit", ranges=freeze.output, pre_execute=fresh_lineage)
        consume = LiftbridgeConsumeOperator(
            task_id="consume", stream={stream!r}, cursor_id="other", apply_function=repr, max_batch_size=2,
            pre_execute=fresh_lineage,
        )
        freeze >> commit >> consume
    """
    run = run_dag(airflow_home, body, lineage_env(liftbridge_server, events))
    assert run.ok(), run.output[-3000:]
    frozen = [(r["partition"], r["start"], r["end"]) for r in run.xcom["freeze"]["ranges"]]
    assert frozen == [(0, 0, 4), (1, 0, 3)]
    for task_id, cursor_id in (("freeze", "ingest"), ("commit", "ingest"), ("consume", "other")):
        facets = offsets_of(events, task_id, "COMPLETE")
        assert len(facets) == 1, (task_id, facets)
        facet = facets[0]
        assert ranges(facet) == frozen, task_id
        assert (facet["stream"], facet["cursorId"], facet["_schemaURL"]) == (stream, cursor_id, SCHEMA_URL)


def test_a_consume_that_failed_part_way_reports_what_each_try_read(
    airflow_home: Path, liftbridge_server: DevServer, client: LiftbridgeClient, tmp_path: Path
) -> None:
    """A function fails at offset 6 on the first try (batches of 4, a commit after each): that try read
    [0, 8) and its failed event says so; the retry resumes after the committed batch and reports [4, 10)."""
    stream = stream_name()
    client.create_stream(stream, stream)
    client.publish_batch(stream, [f"m{i}".encode() for i in range(10)], ack_policy="all")
    (airflow_home / "dags" / "lineage_functions.py").write_text(FUNCTIONS)
    events, marker = tmp_path / "openlineage.jsonl", tmp_path / "failed-once"
    body = f"""
        LiftbridgeConsumeOperator(
            task_id="consume", stream={stream!r}, cursor_id="c", apply_function="lineage_functions.fail_once_at",
            apply_function_kwargs={{"offset": 6, "marker": {str(marker)!r}}},
            max_batch_size=4, commit_cadence="end_of_batch", retries=1, retry_delay=0,
            pre_execute=__import__("lineage_functions").fresh_lineage,
        )
    """
    run = run_dag(airflow_home, body, lineage_env(liftbridge_server, events))
    assert run.states == {"consume": "success"}, run.output[-3000:]
    assert run.tries["consume"] == 2
    assert [ranges(f) for f in offsets_of(events, "consume", "FAIL")] == [[(0, 0, 8)]]
    assert [ranges(f) for f in offsets_of(events, "consume", "COMPLETE")] == [[(0, 4, 10)]]
