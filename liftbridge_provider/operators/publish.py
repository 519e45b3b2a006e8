"""LiftbridgePublishOperator: publish a batch of records with the client's pipelined batch publish."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from airflow.providers.common.compat.sdk import AirflowException
from airflow.sdk.module_loading import import_string  # type: ignore[attr-defined]

from liftbridge_provider.client import (
    AckPolicy,
    BatchResult,
    InvalidArgumentError,
    PublishMessage,
    partition_by_key,
    partition_by_round_robin,
)
from liftbridge_provider.client.partitioners import Partitioner
from liftbridge_provider.operators._base import LiftbridgeBaseOperator

PROGRESS_EVERY = 10.0  # seconds between progress log lines
FAILURES_SHOWN = 20


def _as_bytes(value: Any, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, int | float | bool) or value is None:
        return json.dumps(value).encode()
    if isinstance(value, Mapping | list):
        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    raise InvalidArgumentError(f"{what} must be bytes, str or JSON-serialisable, got {type(value).__name__}")


def record_to_message(
    record: Any,
    *,
    key_field: str | None = None,
    value_field: str | None = None,
    header_fields: Sequence[str] = (),
) -> PublishMessage:
    """A publishable message from a record.

    bytes and str records are the value. A mapping record gives its key from
    ``key_field``, headers from ``header_fields`` and its value from
    ``value_field`` (default: the whole record as compact JSON); those fields
    may hold numbers or JSON values. Any other record (a number, None, a list)
    is refused rather than guessed at.
    """
    if isinstance(record, PublishMessage):
        return record
    if not isinstance(record, bytes | str | Mapping):
        raise InvalidArgumentError(f"record must be bytes, str or a mapping, got {type(record).__name__}")
    if not isinstance(record, Mapping):
        if key_field or value_field or header_fields:
            raise InvalidArgumentError(f"key/value/header fields need mapping records, got {type(record).__name__}")
        return PublishMessage(value=_as_bytes(record, "record"))
    missing = [f for f in (key_field, value_field, *header_fields) if f is not None and f not in record]
    if missing:
        raise InvalidArgumentError(f"record has no field(s) {missing}; its fields are {sorted(record)}")
    value = record[value_field] if value_field else record
    return PublishMessage(
        value=_as_bytes(value, f"field {value_field!r}" if value_field else "record"),
        key=_as_bytes(record[key_field], f"key field {key_field!r}") if key_field else None,
        headers={name: _as_bytes(record[name], f"header field {name!r}") for name in header_fields} or None,
    )


def read_jsonl(path: str) -> Iterator[Any]:
    """Records of a JSON-lines file, one per non-empty line."""
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    yield json.loads(line)
                except ValueError as exc:
                    raise InvalidArgumentError(f"{path}:{number} is not JSON: {exc}") from exc


def summarise(result: BatchResult, into: dict[int, dict[str, int]]) -> None:
    """Fold acks into ``{partition: {first_offset, last_offset, count}}``."""
    for ack in result.acks:
        if ack is None:
            continue
        entry = into.setdefault(ack.partition, {"first_offset": ack.offset, "last_offset": ack.offset, "count": 0})
        entry["first_offset"] = min(entry["first_offset"], ack.offset)
        entry["last_offset"] = max(entry["last_offset"], ack.offset)
        entry["count"] += 1


class LiftbridgePublishOperator(LiftbridgeBaseOperator):
    """Publish records to a stream; returns ``{partition: {first_offset, last_offset, count}}`` per partition.

    Give exactly one source: ``messages`` (an iterable, or an upstream XCom via
    ``XComArg``), ``messages_callable`` (a callable or a dotted path to one,
    called with ``messages_callable_kwargs`` and returning an iterable), or
    ``jsonl_path`` (a JSON-lines file). Records are bytes, str, or mappings;
    see :func:`record_to_message` for ``key_field``, ``value_field`` and
    ``header_fields``.

    :param stream: stream name.
    :param partitioner: ``"key"`` (CRC-32 of the key, like go-liftbridge),
        ``"round_robin"``, or None (partition 0) (default ``"key"``).
    :param ack_policy: ``"leader"`` (default), ``"all"`` or ``"none"``.
    :param batch_size: records validated and published per pipelined batch (default 10,000).
    :param window: messages in flight awaiting their ack (default 1024).
    :param ack_wait: seconds to wait for each ack (default: the connection's client, 5 s).

    A bad record fails the task before anything is published when the source
    can be read twice (a list or tuple of ``messages``, ``jsonl_path``);
    otherwise before its batch is sent. Any message that fails fails the task,
    listing the failures; nothing is published after the batch in which a
    failure happened.
    """

    template_fields = (
        *LiftbridgeBaseOperator.template_fields,
        "stream",
        "messages",
        "messages_callable_kwargs",
        "jsonl_path",
    )

    def __init__(
        self,
        *,
        stream: str,
        messages: Iterable[Any] | None = None,
        messages_callable: Callable[..., Iterable[Any]] | str | None = None,
        messages_callable_kwargs: dict[str, Any] | None = None,
        jsonl_path: str | None = None,
        key_field: str | None = None,
        value_field: str | None = None,
        header_fields: Sequence[str] = (),
        partitioner: Literal["key", "round_robin"] | None = "key",
        ack_policy: str = "leader",
        batch_size: int = 10_000,
        window: int = 1024,
        ack_wait: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        sources = [s for s in (messages, messages_callable, jsonl_path) if s is not None]
        if len(sources) != 1:
            raise ValueError("give exactly one of messages, messages_callable or jsonl_path")
        if partitioner not in ("key", "round_robin", None):
            raise ValueError(f"partitioner must be 'key', 'round_robin' or None, got {partitioner!r}")
        AckPolicy.parse(ack_policy)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a whole number >= 1, got {batch_size!r}")
        self.stream = stream
        self.messages = messages
        self.messages_callable = messages_callable
        self.messages_callable_kwargs = messages_callable_kwargs or {}
        self.jsonl_path = jsonl_path
        self.key_field = key_field
        self.value_field = value_field
        self.header_fields = tuple(header_fields)
        self.partitioner = partitioner
        self.ack_policy = ack_policy
        self.batch_size = batch_size
        self.window = window
        self.ack_wait = ack_wait

    def _records(self) -> Iterable[Any]:
        if self.jsonl_path is not None:
            return read_jsonl(self.jsonl_path)
        if self.messages_callable is not None:
            function = self.messages_callable
            if isinstance(function, str):
                function = import_string(function)
            return function(**self.messages_callable_kwargs)
        if isinstance(self.messages, str | bytes):
            raise InvalidArgumentError("messages must be an iterable of records, not a single string")
        if isinstance(self.messages, Mapping):  # iterating it would publish its keys
            raise InvalidArgumentError(
                f"messages must be an iterable of records, not a single record (a mapping with keys "
                f"{sorted(map(str, self.messages))[:5]}): give [record]"
            )
        return self.messages or ()

    def _partitioner(self) -> Partitioner | None:
        if self.partitioner == "key":
            return partition_by_key
        if self.partitioner == "round_robin":
            return partition_by_round_robin()
        return None

    def _message(self, index: int, record: Any) -> PublishMessage:
        """The record as a message; bad records are named by their index in the input (0-based)."""
        try:
            return record_to_message(
                record, key_field=self.key_field, value_field=self.value_field, header_fields=self.header_fields
            )
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"record #{index}: {exc}") from None

    def _check_all_records(self) -> None:
        """Every record of a source that can be read twice (``messages`` held in memory as a list or tuple,
        or ``jsonl_path`` naming a regular file) checked before the first batch goes out, so one bad record
        half-way through publishes nothing; a retried task would send the first batches again. The records
        of ``messages_callable``, a one-shot iterator or a pipe are checked batch by batch."""
        if self.jsonl_path is not None:
            twice = Path(self.jsonl_path).is_file()
        else:
            twice = isinstance(self.messages, list | tuple)
        if twice:
            for index, record in enumerate(self._records()):
                self._message(index, record)

    def execute(self, context: Any) -> dict[str, Any]:
        partitions: dict[int, dict[str, int]] = {}
        published, started, last_log = 0, time.monotonic(), time.monotonic()
        partitioner = self._partitioner()
        with self.client() as client:  # its bad-input errors fail the task without retries
            self._check_all_records()
            self.hook.report_written(self.stream)
            records = iter(self._records())
            while chunk := list(itertools.islice(records, self.batch_size)):
                batch = [self._message(published + index, record) for index, record in enumerate(chunk)]
                result = client.publish_batch(
                    self.stream,
                    batch,
                    partitioner=partitioner,
                    ack_policy=self.ack_policy,
                    window=self.window,
                    ack_wait=self.ack_wait,
                    raise_on_error=False,
                )
                summarise(result, partitions)
                if result.failures:
                    self._fail(result, published)
                published += len(batch)
                if time.monotonic() - last_log >= PROGRESS_EVERY:
                    last_log = time.monotonic()
                    self.log.info("published %d messages (%.0f msgs/s)", published, published / (last_log - started))
        elapsed = max(time.monotonic() - started, 1e-9)
        self.log.info(
            "published %d messages to %r in %.1fs (%.0f msgs/s)", published, self.stream, elapsed, published / elapsed
        )
        return {
            "stream": self.stream,
            "count": published,
            "partitions": {str(p): partitions[p] for p in sorted(partitions)},
        }

    def _fail(self, result: BatchResult, offset: int) -> None:
        lines = [
            f"  record #{offset + f.index}: {type(f.error).__name__}: {f.error}"
            + (" (may have been stored)" if f.may_be_stored else "")
            for f in result.failures[:FAILURES_SHOWN]
        ]
        more = len(result.failures) - FAILURES_SHOWN
        if more > 0:
            lines.append(f"  ... and {more} more")
        stored = sum(1 for a in result.acks if a is not None)
        raise AirflowException(
            f"{len(result.failures)} of {len(result.acks)} messages failed ({stored} stored, "
            f"records before #{offset} were published earlier); nothing after this batch was sent:\n" + "\n".join(lines)
        )
