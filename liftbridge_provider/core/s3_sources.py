"""Where the ingest job's S3 settings come from, as one :class:`~liftbridge_provider.core.object_store.S3Settings`.

The job has one source of the object store's endpoint and keys, whoever runs it:

- **Airflow users** keep them in the Amazon provider's ``aws`` connection (login = access key id, password =
  secret access key; extras ``endpoint_url``, ``region_name``, ``service_config.s3.endpoint_url``,
  ``config_kwargs.s3.addressing_style``). ``hooks/object_store.py`` hands the connection to the job in the
  environment (``LIFTBRIDGE_AWS_CONN_JSON``, Airflow's JSON form): :func:`settings_from_aws_connection_json`.
  The job writes it into its Spark session's S3A settings (:func:`s3a_conf_with_keys`), so S3A, delta-rs
  and pyiceberg all use what the connection says.
- **Spark users** keep them in S3A's settings (``fs.s3a.*``, per bucket ``fs.s3a.bucket.<b>.*``) and the
  keys in S3A's settings or the environment S3A reads (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``):
  :func:`settings_from_s3a` reads them the way S3A does, for delta-rs and pyiceberg.

No secret goes on a command line: the connection travels in the environment, S3A's keys in its settings or
the environment. Errors name settings, never their values.

Temporary credentials (keys with a session token: the connection's extra ``aws_session_token``, S3A's
``fs.s3a.session.token`` with its temporary-credentials provider, ``AWS_SESSION_TOKEN``) are carried to every
consumer. Not mapped, so refused by name rather than half used: what makes boto3 sign differently (a role to
assume, a profile, a web identity): the job cannot reproduce those itself.

Also here: the URIs of object-store locations (:func:`s3_location`), and the scheme each side writes:
Spark's S3A takes ``s3a://`` (:func:`spark_uri`), delta-rs, pyiceberg and pyarrow take ``s3://``
(:func:`library_uri`) and read ``s3a://`` too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.object_store import ENVIRONMENT_CREDENTIALS, S3Settings

AWS_CONNECTION_ENV = "LIFTBRIDGE_AWS_CONN_JSON"
"""The environment variable that carries an ``aws`` connection to the ingest job (Airflow's JSON form)."""

DEFAULT_REGION = "us-east-1"
S3_SCHEMES = ("s3", "s3a", "s3n")

SIMPLE_CREDENTIALS = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
"""S3A's provider of ``fs.s3a.access.key`` / ``fs.s3a.secret.key``."""
TEMPORARY_CREDENTIALS = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
ENVIRONMENT_PROVIDERS = (ENVIRONMENT_CREDENTIALS, "com.amazonaws.auth.EnvironmentVariableCredentialsProvider")
S3A_DEFAULT_PROVIDERS = (TEMPORARY_CREDENTIALS, SIMPLE_CREDENTIALS, ENVIRONMENT_CREDENTIALS)
"""What S3A tries when ``fs.s3a.aws.credentials.provider`` is unset (Hadoop 3.4+), in order."""

S3A_OPTIONS = (
    "endpoint",
    "endpoint.region",
    "path.style.access",
    "connection.ssl.enabled",
    "aws.credentials.provider",
    "access.key",
    "secret.key",
    "session.token",
)
"""The S3A options (``fs.s3a.<option>``, and per bucket ``fs.s3a.bucket.<bucket>.<option>``) read here."""

AWS_CONNECTION_KEYS = {"conn_type", "login", "password", "host", "port", "schema", "extra", "description"}
MAPPED_EXTRAS = {
    "endpoint_url",
    "region_name",
    "service_config",
    "config_kwargs",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
}
"""The ``aws`` connection extras this module maps; any other extra is refused by name."""


def settings_from_aws_connection(login: str | None, password: str | None, extra: Mapping[str, Any]) -> S3Settings:
    """The S3 settings of an Amazon provider ``aws`` connection (its login, password and extra).

    Keys: login and password, else the extras ``aws_access_key_id`` / ``aws_secret_access_key``; the extra
    ``aws_session_token`` makes them temporary credentials. Endpoint:
    ``service_config.s3.endpoint_url``, else ``endpoint_url``, else AWS itself. Region: ``region_name`` (default
    us-east-1). Addressing: ``config_kwargs.s3.addressing_style`` (``path`` or ``virtual``), else path style
    with an endpoint (S3-compatible stores on one host need it) and virtual hosting on AWS. InvalidArgumentError
    for an extra this cannot map, or no keys.
    """
    unmapped = sorted(set(extra) - MAPPED_EXTRAS)
    if unmapped:
        raise InvalidArgumentError(
            f"the aws connection has extras {unmapped} that the ingest job cannot hand to S3A, delta-rs and "
            f"pyiceberg (they would sign otherwise than boto3); it maps {sorted(MAPPED_EXTRAS)}, with the keys "
            "as login and password: give a connection with keys, or leave the job's credentials to Spark's S3A "
            "settings and the environment (docs/spark.md, 'Object storage')"
        )
    access_key = login or extra.get("aws_access_key_id")
    secret_key = password or extra.get("aws_secret_access_key")
    if not access_key or not secret_key:
        raise InvalidArgumentError(
            "the aws connection has no access key id (login) or no secret access key (password): the ingest "
            "job needs both to hand S3A, delta-rs and pyiceberg the same keys"
        )
    service = _section(extra, "service_config")
    endpoint = service.get("endpoint_url") or extra.get("endpoint_url") or None
    if endpoint is not None and urlsplit(str(endpoint)).scheme.lower() not in ("http", "https"):
        raise InvalidArgumentError(f"the aws connection's endpoint_url must be an http(s) URL, got {endpoint!r}")
    style = _section(extra, "config_kwargs").get("addressing_style")
    if style not in (None, "auto", "path", "virtual"):
        raise InvalidArgumentError(f"config_kwargs.s3.addressing_style must be path or virtual, got {style!r}")
    path_style = style == "path" or (style != "virtual" and endpoint is not None)
    region = str(extra.get("region_name") or DEFAULT_REGION)
    token = extra.get("aws_session_token") or None
    return S3Settings(
        endpoint,
        str(access_key),
        str(secret_key),
        region=region,
        path_style=path_style,
        session_token=str(token) if token else None,
    )


def _section(extra: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The ``s3`` part of a per-service extra (``{"s3": {...}}``), or nothing."""
    value = extra.get(name) or {}
    if not isinstance(value, Mapping) or not isinstance(value.get("s3") or {}, Mapping):
        raise InvalidArgumentError(f"the aws connection's extra {name} must be an object of services")
    return value.get("s3") or {}


def settings_from_aws_connection_json(text: str | bytes) -> S3Settings:
    """:func:`settings_from_aws_connection` of a connection in Airflow's JSON form (``conn_type`` aws when
    given; ``extra`` an object or a JSON string), as ``aws_connection_json`` writes it. Values never echoed."""
    connection = _json_object(text, "the aws connection JSON")
    unknown = sorted(set(connection) - AWS_CONNECTION_KEYS)
    if unknown:
        raise InvalidArgumentError(f"unknown keys {unknown} in the aws connection JSON")
    if connection.get("conn_type") not in (None, "aws"):
        raise InvalidArgumentError(f"the connection's conn_type must be 'aws', got {connection.get('conn_type')!r}")
    extra = connection.get("extra") or {}
    if isinstance(extra, str | bytes):
        extra = _json_object(extra, "the aws connection's extra")
    if not isinstance(extra, Mapping):
        raise InvalidArgumentError("the aws connection's extra must be a JSON object")
    return settings_from_aws_connection(connection.get("login"), connection.get("password"), extra)


def _json_object(text: str | bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise InvalidArgumentError(f"{what} is not valid JSON") from None  # the text may hold a secret
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def s3a_keys(bucket: str, options: tuple[str, ...] = S3A_OPTIONS) -> tuple[str, ...]:
    """The Hadoop settings of S3A ``options`` for ``bucket`` (global and the bucket's own); by default those
    :func:`settings_from_s3a` reads."""
    return tuple(f"fs.s3a.{option}" for option in options) + tuple(
        f"fs.s3a.bucket.{bucket}.{option}" for option in options
    )


def settings_from_s3a(conf: Mapping[str, str], environ: Mapping[str, str], bucket: str) -> S3Settings:
    """The S3 settings S3A uses for ``bucket``, from its Hadoop settings ``conf`` (``fs.s3a.*``, the keys of
    :func:`s3a_keys`) and the process's ``environ``, resolved as S3A resolves them.

    A bucket's own ``fs.s3a.bucket.<b>.<option>`` wins over ``fs.s3a.<option>``. An endpoint without a scheme
    takes ``https`` unless ``fs.s3a.connection.ssl.enabled`` is false; none means AWS itself. Path style is off
    unless ``fs.s3a.path.style.access`` is true. The region is ``fs.s3a.endpoint.region``, else
    ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, else us-east-1. The keys come from the credential providers S3A
    is configured with (``fs.s3a.aws.credentials.provider``; unset: its default order, the settings' keys
    before the environment's), with the session token the same provider reads (``fs.s3a.session.token`` for
    the temporary-credentials provider, ``AWS_SESSION_TOKEN`` for the environment's; the simple provider
    reads none). InvalidArgumentError when there are none.
    """

    def option(name: str) -> str | None:
        value = conf.get(f"fs.s3a.bucket.{bucket}.{name}")
        value = value if value not in (None, "") else conf.get(f"fs.s3a.{name}")
        return value.strip() if isinstance(value, str) and value.strip() else None

    endpoint = option("endpoint")
    if endpoint is not None and "://" not in endpoint:
        secure = (option("connection.ssl.enabled") or "true").lower() != "false"
        endpoint = f"{'https' if secure else 'http'}://{endpoint}"
    region = option("endpoint.region") or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    path_style = (option("path.style.access") or "false").lower() == "true"
    providers = [p.strip() for p in (option("aws.credentials.provider") or "").split(",") if p.strip()]
    access_key, secret_key, token = _keys(option, environ, providers or list(S3A_DEFAULT_PROVIDERS))
    return S3Settings(
        endpoint, access_key, secret_key, region=region or DEFAULT_REGION, path_style=path_style, session_token=token
    )


def _keys(option: Any, environ: Mapping[str, str], providers: list[str]) -> tuple[str, str, str | None]:
    """The first keys (and their session token) a provider of ``providers`` finds, as S3A asks them in turn.
    S3A's temporary-credentials provider takes keys only with a token; the simple one takes keys without."""
    conf_keys = (option("access.key"), option("secret.key"))
    for provider in providers:
        found: tuple[str | None, str | None, str | None] | None = None
        if provider == TEMPORARY_CREDENTIALS:
            found = (*conf_keys, option("session.token")) if option("session.token") else None
        elif provider == SIMPLE_CREDENTIALS:
            found = (*conf_keys, None)
        elif provider in ENVIRONMENT_PROVIDERS:
            found = (
                environ.get("AWS_ACCESS_KEY_ID"),
                environ.get("AWS_SECRET_ACCESS_KEY"),
                environ.get("AWS_SESSION_TOKEN") or None,
            )
        if found is not None and found[0] and found[1]:
            return found[0], found[1], found[2]
    raise InvalidArgumentError(
        "delta-rs and pyiceberg need the object store's keys, and S3A's settings give none they can use "
        f"(credential providers {providers}): give the job an aws connection ({AWS_CONNECTION_ENV}), or put "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in its environment (S3A reads them too), or set "
        "fs.s3a.access.key and fs.s3a.secret.key in a properties file, never on the command line"
    )


def s3a_conf_with_keys(settings: S3Settings) -> dict[str, str]:
    """S3A's settings for ``settings`` with the keys in them (``fs.s3a.access.key`` / ``secret.key``, with
    ``fs.s3a.session.token`` for temporary credentials, and the provider that reads them): what the job sets
    on its session's Hadoop configuration for an ``aws`` connection. Set at run time, they reach every S3A
    filesystem and task of the session, and no Spark setting, UI or event log shows them."""
    conf = settings.hadoop_conf()
    conf.update(
        {
            "fs.s3a.aws.credentials.provider": SIMPLE_CREDENTIALS,
            "fs.s3a.access.key": settings.access_key,
            "fs.s3a.secret.key": settings.secret_key,
        }
    )
    if settings.session_token:
        conf["fs.s3a.aws.credentials.provider"] = TEMPORARY_CREDENTIALS
        conf["fs.s3a.session.token"] = settings.session_token
    return conf


def s3_location(uri: str) -> tuple[str, str] | None:
    """``(bucket, key)`` of an ``s3://``, ``s3a://`` or ``s3n://`` URI (key without slashes at its ends);
    None for any other URI or a plain path. InvalidArgumentError when the URI names no bucket."""
    parts = urlsplit(uri)
    if parts.scheme.lower() not in S3_SCHEMES:
        return None
    if not parts.netloc:
        raise InvalidArgumentError(f"{uri!r} names no bucket (s3a://<bucket>/<key>)")
    return parts.netloc, parts.path.strip("/")


def spark_uri(uri: str) -> str:
    """``uri`` as Spark's S3A writes it: ``s3://`` and ``s3n://`` become ``s3a://`` (others unchanged)."""
    return _with_scheme(uri, "s3a")


def library_uri(uri: str) -> str:
    """``uri`` as delta-rs, pyiceberg and pyarrow name it: ``s3a://`` and ``s3n://`` become ``s3://``."""
    return _with_scheme(uri, "s3")


def _with_scheme(uri: str, scheme: str) -> str:
    location = s3_location(uri)
    if location is None:
        return uri
    bucket, key = location
    return f"{scheme}://{bucket}/{key}" if key else f"{scheme}://{bucket}"
