"""Unary calls as plans without I/O: where to send, when to retry, refresh or give up.

A plan is a generator. It yields actions (:class:`Attempt`, :class:`Sleep`,
:class:`Refresh`) and receives their outcomes: the attempt's result or the
refreshed metadata is sent back; a failed attempt's ``grpc.RpcError`` (or a
refresh's ``LiftbridgeError``) is thrown in. The plan returns the call's
result or raises its typed error. The synchronous client
(:meth:`Router.run <liftbridge_provider.client.routing.Router.run>`) and the
asyncio client (:meth:`AsyncLiftbridgeClient._run`) only carry actions out, so
every decision (routing, retries, deadlines, paused partitions, ambiguous
admin calls) is written once, here, in the manner of h11's sans-I/O state
machines.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.addresses import broker_addresses, dial_address, replica_address
from liftbridge_provider.client.errors import (
    AckTimeoutError,
    LiftbridgeTimeoutError,
    NoSuchPartitionError,
    NoSuchStreamError,
    PartitionPausedError,
    PermissionDeniedError,
    StreamExistsError,
    UnavailableError,
    error_from_rpc,
)
from liftbridge_provider.client.health import HEALTH, Signal
from liftbridge_provider.client.metadata import Metadata, PartitionInfo, metadata_from_response
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.requests import CURSORS_STREAM
from liftbridge_provider.client.retry import Action, Deadline, RetryState
from liftbridge_provider.core.errors import InvalidArgumentError, LiftbridgeError

T = TypeVar("T")

CONNECT_TRY = 2.0
"""Seconds a call that must know whether it sent waits for one broker's connection before trying the next.

A broker that refuses fails at once; a frozen one (TCP accepted, no HTTP/2
answer) costs this much. Loopback and LAN connections take milliseconds.
"""

Rpc = Callable[[Any, float], Any]
"""``(stub, timeout) -> result`` (sync stub) or an awaitable of it (grpc.aio stub)."""


class Connection(Enum):
    """How a wait for a channel's connection ended."""

    READY = "ready"
    REFUSED = "refused"  # refused, unreachable or a failed handshake: an RPC would fail at once
    SILENT = "silent"  # still connecting when the wait ended (a frozen peer, a black hole)


@dataclass(frozen=True)
class Attempt:
    """Send ``rpc`` to ``address`` with ``timeout`` seconds.

    ``connect_timeout``: first wait at most this long (capped by ``timeout``)
    for the channel to connect; a broker still silent then raises
    :class:`NotSent`, and the RPC gets what is left of ``timeout``.
    ``connect_first``: send only on a connected channel, so that the caller
    knows nothing was sent when it raises :class:`NotSent` (a refused
    connection raises it too; otherwise the RPC runs and fails at once with
    gRPC's reason, say a TLS error).
    """

    address: str
    timeout: float
    rpc: Rpc
    connect_first: bool = False
    connect_timeout: float | None = None

    def connect_budget(self) -> float | None:
        """Seconds to wait for the connection, or None for no wait."""
        if self.connect_timeout is None:
            return self.timeout if self.connect_first else None
        return min(self.timeout, self.connect_timeout)

    def after_connect(self, connection: Connection) -> None:
        """Raise :class:`NotSent` unless the RPC may go out on a channel that ended its wait so."""
        if connection is Connection.SILENT or (self.connect_first and connection is not Connection.READY):
            raise NotSent(self.address, connection)


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Refresh:
    """Fetch metadata within ``timeout`` seconds (all streams, or ``streams``) and send back the snapshot."""

    timeout: float
    streams: tuple[str, ...] = ()


PlanAction = Attempt | Sleep | Refresh
Plan = Generator[PlanAction, Any, T]


class NotSent(grpc.RpcError):
    """The channel did not connect within the attempt's time: nothing was sent, another broker may take it."""

    def __init__(self, address: str, connection: Connection = Connection.SILENT) -> None:
        self.address = address
        self.connection = connection

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        if self.connection is Connection.REFUSED:
            return f"could not connect to {self.address} (refused or unreachable)"
        return f"could not connect to {self.address} (no answer within {CONNECT_TRY:g}s)"


def paused_error(stream: str, partition: int) -> PartitionPausedError:
    """A paused partition has no serving leader: it answers "not leader" (or nothing) until resumed."""
    return PartitionPausedError(
        "the partition is paused; publish to it, or read with resume=True, to resume it",
        stream=stream,
        partition=partition,
    )


def refreshed(deadline: Deadline, snapshot: Metadata, streams: tuple[str, ...] = ()) -> Plan[Metadata]:
    """A fresher snapshot within the deadline; the old one if the refresh fails (the caller goes on retrying)."""
    if deadline.expired:
        return snapshot
    try:
        fresh: Metadata = yield Refresh(deadline.remaining(), streams)
    except LiftbridgeError:
        return snapshot
    return fresh


UNKNOWN_STREAM_ASKS = 2  # refreshes before a stream is called missing
UNKNOWN_STREAM_PAUSE = 0.2  # seconds between them


def knowing(deadline: Deadline, snapshot: Metadata, stream: str) -> Plan[Metadata]:
    """A snapshot that knows ``stream`` (refreshed if needed); NoSuchStreamError if the cluster does not.

    A broker applies a new stream a moment after the metadata leader committed it, so a refresh that
    reaches it right after ``create_stream`` returned does not list the stream yet (seen in CI): the
    stream is asked for again, :data:`UNKNOWN_STREAM_PAUSE` s later, before it is called missing.
    """
    for ask in range(UNKNOWN_STREAM_ASKS):
        if stream in snapshot.streams:
            break
        if ask:
            yield Sleep(min(UNKNOWN_STREAM_PAUSE, deadline.remaining()))
        fresh: Metadata = yield Refresh(deadline.remaining())
        snapshot = fresh
    snapshot.stream(stream)
    return snapshot


def any_broker(
    config: ClientConfig,
    snapshot: Metadata,
    rpc: Rpc,
    deadline: Deadline,
    *,
    stream: str | None = None,
    addresses: list[str] | None = None,
) -> Plan[Any]:
    """Try the known brokers in random order: UNAVAILABLE, a refused or slow connection (see
    :data:`CONNECT_TRY`) or a hung attempt moves on to the next one (a hung broker goes last for the
    next calls too), an election backs off; anything else is final. ``addresses`` overrides the brokers
    to try."""
    state = RetryState(deadline, leader_directed=False, stream=stream)
    while True:
        for address in addresses or broker_addresses(config, snapshot):
            try:
                return (yield Attempt(address, state.attempt_timeout(), rpc, connect_timeout=CONNECT_TRY))
            except grpc.RpcError as exc:
                _note_if_hung(state, address, exc)
                action, delay = state.after_failure(exc)
            if action is not Action.NEXT_BROKER:
                yield Sleep(delay)
                break
        else:
            yield Sleep(state.pause())


def _note_if_hung(state: RetryState, address: str, exc: grpc.RpcError) -> None:
    """A broker that answered nothing in an attempt's own time, or never finished connecting within
    :data:`CONNECT_TRY` (a frozen peer accepts TCP and says nothing), goes last for the next calls."""
    silent = isinstance(exc, NotSent) and exc.connection is Connection.SILENT and not state.deadline.expired
    if silent or state.attempt_hung(exc):
        HEALTH.tell(address, Signal.SILENT)


def leader_call(
    config: ClientConfig,
    snapshot: Metadata,
    rpc: Rpc,
    deadline: Deadline,
    *,
    stream: str,
    partition: int,
    any_isr_replica: bool = False,
    agreed: KeptVote | None = None,
    when_paused: Callable[[str], Plan[Any]] | None = None,
) -> Plan[Any]:
    """Send ``rpc`` to the partition leader (or a random ISR member), following leadership as it moves.

    ``agreed``: to the leader that more than half of the brokers name (see
    :func:`agreed_leader`), not the one the snapshot names; the vote is kept
    there for the next calls that share it, until an attempt fails.
    A partition whose metadata names as leader the very broker that just refused
    ("not leader") and carries the paused flag is paused: ``when_paused(leader
    address)`` decides what the call returns then (default: PartitionPausedError).
    """
    state = RetryState(deadline, leader_directed=True, stream=stream, partition=partition)
    snapshot = yield from knowing(deadline, snapshot, stream)
    refused_by: str | None = None
    while True:
        if agreed is not None:
            if agreed.vote is None or agreed.vote.address is None:
                agreed.vote = yield from agreed_leader(config, snapshot, deadline, stream, partition)
            vote = agreed.vote
            address = vote.address
            if address is None and (vote.tally or state.last_error is None):  # keep the last tally that says something
                state.last_error = no_agreed_leader(stream, partition, vote)
        else:
            address = yield from _replica(config, snapshot, deadline, (stream, partition), any_isr_replica)
        if refused_by is not None and refused_by == address and snapshot.partition(stream, partition).paused:
            if when_paused is None:
                raise paused_error(stream, partition)
            return (yield from when_paused(address))
        refused_by = None
        if address is None:
            delay = state.pause()  # no leader right now: an election is running
        else:
            try:
                return (yield Attempt(address, state.attempt_timeout(), rpc))
            except grpc.RpcError as exc:
                if agreed is not None:
                    agreed.vote = None  # the leader it named failed: ask again
                _action, delay = state.after_failure(exc)
                if is_refusal(exc):
                    refused_by = address
        yield Sleep(delay)
        snapshot = yield from refreshed(deadline, snapshot)


@dataclass(frozen=True)
class Vote:
    """How the brokers answered "who leads this partition?": the dial address of the leader more than half of
    them name (None: no majority), and the tally (each asked address and the leader it named, or its failure;
    empty: nobody was asked)."""

    address: str | None
    tally: str


@dataclass
class KeptVote:
    """The vote one cursor call or read goes by (None: not asked yet, or its leader failed an attempt)."""

    vote: Vote | None = None


def agreed_leader(
    config: ClientConfig, snapshot: Metadata, deadline: Deadline, stream: str, partition: int
) -> Plan[Vote]:
    """The partition leader that more than half of the brokers name, asked one at a time (hung ones last).

    A leader frozen past a failover still acts as leader for a moment after it
    thaws (v1.9.0): it answers calls, and names itself in its metadata, while the
    brokers that saw the failover name the new leader. The electorate is the
    brokers the client dials (distinct addresses, so a proxy in front of every
    broker counts once) or the partition's replicas, whichever is more; with one
    address there is no vote: the snapshot's leader. Each answer gets at most an
    equal share of the time left. Failures that retrying does not heal (TLS,
    permissions) raise at once; other failures count as no answer.
    """
    voters = {dial_address(config, b.host, b.port) for b in snapshot.brokers.values()}
    if len(voters) <= 1:
        return Vote((yield from _replica(config, snapshot, deadline, (stream, partition), False)), "one broker")
    info = _partition_or_none(snapshot, stream, partition)
    electorate = max(len(voters), len(info.replicas) if info else 0)
    request = api.FetchMetadataRequest(streams=[stream])

    def fetch(stub: Any, timeout: float) -> Any:
        return stub.FetchMetadata(request, timeout=timeout)

    state = RetryState(deadline, leader_directed=False, stream=stream, partition=partition)
    votes: Counter[str] = Counter()
    tally: list[str] = []
    for address in [a for a in broker_addresses(config, snapshot) if a in voters]:
        budget = state.attempt_timeout(limit=max(deadline.remaining() / len(voters), MIN_VOTE))
        if budget <= 0:
            break
        try:
            response = yield Attempt(address, budget, fetch, connect_timeout=CONNECT_TRY)
        except grpc.RpcError as exc:
            _note_if_hung(state, address, exc)
            if state.is_final(exc) and exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:  # the call's deadline: no vote
                raise error_from_rpc(exc, stream=stream, partition=partition) from exc
            tally.append(f"{address}: {exc.code().name.lower()}")
            continue
        view = metadata_from_response(response, snapshot, [stream])
        named = _partition_or_none(view, stream, partition)
        leader = named.leader if named else None
        tally.append(f"{address}: {leader or 'none'}")
        if leader is None:
            continue
        votes[leader] += 1
        broker = view.brokers.get(leader)
        if votes[leader] > electorate // 2 and broker is not None:
            return Vote(dial_address(config, broker.host, broker.port), ", ".join(tally))
    return Vote(None, ", ".join(tally))


MIN_VOTE = 1.0  # seconds: the least one broker's answer to a vote gets (while the call has that much left)


def _partition_or_none(view: Metadata, stream: str, partition: int) -> PartitionInfo | None:
    """The partition as ``view`` has it, or None (a broker that has not applied the stream yet)."""
    try:
        return view.partition(stream, partition)
    except (NoSuchStreamError, NoSuchPartitionError):
        return None


def no_agreed_leader(stream: str, partition: int, vote: Vote) -> UnavailableError:
    """The error a call reports when its deadline passes with no leader that a majority of brokers name."""
    return UnavailableError(
        f"no leader that more than half of the brokers name (a failover under way, or brokers that do not "
        f"answer): {vote.tally or 'no time left to ask'}",
        stream=stream,
        partition=partition,
    )


def is_refusal(exc: grpc.RpcError) -> bool:
    """The broker refused as not leading the partition (or its log is closed): paused, or leadership moved."""
    details = (exc.details() or "").lower()
    return exc.code() == grpc.StatusCode.FAILED_PRECONDITION or (
        exc.code() == grpc.StatusCode.INTERNAL and "closed" in details
    )


def _replica(
    config: ClientConfig, snapshot: Metadata, deadline: Deadline, where: tuple[str, int], any_isr: bool
) -> Plan[str | None]:
    stream, partition = where
    try:
        return replica_address(config, snapshot, stream, partition, any_isr)
    except (NoSuchStreamError, NoSuchPartitionError):
        fresh: Metadata = yield Refresh(deadline.remaining())
        return replica_address(config, fresh, stream, partition, any_isr)


def partition_metadata(
    config: ClientConfig,
    snapshot: Metadata,
    deadline: Deadline,
    stream: str,
    partition: int,
    *,
    settle: bool = True,
    agreed: KeptVote | None = None,
) -> Plan[PartitionInfo]:
    """Authoritative partition metadata from the leader; for a paused partition, the leader's metadata view.

    A paused partition refuses FetchPartitionMetadata, but its high watermark is
    known: no message arrives while it is paused (a publish resumes it). The
    leader's FetchMetadata answer carries it, from the leader's own log, and
    asking for it does not resume the partition, unless it is unsettled (see
    :func:`unsettled`) and ``settle`` is on: then :func:`settled` resumes it.
    """
    request = api.FetchPartitionMetadataRequest(stream=stream, partition=partition)

    def fetch(stub: Any, timeout: float) -> Any:
        return stub.FetchPartitionMetadata(request, timeout=timeout)

    def from_leader_view(address: str) -> Plan[PartitionInfo]:
        view = yield from leader_view(config, snapshot, deadline, stream, address)
        return view.partition(stream, partition)

    response = yield from leader_call(
        config,
        snapshot,
        fetch,
        deadline,
        stream=stream,
        partition=partition,
        agreed=agreed,
        when_paused=from_leader_view,
    )
    if not isinstance(response, PartitionInfo):
        return PartitionInfo.from_proto(stream, response.metadata)
    if settle and unsettled(response):
        return (yield from settled(config, snapshot, deadline, response))
    return response


SETTLE_WAIT = 5.0
"""Seconds, at most, a call waits for a leader to commit what it holds after resuming a partition."""
SETTLE_POLL = 0.1  # seconds between high watermark checks while settling
RESUME_RETRY = 0.25  # seconds before a failed resume is tried again while settling


def unsettled(info: PartitionInfo) -> bool:
    """Paused while its leader held offsets above the high watermark.

    A leader's high watermark moves only while its partition runs. A partition
    that pauses right after a failover, before the new leader saw its followers
    catch up, keeps acked offsets hidden until it runs again, which for an idle
    partition can be never (newest offsets that were never acked look the same).
    """
    return info.paused and info.newest_offset > info.high_watermark


def settled(config: ClientConfig, snapshot: Metadata, deadline: Deadline, paused: PartitionInfo) -> Plan[PartitionInfo]:
    """Resume an unsettled partition and wait (at most :data:`SETTLE_WAIT` s) until its leader commits what it held.

    Returns the last metadata seen, settled or not (offsets never acked may stay
    above the high watermark); a partition that cannot be resumed in time
    answers as it was.
    """
    stream, partition = paused.stream, paused.id
    wait = Deadline(min(deadline.remaining(), SETTLE_WAIT))
    snapshot = yield from refreshed(wait, snapshot, (stream,))
    while True:
        try:
            yield from leader_call(
                config, snapshot, resume_rpc(stream, partition), wait, stream=stream, partition=partition
            )
            break
        except (PermissionDeniedError, InvalidArgumentError, NoSuchStreamError, NoSuchPartitionError):
            return paused  # this client may not subscribe here, or the partition went: nothing to settle
        except LiftbridgeError:  # e.g. "no responders": the metadata leader that applies a resume is changing
            if wait.remaining() <= RESUME_RETRY:
                return paused
            yield Sleep(RESUME_RETRY)
    latest = yield from committed(config, snapshot, wait, stream, partition, target=paused.newest_offset, seen=paused)
    return latest or paused


def committed(
    config: ClientConfig,
    snapshot: Metadata,
    wait: Deadline,
    stream: str,
    partition: int,
    *,
    target: int | None = None,
    seen: PartitionInfo | None = None,
    agreed: KeptVote | None = None,
) -> Plan[PartitionInfo | None]:
    """Ask the leader (``agreed``: see :func:`leader_call`) every :data:`SETTLE_POLL` s until the high watermark
    reaches ``target`` (default: the newest offset of each answer), ``wait`` runs out or no leader answers;
    the last answer (or ``seen``)."""
    while True:
        if seen is not None:
            if seen.high_watermark >= (seen.newest_offset if target is None else target):
                return seen
            if wait.remaining() <= SETTLE_POLL:
                return seen
            yield Sleep(SETTLE_POLL)
        try:
            seen = yield from partition_metadata(config, snapshot, wait, stream, partition, settle=False, agreed=agreed)
        except LiftbridgeError:
            return seen


def cursor_read(config: ClientConfig, snapshot: Metadata, rpc: Rpc, deadline: Deadline, *, partition: int) -> Plan[Any]:
    """FetchCursor (``rpc``) on the leader of ``__cursors`` partition ``partition`` that a majority of brokers
    name (see :func:`cursor_call`), once its high watermark covers what the leader held when first asked.

    A new leader's high watermark lags after a failover until the dead leader
    leaves the ISR (``clustering.replica.max.lag.time``). The server reads a
    cursor only up to the high watermark and caches what it found, -1
    included, until the cursor is set again (v1.9.0), so a read in that lag
    would make a committed cursor read -1 for good. This waits for the lag to
    end within the call's deadline and never reads before: when the deadline
    comes first, LiftbridgeTimeoutError (try again later). If no leader answers
    yet, the call itself retries and reports.
    """
    kept = KeptVote()
    try:
        seen: PartitionInfo | None = yield from partition_metadata(
            config, snapshot, deadline, CURSORS_STREAM, partition, settle=False, agreed=kept
        )
    except LiftbridgeError:
        seen = None
    if seen is not None and seen.high_watermark < seen.newest_offset:
        target = seen.newest_offset
        seen = yield from committed(
            config, snapshot, deadline, CURSORS_STREAM, partition, target=target, seen=seen, agreed=kept
        )
        if seen is None or seen.high_watermark < target:
            watermark = "unknown" if seen is None else seen.high_watermark
            raise LiftbridgeTimeoutError(
                f"cursor read on {CURSORS_STREAM}/{partition}: its leader's high watermark ({watermark}) did not "
                f"reach offset {target} by the deadline (a leader failover); not read, as the server would answer "
                "-1 for a committed cursor and keep that answer; try again",
                stream=CURSORS_STREAM,
                partition=partition,
            )
    return (yield from cursor_call(config, snapshot, rpc, deadline, partition=partition, agreed=kept))


def cursor_call(
    config: ClientConfig,
    snapshot: Metadata,
    rpc: Rpc,
    deadline: Deadline,
    *,
    partition: int,
    agreed: KeptVote | None = None,
) -> Plan[Any]:
    """SetCursor or FetchCursor (``rpc``) on the leader of ``__cursors`` partition ``partition`` that more than
    half of the brokers name.

    A ``__cursors`` leader frozen past a failover still answers as leader for a
    moment after it thaws (v1.9.0). A SetCursor it takes answers OK, and its
    message even reaches the new leader's log, but only the broker that ran
    SetCursor updates its cursor cache: the new leader keeps answering the
    value it cached before, so a commit that reported success reads back the
    old value (chaos seed 128). Asking the brokers which leader they name
    costs one FetchMetadata per broker up to a majority (none with one broker),
    once per call (or per ``agreed``, a vote already taken), again only after
    an attempt on the leader it named failed.
    """
    kept = agreed or KeptVote()
    return (
        yield from leader_call(config, snapshot, rpc, deadline, stream=CURSORS_STREAM, partition=partition, agreed=kept)
    )


def resume_rpc(stream: str, partition: int) -> Rpc:
    """Subscribe with ``resume`` (the server resumes a paused partition first), then cancel at once.

    The server's first message is an empty one that confirms the subscription.
    """
    request = api.SubscribeRequest(stream=stream, partition=partition, resume=True)

    def rpc(stub: Any, timeout: float) -> Any:
        call = stub.Subscribe(request, timeout=timeout)
        if isinstance(call, grpc.aio.Call):
            return _first_then_cancel(call)
        try:
            return next(call)
        finally:
            call.cancel()

    return rpc


async def _first_then_cancel(call: Any) -> Any:
    try:
        return await call.read()
    finally:
        call.cancel()


def leader_view(
    config: ClientConfig, snapshot: Metadata, deadline: Deadline, stream: str, address: str
) -> Plan[Metadata]:
    """The stream's metadata as the broker at ``address`` sees it (any broker's, if that one does not answer)."""
    request = api.FetchMetadataRequest(streams=[stream])

    def fetch(stub: Any, timeout: float) -> Any:
        return stub.FetchMetadata(request, timeout=timeout)

    try:
        response = yield Attempt(address, deadline.attempt_budget(), fetch)
    except grpc.RpcError:
        response = yield from any_broker(config, snapshot, fetch, deadline, stream=stream)
    view = metadata_from_response(response, snapshot, [stream])
    view.stream(stream)
    return view


def ambiguous_admin(
    config: ClientConfig,
    snapshot: Metadata,
    rpc: Rpc,
    deadline: Deadline,
    *,
    stream: str,
    already_done: Callable[[LiftbridgeError], Plan[bool]],
) -> Plan[Any]:
    """A CreateStream or DeleteStream: retried only in a way that cannot misreport what happened.

    An attempt that fails before anything was sent (no connection) goes to the
    next broker. One that fails after sending may have been applied; it is sent
    again, and if that answer is the error the first attempt would cause
    (AlreadyExists for a create, NotFound for a delete), ``already_done(error)``
    decides whether the first attempt did it (then the call succeeds).
    """
    state = RetryState(deadline, leader_directed=False, stream=stream)
    maybe_applied = False
    while True:
        for address in broker_addresses(config, snapshot):
            try:
                attempt = Attempt(
                    address, state.attempt_timeout(), rpc, connect_first=True, connect_timeout=CONNECT_TRY
                )
                return (yield attempt)
            except grpc.RpcError as exc:
                if maybe_applied and exc.code() in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.NOT_FOUND):
                    error = error_from_rpc(exc, stream=stream)
                    if (yield from already_done(error)):
                        return None
                    raise error from exc
                maybe_applied = maybe_applied or not isinstance(exc, NotSent)
                _note_if_hung(state, address, exc)
                action, delay = state.after_failure(_as_retryable(exc))
            if action is not Action.NEXT_BROKER:
                yield Sleep(delay)
                break
        else:
            yield Sleep(state.pause())


class _LostAnswer(grpc.RpcError):
    """An admin call whose answer was lost after sending: retried (the retry finds out what happened)."""

    def __init__(self, cause: grpc.RpcError) -> None:
        self.cause = cause

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return f"answer lost ({self.cause.code().name}: {self.cause.details()})"


def _as_retryable(exc: grpc.RpcError) -> grpc.RpcError:
    """Connection-level failures after sending (UNAVAILABLE, a hung attempt, a reset) are worth a retry."""
    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return _LostAnswer(exc)
    return exc


def stream_created_as(
    subject: str, partitions: int, config: ClientConfig, deadline: Deadline, name: str
) -> Callable[[LiftbridgeError], Plan[bool]]:
    """For a create whose answer was lost: the existing stream is ours if it has our subject and partition count."""

    def check(error: LiftbridgeError) -> Plan[bool]:
        if not isinstance(error, StreamExistsError):
            return False
        fresh: Metadata = yield Refresh(deadline.remaining(), (name,))
        info = fresh.streams.get(name)
        return info is not None and info.subject == subject and len(info.partitions) == partitions

    return check


def stream_gone(error: LiftbridgeError) -> Plan[bool]:
    """For a delete whose answer was lost: NotFound means the lost attempt deleted it."""
    gone = isinstance(error, NoSuchStreamError)
    yield from ()  # a plan that needs no I/O
    return gone


def send_once(
    config: ClientConfig, snapshot: Metadata, rpc: Rpc, deadline: Deadline, *, stream: str | None, partition: int | None
) -> Plan[Any]:
    """A publish: sent to one broker, never again once it may have arrived.

    Brokers that refuse or do not connect within :data:`CONNECT_TRY` s are
    skipped (nothing was sent); the first one that connects gets the rest of
    the time. A failure after
    sending is raised with ``may_be_stored=True`` where the message may have
    been stored.
    """
    state = RetryState(deadline, leader_directed=False, stream=stream)
    while True:
        for address in broker_addresses(config, snapshot):
            try:
                return (
                    yield Attempt(
                        address, max(deadline.remaining(), 0.001), rpc, connect_first=True, connect_timeout=CONNECT_TRY
                    )
                )
            except NotSent as exc:
                state.after_failure(exc)
            except grpc.RpcError as exc:
                raise after_send_error(exc, stream, partition) from exc
        yield Sleep(state.pause())


def after_send_error(exc: grpc.RpcError, stream: str | None, partition: int | None) -> LiftbridgeError:
    """A publish failed after it was sent: never retried, since it may have been stored."""
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return AckTimeoutError(
            "no ack before the deadline; the message may have been stored",
            stream=stream,
            partition=partition,
            code=code,
            may_be_stored=True,
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        return UnavailableError(
            f"connection lost during publish ({exc.details()}); the message may have been stored",
            stream=stream,
            partition=partition,
            code=code,
            may_be_stored=True,
        )
    return error_from_rpc(exc, stream=stream, partition=partition)
