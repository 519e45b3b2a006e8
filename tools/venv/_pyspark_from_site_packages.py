"""Python processes of this environment import pyspark and py4j from site-packages, not from Spark's zips.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's source zip first on the ``PYTHONPATH`` of every
Python process it starts: its daemons, their forked workers (a data source's planning steps, each task's Python
side) and a ``spark-submit`` driver. With pip's pyspark, ``$SPARK_HOME`` is ``site-packages/pyspark``, so the
zips hold the same files as site-packages, but Python keeps no compiled bytecode for modules it loads from a
zip: each of those processes compiled every pyspark module it imported from source (docs/benchmarks.md, "The
test suite's Spark Python processes compiled pyspark from its zip").

``make venv`` puts this module and a ``.pth`` line that imports it into the environment's site-packages.
At start-up it removes the two zips from ``sys.path`` when they are the ones inside this environment's own
pyspark and the packages they hold are installed here at the same version (pyspark-client, which Airflow's Spark
provider pulls in, overwrites pyspark's Python files with those of another release), so the same modules load
from site-packages and their cached bytecode. A process of another environment (the packed executors'
environment, which has no pyspark of its own) has no such line and keeps the zips.
"""

from __future__ import annotations

import os
import sys

_SITE = os.path.dirname(os.path.realpath(__file__))
_SPARK_LIB = os.path.join(_SITE, "pyspark", "python", "lib")


def _installed_here(entry: str) -> bool:
    """``entry`` is a zip of this pyspark's lib folder whose package is installed in site-packages."""
    path = os.path.realpath(entry)
    if os.path.dirname(path) != _SPARK_LIB or not path.endswith(".zip"):
        return False
    name = os.path.basename(path)
    if name == "pyspark.zip":  # the same release: pyspark-client can overwrite site-packages' copy with another
        return _same_release(os.path.join(_SITE, "pyspark", "version.py"), path)
    if name.startswith("py4j-") and name.endswith("-src.zip"):  # py4j-0.10.9.9-src.zip
        version = name[len("py4j-") : -len("-src.zip")]
        return os.path.isdir(os.path.join(_SITE, f"py4j-{version}.dist-info"))
    return False


def _same_release(installed: str, archive: str) -> bool:
    """``installed`` (site-packages' ``pyspark/version.py``) names the version ``archive``'s copy names."""
    import zipfile  # noqa: PLC0415 - only in a process Spark started: the others never read a zip

    def version(lines: list[str]) -> list[str]:
        return [line.strip() for line in lines if line.startswith("__version__")][:1]

    try:
        with open(installed, encoding="utf-8") as here, zipfile.ZipFile(archive) as spark:
            ours = version(here.readlines())
            theirs = version(spark.read("pyspark/version.py").decode().splitlines())
    except (OSError, KeyError, zipfile.BadZipFile):
        return False
    return bool(ours) and ours == theirs


sys.path[:] = [entry for entry in sys.path if not _installed_here(entry)]
