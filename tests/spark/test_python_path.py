"""Spark's Python processes of the test environment load pyspark from site-packages, not from Spark's zip.

Spark puts ``pyspark.zip`` and py4j's zip first on the path of every Python process it starts, and Python
compiles the modules it loads from a zip anew in each process: about 0.7 s of CPU for each Spark Python daemon
before it forks its first worker. ``make venv`` installs a start-up line that drops the zips when they hold what
site-packages holds (tools/venv/_pyspark_from_site_packages.py). These tests guard that it takes effect in a
real Spark worker, and that it leaves a zip alone that is not this environment's own.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

SITE_PYSPARK = Path(pyspark.__file__).resolve().parent  # the driver imports site-packages' pyspark
SPARK_LIB = SITE_PYSPARK / "python" / "lib"


def _origins(batches: Iterator[object]) -> Iterator[object]:
    import py4j  # type: ignore[import-untyped]  # noqa: PLC0415
    import pyarrow as pa  # noqa: PLC0415 - in the Spark worker
    import pyspark as worker_pyspark  # noqa: PLC0415

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"pyspark": [worker_pyspark.__file__], "py4j": [py4j.__file__]})


def test_a_spark_python_worker_imports_pyspark_and_py4j_from_site_packages(spark: SparkSession) -> None:
    """Without the start-up line the worker's pyspark is ``.../python/lib/pyspark.zip/pyspark/__init__.py``."""
    row = spark.range(1, numPartitions=1).mapInArrow(_origins, "pyspark string, py4j string").collect()[0]
    assert Path(row["pyspark"]).resolve().parent == SITE_PYSPARK, f"{row['pyspark']}: run `make venv`"
    assert ".zip" not in row["py4j"], row["py4j"]


def _imported_from(python_path: str) -> str:
    found = subprocess.run(
        [sys.executable, "-c", "import pyspark, py4j; print(pyspark.__file__); print(py4j.__file__)"],
        env={"PYTHONPATH": python_path},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return found.stdout


def test_the_zips_of_this_environments_pyspark_are_dropped_and_a_copy_elsewhere_is_kept(tmp_path: Path) -> None:
    zips = sorted(str(path) for path in SPARK_LIB.glob("*.zip"))
    assert len(zips) == 2, zips  # pyspark.zip and py4j-<version>-src.zip
    own = _imported_from(":".join(zips))
    assert ".zip" not in own, own
    for path in zips:
        shutil.copy(path, tmp_path)
    elsewhere = _imported_from(":".join(str(tmp_path / Path(path).name) for path in zips))
    assert elsewhere.count(str(tmp_path)) == 2, elsewhere  # another Spark's zips stay first
