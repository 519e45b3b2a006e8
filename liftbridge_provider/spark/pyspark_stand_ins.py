"""Stand-ins for what older PySpark lacks: stream admission control (4.2+), the Arrow stream writer (4.1+).

Same names and shapes as PySpark's, so the reader and the sink are defined the
same way on every PySpark:

* ``ReadLimit``, ``ReadAllAvailable``, ``ReadMaxRows``, ``SupportsTriggerAvailableNow``
  (``pyspark.sql.streaming.datasource``, 4.2+): PySpark 4.0 and 4.1 never call
  what uses them; they ask ``latestOffset()`` without a start or limit, and the
  reader caps each micro-batch itself (:mod:`liftbridge_provider.spark.stream`).
* ``DataSourceStreamArrowWriter`` (``pyspark.sql.datasource``, 4.1+): on PySpark
  4.0 a ``writeStream`` to Liftbridge is refused with a message naming the version.

Imported through :mod:`liftbridge_provider.version_compat`, never directly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter


class ReadLimit:
    """How much a micro-batch may read."""


@dataclass
class ReadAllAvailable(ReadLimit):
    """No limit: everything available."""


@dataclass
class ReadMaxRows(ReadLimit):
    """At most ``max_rows`` rows (offsets) per micro-batch."""

    max_rows: int


class SupportsTriggerAvailableNow(ABC):
    """A reader that can fix where an ``availableNow`` query stops (only called by PySpark 4.2+)."""

    @abstractmethod
    def prepareForTriggerAvailableNow(self) -> None:
        """Remember what is available now: the query ends there."""


class DataSourceStreamArrowWriter(DataSourceStreamWriter):
    """PySpark 4.0 has no Arrow stream writer: creating the Liftbridge stream sink fails, saying so."""

    def __new__(cls, *args: Any, **kwargs: Any) -> DataSourceStreamArrowWriter:
        from pyspark import __version__  # noqa: PLC0415 - only to name the version in the message

        raise NotImplementedError(
            f"writeStream.format('liftbridge') needs PySpark 4.1+ (DataSourceStreamArrowWriter); this is "
            f"PySpark {__version__}. Batch writes (df.write.format('liftbridge')) work on this version."
        )
