"""Where the ingest job's S3 settings come from: an Airflow ``aws`` connection, or Spark's S3A settings and the
environment, each turned into the one :class:`S3Settings` that S3A, delta-rs and pyiceberg settings come from."""

from __future__ import annotations

import json

import pytest

from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.object_store import ENVIRONMENT_CREDENTIALS, S3Settings
from liftbridge_provider.core.s3_sources import (
    SIMPLE_CREDENTIALS,
    library_uri,
    s3_location,
    s3a_conf_with_keys,
    s3a_keys,
    settings_from_aws_connection,
    settings_from_aws_connection_json,
    settings_from_s3a,
    spark_uri,
)

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"


def test_an_aws_connection_of_an_s3_compatible_store() -> None:
    """The Amazon provider's fields: login and password are the keys; endpoint_url and region_name extras."""
    settings = settings_from_aws_connection(
        "AKID", SECRET, {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-3"}
    )
    assert settings == S3Settings("http://127.0.0.1:9000", "AKID", SECRET, region="eu-west-3", path_style=True)


def test_an_aws_connection_to_aws_itself_addresses_buckets_virtually_and_takes_the_s3_service_endpoint() -> None:
    aws = settings_from_aws_connection("AKID", SECRET, {"region_name": "us-west-2"})
    assert (aws.endpoint, aws.region, aws.path_style) == (None, "us-west-2", False)
    per_service = settings_from_aws_connection(
        "AKID",
        SECRET,
        {
            "endpoint_url": "https://sts.example",
            "service_config": {"s3": {"endpoint_url": "https://s3.example:9443"}},
            "config_kwargs": {"s3": {"addressing_style": "virtual"}},
        },
    )
    assert (per_service.endpoint, per_service.path_style) == ("https://s3.example:9443", False)
    in_extra = settings_from_aws_connection(None, None, {"aws_access_key_id": "K", "aws_secret_access_key": "S"})
    assert (in_extra.access_key, in_extra.secret_key, in_extra.region) == ("K", "S", "us-east-1")


def test_an_aws_connection_the_job_cannot_reproduce_is_refused_without_echoing_its_secret() -> None:
    """A role to assume or a profile change how boto3 signs: S3A, delta-rs and pyiceberg would sign otherwise,
    so the connection is refused by name rather than half used."""
    cases = {
        "role_arn": {"role_arn": "arn:aws:iam::1:role/x"},
        "profile_name": {"profile_name": "dev"},
    }
    for name, extra in cases.items():
        with pytest.raises(InvalidArgumentError, match=name) as refused:
            settings_from_aws_connection("AKID", SECRET, extra)
        assert SECRET not in str(refused.value)
    with pytest.raises(InvalidArgumentError, match="no access key") as missing:
        settings_from_aws_connection(None, SECRET, {})
    assert SECRET not in str(missing.value)
    with pytest.raises(InvalidArgumentError, match="endpoint_url"):
        settings_from_aws_connection("AKID", SECRET, {"endpoint_url": "ftp://x"})


def test_the_json_form_of_an_aws_connection() -> None:
    """What ``aws_connection_json`` hands the job in ``LIFTBRIDGE_AWS_CONN_JSON`` (Airflow's JSON form; extra an
    object or a JSON string)."""
    connection = {"conn_type": "aws", "login": "AKID", "password": SECRET, "extra": {"endpoint_url": "http://h:1"}}
    assert settings_from_aws_connection_json(json.dumps(connection)).endpoint == "http://h:1"
    as_string = {**connection, "extra": json.dumps(connection["extra"])}
    assert settings_from_aws_connection_json(json.dumps(as_string)).secret_key == SECRET
    for bad, problem in (("[]", "JSON object"), ('{"conn_type": "liftbridge"}', "conn_type"), ("{", "not valid JSON")):
        with pytest.raises(InvalidArgumentError, match=problem):
            settings_from_aws_connection_json(bad)


def test_spark_s3a_settings_and_the_environment_make_the_same_settings() -> None:
    """The test set-up's (and a Spark user's) way: endpoint and style in fs.s3a.*, keys in the environment that
    S3A's EnvironmentVariableCredentialsProvider reads."""
    given = S3Settings("http://127.0.0.1:9000", "AKID", SECRET, region="eu-west-3")
    conf = given.hadoop_conf()
    assert settings_from_s3a(conf, given.environment(), "lake") == given
    keys_in_conf = {**conf, **s3a_conf_with_keys(given)}
    assert settings_from_s3a(keys_in_conf, {}, "lake") == given
    assert s3a_conf_with_keys(given)["fs.s3a.aws.credentials.provider"] == SIMPLE_CREDENTIALS
    read = set(s3a_keys("lake"))
    for name in ("endpoint", "endpoint.region", "path.style.access", "connection.ssl.enabled", "access.key"):
        assert {f"fs.s3a.{name}", f"fs.s3a.bucket.lake.{name}"} <= read


def test_s3a_defaults_per_bucket_settings_and_an_endpoint_without_a_scheme() -> None:
    """What S3A itself does: a bucket's own fs.s3a.bucket.<b>.* wins, an endpoint without a scheme takes it from
    fs.s3a.connection.ssl.enabled (default true), path style is off unless set, the region defaults to
    AWS_REGION then us-east-1; with the keys in fs.s3a.* they are used before the environment's."""
    conf = {
        "fs.s3a.endpoint": "store:9000",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.bucket.other.endpoint": "https://other.example",
        "fs.s3a.bucket.other.path.style.access": "true",
        "fs.s3a.access.key": "CONFKEY",
        "fs.s3a.secret.key": "CONFSECRET",
    }
    environ = {"AWS_ACCESS_KEY_ID": "ENVKEY", "AWS_SECRET_ACCESS_KEY": "ENVSECRET", "AWS_REGION": "ap-south-1"}
    lake = settings_from_s3a(conf, environ, "lake")
    assert lake == S3Settings("http://store:9000", "CONFKEY", "CONFSECRET", region="ap-south-1", path_style=False)
    other = settings_from_s3a(conf, environ, "other")
    assert (other.endpoint, other.path_style) == ("https://other.example", True)
    aws = settings_from_s3a({}, environ, "lake")
    assert (aws.endpoint, aws.access_key) == (None, "ENVKEY")


def test_s3a_keys_follow_the_credential_providers_s3a_uses() -> None:
    """With only the environment provider configured, S3A ignores fs.s3a.access.key: so does the mapping."""
    conf = {
        "fs.s3a.aws.credentials.provider": ENVIRONMENT_CREDENTIALS,
        "fs.s3a.access.key": "CONFKEY",
        "fs.s3a.secret.key": "CONFSECRET",
    }
    environ = {"AWS_ACCESS_KEY_ID": "ENVKEY", "AWS_SECRET_ACCESS_KEY": SECRET}
    assert settings_from_s3a(conf, environ, "b").access_key == "ENVKEY"
    with pytest.raises(InvalidArgumentError, match="AWS_ACCESS_KEY_ID") as missing:
        settings_from_s3a(conf, {}, "b")
    assert "CONFSECRET" not in str(missing.value)


TOKEN = "FwoGZXIvYXdzEJr-session-token"


def test_temporary_credentials_carry_their_session_token_to_every_consumer_and_nowhere_else() -> None:
    """Keys with a session token (an assumed role, SSO): from the aws connection's extra aws_session_token, from
    S3A's temporary-credentials provider and fs.s3a.session.token, or from AWS_SESSION_TOKEN; each consumer's
    settings carry it (S3A through its temporary provider, the environment, pyarrow, delta-rs, pyiceberg), and
    no repr or keyless Spark setting shows it. (The job refused a token before.)"""
    from_connection = settings_from_aws_connection("ASIAKEY", SECRET, {"aws_session_token": TOKEN})
    from_env = settings_from_s3a(
        {}, {"AWS_ACCESS_KEY_ID": "ASIAKEY", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": TOKEN}, "b"
    )
    temporary = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    from_s3a = settings_from_s3a(
        {
            "fs.s3a.aws.credentials.provider": temporary,
            "fs.s3a.access.key": "ASIAKEY",
            "fs.s3a.secret.key": SECRET,
            "fs.s3a.session.token": TOKEN,
        },
        {},
        "b",
    )
    for settings in (from_connection, from_env, from_s3a):
        assert settings.session_token == TOKEN
        assert settings.environment()["AWS_SESSION_TOKEN"] == TOKEN
        assert settings.pyarrow_options()["session_token"] == TOKEN
        assert settings.delta_storage_options()["AWS_SESSION_TOKEN"] == TOKEN
        assert settings.pyiceberg_properties()["s3.session-token"] == TOKEN
        conf = s3a_conf_with_keys(settings)
        assert (conf["fs.s3a.aws.credentials.provider"], conf["fs.s3a.session.token"]) == (temporary, TOKEN)
        assert TOKEN not in repr(settings)
        assert TOKEN not in json.dumps(settings.spark_conf())
    long_lived = settings_from_aws_connection("AKID", SECRET, {})
    assert long_lived.session_token is None
    assert "AWS_SESSION_TOKEN" not in long_lived.environment()
    assert "fs.s3a.session.token" not in s3a_conf_with_keys(long_lived)
    assert s3a_conf_with_keys(long_lived)["fs.s3a.aws.credentials.provider"] == SIMPLE_CREDENTIALS


def test_s3a_reads_a_session_token_only_through_the_provider_that_takes_it() -> None:
    """S3A's simple provider ignores fs.s3a.session.token, and its temporary provider takes no keys without one:
    the mapping follows S3A's order (temporary, simple, environment when unset)."""
    keys = {"fs.s3a.access.key": "CONFKEY", "fs.s3a.secret.key": "CONFSECRET"}
    simple_only = settings_from_s3a(
        {**keys, "fs.s3a.session.token": TOKEN, "fs.s3a.aws.credentials.provider": SIMPLE_CREDENTIALS}, {}, "b"
    )
    assert (simple_only.access_key, simple_only.session_token) == ("CONFKEY", None)
    default_order = settings_from_s3a({**keys, "fs.s3a.session.token": TOKEN}, {}, "b")
    assert (default_order.access_key, default_order.session_token) == ("CONFKEY", TOKEN)
    no_token = settings_from_s3a(keys, {}, "b")
    assert no_token.session_token is None


def test_object_store_uris() -> None:
    assert s3_location("s3a://lake/orders/") == ("lake", "orders")
    assert s3_location("s3://lake") == ("lake", "")
    assert s3_location("/data/lake") is None
    assert s3_location("file:/data/lake") is None
    assert spark_uri("s3://lake/orders/data/x.parquet") == "s3a://lake/orders/data/x.parquet"
    assert spark_uri("s3a://lake/o") == "s3a://lake/o"
    assert library_uri("s3a://lake/orders") == "s3://lake/orders"
    for bad in ("s3a:///orders", "s3a://"):
        with pytest.raises(InvalidArgumentError, match="bucket"):
            s3_location(bad)
