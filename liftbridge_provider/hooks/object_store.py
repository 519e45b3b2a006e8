"""The object store's credentials for the Spark step and the freeze operator: the Amazon provider's ``aws``
connection, read through Airflow's own connections (any provider may read any connection's fields, so the
Amazon provider need not be installed).

- :func:`aws_connection_json`: the connection in Airflow's JSON form, for ``SparkSubmitOperator(env_vars=
  {"LIFTBRIDGE_AWS_CONN_JSON": "{{ aws_connection_json('aws_default') }}"})``: the job maps it to S3A,
  delta-rs and pyiceberg (``core/s3_sources.py``, ``spark/s3_session.py``). The environment carries it, never
  the command line; the text and the secret in it are masked in logs and in the rendered template fields
  Airflow stores.
- :func:`aws_s3_settings`: the same mapping for code that runs in the task itself (the freeze operator's
  ``start="delta"`` on a table on S3).
"""

from __future__ import annotations

import json

from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret

from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.core.s3_sources import settings_from_aws_connection

DEFAULT_AWS_CONN_ID = "aws_default"  # the Amazon provider's default connection id


def aws_connection_json(conn_id: str | None = DEFAULT_AWS_CONN_ID) -> str:
    """The ``aws`` connection ``conn_id`` as ``{"conn_type", "login", "password", "extra"}`` JSON (``""`` for an
    empty id, so a DAG can leave object storage out). Checked first: a connection the job could not map fails
    the task here, naming the problem. Masked: the whole text, the secret key and any secret in its extras."""
    if not conn_id:
        return ""
    connection = BaseHook.get_connection(conn_id)
    extra = connection.extra_dejson
    settings_from_aws_connection(connection.login, connection.password, extra)  # InvalidArgumentError, early
    for secret in (connection.password, extra.get("aws_secret_access_key"), extra.get("aws_session_token")):
        if secret:
            mask_secret(str(secret))
    text = json.dumps({"conn_type": "aws", "login": connection.login, "password": connection.password, "extra": extra})
    mask_secret(text)
    return text


def aws_s3_settings(conn_id: str) -> S3Settings:
    """The S3 settings of the ``aws`` connection ``conn_id`` (InvalidArgumentError when it cannot be mapped);
    its secret key is masked in this task's logs."""
    connection = BaseHook.get_connection(conn_id)
    settings = settings_from_aws_connection(connection.login, connection.password, connection.extra_dejson)
    for secret in settings.secrets():
        mask_secret(secret)
    return settings
