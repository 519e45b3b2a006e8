"""The object-store settings, rendered for each consumer from one S3Settings, and what a missing filesystem says."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from liftbridge_provider.core.object_store import (
    ENVIRONMENT_CREDENTIALS,
    FILESYSTEMS,
    S3A_EXCLUDES,
    S3A_PACKAGES,
    S3Settings,
    missing_filesystem_message,
    packages_line,
    scheme_of,
)

ROOT = Path(__file__).resolve().parents[3]
LOCAL = S3Settings("http://127.0.0.1:9000", "AKID", "SECRET-KEY")
AWS = S3Settings(None, "AKID", "SECRET-KEY", region="eu-west-1", path_style=False)


def test_the_secret_is_in_no_spark_setting_and_not_in_repr() -> None:
    for settings in (LOCAL, AWS):
        assert "SECRET-KEY" not in repr(settings)
        assert "SECRET-KEY" not in str(settings.spark_conf())
        assert "AKID" not in str(settings.spark_conf())
        assert settings.environment() == {"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "SECRET-KEY"}


def test_spark_settings_for_a_local_store_and_for_aws() -> None:
    assert LOCAL.spark_conf() == {
        "spark.hadoop.fs.s3a.aws.credentials.provider": ENVIRONMENT_CREDENTIALS,
        "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
    }
    aws = AWS.hadoop_conf()
    assert "fs.s3a.endpoint" not in aws
    assert aws["fs.s3a.connection.ssl.enabled"] == "true"
    assert aws["fs.s3a.path.style.access"] == "false"
    assert aws["fs.s3a.endpoint.region"] == "eu-west-1"
    assert not any("performance" in key for key in aws)  # see core/object_store.py: it unchecks create()


def test_pyarrow_delta_and_pyiceberg_settings_come_from_the_same_values() -> None:
    assert LOCAL.pyarrow_options() == {
        "access_key": "AKID",
        "secret_key": "SECRET-KEY",
        "region": "us-east-1",
        "scheme": "http",
        "force_virtual_addressing": False,
        "endpoint_override": "http://127.0.0.1:9000",
    }
    assert LOCAL.delta_storage_options() == {
        "AWS_ACCESS_KEY_ID": "AKID",
        "AWS_SECRET_ACCESS_KEY": "SECRET-KEY",
        "AWS_REGION": "us-east-1",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_CONDITIONAL_PUT": "etag",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ALLOW_HTTP": "true",
    }
    assert LOCAL.pyiceberg_properties() == {
        "s3.access-key-id": "AKID",
        "s3.secret-access-key": "SECRET-KEY",
        "s3.region": "us-east-1",
        "s3.force-virtual-addressing": "false",
        "s3.endpoint": "http://127.0.0.1:9000",
    }
    assert "AWS_ALLOW_HTTP" not in AWS.delta_storage_options()
    assert "s3.endpoint" not in AWS.pyiceberg_properties()
    assert AWS.pyarrow_options()["scheme"] == "https"
    assert AWS.pyarrow_options()["force_virtual_addressing"] is True


def test_the_packages_match_the_jars_make_tools_fetches() -> None:
    """tools/s3a-jars/pom.xml (what the tests run with) and S3A_PACKAGES (what the error tells users to add)
    name the same artifacts and versions."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    pom = ET.parse(ROOT / "tools" / "s3a-jars" / "pom.xml").getroot()
    declared = {
        ":".join(d.findtext(f"m:{part}", namespaces=ns) or "" for part in ("groupId", "artifactId", "version"))
        for d in pom.findall("m:dependencies/m:dependency", ns)
    }
    assert declared == set(S3A_PACKAGES)
    pinned = (ROOT / "tools" / "s3a-jars" / "jars.sha256").read_text().split()[1::2]
    for package in S3A_PACKAGES:
        _, artifact, version = package.split(":")
        assert f"{artifact}-{version}.jar" in pinned
    assert not any(name.startswith(("bundle-", "netty-codec", "httpclient", "slf4j")) for name in pinned)


def test_a_missing_filesystem_names_its_packages_and_settings() -> None:
    message = missing_filesystem_message("s3a://b/lake", "java.lang.ClassNotFoundException: x")
    assert message.startswith("s3a://b/lake: Spark cannot load the s3a:// filesystem (org.apache.hadoop.fs.s3a.")
    assert "--packages " + ",".join(S3A_PACKAGES) + " --exclude-packages " + ",".join(S3A_EXCLUDES) in message
    assert "--conf spark.hadoop.fs.s3a.create.conditional.enabled=true" in message
    assert "Nothing was claimed or written" in message
    assert packages_line(FILESYSTEMS["gs"]) == "--packages org.apache.hadoop:hadoop-gcp:3.5.0"
    assert set(FILESYSTEMS) == {"s3a", "s3", "gs", "abfs", "abfss"}


@pytest.mark.parametrize(
    ("uri", "scheme"), [("s3a://b/x", "s3a"), ("S3A://b/x", "s3a"), ("/data/lake", ""), ("file:/x", "file")]
)
def test_scheme_of(uri: str, scheme: str) -> None:
    assert scheme_of(uri) == scheme
