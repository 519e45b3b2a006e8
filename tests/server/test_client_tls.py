"""The client over TLS, mutual TLS and mutual TLS with authorization, against the real Liftbridge server.

Three single-node servers are started once for this module, all with a server
certificate from a test CA (SAN IP:127.0.0.1 and DNS:localhost):

- ``tls_server``: TLS only (server certificate).
- ``mtls_server``: TLS and required client certificates from the test CA.
- ``authz_server``: as ``mtls_server``, plus a Casbin ACL (see :data:`POLICY`).

Server behaviour (Liftbridge v1.9.0) these tests pin down:

- A refused TLS handshake (plaintext client, untrusted CA, missing or
  untrusted client certificate, wrong server name) never reaches an RPC: the
  client retries UNAVAILABLE until its request timeout and raises
  UnavailableError.
- An authorization denial is a plain Go error, so it arrives as gRPC UNKNOWN
  with the message "The client is not authorized to call <RPC> on resource
  <stream|subject|*>"; the client raises PermissionDeniedError.
- PublishAsync (``publish_batch``) reports the denial per message as
  PublishAsyncError PERMISSION_DENIED but stores the messages anyway; the
  unary Publish refuses before storing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from liftbridge_provider._proto import liftbridge_api_pb2 as api
from liftbridge_provider.client import (
    LiftbridgeClient,
    LiftbridgeError,
    PermissionDeniedError,
    StartPosition,
    StopPosition,
    TLSConfig,
    UnavailableError,
)
from liftbridge_provider.client.publish.publisher import BatchPublisher
from liftbridge_provider.client.retry import Deadline
from liftbridge_provider.devserver import DevServer, start_single
from tests.tls_certs import Issued, write_ca, write_client_cert, write_server_cert

E = TypeVar("E", bound=LiftbridgeError)

REQUEST_TIMEOUT = 3.0  # seconds: refused handshakes fail after this long
MAX_FAILURE_SECONDS = REQUEST_TIMEOUT + 3.0  # a refused connection must not hang beyond its deadline

# Casbin ACL model: exact subject (certificate CN) and action (RPC name);
# the object (stream, subject or "*") may end with a "*" wildcard (keyMatch),
# so the launcher's random readiness probe streams can be allowed.
MODEL = """\
[request_definition]
r = sub, obj, act

[policy_definition]
p = sub, obj, act

[policy_effect]
e = some(where (p.eft == allow))

[matchers]
m = r.sub == p.sub && keyMatch(r.obj, p.obj) && r.act == p.act
"""

ALLOWED = "client1"
INTRUDER = "intruder"  # signed by the test CA, absent from the policy
GUARDED = "guarded"  # everything but DeleteStream
NO_SUBSCRIBE = "nosub"  # everything but Subscribe
NO_PUBLISH = "nopub"  # everything but Publish

POLICY_RULES: list[tuple[str, str]] = [
    ("*", "FetchMetadata"),
    # The launcher's readiness probe: CreateStream + DeleteStream of lbdev-ready-<hex>.
    ("lbdev-ready-*", "CreateStream"),
    ("lbdev-ready-*", "DeleteStream"),
    # Cursors are stored by publishing to the internal __cursors stream.
    ("__cursors", "Publish"),
    *[
        (GUARDED, act)
        for act in ("CreateStream", "Publish", "Subscribe", "FetchPartitionMetadata", "SetCursor", "FetchCursor")
    ],
    *[(NO_SUBSCRIBE, act) for act in ("CreateStream", "Publish", "FetchPartitionMetadata")],
    *[(NO_PUBLISH, act) for act in ("CreateStream", "Subscribe", "FetchPartitionMetadata")],
]
POLICY = "".join(f"p, {ALLOWED}, {obj}, {act}\n" for obj, act in POLICY_RULES)


@dataclass(frozen=True)
class Certs:
    ca: Issued
    other_ca: Issued  # trusted by nobody
    server: Issued
    client1: Issued
    intruder: Issued
    rogue: Issued  # CN=client1, but signed by other_ca

    def tls(
        self, client: Issued | None = None, *, ca: Issued | None = None, server_name: str | None = None
    ) -> TLSConfig:
        """Client TLS settings as PEM bytes: trust ``ca`` (default the test CA), present ``client`` if given."""
        return TLSConfig(
            ca=(ca or self.ca).cert_pem,
            cert=client.cert_pem if client else None,
            key=client.key_pem if client else None,
            server_name=server_name,
        )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    folder = tmp_path_factory.mktemp("tls-certs")
    ca = write_ca(folder)
    other_ca = write_ca(folder, "other-ca", "untrusted-test-ca")
    return Certs(
        ca=ca,
        other_ca=other_ca,
        server=write_server_cert(folder, ca),
        client1=write_client_cert(folder, ca, ALLOWED),
        intruder=write_client_cert(folder, ca, INTRUDER),
        rogue=write_client_cert(folder, other_ca, ALLOWED, "rogue"),
    )


def _start(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    settings: dict[str, object],
    credentials: grpc.ChannelCredentials,
) -> Iterator[DevServer]:
    server = start_single(data_dir=tmp_path_factory.mktemp(name), extra_config=settings, credentials=credentials)
    try:
        yield server
    finally:
        server.stop()


def _server_tls(certs: Certs) -> dict[str, object]:
    return {"tls.cert": str(certs.server.cert_path), "tls.key": str(certs.server.key_path)}


def _client_auth(certs: Certs) -> dict[str, object]:
    return {
        **_server_tls(certs),
        "tls.client.auth.enabled": True,
        "tls.client.auth.ca": str(certs.ca.cert_path),
    }


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[DevServer]:
    credentials = grpc.ssl_channel_credentials(root_certificates=certs.ca.cert_pem)
    yield from _start(tmp_path_factory, "tls-server", _server_tls(certs), credentials)


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[DevServer]:
    credentials = grpc.ssl_channel_credentials(certs.ca.cert_pem, certs.client1.key_pem, certs.client1.cert_pem)
    yield from _start(tmp_path_factory, "mtls-server", _client_auth(certs), credentials)


@pytest.fixture(scope="module")
def authz_server(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[DevServer]:
    folder = tmp_path_factory.mktemp("authz")
    model, policy = folder / "model.conf", folder / "policy.csv"
    model.write_text(MODEL)
    policy.write_text(POLICY)
    settings = {
        **_client_auth(certs),
        "tls.client.authz.enabled": True,
        "tls.client.authz.model": str(model),
        "tls.client.authz.policy": str(policy),
    }
    credentials = grpc.ssl_channel_credentials(certs.ca.cert_pem, certs.client1.key_pem, certs.client1.cert_pem)
    yield from _start(tmp_path_factory, "authz-server", settings, credentials)


@pytest.fixture
def client1(authz_server: DevServer, certs: Certs) -> Iterator[LiftbridgeClient]:
    """client1 on the authorization server."""
    with LiftbridgeClient(authz_server.brokers, tls=certs.tls(certs.client1), request_timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def authz_streams(authz_server: DevServer, certs: Certs) -> None:
    """Create the policy's streams once (CreateStream is allowed on each)."""
    with LiftbridgeClient(authz_server.brokers, tls=certs.tls(certs.client1), request_timeout=10) as client:
        for stream in (GUARDED, NO_SUBSCRIBE, NO_PUBLISH):
            client.create_stream(f"authz.{stream}", stream)


def refused(kind: type[E], call: Callable[[], object]) -> E:
    """Run ``call``, expect exactly ``kind``, and check it came within the request deadline (no hang)."""
    started = time.monotonic()
    with pytest.raises(LiftbridgeError) as caught:
        call()
    elapsed = time.monotonic() - started
    error = caught.value
    assert type(error) is kind, f"expected {kind.__name__}, got {type(error).__name__}: {error}"
    assert isinstance(error, kind)  # for the type checker
    assert elapsed < MAX_FAILURE_SECONDS, f"failure took {elapsed:.1f}s"
    return error


def round_trip(client: LiftbridgeClient, stream: str, value: bytes) -> None:
    """Create ``stream``, publish ``value``, read it back."""
    client.create_stream(f"rt.{stream}", stream)
    ack = client.publish(stream, value)
    assert ack is not None
    assert ack.offset == 0
    messages = list(client.read_range(stream, 0, 0, 1))
    assert [(m.offset, m.value) for m in messages] == [(0, value)]
    # publish_batch streams over its own HTTP/2 connection (client/h2/call_state.py), with the same TLS settings
    result = client.publish_batch(stream, [value] * 3000, window=256)
    assert [ack.offset if ack else None for ack in result.acks] == list(range(1, 3001))


def connect_and_fail(brokers: list[str], tls: TLSConfig | None) -> UnavailableError:
    """A client that cannot complete the TLS handshake: fetch_metadata fails with UnavailableError, no hang."""
    client = LiftbridgeClient(brokers, tls=tls, request_timeout=REQUEST_TIMEOUT)
    try:
        error = refused(UnavailableError, client.fetch_metadata)
    finally:
        client.close()
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert client.open_channels() == 0
    return error


# -- TLS (server certificate only) --------------------------------------------


def test_tls_round_trip_and_close(tls_server: DevServer, certs: Certs) -> None:
    client = LiftbridgeClient(
        tls_server.brokers, tls=TLSConfig(ca=str(certs.ca.cert_path)), request_timeout=REQUEST_TIMEOUT
    )
    try:
        round_trip(client, "tls-round-trip", b"over tls")
        assert client.open_channels() > 0
    finally:
        client.close()
    assert client.open_channels() == 0


def test_tls_server_name_override(tls_server: DevServer, certs: Certs) -> None:
    """server_name picks the name checked against the certificate: one it covers works, another fails."""
    with LiftbridgeClient(
        tls_server.brokers, tls=certs.tls(server_name="localhost"), request_timeout=REQUEST_TIMEOUT
    ) as client:
        assert "n1" in client.fetch_metadata().brokers
        client.create_stream("tls-override", "tls-override")
        result = client.publish_batch("tls-override", [b"named"] * 10)  # the batch's own connection checks it too
        assert [ack.offset if ack else None for ack in result.acks] == list(range(10))
    error = connect_and_fail(tls_server.brokers, certs.tls(server_name="not-in-the-certificate.example"))
    assert "Hostname Verification" in error.message


def test_publish_batch_with_a_name_the_certificate_lacks_sends_nothing(tls_server: DevServer, certs: Certs) -> None:
    """The batch's own connection checks the broker's certificate against server_name before anything goes out:
    every message fails as not sent (not stored), and nothing reaches the stream. (The publisher is driven
    directly: the client's metadata calls would fail the same check before it starts.)"""
    with LiftbridgeClient(tls_server.brokers, tls=certs.tls(), request_timeout=REQUEST_TIMEOUT) as good:
        good.create_stream("tls-wrong-name", "tls-wrong-name")
        requests = [api.PublishRequest(stream="tls-wrong-name", value=b"x", correlationId=str(i)) for i in range(5)]
        tls = certs.tls(server_name="not-in-the-certificate.example")
        with LiftbridgeClient(tls_server.brokers, tls=tls, request_timeout=REQUEST_TIMEOUT) as client:
            publisher = BatchPublisher(
                client._router, requests, window=8, ack_wait=2.0, deadline=Deadline(MAX_FAILURE_SECONDS)
            )
            result = publisher.run()
        assert len(result.failures) == 5
        for failure in result.failures:
            assert not failure.may_be_stored
            assert type(failure.error) is UnavailableError
            assert "certificate" in failure.error.message.lower()
        assert good.fetch_partition_metadata("tls-wrong-name", 0).newest_offset == -1


def test_plaintext_client_against_tls_server(tls_server: DevServer) -> None:
    connect_and_fail(tls_server.brokers, None)


def test_client_trusting_wrong_ca(tls_server: DevServer, certs: Certs) -> None:
    error = connect_and_fail(tls_server.brokers, certs.tls(ca=certs.other_ca))
    assert "CERTIFICATE_VERIFY_FAILED" in error.message


# -- mutual TLS ---------------------------------------------------------------


def test_mtls_round_trip_and_close(mtls_server: DevServer, certs: Certs) -> None:
    tls = TLSConfig(ca=certs.ca.cert_path, cert=certs.client1.cert_path, key=certs.client1.key_path)
    client = LiftbridgeClient(mtls_server.brokers, tls=tls, request_timeout=REQUEST_TIMEOUT)
    try:
        round_trip(client, "mtls-round-trip", b"over mutual tls")
        assert client.open_channels() > 0
    finally:
        client.close()
    assert client.open_channels() == 0


def test_mtls_without_client_cert(mtls_server: DevServer, certs: Certs) -> None:
    connect_and_fail(mtls_server.brokers, certs.tls())


def test_mtls_plaintext_client(mtls_server: DevServer) -> None:
    connect_and_fail(mtls_server.brokers, None)


def test_mtls_client_cert_from_untrusted_ca(mtls_server: DevServer, certs: Certs) -> None:
    """The right CommonName is not enough: the certificate must chain to tls.client.auth.ca."""
    connect_and_fail(mtls_server.brokers, certs.tls(certs.rogue))


def test_mtls_without_authz_accepts_any_trusted_cn(mtls_server: DevServer, certs: Certs) -> None:
    """Without tls.client.authz, any certificate from the trusted CA may call anything."""
    with LiftbridgeClient(
        mtls_server.brokers, tls=certs.tls(certs.intruder), request_timeout=REQUEST_TIMEOUT
    ) as client:
        assert "n1" in client.fetch_metadata().brokers


# -- authorization (Casbin ACL) -----------------------------------------------


@pytest.mark.usefixtures("authz_streams")
def test_authz_allowed_calls_succeed(client1: LiftbridgeClient) -> None:
    ack = client1.publish(GUARDED, b"allowed")
    assert ack is not None
    messages = list(client1.read_range(GUARDED, 0, ack.offset, ack.offset + 1))
    assert [m.value for m in messages] == [b"allowed"]
    client1.set_cursor("tls-cursor", GUARDED, 0, ack.offset)
    assert client1.fetch_cursor("tls-cursor", GUARDED, 0) == ack.offset
    assert GUARDED in client1.fetch_metadata().streams


@pytest.mark.usefixtures("authz_streams")
def test_authz_denied_delete_stream(client1: LiftbridgeClient) -> None:
    error = refused(PermissionDeniedError, lambda: client1.delete_stream(GUARDED))
    assert error.message == f"The client is not authorized to call DeleteStream on resource {GUARDED}"
    assert error.stream == GUARDED
    assert error.code == grpc.StatusCode.UNKNOWN  # v1.9.0 returns a plain error, not PERMISSION_DENIED
    assert "DeleteStream" in str(error)
    assert GUARDED in client1.fetch_metadata().streams  # still there


@pytest.mark.usefixtures("authz_streams")
def test_authz_denied_create_stream_on_other_name(client1: LiftbridgeClient) -> None:
    error = refused(PermissionDeniedError, lambda: client1.create_stream("authz.unlisted", "unlisted"))
    assert error.message == "The client is not authorized to call CreateStream on resource unlisted"
    assert error.stream == "unlisted"
    assert "unlisted" not in client1.fetch_metadata().streams


@pytest.mark.usefixtures("authz_streams")
def test_authz_denied_subscribe(client1: LiftbridgeClient) -> None:
    client1.publish(NO_SUBSCRIBE, b"unreadable")
    error = refused(PermissionDeniedError, lambda: list(client1.read_range(NO_SUBSCRIBE, 0, 0, 1)))
    assert error.message == f"The client is not authorized to call Subscribe on resource {NO_SUBSCRIBE}"
    assert error.stream == NO_SUBSCRIBE


@pytest.mark.usefixtures("authz_streams")
def test_authz_denied_subscribe_iterating(client1: LiftbridgeClient) -> None:
    subscription = client1.subscribe(
        NO_SUBSCRIBE, start=StartPosition.earliest(), stop=StopPosition.at_offset(0), timeout=REQUEST_TIMEOUT
    )
    with subscription:
        error = refused(PermissionDeniedError, lambda: next(iter(subscription)))
    assert "Subscribe" in error.message


@pytest.mark.usefixtures("authz_streams")
def test_authz_denied_publish(client1: LiftbridgeClient) -> None:
    """Unary Publish is refused before storing; PublishAsync reports the denial per message yet stores them."""
    before = client1.fetch_partition_metadata(NO_PUBLISH).newest_offset
    error = refused(PermissionDeniedError, lambda: client1.publish(NO_PUBLISH, b"denied"))
    assert error.message == f"The client is not authorized to call Publish on resource {NO_PUBLISH}"
    assert not error.may_be_stored
    assert client1.fetch_partition_metadata(NO_PUBLISH).newest_offset == before

    # v1.9.0 answers each denied PublishAsync message with PERMISSION_DENIED *and then* an ack, and stores it.
    result = client1.publish_batch(NO_PUBLISH, [b"first", b"second"], raise_on_error=False)
    assert result.acks == [None, None]  # never reported as a plain success
    for failure in result.failures:
        assert type(failure.error) is PermissionDeniedError
        assert failure.error.message == f"The client is not authorized to call Publish on resource {NO_PUBLISH}"
        assert failure.error.may_be_stored
    deadline = time.monotonic() + 5
    while client1.fetch_partition_metadata(NO_PUBLISH).newest_offset != before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client1.fetch_partition_metadata(NO_PUBLISH).newest_offset == before + 2


@pytest.mark.usefixtures("authz_streams")
def test_authz_denied_publish_to_subject(client1: LiftbridgeClient) -> None:
    error = refused(PermissionDeniedError, lambda: client1.publish_to_subject(f"authz.{GUARDED}", b"x"))
    assert error.message == f"The client is not authorized to call PublishToSubject on resource authz.{GUARDED}"


def test_authz_unknown_cn_denied_fetch_metadata(authz_server: DevServer, certs: Certs) -> None:
    client = LiftbridgeClient(authz_server.brokers, tls=certs.tls(certs.intruder), request_timeout=REQUEST_TIMEOUT)
    try:
        error = refused(PermissionDeniedError, client.fetch_metadata)
    finally:
        client.close()
    assert error.message == "The client is not authorized to call FetchMetadata on resource *"
    assert error.code == grpc.StatusCode.UNKNOWN
    assert client.open_channels() == 0


def test_authz_still_requires_client_cert(authz_server: DevServer, certs: Certs) -> None:
    connect_and_fail(authz_server.brokers, certs.tls())


def test_cert_files_are_what_the_tests_assume(certs: Certs) -> None:
    """Guards the helper: names, SANs and issuers the other tests rely on."""

    def cn(cert: x509.Certificate) -> object:
        return cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value

    san = certs.server.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert cn(certs.client1.certificate) == ALLOWED
    assert cn(certs.rogue.certificate) == ALLOWED
    assert certs.rogue.certificate.issuer == certs.other_ca.certificate.subject
    assert certs.client1.certificate.issuer == certs.ca.certificate.subject
    for issued in (certs.ca, certs.server, certs.client1):
        assert issued.cert_path.read_bytes() == issued.cert_pem
        assert issued.key_path.read_bytes() == issued.key_pem
