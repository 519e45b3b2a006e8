"""Auto-registration of the ``liftbridge`` Spark data source.

PySpark 4 registers the ``DefaultSource`` of every importable top-level
``pyspark_*`` module, so ``spark.read.format("liftbridge")`` works without
``spark.dataSource.register``.
"""

from liftbridge_provider.spark.source import LiftbridgeDataSource as DefaultSource

__all__ = ["DefaultSource"]
