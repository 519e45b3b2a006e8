"""Which address a call goes to (pure): any known broker, or a partition's leader or ISR member."""

from __future__ import annotations

import random

from liftbridge_provider.client.health import HEALTH
from liftbridge_provider.client.metadata import Metadata
from liftbridge_provider.client.options import ClientConfig, format_address


def dial_address(config: ClientConfig, host: str, port: int) -> str:
    """The address to dial for an advertised broker (through the address resolver, if any)."""
    if config.address_resolver is not None:
        return config.address_resolver(host, port)
    return format_address(host, port)


def broker_addresses(config: ClientConfig, snapshot: Metadata) -> list[str]:
    """Known brokers (from metadata) and the seeds, without repeats, in the order ``config.broker_selection``
    picks: ``random`` (shuffled), ``workload`` (fewest partitions held plus led, as metadata counts them), or
    ``latency`` (quickest first connection; brokers not connected yet first, so each gets measured). A broker
    the health model suspects (silent or broken lately, :mod:`~liftbridge_provider.client.health`) goes last
    whatever the selection."""
    known = {
        dial_address(config, b.host, b.port): b.partition_count + b.leader_count for b in snapshot.brokers.values()
    }
    addresses = list(dict.fromkeys([*known, *config.brokers]))
    random.shuffle(addresses)  # ties stay random
    if config.broker_selection == "workload":
        addresses.sort(key=lambda a: known.get(a, 0))
    elif config.broker_selection == "latency":
        addresses.sort(key=_connect_seconds)
    return HEALTH.suspects_last(addresses)  # stable: the selection's order otherwise


class KnownAddresses:
    """The addresses of every broker a snapshot knows and the seeds, sorted, without repeats: what a single
    publish's :class:`~liftbridge_provider.client.plans.Dispatch` gets (it orders them itself). Kept for the
    last snapshot asked about, since the snapshot changes only when the metadata is refreshed."""

    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self._last: tuple[Metadata, tuple[str, ...]] | None = None

    def of(self, snapshot: Metadata) -> tuple[str, ...]:
        last = self._last
        if last is not None and last[0] is snapshot:
            return last[1]
        config = self._config
        known = (dial_address(config, b.host, b.port) for b in snapshot.brokers.values())
        addresses = tuple(sorted({*known, *config.brokers}))
        self._last = (snapshot, addresses)
        return addresses


def _connect_seconds(address: str) -> float:
    seconds = HEALTH.connect_seconds(address)
    return -1.0 if seconds is None else seconds


def leader_first(addresses: list[str], leader: str | None) -> list[str]:
    """``addresses`` with the partition leader's first (its broker stores the messages without a NATS hop
    to another node, and a frozen follower is not picked before it); unchanged when no leader is known."""
    if leader is None:
        return addresses
    return [leader, *(a for a in addresses if a != leader)]


def replica_address(
    config: ClientConfig, snapshot: Metadata, stream: str, partition: int, any_isr_replica: bool
) -> str | None:
    """Dial address of the partition leader (or a random ISR member), or None if none is known right now.

    Raises NoSuchStreamError / NoSuchPartitionError if the snapshot does not know the partition.
    """
    info = snapshot.partition(stream, partition)
    candidates = list(info.isr) if any_isr_replica else [info.leader] if info.leader else []
    random.shuffle(candidates)
    known = [snapshot.brokers[b] for b in candidates if b in snapshot.brokers]
    addresses = HEALTH.suspects_last(dial_address(config, b.host, b.port) for b in known)  # an ISR read avoids them
    return addresses[0] if addresses else None
