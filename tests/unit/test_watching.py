"""Pure parts of the stream watchers: settings, payloads, batch timing and resume, trigger wiring."""

from __future__ import annotations

import asyncio
import base64
from typing import Any
from urllib.parse import urlsplit

import pytest

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.assets.liftbridge import create_asset, sanitize_uri
from liftbridge_provider.client import InvalidArgumentError, Message
from liftbridge_provider.core.watching import (
    DEAD_LETTER_ERROR_BYTES,
    AdvanceDecision,
    Outcome,
    WatchSettings,
    batch_document,
    batch_due,
    check_payload,
    dead_letter_headers,
    decide_advance,
    encode_bytes,
    message_payload,
    resume_point,
)
from liftbridge_provider.triggers.activity import activity_payload, check_activity_ops
from liftbridge_provider.triggers.message import LiftbridgeMessageTrigger
from liftbridge_provider.triggers.watchers import WatcherError, reader_for


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "stream"}, "mode must be one of message, batch; got 'stream'"),
        ({"start_from": "oldest"}, "start_from must be one of earliest, latest; got 'oldest'"),
        ({"partitions": [0, 0]}, "partitions must list distinct partitions"),
        ({"partitions": []}, "partitions must list distinct partitions"),
        ({"partitions": [-1]}, "partition"),
        ({"cursor_id": "a,b"}, "cursor_id must be a non-empty string without commas"),
        ({"max_in_flight": 0}, "max_in_flight must be a whole number >= 1, got 0"),
        ({"max_messages": 2.5}, "max_messages must be a whole number >= 1, got 2.5"),
        ({"max_wait": 0}, "max_wait must be a number of seconds > 0, got 0"),
        ({"poll_interval": float("nan")}, "poll_interval must be a number of seconds > 0"),
        # every poll is a metadata request: a nanosecond interval was a busy loop against the brokers
        ({"poll_interval": 1e-9}, "poll_interval must be at least 0.1 seconds (every poll is a request"),
        ({"max_wait": 1e12}, "max_wait must be at most 1e.09 seconds, got 1000000000000.0"),
        ({"liftbridge_conn_id": ""}, "liftbridge_conn_id must be a connection id"),
        ({"dlq_stream": "orders"}, "dlq_stream must be another stream than 'orders'"),
        ({"dlq_stream": "dead letters"}, "invalid stream name 'dead letters'"),
        ({"dlq_stream": "orders-dlq", "mode": "batch"}, "dlq_stream works on single messages"),
    ],
)
def test_bad_settings_are_named(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message.replace("(", r"\(").replace("[", r"\[")):
        WatchSettings(stream="orders", **kwargs)


@pytest.mark.parametrize("poll_interval", [1e-9, 0.0999])
def test_the_message_trigger_refuses_a_poll_interval_under_the_floor(poll_interval: float) -> None:
    """The batch watcher's trigger polls the high watermark every poll_interval seconds: below 0.1 s it is refused
    when the DAG is parsed, naming the value and the floor."""
    with pytest.raises(InvalidArgumentError, match=r"poll_interval must be at least 0\.1 seconds") as raised:
        LiftbridgeMessageTrigger(stream="orders", mode="batch", poll_interval=poll_interval)
    assert repr(poll_interval) in str(raised.value)
    assert LiftbridgeMessageTrigger(stream="orders", mode="batch", poll_interval=0.1).settings.poll_interval == 0.1


def test_group_key_separates_what_changes_the_reader() -> None:
    base = WatchSettings(stream="orders", partitions=(1, 0))
    assert base.partitions == (0, 1)
    assert base.cursor == "airflow-message-watcher"
    assert WatchSettings(stream="orders", mode="batch").cursor == "airflow-batch-watcher"
    assert base.group_key() == WatchSettings(stream="orders", partitions=[0, 1]).group_key()  # type: ignore[arg-type]
    for other in (
        WatchSettings(stream="orders"),
        WatchSettings(stream="orders", partitions=(0, 1), cursor_id="mine"),
        WatchSettings(stream="orders", partitions=(0, 1), max_in_flight=2),
        WatchSettings(stream="orders", partitions=(0, 1), liftbridge_conn_id="other"),
        WatchSettings(stream="orders", partitions=(0, 1), start_from="latest"),
    ):
        assert other.group_key() != base.group_key()
    batch = WatchSettings(stream="orders", mode="batch", cursor_id="c")
    assert batch.group_key() != WatchSettings(stream="orders", mode="batch", cursor_id="c", max_wait=5).group_key()
    assert batch.position_key() == WatchSettings(stream="orders", cursor_id="c").position_key()


def _message(key: bytes, value: bytes, headers: dict[str, bytes]) -> Message:
    raw = api.Message(offset=7, key=key, value=value, timestamp=123, stream="orders", partition=2, headers=headers)
    return Message(raw)


def test_message_payload_text_and_base64() -> None:
    payload = message_payload(_message(b"k", "vä".encode(), {"h": b"x"}))
    assert payload == {
        "stream": "orders",
        "partition": 2,
        "offset": 7,
        "key": "k",
        "key_encoding": "text",
        "value": "vä",
        "value_encoding": "text",
        "headers": {"h": "x"},
        "headers_encoding": "text",
        "timestamp": 123,
    }
    binary = message_payload(_message(b"k", b"\xff\x00", {"h": b"x", "bin": b"\xfe"}))
    assert (binary["key"], binary["key_encoding"]) == ("k", "text")
    assert base64.b64decode(binary["value"]) == b"\xff\x00"
    assert binary["value_encoding"] == "base64"
    assert binary["headers_encoding"] == "base64"
    assert {k: base64.b64decode(v) for k, v in binary["headers"].items()} == {"h": b"x", "bin": b"\xfe"}
    forced = message_payload(_message(b"k", b"v", {}), "base64")
    assert (forced["key"], forced["value"]) == ("aw==", "dg==")
    assert encode_bytes(b"", "text") == ("", "text")


def test_batch_due_by_count_or_by_time() -> None:
    assert not batch_due(0, None, 100.0, max_messages=10, max_wait=5)
    assert not batch_due(0, 1.0, 100.0, max_messages=10, max_wait=5)
    assert batch_due(10, 99.0, 100.0, max_messages=10, max_wait=5)
    assert not batch_due(9, 96.0, 100.0, max_messages=10, max_wait=5)
    assert batch_due(1, 95.0, 100.0, max_messages=10, max_wait=5)


def test_resume_point_resends_a_planned_batch_identically() -> None:
    slots = {0: ({0: 0, 1: 0}, {0: 5, 1: 3}), 1: ({0: 5, 1: 3}, {0: 9, 1: 3})}
    point = resume_point("s", "c", planned=1, recorded=0, slots=slots)
    assert point.resend == batch_document("s", {0: 5, 1: 3}, {0: 9, 1: 3}, batch=1, cursor_id="c")
    assert point.resend is not None
    assert point.resend.metadata == {"mode": "batch", "batch": 1, "offsets": 4, "watcher_cursor": "c"}
    assert (point.next_starts, point.next_batch) == ({0: 9, 1: 3}, 2)


def test_resume_point_after_a_recorded_batch_and_when_new() -> None:
    # Slot 0 may hold a half-written batch 2 that was never marked planned: it is ignored.
    slots = {1: ({0: 0}, {0: 4}), 0: ({0: 4}, {0: 999})}
    point = resume_point("s", "c", planned=1, recorded=1, slots=slots)
    assert (point.resend, point.next_starts, point.next_batch) == (None, {0: 4}, 2)
    fresh = resume_point("s", "c", planned=-1, recorded=-1, slots={})
    assert (fresh.resend, fresh.next_starts, fresh.next_batch) == (None, None, 0)


def test_advance_passes_stored_and_dead_lettered_events_and_stops_at_the_rest() -> None:
    stored = [Outcome(3, acked=2, failed=0), Outcome(4, acked=1, failed=0)]
    assert decide_advance(stored, can_dead_letter=False) == AdvanceDecision(4, (), None)
    # A watcher failed to store offset 4 (ack timeout): nothing past 3, whatever follows.
    failed = decide_advance(
        [stored[0], Outcome(4, acked=1, failed=1), Outcome(5, acked=2, failed=0)], can_dead_letter=True
    )
    assert (failed.last, failed.dead_letter) == (3, ())
    assert failed.stop is not None
    assert failed.stop.startswith("offset 4: Airflow did not store")
    # Broadcast while no watcher was subscribed: all-zero counts are not a pass.
    nobody = decide_advance([Outcome(3, acked=0, failed=0)], can_dead_letter=True)
    assert nobody.last is None
    assert nobody.stop == "offset 3: no watcher was subscribed when it was read"
    # Refused: dead-lettered and passed with a dead-letter stream, a stop without one.
    refused = [Outcome(3, acked=1, failed=0, rejected=1), Outcome(4, acked=0, failed=0, rejected=1), Outcome(5, 1, 0)]
    assert decide_advance(refused, can_dead_letter=True) == AdvanceDecision(5, (3, 4), None)
    without = decide_advance(refused, can_dead_letter=False)
    assert (without.last, without.dead_letter) == (None, ())
    assert without.stop == "offset 3: a watcher refused it and there is no dlq_stream"


def test_dead_letter_headers_name_the_origin_and_keep_the_message_headers() -> None:
    raw = api.Message(
        offset=7,
        stream="orders",
        partition=2,
        timestamp=123,
        value=b"v",
        headers={"subject": b"orders.2", "reply": b"", "trace": b"t1"},
    )
    headers = dead_letter_headers(Message(raw), cursor_id="c", error="ValueError: " + "x" * 5000)
    assert headers["trace"] == b"t1"
    assert "subject" not in headers
    assert "reply" not in headers
    assert (headers["lb-dlq-stream"], headers["lb-dlq-partition"], headers["lb-dlq-offset"]) == (b"orders", b"2", b"7")
    assert (headers["lb-dlq-timestamp"], headers["lb-dlq-cursor-id"]) == (b"123", b"c")
    assert len(headers["lb-dlq-error"]) == DEAD_LETTER_ERROR_BYTES


def test_a_long_dead_letter_error_is_cut_on_a_character_boundary_so_its_headers_stay_text() -> None:
    """The error header keeps at most DEAD_LETTER_ERROR_BYTES bytes of the error; a cut inside a multi-byte
    UTF-8 character made the header undecodable, and a watcher on the dead-letter stream then showed every
    header of the message as base64. The cut keeps whole characters (the longest prefix that fits)."""
    raw = api.Message(offset=7, stream="orders", partition=2, timestamp=123, value=b"v", headers={"trace": b"t1"})
    for filler in ("\u20ac", "\u00e9", "\U0001f600", "x"):  # 3, 2, 4 and 1 byte(s) a character
        error = "ValueError: " + filler * 5000
        kept = dead_letter_headers(Message(raw), cursor_id="c", error=error)["lb-dlq-error"]
        text = kept.decode("utf-8")  # raises when a character was cut
        assert error.startswith(text)
        assert DEAD_LETTER_ERROR_BYTES - len(filler.encode()) < len(kept) <= DEAD_LETTER_ERROR_BYTES
    short = dead_letter_headers(Message(raw), cursor_id="c", error="ValueError: caf\u00e9")["lb-dlq-error"]
    assert short == "ValueError: caf\u00e9".encode()
    letter = api.Message(offset=0, stream="orders-dlq", partition=2, timestamp=9, value=b"v")
    letter.headers.update(dead_letter_headers(Message(raw), cursor_id="c", error="E: " + "\u20ac" * 5000))
    payload = message_payload(Message(letter))
    assert payload["headers_encoding"] == "text"
    assert payload["headers"]["lb-dlq-stream"] == "orders"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (["a"], "must return a dict of JSON values or None, got list"),
        ({"when": object()}, "returned a dict that is not JSON"),
    ],
)
def test_apply_function_results_that_cannot_be_events_are_refused(payload: object, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        check_payload(payload, "m.f")
    assert check_payload(None, "m.f") is None
    assert check_payload({"a": [1]}, "m.f") == {"a": [1]}


def test_asset_uris() -> None:
    uri = urlsplit("liftbridge://broker:9292/orders")
    assert sanitize_uri(uri) == uri
    for bad in ("liftbridge:///orders", "liftbridge://broker:9292/", "liftbridge://broker:9292/a/b"):
        with pytest.raises(ValueError, match="liftbridge URI"):
            sanitize_uri(urlsplit(bad))
    assert create_asset(broker="b:1", stream="orders").uri == "liftbridge://b:1/orders"


def test_airflow_checks_liftbridge_asset_uris_with_the_provider() -> None:
    from airflow.sdk import Asset  # noqa: PLC0415

    assert Asset(uri="liftbridge://b:1/orders").uri == "liftbridge://b:1/orders"
    with pytest.raises(ValueError, match="must name exactly one stream"):
        Asset(uri="liftbridge://b:1/orders/extra")


def test_trigger_serializes_every_setting_and_shares_by_reader_settings() -> None:
    trigger = LiftbridgeMessageTrigger(stream="orders", partitions=[2, 0], value_format="base64", max_in_flight=3)
    classpath, kwargs = trigger.serialize()
    assert classpath == "liftbridge_provider.triggers.message.LiftbridgeMessageTrigger"
    again = LiftbridgeMessageTrigger(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    assert kwargs["partitions"] == [0, 2]
    assert kwargs["cursor_id"] == "airflow-message-watcher"
    # Per-watcher options (format, function) do not split the shared reader.
    other = LiftbridgeMessageTrigger(stream="orders", partitions=[0, 2], max_in_flight=3, apply_function="m.f")
    assert other.shared_stream_key() == trigger.shared_stream_key()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"value_format": "hex"}, "value_format must be one of text, base64, activity; got 'hex'"),
        ({"apply_function": "nodots"}, "apply_function must be a dotted path"),
        ({"mode": "batch", "apply_function": "m.f"}, "cannot be used with mode='batch'"),
    ],
)
def test_bad_trigger_arguments_are_named(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message.replace("(", r"\(")):
        LiftbridgeMessageTrigger(stream="orders", **kwargs)


def test_message_queue_trigger_with_the_liftbridge_scheme_builds_the_liftbridge_trigger() -> None:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger  # noqa: PLC0415

    trigger = MessageQueueTrigger(scheme="liftbridge", stream="orders", mode="batch", max_messages=50)
    classpath, kwargs = trigger.serialize()
    assert classpath == "liftbridge_provider.triggers.message.LiftbridgeMessageTrigger"
    assert (kwargs["stream"], kwargs["mode"], kwargs["max_messages"]) == ("orders", "batch", 50)


def test_readers_with_other_settings_cannot_move_the_same_cursor() -> None:
    first = reader_for(WatchSettings(stream="orders", cursor_id="c"))
    first._claim_position()
    try:
        reader_for(WatchSettings(stream="orders", cursor_id="c"))._claim_position()  # same settings: same group
        other = reader_for(WatchSettings(stream="orders", cursor_id="c", max_in_flight=5))
        with pytest.raises(WatcherError, match="cursor 'c' on stream 'orders' is already moved by a watcher"):
            other._claim_position()
        own_cursor = reader_for(WatchSettings(stream="orders", cursor_id="d", max_in_flight=5))
        own_cursor._claim_position()
        asyncio.run(own_cursor.aclose())
    finally:
        asyncio.run(first.aclose())
    other._claim_position()  # the first reader closed: its cursor is free again
    asyncio.run(other.aclose())


def activity_message(event: api.ActivityStreamEvent, offset: int = 7) -> Message:
    raw = api.Message(offset=offset, value=event.SerializeToString(), stream="__activity", timestamp=5)
    return Message(raw)


def test_activity_payloads_decode_the_change_and_filter_by_op() -> None:
    created = api.ActivityStreamEvent(
        id=42, op=api.CREATE_STREAM, createStreamOp=api.CreateStreamOp(stream="orders", partitions=[0, 1])
    )
    payload = activity_payload(activity_message(created), None)
    assert payload is not None
    assert payload["offset"] == 7
    activity = payload["activity"]
    assert (activity["id"], activity["op"], activity["stream"], activity["partitions"]) == (
        42,
        "create_stream",
        "orders",
        [0, 1],
    )
    joined = api.ActivityStreamEvent(
        id=43, op=api.JOIN_CONSUMER_GROUP,
        joinConsumerGroupOp=api.JoinConsumerGroupOp(groupId="g", consumerId="c", streams=["a", "b"]),
    )  # fmt: skip
    assert activity_payload(activity_message(joined), ("create_stream",)) is None, "filtered out"
    kept = activity_payload(activity_message(joined), ("join_consumer_group",))
    assert kept is not None
    assert (kept["activity"]["group_id"], kept["activity"]["streams"]) == ("g", ["a", "b"])


def test_activity_settings_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match=r"unknown activity op\(s\) \['made_up'\]"):
        check_activity_ops(["made_up"])
    with pytest.raises(InvalidArgumentError, match="value_format='activity' reads stream '__activity'"):
        LiftbridgeMessageTrigger(stream="orders", value_format="activity")
    with pytest.raises(InvalidArgumentError, match="activity_ops filters the activity stream"):
        LiftbridgeMessageTrigger(stream="__activity", activity_ops=["create_stream"])
    trigger = LiftbridgeMessageTrigger(stream="__activity", value_format="activity", activity_ops=["delete_stream"])
    classpath, kwargs = trigger.serialize()
    assert kwargs["activity_ops"] == ["delete_stream"]
    assert LiftbridgeMessageTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_an_apply_function_that_cannot_be_imported_fails_the_watcher_not_each_message() -> None:
    """A missing module or a typo in apply_function became a refusal of every message: with a dead-letter
    stream each one was dead-lettered and the cursor passed it, and no DAG run ever came. The import error
    now fails the watcher, as docs/events.md says, before any message is judged."""
    trigger = LiftbridgeMessageTrigger(stream="orders", apply_function="no_such_pkg.filters.keep", dlq_stream="dlq")
    message = Message(api.Message(offset=7, stream="orders", partition=0, value=b"{}", timestamp=1))
    with pytest.raises(InvalidArgumentError, match=r"no_such_pkg\.filters\.keep"):
        trigger._event_payload(message)
