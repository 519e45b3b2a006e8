"""Iceberg tables for the ingest job (``ingest.py --format iceberg``), through pyiceberg's catalogs.

:class:`IcebergFormat` is the Iceberg side of ``spark/table_ingest.py``'s loop:
the table's properties record the offset intervals it holds
(``core/iceberg_plan.py``), Spark writes the missing pieces as Parquet files under
the table's data location (a file per task, so each holds one partition: the
table is partitioned by ``identity(partition)`` and pyiceberg reads each
file's partition from its statistics), and the driver appends the files and
sets the new intervals in one Iceberg commit. A commit that lost a race to
another writer fails (the table keeps ``commit.retry.num-retries`` at 0), and
the run plans again. A run killed before the commit leaves files no Iceberg
reader sees.

Catalogs are pyiceberg's, named and configured the way pyiceberg names them
(``type``, ``uri``, ``warehouse``, credentials...; also from
``~/.pyiceberg.yaml`` and ``PYICEBERG_CATALOG__<NAME>__<KEY>``). With none
given and a local output, the job uses an embedded SQL catalog on SQLite inside
the output folder (``<output>/catalog.db``, data under ``<output>``), so nothing
needs to run beside it. An output on S3 (``s3a://bucket/prefix``) is the
warehouse, and the catalog must be given: a SQLite file cannot live in a bucket
(SQLite needs file locks), so either a REST catalog (``type=rest``, ``uri=...``)
or a SQL catalog whose database is a local or shared file named explicitly
(``type=sql``, ``uri=sqlite:////shared/catalog.db``); none is refused before
Spark starts. pyiceberg's S3 FileIO settings (``s3.*``) come from the job's one
source of S3 settings (``spark/s3_session.py``), never from catalog properties.
Spark writes data files through S3A (``s3a://``); the table records them under
its own location's scheme (``s3://`` from a REST catalog), the same objects.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from urllib.parse import urlparse

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import CommitFailedException, NamespaceAlreadyExistsError, TableAlreadyExistsError
from pyiceberg.table import Table
from pyspark.sql import DataFrame, SparkSession

from liftbridge_provider.core.errors import InvalidArgumentError
from liftbridge_provider.core.iceberg_plan import (
    REQUIRED_RETRIES,
    RETRY_PROPERTY,
    plan_properties,
    read_holdings,
    retry_problem,
)
from liftbridge_provider.core.lake import LakeError
from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.core.s3_sources import library_uri, s3_location, spark_uri
from liftbridge_provider.core.table_plan import Interval, LedgerError, TablePlan
from liftbridge_provider.spark.lake_store import HadoopStore
from liftbridge_provider.spark.reader import arrow_schema
from liftbridge_provider.spark.table_ingest import CommitConflict, FileStats, Written, footer_stats

log = logging.getLogger("liftbridge.ingest.iceberg")

DEFAULT_CATALOG = "liftbridge"
PARTITION_COLUMN = "partition"


CATALOG_ATTEMPTS = 5  # loads of a SQL catalog that lost the race to create its tables to another run


def catalog_properties(
    output: str,
    given: Mapping[str, str],
    settings: S3Settings | None = None,
    configured: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The catalog's properties: ``given`` (pyiceberg's names), else the embedded SQL catalog on SQLite in
    ``output`` (a local folder: a plain path or a ``file:`` URI, either form naming the same folder).

    An ``output`` on S3 is the warehouse (``warehouse`` defaults to it, as ``s3://``) and needs a catalog,
    given or ``configured`` in pyiceberg's own configuration of the catalog's name (``~/.pyiceberg.yaml``,
    ``PYICEBERG_CATALOG__*``); InvalidArgumentError without one, or for ``s3.*`` properties: those come from
    ``settings``, the job's one source of S3 settings, added here.
    """
    if s3_location(output) is None:
        if given:
            return dict(given)
        parsed = urlparse(output)
        folder = os.path.abspath(parsed.path if parsed.scheme == "file" else output)
        return {"type": "sql", "uri": f"sqlite:///{folder}/catalog.db", "warehouse": f"file://{folder}"}
    named = {**(configured or {}), **given}
    if "type" not in named and "uri" not in named:
        raise InvalidArgumentError(
            f"an Iceberg warehouse on object storage ({output}) needs a catalog, and a SQLite catalog cannot live "
            "in a bucket: give a REST catalog (--iceberg-catalog-property type=rest --iceberg-catalog-property "
            "uri=https://catalog:8181) or a SQL catalog on a local or shared file (--iceberg-catalog-property "
            "type=sql --iceberg-catalog-property uri=sqlite:////shared/iceberg/catalog.db)"
        )
    s3_given = sorted(key for key in named if key.startswith("s3."))
    if s3_given:
        raise InvalidArgumentError(
            f"catalog properties {s3_given}: the S3 settings come from one source (the aws connection, or Spark's "
            "fs.s3a.* settings and the environment), so S3A, delta-rs and pyiceberg agree: drop them here"
        )
    properties = {"warehouse": library_uri(output), **given}
    if settings is not None:
        properties.update(settings.pyiceberg_properties())
    return properties


class IcebergFormat:
    """An Iceberg table of a pyiceberg catalog, as ``table_ingest.ingest_table`` drives it."""

    def __init__(self, catalog_name: str, properties: Mapping[str, str], identifier: str) -> None:
        self.catalog_name = catalog_name
        self.properties = dict(properties)
        self.identifier = identifier
        self._catalog: Catalog | None = None
        self._table: Table | None = None

    @property
    def table(self) -> Table:
        assert self._table is not None, "refresh() first"
        return self._table

    def catalog(self) -> Catalog:
        if self._catalog is None:
            if self.properties.get("type") == "sql" and "uri" in self.properties:
                folder = self.properties["uri"].removeprefix("sqlite:///")
                os.makedirs(os.path.dirname(folder) or ".", exist_ok=True)
            self._catalog = _load_catalog(self.catalog_name, self.properties)
        return self._catalog

    def check(self) -> None:
        """Before Spark starts: the catalog loads, and an existing table has the shape and settings needed."""
        catalog = self.catalog()
        if catalog.table_exists(self.identifier):
            check_shape(catalog.load_table(self.identifier), self.identifier)

    def refresh(self) -> None:
        catalog = self.catalog()
        if not catalog.table_exists(self.identifier):
            self._create(catalog)
        self._table = catalog.load_table(self.identifier)
        check_shape(self._table, self.identifier)

    def load(self) -> bool:
        """Load the table as it is, without creating it: False when there is none (``spark/landed.py``)."""
        catalog = self.catalog()
        if not catalog.table_exists(self.identifier):
            return False
        self._table = catalog.load_table(self.identifier)
        check_shape(self._table, self.identifier)
        return True

    def _create(self, catalog: Catalog) -> None:
        """Create the namespace and the table when missing. Another run may create either at the same moment:
        catalogs say so differently (an "already exists" error, a lost commit; Iceberg's REST catalog over
        JDBC answered a second namespace create with HTTP 500), so a failed create that left the thing in
        place counts as done."""
        namespace = self.identifier.rsplit(".", 1)[0]
        try:
            catalog.create_namespace(namespace)
        except NamespaceAlreadyExistsError:  # another run made it
            pass
        except Exception as exc:
            if not catalog.namespace_exists(namespace):
                raise
            log.info("creating the namespace %s: %s (another run created it)", namespace, exc)
        properties = {RETRY_PROPERTY: REQUIRED_RETRIES}
        try:  # schema, partitioning and settings in one commit: no run sees the table half made
            with (
                catalog.create_table_transaction(self.identifier, arrow_schema(), properties=properties) as created,
                created.update_spec() as spec,
            ):
                spec.add_identity(PARTITION_COLUMN)
        except (TableAlreadyExistsError, CommitFailedException) as exc:  # another run created it at this moment
            log.info("creating the Iceberg table %s: %s", self.identifier, exc)
        except Exception as exc:
            if not catalog.table_exists(self.identifier):
                raise
            log.info("creating the Iceberg table %s: %s (another run created it)", self.identifier, exc)

    def holdings(self, stream: str, partitions: Sequence[int]) -> dict[int, list[Interval]]:
        try:
            return {p: read_holdings(stream, p, self.table.properties) for p in partitions}
        except LedgerError as exc:
            raise LakeError(f"the Iceberg table {self.identifier}: {exc}") from exc

    def write(self, spark: SparkSession, frame: DataFrame, name: str) -> Written:
        location = f"{self.table.location().rstrip('/')}/data/{name}"
        written = spark_uri(location)  # S3A writes s3a://; the table names the same objects by its own scheme
        frame.write.mode("errorifexists").parquet(written)
        store = HadoopStore(spark, written)
        paths = [f"{location}/{n}" for n in store.list_names(written) if n.endswith(".parquet")]
        files = [self._stats(path) for path in paths]
        return Written(location, files, paths)

    def _stats(self, path: str) -> FileStats:
        with self.table.io.new_input(path).open() as source:
            return footer_stats(path, source)  # type: ignore[arg-type]  # a readable, seekable binary stream

    def commit(self, written: Written, plan: TablePlan, stream: str) -> None:
        files: list[str] = written.handle
        try:
            with self.table.transaction() as transaction:
                if files:
                    transaction.add_files(files, snapshot_properties={"liftbridge.stream": stream})
                transaction.set_properties(plan_properties(stream, plan))
        except CommitFailedException as exc:
            raise CommitConflict(str(exc)) from exc

    def discard(self, written: Written) -> None:
        for path in written.handle:
            try:
                self.table.io.delete(path)
            except OSError as exc:  # an orphan file no reader sees; remove_orphan_files cleans it later
                log.warning("could not delete %s: %s", path, exc)

    def describe(self) -> str:
        if self._table is None:
            return self.identifier
        snapshot = self._table.current_snapshot()
        return f"{self.identifier} (Iceberg snapshot {snapshot.snapshot_id if snapshot else 'none'})"


def _load_catalog(name: str, properties: Mapping[str, str]) -> Catalog:
    """pyiceberg's catalog; a SQL catalog's first load again when another run created its tables meanwhile.

    pyiceberg checks whether the catalog's tables exist, then creates them: two first runs on a new catalog
    file can both find none, and the second ``CREATE TABLE`` fails with "table iceberg_tables already exists"
    (issue 50, item 1: mapped batch tasks start together). The tables exist then, and a new load uses them.
    """
    for attempt in range(CATALOG_ATTEMPTS):
        try:
            return load_catalog(name, **properties)
        except Exception as exc:  # sqlalchemy's OperationalError, not imported: a pyiceberg[sql] dependency
            if "already exists" not in str(exc) or attempt == CATALOG_ATTEMPTS - 1:
                raise
            log.info("the catalog's tables were created by another run meanwhile; loading it again: %s", exc)
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def check_shape(table: Table, identifier: str) -> None:
    """InvalidArgumentError when the table cannot hold what this job writes, or retries lost commits."""
    problem = retry_problem(table.properties, identifier)
    if problem is not None:
        raise InvalidArgumentError(problem)
    columns = [f.name for f in table.schema().fields]
    expected = list(arrow_schema().names)
    sources = [table.schema().find_field(f.source_id).name for f in table.spec().fields]
    if columns == expected and sources in ([], [PARTITION_COLUMN]):
        return
    raise InvalidArgumentError(
        f"the Iceberg table {identifier} has columns {columns} partitioned by {sources}; this job writes "
        f"{expected} partitioned by [{PARTITION_COLUMN!r}]: use a new table or one this job created"
    )
