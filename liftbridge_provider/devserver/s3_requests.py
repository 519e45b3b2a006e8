"""One signed S3 request with the standard library: AWS Signature Version 4, path-style, over HTTP.

The S3 launcher checks readiness and creates buckets with it, and tests send the requests no library here
exposes (a ``PutObject`` with ``If-None-Match`` / ``If-Match``). Neither boto3 nor botocore is a
dependency, and the signature is short: the canonical request, the string to sign, the HMAC chain
(https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html).
Plain HTTP only: the launcher's server listens on 127.0.0.1 without TLS.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import http.client
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "s3"
REQUEST_TIMEOUT = 10.0  # seconds for one request (connect, send, answer)


@dataclass(frozen=True)
class S3Response:
    """An S3 answer: the HTTP status, headers (names in lower case) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def etag(self) -> str | None:
        """The ``ETag`` header (quotes kept, as S3 wants it back in ``If-Match``), or None."""
        return self.headers.get("etag")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signing_key(secret_key: str, day: str, region: str) -> bytes:
    """The key of one day's signatures: HMAC-SHA256 chained over the day (``YYYYMMDD``), region, service."""
    key = _hmac(f"AWS4{secret_key}".encode(), day)
    for part in (region, SERVICE, "aws4_request"):
        key = _hmac(key, part)
    return key


def authorization(
    method: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    payload_hash: str,
    *,
    access_key: str,
    secret_key: str,
    region: str,
    amz_date: str,
) -> str:
    """The ``Authorization`` header of a request whose ``headers`` (host and x-amz-date among them) are all
    signed; ``path`` already URI-encoded, ``query`` already canonical (sorted, encoded)."""
    names = sorted(name.lower() for name in headers)
    values = {name.lower(): " ".join(str(value).split()) for name, value in headers.items()}
    canonical_headers = "".join(f"{name}:{values[name]}\n" for name in names)
    signed = ";".join(names)
    canonical = "\n".join([method, path, query, canonical_headers, signed, payload_hash])
    scope = f"{amz_date[:8]}/{region}/{SERVICE}/aws4_request"
    to_sign = "\n".join([ALGORITHM, amz_date, scope, _sha256(canonical.encode())])
    signature = hmac.new(signing_key(secret_key, amz_date[:8], region), to_sign.encode(), hashlib.sha256)
    return f"{ALGORITHM} Credential={access_key}/{scope}, SignedHeaders={signed}, Signature={signature.hexdigest()}"


def s3_request(
    endpoint: str,
    method: str,
    bucket: str = "",
    key: str = "",
    *,
    access_key: str,
    secret_key: str,
    region: str = "us-east-1",
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    timeout: float = REQUEST_TIMEOUT,
) -> S3Response:
    """Send one signed request to ``endpoint`` (``http://host:port``): ``bucket`` and ``key`` empty for the
    service (ListBuckets), ``key`` empty for the bucket. ``headers`` (e.g. ``If-None-Match: *``) are sent
    and signed. Raises OSError (``ConnectionRefusedError``...) when nothing answers; any HTTP status is an
    answer, returned as it is."""
    parts = urlsplit(endpoint)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"endpoint must be http://host:port, got {endpoint!r}")
    host = parts.netloc
    path = "/" + quote(bucket, safe="-_.~") + ("/" + quote(key, safe="-_.~/") if key else "")
    amz_date = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    payload_hash = _sha256(body)
    signed = {
        "host": host,
        "x-amz-date": amz_date,
        "x-amz-content-sha256": payload_hash,
        **{name.lower(): value for name, value in (headers or {}).items()},
    }
    signed["authorization"] = authorization(
        method,
        path,
        "",
        signed,
        payload_hash,
        access_key=access_key,
        secret_key=secret_key,
        region=region,
        amz_date=amz_date,
    )
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers={**signed, "content-length": str(len(body))})
        answer = connection.getresponse()
        return S3Response(answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read())
    finally:
        connection.close()
