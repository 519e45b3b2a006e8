"""The S3 request signature of the launcher's requests (AWS Signature Version 4), against AWS's own example."""

from __future__ import annotations

import hashlib

from liftbridge_provider.devserver.s3_requests import authorization, signing_key


def test_the_request_signature_matches_aws_example() -> None:
    """AWS's worked example of a signed GetObject (Signature Version 4, "Example: GET Object")."""
    empty = hashlib.sha256(b"").hexdigest()
    header = authorization(
        "GET",
        "/test.txt",
        "",
        {
            "host": "examplebucket.s3.amazonaws.com",
            "range": "bytes=0-9",
            "x-amz-content-sha256": empty,
            "x-amz-date": "20130524T000000Z",
        },
        empty,
        access_key="AKIAIOSFODNN7EXAMPLE",
        secret_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        region="us-east-1",
        amz_date="20130524T000000Z",
    )
    assert header == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )


def test_the_signing_key_changes_with_the_day_and_the_region() -> None:
    keys = {signing_key("secret", day, region) for day in ("20260101", "20260102") for region in ("a", "b")}
    assert len(keys) == 4
