"""Stream administration operators: create, delete, pause, readonly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from airflow.providers.common.compat.sdk import AirflowFailException

from liftbridge_provider.client import NoSuchStreamError, StreamExistsError
from liftbridge_provider.client.metadata import StreamInfo
from liftbridge_provider.core.checks import rendered_int
from liftbridge_provider.core.stream_options import Duration, StreamOptions
from liftbridge_provider.operators._base import LiftbridgeBaseOperator


def stream_summary(info: StreamInfo) -> dict[str, Any]:
    """A JSON-ready description of a stream: partitions with leader, replicas and ISR."""
    return {
        "stream": info.name,
        "subject": info.subject,
        "partitions": {
            str(p.id): {"leader": p.leader, "replicas": list(p.replicas), "isr": list(p.isr)}
            for p in info.partitions.values()
        },
    }


class LiftbridgeCreateStreamOperator(LiftbridgeBaseOperator):
    """Create a stream; returns its partitions, leaders, replicas and ISR (XCom).

    :param stream: stream name.
    :param subject: NATS subject (default: the stream name).
    :param partitions: number of partitions (default 1).
    :param replication_factor: replicas per partition (default 1; -1 = every broker).
    :param if_exists: ``"ignore"`` (default) leaves an existing stream as it is;
        ``"fail"`` fails the task.
    :param group: load-balance group of the stream (default none).
    :param retention_max_bytes: bytes kept per partition (default: server's).
    :param retention_max_messages: messages kept per partition (default: server's).
    :param retention_max_age: age of messages kept, seconds or timedelta (default: server's).
    :param cleaner_interval: how often retention runs, seconds or timedelta.
    :param segment_max_bytes: size at which a log segment rolls.
    :param segment_max_age: age at which a log segment rolls, seconds or timedelta.
    :param compact_enabled: keep only the newest message per key.
    :param compact_max_goroutines: compaction concurrency.
    :param auto_pause_time: pause a partition idle this long, seconds or timedelta.
    :param auto_pause_disable_if_subscribers: do not auto-pause partitions that have subscribers.
    :param min_isr: in-sync replicas needed to commit.
    :param optimistic_concurrency_control: check expected offsets on publish.
    :param encryption: encrypt data at rest (the server needs a key).
    Options left as None keep the server's defaults (:class:`~liftbridge_provider.client.StreamOptions`).
    """

    template_fields = (*LiftbridgeBaseOperator.template_fields, "stream", "subject", "partitions")

    def __init__(
        self,
        *,
        stream: str,
        subject: str | None = None,
        partitions: int | str = 1,
        replication_factor: int = 1,
        if_exists: Literal["ignore", "fail"] = "ignore",
        group: str | None = None,
        retention_max_bytes: int | None = None,
        retention_max_messages: int | None = None,
        retention_max_age: Duration | None = None,
        cleaner_interval: Duration | None = None,
        segment_max_bytes: int | None = None,
        segment_max_age: Duration | None = None,
        compact_enabled: bool | None = None,
        compact_max_goroutines: int | None = None,
        auto_pause_time: Duration | None = None,
        auto_pause_disable_if_subscribers: bool | None = None,
        min_isr: int | None = None,
        optimistic_concurrency_control: bool | None = None,
        encryption: bool | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if if_exists not in ("ignore", "fail"):
            raise ValueError(f"if_exists must be 'ignore' or 'fail', got {if_exists!r}")
        self.stream = stream
        self.subject = subject
        self.partitions = partitions
        self.replication_factor = replication_factor
        self.if_exists = if_exists
        self.stream_options = StreamOptions(
            group=group,
            retention_max_bytes=retention_max_bytes,
            retention_max_messages=retention_max_messages,
            retention_max_age=retention_max_age,
            cleaner_interval=cleaner_interval,
            segment_max_bytes=segment_max_bytes,
            segment_max_age=segment_max_age,
            compact_enabled=compact_enabled,
            compact_max_goroutines=compact_max_goroutines,
            auto_pause_time=auto_pause_time,
            auto_pause_disable_if_subscribers=auto_pause_disable_if_subscribers,
            min_isr=min_isr,
            optimistic_concurrency_control=optimistic_concurrency_control,
            encryption=encryption,
        )

    def execute(self, context: Any) -> dict[str, Any]:
        partitions = _partition_count(self.partitions)
        with self.client() as client:
            try:
                client.create_stream(
                    self.subject or self.stream,
                    self.stream,
                    partitions=partitions,
                    replication_factor=self.replication_factor,
                    options=self.stream_options,
                )
                self.log.info("created stream %r with %d partition(s)", self.stream, partitions)
            except StreamExistsError:
                if self.if_exists == "fail":
                    raise AirflowFailException(f"stream {self.stream!r} already exists (if_exists='fail')") from None
                self.log.info("stream %r exists already; leaving it as it is", self.stream)
            return stream_summary(client.stream_info(self.stream))


def _partition_count(value: object) -> int:
    """The partition count as given, or rendered by a template (digits); 2.7, True or None are refused,
    not truncated to 2 or 1. The range is checked with the rest of the request."""
    value = rendered_int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise AirflowFailException(f"partitions must be a whole number (or a template rendering one), got {value!r:.80}")


class LiftbridgeDeleteStreamOperator(LiftbridgeBaseOperator):
    """Delete a stream and its data.

    :param stream: stream name.
    :param if_missing: ``"ignore"`` (default) succeeds when there is no such
        stream; ``"fail"`` fails the task.
    """

    template_fields = (*LiftbridgeBaseOperator.template_fields, "stream")

    def __init__(self, *, stream: str, if_missing: Literal["ignore", "fail"] = "ignore", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if if_missing not in ("ignore", "fail"):
            raise ValueError(f"if_missing must be 'ignore' or 'fail', got {if_missing!r}")
        self.stream = stream
        self.if_missing = if_missing

    def execute(self, context: Any) -> bool:
        """Returns whether a stream was deleted."""
        with self.client() as client:
            try:
                client.delete_stream(self.stream)
            except NoSuchStreamError:
                if self.if_missing == "fail":
                    raise AirflowFailException(f"there is no stream {self.stream!r} (if_missing='fail')") from None
                self.log.info("no stream %r to delete", self.stream)
                return False
            self.log.info("deleted stream %r", self.stream)
            return True


class LiftbridgePauseStreamOperator(LiftbridgeBaseOperator):
    """Pause partitions of a stream (a publish or a ``resume`` read resumes one).

    :param stream: stream name.
    :param partitions: partitions to pause (default: all).
    :param resume_all: when any partition resumes, resume them all (default False).
    """

    template_fields = (*LiftbridgeBaseOperator.template_fields, "stream", "partitions")

    def __init__(
        self, *, stream: str, partitions: Sequence[int] | None = None, resume_all: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.partitions = partitions
        self.resume_all = resume_all

    def execute(self, context: Any) -> None:
        with self.client() as client:
            client.pause_stream(self.stream, partitions=self.partitions, resume_all=self.resume_all)
        self.log.info("paused %r partitions %s", self.stream, self.partitions or "all")


class LiftbridgeSetStreamReadonlyOperator(LiftbridgeBaseOperator):
    """Make partitions of a stream readonly (or writable again).

    :param stream: stream name.
    :param partitions: partitions to change (default: all).
    :param readonly: True (default) for readonly, False for writable.
    """

    template_fields = (*LiftbridgeBaseOperator.template_fields, "stream", "partitions")

    def __init__(
        self, *, stream: str, partitions: Sequence[int] | None = None, readonly: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.partitions = partitions
        self.readonly = readonly

    def execute(self, context: Any) -> None:
        with self.client() as client:
            client.set_stream_readonly(self.stream, partitions=self.partitions, readonly=self.readonly)
        state = "readonly" if self.readonly else "writable"
        self.log.info("made %r partitions %s %s", self.stream, self.partitions or "all", state)
