"""The ``liftbridge`` PySpark data source: its name, schema and options, and the reader or writer Spark asks for.

``spark.read`` gets the batch reader (:mod:`~liftbridge_provider.spark.reader`:
bounded offset ranges read from partition leaders), ``readStream`` the stream
reader (:mod:`~liftbridge_provider.spark.stream`), ``write`` and
``writeStream`` the sink (:mod:`~liftbridge_provider.spark.sink`). Options are
parsed here, on the driver, so bad options fail before any task runs.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from liftbridge_provider.client import LiftbridgeClient
from liftbridge_provider.spark.options import parse_options, parse_write_options
from liftbridge_provider.spark.reader import SCHEMA, LiftbridgeReader, resolve_ranges
from liftbridge_provider.spark.sink import LiftbridgeStreamWriter, LiftbridgeWriter
from liftbridge_provider.spark.stream import LiftbridgeStreamReader


class LiftbridgeDataSource(DataSource):
    """``spark.read`` / ``readStream`` / ``write`` / ``writeStream`` ``.format("liftbridge")``: see
    :mod:`liftbridge_provider.spark.options` for the options. Bad options fail on the driver, when Spark
    asks for a reader or writer, before any task runs."""

    @classmethod
    def name(cls) -> str:
        return "liftbridge"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        read_options = parse_options(self.options)
        with LiftbridgeClient(read_options.config) as client:
            document = resolve_ranges(read_options, client)
        return LiftbridgeReader(read_options, document)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LiftbridgeStreamReader(parse_options(self.options, mode="stream"))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return LiftbridgeWriter(parse_write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return LiftbridgeStreamWriter(parse_write_options(self.options), schema)
