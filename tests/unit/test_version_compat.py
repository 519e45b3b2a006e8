"""version_compat: the one place that reads the installed Airflow and PySpark versions."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from liftbridge_provider import version_compat
from liftbridge_provider.version_compat import version_tuple


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3.2.2", (3, 2, 2)),
        ("4.1.0.dev0", (4, 1, 0)),
        ("3.3.0rc1", (3, 3, 0)),
        ("4.2", (4, 2, 0)),
        ("4.3.0+local", (4, 3, 0)),
    ],
)
def test_version_tuple(text: str, expected: tuple[int, int, int]) -> None:
    assert version_tuple(text) == expected


def _versions_seen(pythonpath: Path) -> str:
    code = "from liftbridge_provider import version_compat as v; print(v.PYSPARK_VERSION, v.ARROW_SCHEMA_UTC)"
    result = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": f"{pythonpath}:{Path.cwd()}"},
                            capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return result.stdout.strip()


@pytest.mark.parametrize("version", ["4.1.4", "4.2.1"])
def test_the_pyspark_files_python_imports_decide_even_from_a_zip(tmp_path: Path, version: str) -> None:
    """PySpark's version is read from the pyspark/version.py that Python imports, also when it comes from a
    zip (Spark's Python workers put pyspark.zip on their path): 4.1 gets timestamp_utc, 4.2+ timezone."""
    archive = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("pyspark/__init__.py", "")
        zipped.writestr("pyspark/version.py", f'__version__: str = "{version}"\n')
    seen = _versions_seen(archive)
    keyword = "{'timezone': 'UTC'}" if version >= "4.2" else "{'timestamp_utc': True}"
    assert seen == f"{version_tuple(version)} {keyword}"


def test_the_installed_versions_are_read() -> None:
    """In this environment (the newest targets) both are installed and read."""
    assert version_compat.AIRFLOW_VERSION is not None
    assert version_compat.PYSPARK_VERSION is not None
    assert version_compat.AIRFLOW_V_3_3_PLUS is (version_compat.AIRFLOW_VERSION >= (3, 3, 0))


def test_moved_names_come_from_airflow_or_pyspark_when_installed_and_unknown_names_are_refused() -> None:
    from airflow.triggers import shared_stream  # noqa: PLC0415 - only to compare

    if version_compat.AIRFLOW_V_3_3_PLUS:
        assert version_compat.SharedStreamProducer is shared_stream.SharedStreamProducer
    with pytest.raises(AttributeError):
        _ = version_compat.NotAName
