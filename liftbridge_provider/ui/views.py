"""What the Liftbridge page shows, shaped as JSON rows from what was read (no I/O, no Airflow).

* :func:`stream_rows`: each stream and its partitions (leader, replicas, ISR,
  high watermark, newest offset, paused, readonly).
* :func:`cursor_rows`: each position cursor with its lag per partition,
  ``high watermark - cursor`` (never below 0), as ``LiftbridgeCursorLagSensor``
  and the ``liftbridge.cursor_lag`` gauge count it.
* :func:`watcher_rows`: each asset watcher of the connection, its cursor's lag
  and the refused messages in its dead-letter stream (:func:`fold_dead_letters`).
* :func:`connection_summary` and :func:`redact`: a connection without its
  secrets. Only the brokers and whether TLS and NATS are on leave the server;
  every error text is passed through :func:`redact` with the connection's
  secret values before it does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from liftbridge_provider.client import Metadata
from liftbridge_provider.core.connection_fields import BY_NAME
from liftbridge_provider.ui.cursor_log import CursorRecord, cursor_kind

INTERNAL_STREAMS = ("__cursors", "__activity")


def lag(high_watermark: int, cursor: int) -> int:
    """Offsets a cursor (the last offset processed, -1: none) is behind the high watermark (-1: empty): >= 0."""
    return max(0, high_watermark - cursor)


def stream_rows(metadata: Metadata) -> list[dict[str, Any]]:
    """Every stream (internal ones last) with its partitions, as the answering broker knows them."""
    names = sorted(metadata.streams, key=lambda name: (name in INTERNAL_STREAMS, name))
    rows = []
    for name in names:
        stream = metadata.streams[name]
        partitions = [
            {
                "partition": p.id,
                "leader": p.leader,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
                "under_replicated": len(p.isr) < len(p.replicas),
                "high_watermark": p.high_watermark,
                "newest_offset": p.newest_offset,
                "paused": p.paused,
                "readonly": p.readonly,
            }
            for p in stream.partitions.values()
        ]
        rows.append(
            {
                "stream": name,
                "subject": stream.subject,
                "internal": name in INTERNAL_STREAMS,
                "partitions": partitions,
                "messages": sum(max(0, p.high_watermark + 1) for p in stream.partitions.values()),
            }
        )
    return rows


def _high_watermark(metadata: Metadata, stream: str, partition: int) -> int | None:
    info = metadata.streams.get(stream)
    found = info.partitions.get(partition) if info is not None else None
    return found.high_watermark if found is not None else None


def cursor_rows(
    records: Iterable[CursorRecord], metadata: Metadata, watcher_cursors: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """One row per (cursor id, stream) that holds positions, with each partition's offset and lag.

    A partition the metadata does not know (its stream was deleted) has ``high_watermark`` and ``lag`` None.
    """
    watchers = set(watcher_cursors)
    grouped: dict[tuple[str, str], list[CursorRecord]] = {}
    for record in records:
        grouped.setdefault((record.cursor_id, record.stream), []).append(record)
    rows = []
    for (cursor_id, stream), found in sorted(grouped.items()):
        partitions = []
        for record in sorted(found, key=lambda r: r.partition):
            high = _high_watermark(metadata, stream, record.partition)
            partitions.append(
                {
                    "partition": record.partition,
                    "offset": record.offset,
                    "high_watermark": high,
                    "lag": None if high is None else lag(high, record.offset),
                }
            )
        lags = [p["lag"] for p in partitions if p["lag"] is not None]
        rows.append(
            {
                "cursor_id": cursor_id,
                "stream": stream,
                "kind": cursor_kind(cursor_id, watchers),
                "stream_exists": stream in metadata.streams,
                "partitions": partitions,
                "total_lag": sum(lags),
                "max_lag": max(lags, default=0),
            }
        )
    return rows


def bookkeeping_counts(records: Iterable[CursorRecord], watcher_cursors: Iterable[str] = ()) -> dict[str, int]:
    """How many cursors of each bookkeeping kind (``watcher-state``, ``task-state``) were seen and not listed."""
    watchers = set(watcher_cursors)
    counts = {"watcher-state": 0, "task-state": 0}
    for record in records:
        kind = cursor_kind(record.cursor_id, watchers)
        if kind in counts:
            counts[kind] += 1
    return counts


@dataclass(frozen=True)
class WatcherInfo:
    """An asset watcher that runs ``LiftbridgeMessageTrigger``, as Airflow's metadata DB records it.

    :param name: the watcher's name.
    :param asset: the asset it fires (its name).
    :param stream: the stream it follows.
    :param cursor_id: its cursor.
    :param mode: ``message`` or ``batch``.
    :param dlq_stream: its dead-letter stream, or None.
    :param partitions: the partitions it watches (None: all).
    :param last_event: when the asset's last event was stored (ISO 8601), or None.
    """

    name: str
    asset: str
    stream: str
    cursor_id: str
    mode: str
    dlq_stream: str | None
    partitions: tuple[int, ...] | None = None
    last_event: str | None = None


@dataclass(frozen=True)
class DeadLetterView:
    """What a dead letter's ``lb-dlq-*`` headers say (``liftbridge_provider.core.watching.dead_letter_headers``)."""

    offset: int
    cursor_id: str
    stream: str
    partition: str
    origin_offset: str
    error: str
    timestamp: int  # ns, when the dead letter was published


def dead_letter_view(offset: int, timestamp: int, headers: Mapping[str, bytes]) -> DeadLetterView:
    """A dead letter read from its headers (missing headers read as empty text)."""

    def text(name: str) -> str:
        return headers.get(name, b"").decode("utf-8", errors="replace")

    return DeadLetterView(
        offset=offset,
        cursor_id=text("lb-dlq-cursor-id"),
        stream=text("lb-dlq-stream"),
        partition=text("lb-dlq-partition"),
        origin_offset=text("lb-dlq-offset"),
        error=text("lb-dlq-error"),
        timestamp=timestamp,
    )


def fold_dead_letters(letters: Iterable[DeadLetterView]) -> dict[str, dict[str, Any]]:
    """Per watcher cursor id: how many dead letters were read and the newest one (its origin, error, time)."""
    folded: dict[str, dict[str, Any]] = {}
    for letter in letters:
        entry = folded.setdefault(letter.cursor_id, {"count": 0, "last": None})
        entry["count"] += 1
        last = entry["last"]
        if last is None or letter.timestamp >= last["timestamp"]:
            entry["last"] = {
                "stream": letter.stream,
                "partition": letter.partition,
                "offset": letter.origin_offset,
                "error": letter.error,
                "timestamp": letter.timestamp,
            }
    return folded


@dataclass(frozen=True)
class DeadLetterRead:
    """A dead-letter stream as read: letters per watcher cursor (:func:`fold_dead_letters`), the stream's
    total (sum of high watermark + 1), whether every retained letter was read, or the error that stopped it."""

    by_cursor: Mapping[str, Mapping[str, Any]]
    total: int
    complete: bool
    error: str | None = None


def watcher_rows(
    watchers: Sequence[WatcherInfo],
    records: Iterable[CursorRecord],
    metadata: Metadata,
    dead_letters: Mapping[str, DeadLetterRead],
) -> list[dict[str, Any]]:
    """One row per watcher: its stream, cursor lag per watched partition, last event and dead letters."""
    positions: dict[tuple[str, str], dict[int, int]] = {}
    for record in records:
        positions.setdefault((record.cursor_id, record.stream), {})[record.partition] = record.offset
    rows = []
    for watcher in sorted(watchers, key=lambda w: (w.name, w.asset)):
        stream = metadata.streams.get(watcher.stream)
        ids = sorted(stream.partitions) if stream is not None else []
        watched = [p for p in ids if watcher.partitions is None or p in watcher.partitions]
        at = positions.get((watcher.cursor_id, watcher.stream), {})
        partitions = []
        for pid in watched:
            assert stream is not None
            high = stream.partitions[pid].high_watermark
            offset = at.get(pid)
            partitions.append(
                {
                    "partition": pid,
                    "offset": offset,
                    "high_watermark": high,
                    "lag": lag(high, -1 if offset is None else offset),
                }
            )
        row: dict[str, Any] = {
            "name": watcher.name,
            "asset": watcher.asset,
            "stream": watcher.stream,
            "stream_exists": stream is not None,
            "cursor_id": watcher.cursor_id,
            "mode": watcher.mode,
            "last_event": watcher.last_event,
            "partitions": partitions,
            "total_lag": sum(p["lag"] for p in partitions),
            "dlq_stream": watcher.dlq_stream,
            "dead_letters": None,
        }
        read = dead_letters.get(watcher.dlq_stream) if watcher.dlq_stream else None
        if watcher.dlq_stream and read is None:
            row["dead_letters"] = {"count": 0, "complete": True, "last": None, "error": None, "stream_total": 0}
        elif read is not None:
            mine = read.by_cursor.get(watcher.cursor_id, {"count": 0, "last": None})
            row["dead_letters"] = {
                "count": mine["count"],
                "complete": read.complete,
                "last": mine["last"],
                "error": read.error,
                "stream_total": read.total,
            }
        rows.append(row)
    return rows


# Connection extras that are no secret and may be shown as they are: none is needed beyond what the summary
# says. Every other extra's text, and the password, are secrets for redact().
_PLAIN_KINDS = ("number", "flag")


def connection_summary(conn_id: str, brokers: Sequence[str], extra: Mapping[str, Any]) -> dict[str, Any]:
    """What the page may show of a connection: its id, brokers, and whether TLS and NATS are on."""
    return {
        "conn_id": conn_id,
        "brokers": list(brokers),
        "tls": any(extra.get(name) for name, field in BY_NAME.items() if field.group == "tls"),
        "nats": bool(extra.get("nats_servers")),
    }


def secrets_of(password: str | None, extra: Mapping[str, Any], *, shortest: int = 4) -> list[str]:
    """The texts of a connection that must never leave the server: its password, and every extra that is not
    a number or a flag (TLS keys, certificates and paths, NATS users, passwords, tokens and credentials), each
    line of a multi-line one too (a PEM's body lines), longest first; texts shorter than ``shortest`` are left
    out (they would mask unrelated text)."""
    found: set[str] = set()
    texts = [password or ""]
    for name, value in extra.items():
        field = BY_NAME.get(name)
        if value is None or (field is not None and field.group in _PLAIN_KINDS):
            continue
        texts.append(str(value))
    for text in texts:
        for piece in (text, *text.splitlines()):
            if len(piece.strip()) >= shortest:
                found.add(piece.strip())
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
