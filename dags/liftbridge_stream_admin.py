"""Stream administration with the Liftbridge operators: create, pause, make readonly, delete.

Uses the ``liftbridge_default`` connection. The stream it creates is deleted at the end.
"""

from __future__ import annotations

from airflow.sdk import DAG

from liftbridge_provider.operators.publish import LiftbridgePublishOperator
from liftbridge_provider.operators.streams import (
    LiftbridgeCreateStreamOperator,
    LiftbridgeDeleteStreamOperator,
    LiftbridgePauseStreamOperator,
    LiftbridgeSetStreamReadonlyOperator,
)
from liftbridge_provider.sensors.offset import LiftbridgePartitionOffsetSensor

STREAM = "admin-demo"

with DAG("liftbridge_stream_admin", schedule=None, catchup=False, tags=["liftbridge", "example"], doc_md=__doc__):
    create = LiftbridgeCreateStreamOperator(
        task_id="create_stream",
        stream=STREAM,
        partitions=2,
        retention_max_age=7 * 24 * 3600,
        segment_max_bytes=64 * 1024 * 1024,
        if_exists="fail",
    )
    publish = LiftbridgePublishOperator(
        task_id="publish", stream=STREAM, messages=[b"one", b"two", b"three"], partitioner="round_robin"
    )
    pause = LiftbridgePauseStreamOperator(task_id="pause_partition_1", stream=STREAM, partitions=[1])
    readonly = LiftbridgeSetStreamReadonlyOperator(task_id="make_partition_0_readonly", stream=STREAM, partitions=[0])
    check = LiftbridgePartitionOffsetSensor(
        task_id="check_partition_0", stream=STREAM, target_offsets={"0": 1}, poke_interval=1, timeout=60
    )
    delete = LiftbridgeDeleteStreamOperator(task_id="delete_stream", stream=STREAM, trigger_rule="all_done")

    create >> publish >> pause >> readonly >> check >> delete
