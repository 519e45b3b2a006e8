"""Options of the ``liftbridge`` Spark source and sink: strings in, validated ReadOptions / WriteOptions out.

Reading (``spark.read`` and ``spark.readStream``):

| option | meaning |
|---|---|
| ``brokers`` | ``host:port`` list, comma separated (required) |
| ``stream`` | stream name (required unless ``ranges`` names it) |
| ``ranges`` | a ranges document (JSON), as LiftbridgeOffsetRangesOperator returns |
| ``startingOffsets`` / ``endingOffsets`` | ``{"partition": offset}`` JSON, or ``"earliest"`` / ``"latest"`` |
| ``startingTimestamp`` / ``endingTimestamp`` | ms since the epoch: where messages received at or after it begin |
| ``startingOffsetsByTimestamp`` / ``endingOffsetsByTimestamp`` | ``{"partition": ms}`` JSON: the same per partition |
| ``partitions`` | partitions to read, comma separated (default: every partition in the offsets) |
| ``minPartitions`` | at least this many Spark input partitions (ranges are split) |
| ``maxRecordsPerPartition`` | at most this many offsets per Spark input partition |
| ``maxPartitions`` | at most this many Spark input partitions: more slices are packed, whole, into that many tasks |
| ``readFromReplica`` | ``true`` reads from any in-sync replica (default ``false``: the leader) |
| ``failOnDataLoss`` | ``true`` (default) fails when retention removed a range's start; ``false`` skips ahead |
| ``compacted`` | ``true``: the stream is compacted, gaps are normal and nothing is reported lost (default ``false``) |
| ``checkRanges`` | ``false``: ranges are read as given, not checked when planned (the caller checked them) |
| ``tlsCaCert`` / ``tlsClientCert`` / ``tlsPrivateKey`` / ``tlsServerName`` | TLS, as in the connection |
| ``requestTimeout`` | seconds per request (default 10) |
| ``readTimeout`` | seconds a read may go without a new message before it fails (default 120) |
| ``batchSize`` | at most this many rows per Arrow record batch (default 10000) |
| ``batchBytes`` | at most this many key + value + header bytes per Arrow record batch (default 64 MiB) |

| ``maxOffsetsPerTrigger`` | ``readStream``: at most this many offsets per micro-batch, shared by backlog |
| ``commitCursorId`` | ``readStream``: a Liftbridge cursor moved to each committed micro-batch's end |

``ranges`` and the starting/ending options exclude each other; a batch read
gives one starting and one ending option. End offsets are exclusive
(``[start, end)``); ``latest`` is the high watermark + 1; an end time is
exclusive too (messages received before it). ``readStream`` takes a stream
and a start (default ``latest``), never an end or ranges.

Writing (``df.write`` and ``writeStream``; see :class:`WriteOptions`): ``brokers``,
``stream``, the TLS options and ``requestTimeout`` as above, ``natsServers``,
``ackPolicy``, ``batchSize``, ``partitioner``, ``useOffsets``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from liftbridge_provider.client import AckPolicy, ClientConfig, NatsConfig, TLSConfig
from liftbridge_provider.client.options import split_brokers, split_nats_servers
from liftbridge_provider.core.checks import MAX_TIMESTAMP_MS, check_cursor_id, check_stream_name
from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.ranges import partition_offsets

DEFAULT_READ_TIMEOUT = 120.0
DEFAULT_BATCH_SIZE = 10_000
DEFAULT_BATCH_BYTES = 64 * 1024 * 1024
MAX_BATCH_BYTES = 1024 * 1024 * 1024  # Arrow's binary columns hold at most 2 GiB per batch

KNOWN = {
    "brokers",
    "stream",
    "ranges",
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "endingtimestamp",
    "startingoffsetsbytimestamp",
    "endingoffsetsbytimestamp",
    "partitions",
    "minpartitions",
    "maxrecordsperpartition",
    "checkranges",
    "maxpartitions",
    "readfromreplica",
    "failondataloss",
    "compacted",
    "tlscacert",
    "tlsclientcert",
    "tlsprivatekey",
    "tlsservername",
    "requesttimeout",
    "readtimeout",
    "batchsize",
    "batchbytes",
    "maxoffsetspertrigger",
    "commitcursorid",
    "path",  # spark.read.load(path) passes it; unused
}
STREAM_ONLY = ("maxOffsetsPerTrigger", "commitCursorId")


class OptionError(InvalidArgumentError):
    """An option's value refused: ``option`` names the option as documented, ``problem`` says what is allowed
    and what was given (the message is both), so that a caller that set it from a flag can name the flag."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(f"option {option} {problem}")
        self.option = option
        self.problem = problem


@dataclass(frozen=True)
class Bound:
    """Where ranges start (or end): ``offsets`` (JSON or ``earliest``/``latest``) or ``times``
    (``{"partition": milliseconds}``, ``"*"`` for every partition). ``name`` is the option it came from."""

    name: str
    offsets: str | None = None
    times: Mapping[str, int] | None = None

    def named_partitions(self) -> list[int]:
        """The partitions this bound names one by one (JSON keys), whatever kind it is; none for
        ``earliest``/``latest`` or one time for every partition."""
        if self.times is not None:
            return sorted(int(p) for p in self.times if p != "*")
        if self.offsets is None or self.offsets.strip().lower() in ("earliest", "latest"):
            return []
        return sorted(partition_offsets(self.offsets, self.name))

    def time_of(self, partition: int) -> int | None:
        """Milliseconds for ``partition`` (None: none given for it); only for a bound of times."""
        assert self.times is not None
        return self.times.get("*", self.times.get(str(partition)))


@dataclass(frozen=True)
class ReadOptions:
    """The source's options, checked. Offsets stay as given; the reader resolves them."""

    config: ClientConfig
    stream: str | None
    ranges: str | None
    starting_offsets: Bound | None
    ending_offsets: Bound | None
    partitions: tuple[int, ...] | None
    min_partitions: int | None
    max_records_per_partition: int | None
    read_from_replica: bool
    fail_on_data_loss: bool
    compacted: bool
    read_timeout: float
    batch_size: int
    batch_bytes: int
    max_offsets_per_trigger: int | None = None
    max_partitions: int | None = None
    commit_cursor_id: str | None = None
    check_ranges: bool = True


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name.lower())
    if value is None:
        return default
    if value.strip().lower() not in ("true", "false"):
        raise OptionError(name, f"must be true or false, got {value!r}")
    return value.strip().lower() == "true"


def _number(options: Mapping[str, str], name: str, kind: type[int] | type[float]) -> int | float | None:
    value = options.get(name.lower())
    if value is None:
        return None
    try:
        if "_" in value:  # int() and float() read "1_000" as 1000
            raise ValueError(value)
        number = kind(value)
    except ValueError:
        raise OptionError(name, f"must be a {kind.__name__}, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:  # nan compares false: a read timeout of nan never fired
        raise OptionError(name, f"must be a finite number > 0, got {value!r}")
    return number


def parse_options(raw: Mapping[str, str], mode: Literal["batch", "stream"] = "batch") -> ReadOptions:
    """Validate the options Spark passes (a case-insensitive mapping of strings) for a batch or a stream read."""
    options = {key.lower(): value for key, value in raw.items()}
    unknown = sorted(set(options) - KNOWN)
    if unknown:
        raise InvalidArgumentError(f"unknown liftbridge source option(s) {unknown}; see docs/spark.md")
    if "brokers" not in options:
        raise InvalidArgumentError("option brokers is required: host:port[,host:port...]")
    starting, ending = _bound(options, "starting"), _bound(options, "ending")
    if mode == "stream":
        return _stream_options(options, starting, ending)
    given = [name for name in STREAM_ONLY if name.lower() in options]
    if given:
        raise InvalidArgumentError(f"option(s) {', '.join(given)} are for spark.readStream only")
    return _read_options(options, starting, ending)


def _stream_options(options: Mapping[str, str], starting: Bound | None, ending: Bound | None) -> ReadOptions:
    if "ranges" in options or ending is not None:
        raise InvalidArgumentError(
            "spark.readStream reads on and on from its start: it takes no ranges and no ending option"
        )
    if "stream" not in options:
        raise InvalidArgumentError("option stream is required for spark.readStream")
    if "checkranges" in options:  # each micro-batch's ranges come from the high watermarks it just read
        raise InvalidArgumentError("option checkRanges is for spark.read only")
    cursor_id = options.get("commitcursorid")
    if cursor_id is not None:
        check_cursor_id(cursor_id)
    return replace(
        _read_options(options, starting or Bound("startingOffsets", offsets="latest"), None, streaming=True),
        max_offsets_per_trigger=_number(options, "maxOffsetsPerTrigger", int),  # type: ignore[arg-type]
        commit_cursor_id=cursor_id,
    )


def _read_options(
    options: Mapping[str, str], starting: Bound | None, ending: Bound | None, *, streaming: bool = False
) -> ReadOptions:
    if "ranges" in options and (starting or ending):
        raise InvalidArgumentError("give either ranges or starting/ending offsets or timestamps, not both")
    if "ranges" not in options and not (starting and (ending or streaming)):
        raise InvalidArgumentError(
            "give ranges, or a start (startingOffsets, startingTimestamp or startingOffsetsByTimestamp) and an end "
            "(endingOffsets, endingTimestamp or endingOffsetsByTimestamp)"
        )
    if "ranges" not in options and "stream" not in options:
        raise InvalidArgumentError("option stream is required with starting/ending offsets or timestamps")
    partitions = None
    if "partitions" in options:
        named = [p.strip() for p in options["partitions"].split(",") if p.strip()]
        if not all(p.isascii() and p.isdigit() for p in named):  # int() would take "1_0" as 10, "+1" as 1
            raise InvalidArgumentError(f"option partitions must be numbers, got {options['partitions']!r}")
        if not named:
            raise InvalidArgumentError(
                f"option partitions must name at least one partition, got {options['partitions']!r}"
            )
        partitions = tuple(int(p) for p in named)
        twice = sorted({p for p in partitions if partitions.count(p) > 1})
        if twice:
            raise InvalidArgumentError(f"option partitions names partition {twice[0]} twice: {options['partitions']!r}")
    return ReadOptions(
        config=_client_config(options),
        stream=options.get("stream"),
        ranges=options.get("ranges"),
        starting_offsets=starting,
        ending_offsets=ending,
        partitions=partitions,
        min_partitions=_number(options, "minPartitions", int),  # type: ignore[arg-type]
        max_records_per_partition=_number(options, "maxRecordsPerPartition", int),  # type: ignore[arg-type]
        max_partitions=_number(options, "maxPartitions", int),  # type: ignore[arg-type]
        read_from_replica=_flag(options, "readFromReplica", False),
        fail_on_data_loss=_flag(options, "failOnDataLoss", True),
        compacted=_flag(options, "compacted", False),
        check_ranges=_flag(options, "checkRanges", True),
        read_timeout=float(_number(options, "readTimeout", float) or DEFAULT_READ_TIMEOUT),
        batch_size=int(_number(options, "batchSize", int) or DEFAULT_BATCH_SIZE),
        batch_bytes=_batch_bytes(options),
    )


def _client_config(options: Mapping[str, str]) -> ClientConfig:
    """Brokers, TLS, request timeout and NATS servers of the (lower-cased) options."""
    tls_values = [options.get(k) for k in ("tlscacert", "tlsclientcert", "tlsprivatekey", "tlsservername")]
    tls = (
        TLSConfig(ca=tls_values[0], cert=tls_values[1], key=tls_values[2], server_name=tls_values[3])
        if any(tls_values)
        else None
    )
    nats = NatsConfig(servers=split_nats_servers(options["natsservers"])) if options.get("natsservers") else None
    timeout = _number(options, "requestTimeout", float)
    return ClientConfig(
        brokers=split_brokers(options["brokers"]), tls=tls, nats=nats, request_timeout=float(timeout or 10.0)
    )


def _bound(options: Mapping[str, str], side: str) -> Bound | None:
    """The one ``side`` ("starting" or "ending") option given, as a :class:`Bound`; several are refused."""
    names = [f"{side}Offsets", f"{side}Timestamp", f"{side}OffsetsByTimestamp"]
    given = [name for name in names if name.lower() in options]
    if len(given) > 1:
        raise InvalidArgumentError(f"give one of {', '.join(given)}, not several")
    if not given:
        return None
    (name,) = given
    value = options[name.lower()]
    if name.endswith("OffsetsByTimestamp"):
        times = partition_offsets(value, name, unit=_TIME, maximum=MAX_TIMESTAMP_MS)
        return Bound(name, times={str(p): ms for p, ms in times.items()})
    if name.endswith("Timestamp"):
        return Bound(name, times={"*": _milliseconds(value, name)})
    if value.strip().lower() not in ("earliest", "latest"):
        try:
            partition_offsets(value, name)  # checked here, before any broker is asked
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(
                f'{name} must be earliest, latest or {{"partition": offset}} JSON: {exc}'
            ) from None
    return Bound(name, offsets=value)


_TIME = "time in milliseconds since the epoch"


def _milliseconds(value: str, name: str) -> int:
    """A time option: ASCII digits, milliseconds since the epoch from 0 to :data:`MAX_TIMESTAMP_MS`."""
    digits = value.strip()
    if not (digits.isascii() and digits.isdigit()) or int(digits) > MAX_TIMESTAMP_MS:
        raise OptionError(
            name,
            f"must be milliseconds since the epoch (digits, from 0 to {MAX_TIMESTAMP_MS}, "
            f"2262-04-11: the server keeps int64 nanoseconds), got {value!r:.80}",
        )
    return int(digits)


def _batch_bytes(options: Mapping[str, str]) -> int:
    value = int(_number(options, "batchBytes", int) or DEFAULT_BATCH_BYTES)
    if value > MAX_BATCH_BYTES:
        raise OptionError(
            "batchBytes", f"must be at most {MAX_BATCH_BYTES} (1 GiB; Arrow's binary columns hold 2 GiB), got {value}"
        )
    return value


WRITE_KNOWN = {
    "brokers",
    "stream",
    "tlscacert",
    "tlsclientcert",
    "tlsprivatekey",
    "tlsservername",
    "requesttimeout",
    "natsservers",
    "ackpolicy",
    "batchsize",
    "partitioner",
    "useoffsets",
    "path",
    "checkpointlocation",  # Spark's own: a streaming query passes it to its sink too
}
DEFAULT_WRITE_BATCH = 10_000


@dataclass(frozen=True)
class WriteOptions:
    """The sink's options, checked.

    ``ack_policy``: ``all`` (default), ``leader`` or ``none``; ``batch_size``: rows
    per ``publish_batch`` of a task (10,000); ``partitioner``: for rows without a
    ``partition`` column value: ``key`` (default) or ``round_robin``; ``use_offsets``:
    the ``offset`` column is each row's expected offset (optimistic concurrency
    control streams: exactly once per partition, see docs/spark.md).
    """

    config: ClientConfig
    stream: str
    ack_policy: AckPolicy
    batch_size: int
    partitioner: str
    use_offsets: bool


def parse_write_options(raw: Mapping[str, str]) -> WriteOptions:
    """Validate the options of ``df.write.format("liftbridge")`` / ``writeStream``."""
    options = {key.lower(): value for key, value in raw.items()}
    unknown = sorted(set(options) - WRITE_KNOWN)
    if unknown:
        raise InvalidArgumentError(f"unknown liftbridge sink option(s) {unknown}; see docs/spark.md")
    for required in ("brokers", "stream"):
        if required not in options:
            raise InvalidArgumentError(f"option {required} is required to write to Liftbridge")
    partitioner = options.get("partitioner", "key")
    if partitioner not in ("key", "round_robin"):
        raise InvalidArgumentError(f"option partitioner must be key or round_robin, got {partitioner!r}")
    use_offsets = _flag(options, "useOffsets", False)
    ack_policy = AckPolicy.parse(options.get("ackpolicy", "all"))
    if use_offsets and ack_policy == AckPolicy.NONE:
        raise InvalidArgumentError("option useOffsets needs acks: set ackPolicy to leader or all")
    return WriteOptions(
        config=_client_config(options),
        stream=check_stream_name(options["stream"]),
        ack_policy=ack_policy,
        batch_size=int(_number(options, "batchSize", int) or DEFAULT_WRITE_BATCH),
        partitioner=partitioner,
        use_offsets=use_offsets,
    )
