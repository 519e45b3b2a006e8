"""Client configuration: brokers, timeouts, pool sizes, TLS and gRPC options."""

from __future__ import annotations

import re
import ssl
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from liftbridge_provider.core.checks import INT32_MAX, check_seconds, check_whole
from liftbridge_provider.core.errors import InvalidArgumentError

DEFAULT_PORT = 9292
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
NATS_DEFAULT_PORT = 4222
# HTTP/2 keepalive pings on channels with calls in flight. The server (grpc-go defaults) answers pings
# more frequent than every 5 minutes without data of its own with GOAWAY "too_many_pings"; subscriptions
# are reopened every liveness_interval, which sends data, so a minute is safe and finds a dead peer
# (one that vanished without a reset) within ping interval + ping timeout.
KEEPALIVE_TIME_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000
RECONNECT_BACKOFF_MS = (100, 2_000)  # first and longest wait between reconnects to a broker
# A host is a DNS name (ASCII letters, digits, '.', '-', and '_' as container networks use it; punycode for
# other scripts), an IPv4 address, or an IPv6 address in brackets. Anything else cannot name a broker: a NUL
# cut gRPC's target short, and '*', '@', a space or non-ASCII went to the resolver and failed only after the
# whole request timeout.
_BROKER = re.compile(r"^(?:\[(?P<ipv6>[0-9a-fA-F:.]+)\]|(?P<host>[A-Za-z0-9._-]+))(?::(?P<port>[0-9]+))?$")
_BROKER_FORM = (
    "expected 'host:port' with port 1-65535, the host made of ASCII letters, digits, '.', '-' or '_' "
    "(punycode for other scripts), or an IPv6 address in brackets"
)

AddressResolver = Callable[[str, int], str]
"""Maps a broker's advertised ``(host, port)`` to the ``host:port`` to dial."""


def parse_broker(address: str) -> tuple[str, int]:
    """Split ``host[:port]`` (or ``[ipv6][:port]``) into host and port; the port defaults to 9292."""
    if not isinstance(address, str):
        raise InvalidArgumentError(f"broker address must be a 'host:port' string, got {address!r}")
    match = _BROKER.match(address.strip())
    port = int(match.group("port")) if match and match.group("port") else DEFAULT_PORT
    if match is None or not 0 < port < 65536:
        raise InvalidArgumentError(f"invalid broker address {address!r}: {_BROKER_FORM}")
    return match.group("ipv6") or match.group("host"), port


def format_address(host: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_brokers(brokers: object) -> tuple[str, ...]:
    """Normalise ``"a:1,b:2"`` or ``["a:1", "b"]`` into ``("a:1", "b:9292")``."""
    if not isinstance(brokers, str | Sequence) or isinstance(brokers, bytes | bytearray):
        raise InvalidArgumentError(
            f"brokers must be 'host:port' text (comma-separated) or a list of 'host:port' strings, got {brokers!r}"
        )
    items = brokers.split(",") if isinstance(brokers, str) else list(brokers)
    addresses = tuple(format_address(*parse_broker(item)) for item in items if str(item).strip())
    if not addresses:
        raise InvalidArgumentError(f"at least one broker address is needed, got {brokers!r}")
    return addresses


def _pem(value: str | bytes | Path | None, what: str) -> bytes | None:
    """PEM bytes from PEM text or a file path."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    text = str(value)
    if "-----BEGIN" in text:
        return text.encode()
    path = Path(text).expanduser()
    if not path.is_file():
        raise InvalidArgumentError(f"TLS {what} {text!r} is neither PEM text nor a readable file")
    return path.read_bytes()


@dataclass(frozen=True, kw_only=True)
class TLSConfig:
    """TLS for the gRPC connections. Each value is PEM text, PEM bytes or a file path.

    :param ca: CA certificate(s) that sign the brokers' certificates; None
        uses the system's trust store.
    :param cert: client certificate, for mutual TLS (needs ``key``).
    :param key: client private key, for mutual TLS (needs ``cert``). Never logged.
    :param server_name: expected name in the broker certificate, when it
        differs from the host dialled (gRPC ``ssl_target_name_override``).
    """

    ca: str | bytes | Path | None = None
    cert: str | bytes | Path | None = None
    key: str | bytes | Path | None = field(default=None, repr=False)
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise InvalidArgumentError("mutual TLS needs both a client certificate and a client key, got only one")

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.ca, "CA"),
            private_key=_pem(self.key, "client key"),
            certificate_chain=_pem(self.cert, "client certificate"),
        )

    def ssl_context(self, alpn: Sequence[str] = ()) -> ssl.SSLContext:
        """The same settings as a context of Python's ``ssl`` (NATS, and the batch publisher's own HTTP/2
        connections with ``alpn=("h2",)``); the broker's name is checked against ``server_name`` by the caller."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ca = _pem(self.ca, "CA")
        if ca is not None:
            context.load_verify_locations(cadata=ca.decode())
        if self.cert is not None:
            with _pem_files(self.cert, self.key) as (cert_path, key_path):
                context.load_cert_chain(cert_path, key_path)
        if alpn:
            context.set_alpn_protocols(list(alpn))
        return context


_NATS_URL = re.compile(r"^(?:(?P<scheme>nats|tls)://)?(?P<hostport>[^\s/@]+)$")


def split_nats_servers(servers: object) -> tuple[str, ...]:
    """Normalise ``"a:4222,b"`` or ``["nats://a:4222", "tls://b:4443"]`` into NATS URLs (default port 4222)."""
    if not isinstance(servers, str | Sequence) or isinstance(servers, bytes | bytearray):
        raise InvalidArgumentError(f"nats servers must be 'nats://host:port' text or a list of them, got {servers!r}")
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    urls = []
    for item in items:
        text = item.strip() if isinstance(item, str) else item
        if text == "":
            continue
        match = _NATS_URL.match(text) if isinstance(text, str) else None
        if match is None:
            raise InvalidArgumentError(
                f"invalid NATS server {item!r}: expected [nats://|tls://]host[:port], without credentials in it"
            )
        hostport = match.group("hostport")
        host, port = parse_broker(hostport if ":" in hostport.strip("[]") else f"{hostport}:{NATS_DEFAULT_PORT}")
        urls.append(f"{match.group('scheme') or 'nats'}://{format_address(host, port)}")
    if not urls:
        raise InvalidArgumentError(f"at least one NATS server is needed, got {servers!r}")
    return tuple(urls)


@dataclass(frozen=True, kw_only=True)
class NatsConfig:
    """The NATS servers the Liftbridge cluster uses, for publishing straight to stream subjects.

    :param servers: NATS URLs, ``nats://host:port`` (or ``tls://``; default port 4222).
    :param user: user name, with ``password``.
    :param password: password (never logged).
    :param token: authentication token (never logged).
    :param credentials: path of a ``.creds`` file (JWT and NKey seed).
    :param tls: TLS settings (the CA, and a client certificate for mutual TLS); None for plaintext,
        unless a ``tls://`` URL asks for the system's trust store.
    :param connect_timeout: seconds to connect to one server (default 5).
    """

    servers: tuple[str, ...]
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    credentials: str | None = None
    tls: TLSConfig | None = None
    connect_timeout: float = 5.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "servers", split_nats_servers(self.servers))
        for name in ("user", "password", "token", "credentials"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidArgumentError(f"nats {name} must be non-empty text or None, got {type(value).__name__}")
        if (self.user is None) != (self.password is None):
            raise InvalidArgumentError("NATS user and password go together: give both or neither")
        if self.credentials is not None and not Path(self.credentials).expanduser().is_file():
            raise InvalidArgumentError(f"NATS credentials file {self.credentials!r} is not a readable file")
        if self.tls is not None and not isinstance(self.tls, TLSConfig):
            raise InvalidArgumentError(f"nats tls must be a TLSConfig or None, got {self.tls!r}")
        check_seconds("nats connect_timeout", self.connect_timeout)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for the NATS connection; None for plaintext."""
        return None if self.tls is None else self.tls.ssl_context()


@contextmanager
def _pem_files(cert: str | bytes | Path, key: str | bytes | Path | None) -> Iterator[tuple[str, str]]:
    """The client certificate and key as files (``ssl`` loads a chain only from files)."""
    with tempfile.TemporaryDirectory(prefix="lb-tls-") as folder:
        paths = []
        for name, value in (("cert.pem", cert), ("key.pem", key)):
            path = Path(folder) / name
            path.write_bytes(_pem(value, name) or b"")
            path.chmod(0o600)
            paths.append(str(path))
        yield paths[0], paths[1]


BROKER_SELECTIONS = ("random", "workload", "latency")


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """Everything a :class:`~liftbridge_provider.client.LiftbridgeClient` needs to connect.

    :param brokers: seed addresses, ``host[:port]`` (default port 9292); more
        brokers are learnt from the cluster metadata.
    :param request_timeout: seconds for one request including its retries (default 10).
    :param max_conns_per_broker: gRPC channels kept per broker (default 2).
    :param keep_alive_time: seconds an unused channel stays open (default 30).
    :param resubscribe_wait: seconds a subscription keeps trying to resubscribe
        after losing its broker (default 30).
    :param liveness_interval: seconds one Subscribe call may run before it is
        reopened after its last offset (default 30): a leader that froze or
        vanished without a reset is noticed within this time.
    :param ack_wait: seconds ``publish_batch`` waits for each ack (default 5).
    :param read_isr_replica: subscribe to any in-sync replica instead of the
        leader by default (default False).
    :param tls: TLS settings; None for plaintext.
    :param address_resolver: maps advertised ``(host, port)`` to the address to dial.
    :param max_message_bytes: gRPC send/receive size limit (default 64 MiB).
    :param grpc_options: extra gRPC channel arguments.
    :param nats: the cluster's NATS servers: ``publish_batch`` then publishes straight to
        the streams' NATS subjects (the fast path); None keeps it on gRPC PublishAsync.
    :param broker_selection: the order calls that any broker can serve try the brokers in:
        ``random`` (default), ``workload`` (fewest partitions held and led first) or
        ``latency`` (quickest to connect first), as go-liftbridge's
        ``SetConnectToLowWorkloadServer`` / ``SetConnectToLowLatencyServer``.
    """

    brokers: tuple[str, ...]
    request_timeout: float = 10.0
    max_conns_per_broker: int = 2
    keep_alive_time: float = 30.0
    resubscribe_wait: float = 30.0
    liveness_interval: float = 30.0
    ack_wait: float = 5.0
    read_isr_replica: bool = False
    tls: TLSConfig | None = None
    address_resolver: AddressResolver | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    grpc_options: tuple[tuple[str, Any], ...] = ()
    nats: NatsConfig | None = None
    broker_selection: str = "random"

    def __post_init__(self) -> None:
        if self.broker_selection not in BROKER_SELECTIONS:
            raise InvalidArgumentError(
                f"broker_selection must be one of {', '.join(BROKER_SELECTIONS)}, got {self.broker_selection!r}"
            )
        object.__setattr__(self, "brokers", split_brokers(self.brokers))
        for name in ("request_timeout", "keep_alive_time", "resubscribe_wait", "liveness_interval", "ack_wait"):
            check_seconds(name, getattr(self, name))
        check_whole(self.max_conns_per_broker, "max_conns_per_broker", minimum=1)
        # gRPC keeps its message size limits in a C int.
        check_whole(self.max_message_bytes, "max_message_bytes", minimum=1, maximum=INT32_MAX)
        if not isinstance(self.read_isr_replica, bool):
            raise InvalidArgumentError(f"read_isr_replica must be True or False, got {self.read_isr_replica!r}")
        if self.tls is not None and not isinstance(self.tls, TLSConfig):
            raise InvalidArgumentError(f"tls must be a TLSConfig or None, got {self.tls!r}")
        if self.address_resolver is not None and not callable(self.address_resolver):
            raise InvalidArgumentError(
                f"address_resolver must be a callable (host, port) -> 'host:port', got {self.address_resolver!r}"
            )
        object.__setattr__(self, "grpc_options", _grpc_options(self.grpc_options))
        if self.nats is not None and not isinstance(self.nats, NatsConfig):
            raise InvalidArgumentError(f"nats must be a NatsConfig or None, got {self.nats!r}")

    @classmethod
    def of(cls, brokers: str | Sequence[str] | ClientConfig, **options: Any) -> ClientConfig:
        """A config from broker addresses and keyword options, or a given config (then no options)."""
        if isinstance(brokers, ClientConfig):
            if options:
                raise InvalidArgumentError(f"give options in the ClientConfig, not also as {sorted(options)}")
            return brokers
        return cls(brokers=brokers, **options)  # type: ignore[arg-type]  # normalised in __post_init__

    def channel_options(self) -> list[tuple[str, Any]]:
        options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            # Each pooled channel gets its own connection instead of sharing one.
            ("grpc.use_local_subchannel_pool", 1),
            # A peer that vanished without a reset (host loss, SIGSTOP, a partition) fails the channel's
            # calls within KEEPALIVE_TIME + KEEPALIVE_TIMEOUT instead of never.
            ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.max_pings_without_data", 0),
            # gRPC waits up to 2 minutes between reconnects to a broker that was down, failing calls to it
            # at once meanwhile: a restarted leader would stay unreachable that long. Keep it short.
            ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
            ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
        ]
        if self.tls is not None and self.tls.server_name:
            options.append(("grpc.ssl_target_name_override", self.tls.server_name))
        return options + list(self.grpc_options)


def _grpc_options(value: object) -> tuple[tuple[str, Any], ...]:
    pairs = list(value) if isinstance(value, Sequence) and not isinstance(value, str | bytes) else None
    if pairs is None or not all(isinstance(p, tuple | list) and len(p) == 2 and isinstance(p[0], str) for p in pairs):
        raise InvalidArgumentError(f"grpc_options must be (name, value) pairs, got {value!r}")
    return tuple((name, option) for name, option in pairs)
