"""The Liftbridge page's pure parts: __cursors records, cursor kinds, lag, rows, secrets, the TTL cache."""

from __future__ import annotations

import threading
import time
from types import MappingProxyType
from typing import Any

import pytest

from liftbridge_provider.client import Metadata, PartitionInfo, StreamInfo, UnavailableError
from liftbridge_provider.core.watching import CursorNames
from liftbridge_provider.cursor_state import CursorStateStore
from liftbridge_provider.ui import bounds
from liftbridge_provider.ui.airflow_sources import LiftbridgeConnection
from liftbridge_provider.ui.cursor_log import CursorRecord, cursor_kind, cursor_record, latest, positions, scan_start
from liftbridge_provider.ui.service import OverviewService
from liftbridge_provider.ui.views import (
    DeadLetterRead,
    WatcherInfo,
    connection_summary,
    cursor_rows,
    dead_letter_view,
    fold_dead_letters,
    lag,
    redact,
    secrets_of,
    stream_rows,
    watcher_rows,
)


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def cursor_value(stream: str, partition: int, cursor_id: str, offset: int) -> bytes:
    """The server's Cursor protobuf (stream = 1, partition = 2, cursorId = 3, offset = 4), written by hand."""
    data = b"\x0a" + _varint(len(stream)) + stream.encode()
    if partition:
        data += b"\x10" + _varint(partition)
    data += b"\x1a" + _varint(len(cursor_id)) + cursor_id.encode()
    if offset:
        data += b"\x20" + _varint(offset)
    return data


def test_a_cursors_message_reads_as_the_cursor_it_sets() -> None:
    key = b"ingest,orders.eu,3"
    assert cursor_record(key, cursor_value("orders.eu", 3, "ingest", 41)) == CursorRecord("ingest", "orders.eu", 3, 41)
    # offset 0 and partition 0 are left out of the protobuf; -1 is ten bytes of varint
    assert cursor_record(b"c,s,0", cursor_value("s", 0, "c", 0)) == CursorRecord("c", "s", 0, 0)
    assert cursor_record(b"c,s,0", cursor_value("s", 0, "c", -1)) == CursorRecord("c", "s", 0, -1)
    # the key fills what the value leaves out; a stream name with a comma stays whole
    assert cursor_record(b"c,a,b,7", b"\x20\x05") == CursorRecord("c", "a,b", 7, 5)


@pytest.mark.parametrize("value", [b"\x0a\x05ab", b"\x20", b"\x0f", b"\x20" + b"\xff" * 11])
def test_a_malformed_cursors_message_is_skipped(value: bytes) -> None:
    assert cursor_record(b"c,s,0", value) is None
    assert cursor_record(b"\xff,s,0", b"") is None


def test_the_newest_record_of_each_cursor_wins() -> None:
    found = latest([CursorRecord("c", "s", 0, 1), None, CursorRecord("c", "s", 1, 7), CursorRecord("c", "s", 0, 9)])
    assert found == {("c", "s", 0): CursorRecord("c", "s", 0, 9), ("c", "s", 1): CursorRecord("c", "s", 1, 7)}


def test_cursor_kinds_follow_the_providers_names() -> None:
    names = CursorNames(cursor_id="orders.watch")
    bookkeeping = [names.start, names.planned, names.recorded, names.slot_start(1), names.slot_end(0)]
    bookkeeping += [names.handover, names.handed_by]
    for name in bookkeeping:
        assert cursor_kind(name, ["orders.watch"]) == "watcher-state", name
    assert cursor_kind("orders.watch", ["orders.watch"]) == "watcher"
    assert cursor_kind("orders.watch") == "cursor"
    assert cursor_kind("__group:ingesters") == "group"
    assert cursor_kind("ingest.eu") == "cursor"
    store = CursorStateStore(None, "s", dag_id="d", task_id="t", run_id="r")  # type: ignore[arg-type]
    assert cursor_kind(store._cursor("ranges", "sum")) == "task-state"
    found = latest([CursorRecord(names.handover, "s", 0, 1), CursorRecord("ingest", "s", 0, 2)])
    assert [r.cursor_id for r in positions(found, ["orders.watch"])] == ["ingest"]


def test_a_scan_reads_at_most_the_newest_messages() -> None:
    assert scan_start(-1, 10) == 0
    assert scan_start(9, 10) == 0
    assert scan_start(10, 10) == 1
    assert scan_start(1_000_000, 20_000) == 980_001


def partition(stream: str, pid: int, high: int, **changes: object) -> PartitionInfo:
    fields: dict[str, object] = {
        "stream": stream,
        "id": pid,
        "leader": "b1",
        "replicas": ("b1", "b2"),
        "isr": ("b1", "b2"),
        "high_watermark": high,
        "newest_offset": high,
        "paused": False,
        "readonly": False,
    }
    fields.update(changes)
    return PartitionInfo(**fields)  # type: ignore[arg-type]


def metadata(*streams: tuple[str, list[PartitionInfo]]) -> Metadata:
    infos = {name: StreamInfo(name, name, MappingProxyType({p.id: p for p in parts}), 0) for name, parts in streams}
    return Metadata(MappingProxyType({}), MappingProxyType(infos), 0.0)


def test_lag_is_the_high_watermark_minus_the_cursor_never_below_zero() -> None:
    assert lag(9, 5) == 4
    assert lag(9, -1) == 10
    assert lag(-1, -1) == 0
    assert lag(3, 7) == 0


def test_streams_show_each_partitions_state_internal_streams_last() -> None:
    meta = metadata(
        ("__cursors", [partition("__cursors", 0, 4)]),
        ("orders", [partition("orders", 0, 9, isr=("b1",), paused=True), partition("orders", 1, -1, readonly=True)]),
    )
    rows = stream_rows(meta)
    assert [r["stream"] for r in rows] == ["orders", "__cursors"]
    first, second = rows[0]["partitions"]
    assert first == {
        "partition": 0,
        "leader": "b1",
        "replicas": ["b1", "b2"],
        "isr": ["b1"],
        "under_replicated": True,
        "high_watermark": 9,
        "newest_offset": 9,
        "paused": True,
        "readonly": False,
    }
    assert second["readonly"]
    assert not second["under_replicated"]
    assert rows[0]["messages"] == 10


def test_cursor_rows_give_the_lag_per_partition() -> None:
    meta = metadata(("orders", [partition("orders", 0, 9), partition("orders", 1, 20)]))
    records = [CursorRecord("ingest", "orders", 1, 15), CursorRecord("ingest", "orders", 0, 9)]
    records += [CursorRecord("old", "gone", 0, 3)]
    rows = cursor_rows(records, meta, ["w"])
    assert rows[0]["cursor_id"] == "ingest"
    assert [(p["partition"], p["offset"], p["high_watermark"], p["lag"]) for p in rows[0]["partitions"]] == [
        (0, 9, 9, 0),
        (1, 15, 20, 5),
    ]
    assert (rows[0]["total_lag"], rows[0]["max_lag"], rows[0]["kind"]) == (5, 5, "cursor")
    assert rows[1]["stream_exists"] is False
    assert rows[1]["partitions"][0]["lag"] is None


def test_watcher_rows_count_their_own_dead_letters() -> None:
    meta = metadata(("orders", [partition("orders", 0, 9), partition("orders", 1, 4)]))
    letters = [
        dead_letter_view(0, 10, {"lb-dlq-cursor-id": b"w1", "lb-dlq-error": b"old", "lb-dlq-offset": b"2"}),
        dead_letter_view(1, 30, {"lb-dlq-cursor-id": b"w1", "lb-dlq-error": b"bad json", "lb-dlq-offset": b"7"}),
        dead_letter_view(2, 20, {"lb-dlq-cursor-id": b"w2", "lb-dlq-error": b"other"}),
    ]
    read = DeadLetterRead(fold_dead_letters(letters), total=3, complete=True)
    watchers = [
        WatcherInfo("w1", "asset1", "orders", "w1", "message", "dlq", (1,), "2026-01-01T00:00:00+00:00"),
        WatcherInfo("w3", "asset3", "orders", "w3", "batch", None),
    ]
    rows = watcher_rows(watchers, [CursorRecord("w1", "orders", 1, 2)], meta, {"dlq": read})
    one, three = rows
    assert one["partitions"] == [{"partition": 1, "offset": 2, "high_watermark": 4, "lag": 2}]
    assert one["dead_letters"]["count"] == 2
    assert one["dead_letters"]["last"]["error"] == "bad json"
    assert one["dead_letters"]["last"]["offset"] == "7"
    assert one["last_event"] == "2026-01-01T00:00:00+00:00"
    assert three["dead_letters"] is None
    assert three["total_lag"] == 10 + 5  # no position yet: every offset is behind


PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nSECRETLINE2abcdef\n-----END PRIVATE KEY-----"


def test_no_secret_of_a_connection_survives() -> None:
    extra = {"tls_private_key": PEM, "nats_token": "tok-123456", "request_timeout": 2, "read_isr_replica": True}
    summary = connection_summary("lb", ["a:9292"], extra)
    assert summary == {"conn_id": "lb", "brokers": ["a:9292"], "tls": True, "nats": False}
    secrets = secrets_of("hunter2-password", extra)
    text = f"failed with key {PEM} and token tok-123456, password hunter2-password; SECRETLINE2abcdef"
    cleaned = redact(text, secrets)
    for secret in ("hunter2-password", "tok-123456", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC", "SECRETLINE2abcdef"):
        assert secret not in cleaned
    assert "2" not in secrets
    assert "True" not in secrets
    assert secrets_of(None, {}) == []


def test_the_cache_keeps_values_and_errors_for_its_ttl_and_computes_once() -> None:
    now = [100.0]
    cache: bounds.TtlCache[int] = bounds.TtlCache(ttl=5.0, clock=lambda: now[0])
    calls: list[str] = []

    def compute() -> int:
        calls.append("x")
        return len(calls)

    assert cache.get("a", compute).value == 1
    now[0] += 4.9
    assert cache.get("a", compute).value == 1
    now[0] += 0.2
    assert cache.get("a", compute).value == 2

    def fail() -> int:
        raise TimeoutError("no answer within 5 s")

    failed = cache.get("b", fail)
    assert (failed.value, failed.error) == (None, "no answer within 5 s")
    assert cache.get("b", compute).error == "no answer within 5 s"  # the error is kept too


def test_concurrent_callers_share_one_computation() -> None:
    cache: bounds.TtlCache[int] = bounds.TtlCache(ttl=5.0)
    started, calls = threading.Event(), []

    def slow() -> int:
        calls.append(1)
        started.set()
        time.sleep(0.2)
        return 7

    results: list[int | None] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("k", slow).value)) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [7] * 5
    assert len(calls) == 1


def test_the_page_bounds_its_requests() -> None:
    assert bounds.ui_request_timeout(10.0) == bounds.METADATA_TIMEOUT == 5.0
    assert bounds.ui_request_timeout(2.0) == 2.0
    assert bounds.METADATA_TIMEOUT + bounds.READ_TIMEOUT < bounds.BROWSER_TIMEOUT
    assert bounds.REFRESH_INTERVAL >= bounds.CACHE_TTL


def test_an_unreachable_cluster_is_one_clear_error_without_secrets() -> None:
    conn = LiftbridgeConnection(
        "lb",
        "127.0.0.1:1",
        None,
        "hunter2-password",
        {"nats_servers": "nats://127.0.0.1:1", "nats_token": "tok-123456"},
    )

    def unreachable(conn_id: str, config: object) -> Any:
        raise UnavailableError("refused while sending hunter2-password and tok-123456")

    service = OverviewService(
        find=lambda _: conn, list_all=lambda: [conn], watchers=lambda _: [], client_for=unreachable
    )
    overview, error, _ = service.overview(conn)
    assert overview is None
    assert error is not None
    assert error.startswith("Liftbridge at 127.0.0.1:1 did not answer within ")
    assert "hunter2" not in error
    assert "tok-123456" not in error
    assert "***" in error
    bad = LiftbridgeConnection("bad", None, None, "hunter2-password", {})
    assert service.overview(bad)[1] == (
        "the connection cannot be used: the Liftbridge connection has no host: give one or more brokers as host:port"
    )
    assert [c["conn_id"] for c in service.connections()] == ["lb"]
