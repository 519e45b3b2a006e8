"""Where a Parquet lake test runs: the local disk, and the S3 gateway (``s3a://``) when the test set-up has it.

Test modules import :func:`lake_place` (a fixture parametrized over both places); each test gets fresh
lake URIs from :meth:`LakePlace.new_lake`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

PLACES = ["local", "s3"]


@dataclass
class LakePlace:
    """A place for lakes: ``root`` is a local folder or an ``s3a://bucket`` URI (a new bucket per test)."""

    name: str
    root: str
    submit_options: tuple[str, ...] = ()  # what spark-submit needs to reach the place (jars, settings)

    def new_lake(self) -> str:
        """A new, empty lake URI (or local path) under the place's root."""
        return f"{self.root}/lake-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=PLACES)
def lake_place(request: pytest.FixtureRequest, tmp_path: Path, spark: SparkSession) -> Iterator[LakePlace]:
    if request.param == "local":
        yield LakePlace("local", str(tmp_path))
        return
    yield s3_place(request, spark)


def s3_place(request: pytest.FixtureRequest, spark: SparkSession) -> LakePlace:
    """A new bucket of the S3 gateway (tests/object_store.py), S3A on the shared session set up for it."""
    from tests.object_store import s3a_submit_options  # noqa: PLC0415 - the S3 tier's own helpers

    request.getfixturevalue("s3a_spark")
    bucket = request.getfixturevalue("s3_bucket")
    return LakePlace("s3", f"s3a://{bucket}", tuple(s3a_submit_options(request.getfixturevalue("s3_settings"))))
