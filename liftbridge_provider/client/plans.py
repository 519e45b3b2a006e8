"""Unary calls as plans without I/O: the actions a plan yields, and routing (any broker, the leader).

A plan is a generator. It yields actions (:class:`Attempt`, :class:`Sleep`,
:class:`Refresh`, :class:`Dispatch`) and receives their outcomes: the
attempt's result or the refreshed metadata is sent back; a failed attempt's
``grpc.RpcError`` (or a refresh's ``LiftbridgeError``) is thrown in. The plan
returns the call's result or raises its typed error. The drivers, synchronous
(:meth:`Router.run <liftbridge_provider.client.routing.Router.run>`) and
asyncio (:meth:`AsyncRouter.run <liftbridge_provider.client.routing.AsyncRouter.run>`),
only carry actions out, so every decision (routing, retries, deadlines, paused
partitions, ambiguous admin calls) is written once, in the manner of h11's
sans-I/O state machines.

This module holds the actions and the routing every other plan builds on:
:func:`any_broker`, :func:`leader_call` (optionally to the leader a majority
of brokers name, :func:`agreed_leader`), :func:`knowing` a stream. The others,
one concern each: ``partition_plans.py`` (partition metadata, paused and
unsettled partitions), ``cursor_plans.py`` (``__cursors`` calls),
``admin_plans.py`` (creates and deletes whose answer may be lost),
``publish/plans.py`` (publishes: never sent twice).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client.addresses import broker_addresses, dial_address, replica_address
from liftbridge_provider.client.errors import (
    NoSuchStreamError,
    PartitionPausedError,
    UnavailableError,
    error_from_rpc,
)
from liftbridge_provider.client.health import HEALTH, Signal
from liftbridge_provider.client.metadata import Metadata, PartitionInfo, metadata_from_response
from liftbridge_provider.client.not_sent import CONNECT_TRY, Connection, NotSent
from liftbridge_provider.client.options import ClientConfig
from liftbridge_provider.client.retry import Action, Deadline, Listing, RetryState, refused_as_unknown
from liftbridge_provider.core.errors import LiftbridgeError, NoSuchPartitionError

T = TypeVar("T")

Rpc = Callable[[Any, float], Any]
"""``(stub, timeout) -> result`` (sync stub) or an awaitable of it (grpc.aio stub)."""


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
            raise NotSent(self.address, connection, waited=self.connect_budget())

    def rpc_timeout(self, connect_started: float) -> float:
        """Seconds the RPC gets after a connection wait that began at ``connect_started`` (``time.monotonic()``):
        what is left of :attr:`timeout`, at least 1 ms (a call given no time fails as timed out)."""
        return max(self.timeout - (time.monotonic() - connect_started), 0.001)


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Refresh:
    """Fetch metadata within ``timeout`` seconds (all streams, or ``streams``) and send back the snapshot."""

    timeout: float
    streams: tuple[str, ...] = ()


@dataclass(frozen=True)
class Dispatch:
    """Call ``send(addresses)`` with the addresses of the brokers the client knows when it runs (read afresh
    each time: another call may have refreshed the metadata meanwhile) and send back its result; ``send`` picks
    the broker itself (a single publish on the shared PublishAsync streams). An awaitable of the result on the
    asyncio side, as for :data:`Rpc`."""

    send: Callable[[Sequence[str]], Any]


PlanAction = Attempt | Sleep | Refresh
Plan = Generator[PlanAction, Any, T]
DriverAction = PlanAction | Dispatch
"""What the drivers carry out: the actions of any plan, :class:`Dispatch` included (only a single publish on the
shared streams yields it)."""
AnyPlan = Generator[DriverAction, Any, T]


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


def knowing(deadline: Deadline, snapshot: Metadata, stream: str, *, fresh: bool = False) -> Plan[Metadata]:
    """A snapshot that knows ``stream`` (refreshed if needed); NoSuchStreamError if the cluster does not.

    A broker applies a new stream a moment after the metadata leader committed it, so a refresh that
    reaches it right after ``create_stream`` returned does not list the stream yet (seen in CI), nor does a
    broker restarted a moment ago (the soak): the stream is asked for again, :data:`UNKNOWN_STREAM_PAUSE` s
    later, before it is called missing. ``fresh``: the caller needs the cluster's word of now (a partition's
    subject, whether it is readonly or paused), so the stream's metadata is fetched at least once.
    """
    snapshot = yield from knowing_that(
        deadline, snapshot, lambda view: stream in view.streams, streams=(stream,) if fresh else (), fresh=fresh
    )
    snapshot.stream(stream)
    return snapshot


def knowing_that(
    deadline: Deadline,
    snapshot: Metadata,
    knows: Callable[[Metadata], bool],
    *,
    streams: tuple[str, ...] = (),
    fresh: bool = False,
) -> Plan[Metadata]:
    """A snapshot of which ``knows`` holds: refreshed (for ``streams``; () for all) when it does not, and asked
    again :data:`UNKNOWN_STREAM_PAUSE` s later, :data:`UNKNOWN_STREAM_ASKS` times in all, since the first answer
    may come from a broker a moment behind; the last one when ``knows`` never held (the caller raises its own
    typed error). ``fresh``: refreshed at least once."""
    for ask in range(UNKNOWN_STREAM_ASKS):
        if knows(snapshot) and not (fresh and ask == 0):
            break
        if ask:
            yield Sleep(min(UNKNOWN_STREAM_PAUSE, deadline.remaining()))
        refreshed: Metadata = yield Refresh(deadline.remaining(), streams)
        snapshot = refreshed
    return snapshot


def lists(snapshot: Metadata, stream: str, partition: int | None) -> bool:
    """``snapshot`` knows ``stream`` (and its ``partition``, unless None)."""
    info = snapshot.streams.get(stream)
    return info is not None and (partition is None or partition in info.partitions)


def listing(
    deadline: Deadline, snapshot: Metadata, stream: str, partition: int | None
) -> Plan[tuple[Metadata, Listing]]:
    """:func:`listed`, with ``snapshot`` kept when no refresh answered."""
    fresh, said = yield from listed(deadline, stream, partition)
    return fresh or snapshot, said


def listed(deadline: Deadline, stream: str, partition: int | None) -> Plan[tuple[Metadata | None, Listing]]:
    """Fresh metadata's word on a stream and partition that a broker just refused as unknown (NOT_FOUND), and
    the fresh snapshot (None when no refresh answered).

    The refresh may reach a broker as far behind as the one that refused, so an
    answer that does not list them is asked for again, :data:`UNKNOWN_STREAM_PAUSE` s
    later, before it counts (as :func:`knowing` does); :data:`UNKNOWN_STREAM_ASKS`
    refreshes at most, so a missing stream still fails within a second.
    """
    said, fresh = Listing.UNANSWERED, None
    for ask in range(UNKNOWN_STREAM_ASKS):
        if deadline.expired:
            break
        if ask:
            yield Sleep(min(UNKNOWN_STREAM_PAUSE, deadline.remaining()))
        try:
            fresh = yield Refresh(max(deadline.remaining(), 0.001))
        except LiftbridgeError:
            continue
        said = Listing.LISTED if lists(fresh, stream, partition) else Listing.UNLISTED
        if said is Listing.LISTED:
            break
    return fresh, said


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
                note_if_hung(state, address, exc)
                action, delay = state.after_failure(exc)
            if action is not Action.NEXT_BROKER:
                yield Sleep(delay)
                break
        else:
            yield Sleep(state.pause())


def broker_call(config: ClientConfig, snapshot: Metadata, rpc: Rpc, deadline: Deadline, broker_id: str) -> Plan[Any]:
    """``rpc`` on the broker ``broker_id`` (a consumer group's coordinator), retried there only (as
    :func:`any_broker`); the metadata is refreshed once when it does not name that broker."""
    if broker_id not in snapshot.brokers:
        snapshot = yield Refresh(deadline.remaining())
    broker = snapshot.brokers.get(broker_id)
    if broker is None:
        raise UnavailableError(f"broker {broker_id!r} is not in the cluster's metadata")
    return (yield from any_broker(config, snapshot, rpc, deadline, addresses=[broker.address]))


def fetch_metadata(
    config: ClientConfig, snapshot: Metadata, streams: list[str], deadline: Deadline
) -> Plan[api.FetchMetadataResponse]:
    """The cluster's FetchMetadata answer (all streams, or ``streams``) from any broker."""
    request = api.FetchMetadataRequest(streams=streams)

    def fetch(stub: Any, timeout: float) -> Any:
        return stub.FetchMetadata(request, timeout=timeout)

    response: api.FetchMetadataResponse = yield from any_broker(config, snapshot, fetch, deadline)
    return response


def note_if_hung(state: RetryState, address: str, exc: grpc.RpcError) -> None:
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

    A broker that answers NOT_FOUND is asked again while fresh metadata lists
    the partition (:func:`listing`, :func:`~liftbridge_provider.client.retry.after_unknown`):
    it has not applied the stream's creation, or loaded the partition after a restart, yet.

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
                if refused_as_unknown(exc.code()):  # a broker behind the metadata, or a missing partition
                    snapshot, said = yield from listing(deadline, snapshot, stream, partition)
                    yield Sleep(state.after_unknown(exc, said))
                    continue
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
    voters = voters_of(config, snapshot)
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
            note_if_hung(state, address, exc)
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


def voters_of(config: ClientConfig, snapshot: Metadata) -> set[str]:
    """The distinct addresses the client dials for the brokers ``snapshot`` knows: who votes in
    :func:`agreed_leader` (one address, or a proxy in front of every broker: no vote to hold)."""
    return {dial_address(config, b.host, b.port) for b in snapshot.brokers.values()}


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
        fresh: Metadata = yield from knowing(deadline, snapshot, stream, fresh=True)
        return replica_address(config, fresh, stream, partition, any_isr)
