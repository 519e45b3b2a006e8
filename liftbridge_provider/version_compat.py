"""The one place that knows which Airflow and PySpark versions are installed, and what follows from them.

The rest of the package never compares versions: it imports the flags and the
names below. Importing this module imports neither Airflow nor PySpark (the
Spark executors have no Airflow; an Airflow worker may have no PySpark): the
versions are read from the installed files, and the names that moved between
versions are imported on first use (module ``__getattr__``).

Airflow (from the ``apache-airflow-core`` distribution, else ``apache-airflow``;
False when Airflow is not installed):

* ``AIRFLOW_V_3_2_PLUS``: named asset watchers, triggerer queues.
* ``AIRFLOW_V_3_3_PLUS``: shared trigger streams in ack mode
  (``airflow.triggers.shared_stream``) and the task state store.

PySpark (from ``pyspark/version.py`` of the package Python imports, so a
``pyspark-client`` that overwrote pyspark's Python files is seen as what it
is; False when PySpark is not installed):

* ``PYSPARK_V_4_1_PLUS``: the Arrow stream writer (``DataSourceStreamArrowWriter``).
* ``PYSPARK_V_4_2_PLUS``: the stream reader's admission control
  (``latestOffset(start, limit)``, ``getDefaultReadLimit``) and
  ``SupportsTriggerAvailableNow``; Arrow schemas take ``timezone=`` (before:
  ``timestamp_utc=``).
* ``ARROW_SCHEMA_UTC``: the keyword arguments of
  ``pyspark.sql.pandas.types.to_arrow_schema`` that give UTC timestamps.

Names that moved or are missing (imported on first use from where the
installed version has them, else from a stand-in of the same shape that the
installed version never calls):

* ``SharedStreamProducer``, ``AdvanceItem``, ``AdvanceOutcome``,
  ``reject_shared_stream_event``: ``airflow.triggers.shared_stream`` on Airflow
  3.3+, :mod:`liftbridge_provider.triggers.no_shared_stream` before.
* ``ReadLimit``, ``ReadAllAvailable``, ``ReadMaxRows``,
  ``SupportsTriggerAvailableNow``: ``pyspark.sql.streaming.datasource`` on
  PySpark 4.2+, :mod:`liftbridge_provider.spark.pyspark_stand_ins` before.
* ``DataSourceStreamArrowWriter``: ``pyspark.sql.datasource`` on PySpark 4.1+,
  :mod:`liftbridge_provider.spark.pyspark_stand_ins` (which refuses) on 4.0.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.triggers.shared_stream import (
        AdvanceItem,
        AdvanceOutcome,
        SharedStreamProducer,
        reject_shared_stream_event,
    )
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

__all__ = [
    "AIRFLOW_VERSION",
    "AIRFLOW_V_3_2_PLUS",
    "AIRFLOW_V_3_3_PLUS",
    "ARROW_SCHEMA_UTC",
    "PYSPARK_VERSION",
    "PYSPARK_V_4_1_PLUS",
    "PYSPARK_V_4_2_PLUS",
    "AdvanceItem",
    "AdvanceOutcome",
    "DataSourceStreamArrowWriter",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxRows",
    "SharedStreamProducer",
    "SupportsTriggerAvailableNow",
    "reject_shared_stream_event",
    "version_tuple",
]


def version_tuple(text: str) -> tuple[int, int, int]:
    """``(major, minor, micro)`` of a version such as ``"3.2.2"``, ``"4.1.0.dev0"`` or ``"3.3.0rc1"``."""
    numbers = [int(n) for n in re.findall(r"\d+", text.split("+", maxsplit=1)[0])[:3]]
    while len(numbers) < 3:
        numbers.append(0)
    return numbers[0], numbers[1], numbers[2]


def _airflow_version() -> tuple[int, int, int] | None:
    for distribution in ("apache-airflow-core", "apache-airflow"):
        try:
            return version_tuple(importlib.metadata.version(distribution))
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _pyspark_version() -> tuple[int, int, int] | None:
    """The version in the ``pyspark/version.py`` Python would import (not the distribution's metadata: the
    ``pyspark-client`` distribution installs the same files, and whichever was installed last owns them).

    Read through the package's loader, so a ``pyspark.zip`` on the path of Spark's Python workers works too.
    """
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    get_data = getattr(spec.loader, "get_data", None)
    for folder in spec.submodule_search_locations:
        try:
            data = get_data(str(Path(folder, "version.py"))) if get_data else Path(folder, "version.py").read_bytes()
        except OSError:
            continue
        found = re.search(r"__version__[^=]*=\s*[\"']([^\"']+)[\"']", data.decode("utf-8"))
        if found:
            return version_tuple(found.group(1))
    return None


AIRFLOW_VERSION = _airflow_version()
"""``(major, minor, micro)`` of the installed Airflow, or None."""
AIRFLOW_V_3_2_PLUS = AIRFLOW_VERSION is not None and AIRFLOW_VERSION >= (3, 2, 0)
AIRFLOW_V_3_3_PLUS = AIRFLOW_VERSION is not None and AIRFLOW_VERSION >= (3, 3, 0)

PYSPARK_VERSION = _pyspark_version()
"""``(major, minor, micro)`` of the PySpark Python files Python imports, or None."""
PYSPARK_V_4_1_PLUS = PYSPARK_VERSION is not None and PYSPARK_VERSION >= (4, 1, 0)
PYSPARK_V_4_2_PLUS = PYSPARK_VERSION is not None and PYSPARK_VERSION >= (4, 2, 0)

ARROW_SCHEMA_UTC: dict[str, Any] = {"timezone": "UTC"} if PYSPARK_V_4_2_PLUS else {"timestamp_utc": True}
"""``to_arrow_schema(schema, **ARROW_SCHEMA_UTC)``: timestamps as ``timestamp[us, tz=UTC]``."""

# name -> (module on versions that have it, stand-in module otherwise, whether the installed version has it)
_MOVED: dict[str, tuple[str, str, bool]] = {
    **{
        name: ("airflow.triggers.shared_stream", "liftbridge_provider.triggers.no_shared_stream", AIRFLOW_V_3_3_PLUS)
        for name in ("SharedStreamProducer", "AdvanceItem", "AdvanceOutcome", "reject_shared_stream_event")
    },
    **{
        name: ("pyspark.sql.streaming.datasource", "liftbridge_provider.spark.pyspark_stand_ins", PYSPARK_V_4_2_PLUS)
        for name in ("ReadLimit", "ReadAllAvailable", "ReadMaxRows", "SupportsTriggerAvailableNow")
    },
    "DataSourceStreamArrowWriter": (
        "pyspark.sql.datasource",
        "liftbridge_provider.spark.pyspark_stand_ins",
        PYSPARK_V_4_1_PLUS,
    ),
}


def __getattr__(name: str) -> Any:
    """A moved name, imported on first use from where the installed version has it (else its stand-in)."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    real, stand_in, present = _MOVED[name]
    value = getattr(importlib.import_module(real if present else stand_in), name)
    globals()[name] = value
    return value
