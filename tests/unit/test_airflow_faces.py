"""Pure translation in the Airflow faces: provider info, connection -> config, records, trigger, ranges."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from importlib import resources
from typing import Any

import jsonschema
import pytest

from liftbridge_provider.client import (
    BrokerInfo,
    InvalidArgumentError,
    Metadata,
    PartitionInfo,
    PublishMessage,
    StreamInfo,
)
from liftbridge_provider.core.ranges import (
    OffsetRange,
    RangesDocument,
    cap_total,
    check_retention,
    interval_start_may_be_lost,
    parse_instant,
    partition_offsets,
    ranges_from_offsets,
)
from liftbridge_provider.get_provider_info import get_provider_info
from liftbridge_provider.hooks.liftbridge import brokers_from, config_from_connection, thin_cursors_warning
from liftbridge_provider.operators.publish import record_to_message
from liftbridge_provider.telemetry import cursor_lag
from liftbridge_provider.triggers.offset import LiftbridgeOffsetTrigger, unmet_targets, waiting_note


def airflow_schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(resources.files("airflow").joinpath(name).read_text())
    return schema


def test_provider_info_is_valid_against_airflow_schemas() -> None:
    info = get_provider_info()
    jsonschema.validate(info, airflow_schema("provider_info.schema.json"))
    connection_schema = airflow_schema("provider.yaml.schema.json")["properties"]["connection-types"]
    jsonschema.validate(info["connection-types"], connection_schema)
    (connection,) = info["connection-types"]
    assert connection["connection-type"] == "liftbridge"
    assert connection["conn-fields"]["tls_private_key"]["schema"]["format"] == "password"
    assert info["package-name"] == "airflow-provider-liftbridge"


def test_provider_info_names_importable_classes() -> None:
    import importlib  # noqa: PLC0415

    info = get_provider_info()
    modules = [
        m for kind in ("hooks", "operators", "sensors", "triggers") for e in info[kind] for m in e["python-modules"]
    ]
    for module in modules:
        importlib.import_module(module)
    for dotted in [*info["queues"], info["asset-uris"][0]["handler"], info["asset-uris"][0]["factory"]]:
        module, _, name = dotted.rpartition(".")
        assert callable(getattr(importlib.import_module(module), name)), dotted
    hook_path = info["connection-types"][0]["hook-class-name"]
    module, _, name = hook_path.rpartition(".")
    hook = getattr(importlib.import_module(module), name)
    assert (hook.conn_type, hook.default_conn_name, hook.conn_name_attr) == (
        "liftbridge",
        "liftbridge_default",
        "liftbridge_conn_id",
    )


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        ("a:1,b:2", None, ("a:1", "b:2")),
        ("a, b", None, ("a:9292", "b:9292")),
        ("a,b:7", 5000, ("a:5000", "b:7")),
        ("[::1]:9", None, ("[::1]:9",)),
    ],
)
def test_brokers_from_host_and_port(host: str, port: int | None, expected: tuple[str, ...]) -> None:
    assert brokers_from(host, port) == expected


def test_connection_extras_become_client_options() -> None:
    config = config_from_connection(
        "h:1",
        None,
        {
            "request_timeout": "3.5",
            "max_conns_per_broker": 4,
            "keep_alive_time": 9,
            "resubscribe_wait": "12",
            "read_isr_replica": "true",
            "tls_ca_cert": "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----",
            "tls_server_name": "liftbridge.internal",
        },
    )
    assert (config.request_timeout, config.max_conns_per_broker, config.keep_alive_time) == (3.5, 4, 9.0)
    assert config.resubscribe_wait == 12.0
    assert config.read_isr_replica is True
    assert config.tls is not None
    assert config.tls.server_name == "liftbridge.internal"
    assert config_from_connection("h", None, {"tls_ca_cert": ""}).tls is None


@pytest.mark.parametrize(
    ("host", "extra", "message"),
    [
        (None, {}, "no host"),
        ("h:99999", {}, "invalid broker address 'h:99999'"),
        ("h", {"request_timeout": "soon"}, "request_timeout must be a number, got 'soon'"),
        ("h", {"request_timeout": -1}, "request_timeout must be a number of seconds > 0, got -1.0"),
        ("h", {"max_conns_per_broker": 0}, "max_conns_per_broker must be a whole number >= 1, got 0"),
        ("h", {"read_isr_replica": "maybe"}, "read_isr_replica must be true or false, got 'maybe'"),
        ("h", {"bootstrap.servers": "x"}, "unknown Liftbridge connection extras ['bootstrap.servers']"),
        ("h", {"tls_client_cert": "c.pem"}, "both a client certificate and a client key"),
    ],
)
def test_bad_connection_extras_are_named(host: str | None, extra: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        config_from_connection(host, None, extra)
    assert message in str(raised.value)


def test_records_to_messages() -> None:
    assert record_to_message(b"raw") == PublishMessage(value=b"raw")
    assert record_to_message("text") == PublishMessage(value=b"text")
    record = {"id": 7, "user": "u1", "trace": "t-9", "body": {"a": 1}}
    whole = record_to_message(record, key_field="user", header_fields=["trace"])
    assert whole.key == b"u1"
    assert whole.headers == {"trace": b"t-9"}
    assert json.loads(whole.value) == record
    assert record_to_message(record, value_field="body").value == b'{"a":1}'
    assert record_to_message(record, key_field="id").key == b"7"
    with pytest.raises(InvalidArgumentError, match=r"record has no field\(s\) \['missing'\]"):
        record_to_message(record, key_field="missing")
    with pytest.raises(InvalidArgumentError, match="need mapping records"):
        record_to_message(b"raw", key_field="user")
    with pytest.raises(InvalidArgumentError, match="record must be bytes, str or a mapping, got object"):
        record_to_message(object())


def test_trigger_serialize_round_trip() -> None:
    trigger = LiftbridgeOffsetTrigger(
        stream="s", targets={0: 5, "2": 9}, liftbridge_conn_id="lb", poll_interval=0.5, timeout=30
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "liftbridge_provider.triggers.offset.LiftbridgeOffsetTrigger"
    assert kwargs == {
        "stream": "s",
        "targets": {"0": 5, "2": 9},
        "liftbridge_conn_id": "lb",
        "poll_interval": 0.5,
        "timeout": 30,
    }
    assert json.loads(json.dumps(kwargs)) == kwargs
    again = LiftbridgeOffsetTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert again.targets == {0: 5, 2: 9}


def test_a_wait_names_partitions_that_hold_their_target_but_have_not_committed_it() -> None:
    """Chaos seed 155: an RF 1 partition restarted after a SIGKILL held offsets 0-144 with high watermark -1
    until the next publish; the sensor only said it was waiting for 146 more offsets."""
    from liftbridge_provider.client.metadata import PartitionInfo  # noqa: PLC0415

    def info(partition: int, high_watermark: int, newest: int) -> PartitionInfo:
        return PartitionInfo("age", partition, "n1", ("n1",), ("n1",), high_watermark, newest, True, False)

    infos = {0: info(0, 9, 9), 1: info(1, -1, 144), 2: info(2, 3, 5)}
    note = waiting_note("age", {0: 9, 1: 45, 2: 20}, infos)
    assert note.startswith("age: waiting for {1: 46, 2: 17} more offset(s) per partition; ")
    assert "partition 1 holds offsets up to 144 but its high watermark is -1" in note
    assert "partition 2" not in note, "partition 2 does not hold offset 20 yet"
    assert waiting_note("age", {2: 20}, infos) == "age: waiting for {2: 17} more offset(s) per partition"


def test_unmet_targets() -> None:
    assert unmet_targets({0: 5, 1: 3}, {0: 5, 1: 1}) == {1: 2}
    assert unmet_targets({0: 0}, {}) == {0: 1}
    assert unmet_targets({0: 4}, {0: 9}) == {}


def test_ranges_document_round_trip_and_validation() -> None:
    document = ranges_from_offsets("orders", {1: 5, 0: 0}, {0: 10, 1: 5}, cursor_id="ingest")
    assert [r.partition for r in document.ranges] == [0, 1]
    assert document.total == 10
    assert document.range_for(1).last is None
    assert RangesDocument.parse(document.dumps()) == document
    assert RangesDocument.parse(document.to_json()) == document
    assert document.to_json() == {
        "version": 1,
        "stream": "orders",
        "cursor_id": "ingest",
        "ranges": [{"partition": 0, "start": 0, "end": 10}, {"partition": 1, "start": 5, "end": 5}],
    }


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "must be a JSON object, got list"),
        ({"stream": "s", "ranges": [{"partition": 0, "start": 5, "end": 2}]}, "end 2 is before start 5"),
        ({"stream": "s", "ranges": [{"partition": 0, "start": -1, "end": 2}]}, "start must be a whole number >= 0"),
        ({"stream": "s", "ranges": [{"partition": 0, "start": 0}]}, "each range must be"),
        ({"stream": "s", "ranges": "0-5"}, "'ranges' must be a list"),
        ({"stream": "", "ranges": []}, "invalid stream name ''"),
        ({"stream": "s", "ranges": [], "extra": 1}, "unknown keys in ranges document: ['extra']"),
        ({"stream": "s", "version": 2, "ranges": []}, "unsupported ranges document version 2"),
        (
            {"stream": "s", "ranges": [{"partition": 0, "start": 0, "end": 1}, {"partition": 0, "start": 1, "end": 2}]},
            "partitions must appear once each",
        ),
    ],
)
def test_malformed_ranges_documents_are_refused(document: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        RangesDocument.parse(document)
    assert message in str(raised.value)


def test_partition_offsets_accepts_json_keys() -> None:
    assert partition_offsets('{"0": 5, "3": 0}', "start") == {0: 5, 3: 0}
    with pytest.raises(InvalidArgumentError, match="start: partition 'x' is not a number"):
        partition_offsets({"x": 1}, "start")
    with pytest.raises(InvalidArgumentError, match="end offset of partition 0 must be a whole number >= 0, got -3"):
        partition_offsets({0: -3}, "end")
    assert OffsetRange(0, 3, 3).count == 0


@pytest.mark.parametrize(
    ("earliest", "compacted", "readable", "lost"),
    [
        pytest.param(None, False, (10, 20), None, id="never-held-a-message"),
        pytest.param(5, False, (10, 20), None, id="start-retained"),
        pytest.param(10, False, (10, 20), None, id="start-is-earliest"),
        pytest.param(15, False, (15, 20), (10, 15), id="head-removed-by-retention"),
        pytest.param(30, False, (20, 20), (10, 20), id="whole-range-removed"),
        pytest.param(15, True, (10, 20), None, id="compacted-head-gap-is-normal"),
    ],
)
def test_check_retention_tells_retention_loss_from_compaction_gaps(
    earliest: int | None, compacted: bool, readable: tuple[int, int], lost: tuple[int, int] | None
) -> None:
    """A compacted stream's first retained offset past the start is no loss."""
    check = check_retention(OffsetRange(3, 10, 20), earliest, compacted=compacted)
    assert (check.readable.start, check.readable.end) == readable
    assert check.readable.partition == 3
    assert check.lost == lost
    assert check.lost_count == (0 if lost is None else lost[1] - lost[0])


def _cluster_metadata(brokers: int, cursor_replicas: int) -> Metadata:
    broker_ids = [f"n{i}" for i in range(1, brokers + 1)]
    cursors = PartitionInfo(
        stream="__cursors",
        id=0,
        leader="n1",
        replicas=tuple(broker_ids[:cursor_replicas]),
        isr=tuple(broker_ids[:cursor_replicas]),
        high_watermark=-1,
        newest_offset=-1,
        paused=False,
        readonly=False,
    )
    return Metadata(
        brokers={b: BrokerInfo(b, "127.0.0.1", 9290 + i) for i, b in enumerate(broker_ids)},
        streams={"__cursors": StreamInfo("__cursors", "c", {0: cursors}, 0)},
        fetched_at=0.0,
    )


@pytest.mark.parametrize(
    ("brokers", "replicas", "warns"),
    [(3, 1, True), (3, 2, True), (3, 3, False), (1, 1, False), (5, 3, False), (5, 2, True)],
)
def test_thin_cursors_warning_flags_cursors_that_die_with_one_broker(brokers: int, replicas: int, warns: bool) -> None:
    """Guards chaos seed 27: a seed-bootstrapped cluster keeps committed cursors on one broker."""
    warning = thin_cursors_warning(_cluster_metadata(brokers, replicas))
    assert bool(warning) is warns
    if warns:
        assert f"{replicas} replica(s) on {brokers} brokers" in warning
        assert "clustering.raft.bootstrap.peers" in warning


def test_interval_times_parse_as_aware_datetimes_and_anything_else_is_named() -> None:
    assert parse_instant("2026-11-24T10:00:00+01:00", "start_time") == datetime(2026, 11, 24, 9, tzinfo=UTC)
    assert parse_instant(" 2026-11-24T09:00:00Z ", "t") == datetime(2026, 11, 24, 9, tzinfo=UTC)
    aware = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_instant(aware, "t") is aware
    with pytest.raises(InvalidArgumentError, match="end_time must carry a time zone"):
        parse_instant("2026-11-24T10:00:00", "end_time")
    with pytest.raises(InvalidArgumentError, match="start_time must be an ISO 8601 time"):
        parse_instant("yesterday", "start_time")
    with pytest.raises(InvalidArgumentError, match="must be a timezone-aware datetime"):
        parse_instant(1700000000, "t")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("offsets", "earliest", "compacted", "latest_received", "may_be_lost"),
    [
        ((10, 15), 10, False, 50, True),  # begins where retention stopped: its head may be gone
        ((10, 15), 10, True, 50, False),  # compacted: gaps are normal
        ((0, 5), 0, False, 50, False),  # nothing was ever removed
        ((12, 15), 10, False, 50, False),  # begins after the oldest retained offset: whole
        ((10, 15), None, False, None, False),  # never held a message
        ((10, 10), 10, False, 50, True),  # empty, and a message came after the start time: removed
        ((10, 10), 10, False, None, True),  # empty, the leader does not know its latest message: maybe
        ((10, 10), 10, False, 20, False),  # empty, the latest message came before the start time: none
    ],
)
def test_an_interval_starting_at_the_retention_boundary_may_have_lost_messages(
    offsets: tuple[int, int], earliest: int | None, compacted: bool, latest_received: int | None, may_be_lost: bool
) -> None:
    offset_range = OffsetRange(0, *offsets)
    lost = interval_start_may_be_lost(
        offset_range, earliest, compacted=compacted, start_time=30, latest_received=latest_received
    )
    assert lost is may_be_lost


def test_cursor_lag_counts_offsets_after_the_cursor_up_to_the_high_watermark() -> None:
    assert cursor_lag(high_watermark=9, cursor=-1) == 10
    assert cursor_lag(high_watermark=9, cursor=9) == 0
    assert cursor_lag(high_watermark=-1, cursor=-1) == 0
    assert cursor_lag(high_watermark=4, cursor=7) == 0, "a cursor ahead (a lagging new leader) is not negative"


@pytest.mark.parametrize(
    ("counts", "cap", "expected"),
    [
        ((10, 10, 10), 9, (3, 3, 3)),
        ((10, 1, 10), 9, (4, 1, 4)),  # the short range's share goes to the others
        ((10, 0, 2), 9, (7, 0, 2)),
        ((3, 3), 10, (3, 3)),  # under the cap: unchanged
        ((5, 5), 0, (0, 0)),
        ((10, 10, 10), 2, (1, 1, 0)),  # fewer than partitions: the first ones
    ],
)
def test_a_total_cap_is_shared_evenly_across_partitions(
    counts: tuple[int, ...], cap: int, expected: tuple[int, ...]
) -> None:
    document = RangesDocument("s", tuple(OffsetRange(p, 100, 100 + n) for p, n in enumerate(counts)), "c")
    capped = cap_total(document, cap)
    assert tuple(r.count for r in capped.ranges) == expected
    assert all(r.start == 100 for r in capped.ranges)
    assert (capped.stream, capped.cursor_id) == ("s", "c")


def test_lake_outputs_become_asset_uris() -> None:
    from liftbridge_provider.telemetry import lake_uri  # noqa: PLC0415

    assert lake_uri("/data/lake") == "file:///data/lake"
    assert lake_uri("s3a://bucket/lake") == "s3://bucket/lake"
    assert lake_uri("hdfs://nn:8020/lake") == "hdfs://nn:8020/lake"
    assert lake_uri("relative/lake").startswith("file:///")


def test_liftbridge_assets_become_openlineage_datasets_named_like_kafka_topics() -> None:
    from airflow.sdk import Asset  # noqa: PLC0415

    from liftbridge_provider.assets.liftbridge import convert_asset_to_openlineage  # noqa: PLC0415

    dataset = convert_asset_to_openlineage(Asset(uri="liftbridge://broker1:9292/orders"), None)
    assert (dataset.namespace, dataset.name) == ("liftbridge://broker1:9292", "orders")
