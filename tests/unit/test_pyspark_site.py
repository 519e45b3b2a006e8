"""Which of Spark's zips the test environment's start-up line drops (tools/venv/_pyspark_from_site_packages.py).

Spark puts ``pyspark.zip`` and py4j's zip first on its Python processes' path; the line drops them only when
site-packages holds the same release, so a process never runs pyspark files of another release than its JVM's
(pyspark-client, which Airflow's Spark provider pulls in, overwrites site-packages' copy with its own).
Each case lays out a small site-packages in a temporary folder and runs the module there.
"""

from __future__ import annotations

import runpy
import sys
import zipfile
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[2] / "tools" / "venv" / "_pyspark_from_site_packages.py"


def _site(root: Path, *, installed: str, zipped: str, py4j_installed: bool) -> list[str]:
    """A site-packages at ``root`` with pyspark ``installed`` and Spark's zips holding pyspark ``zipped``."""
    lib = root / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (root / "pyspark" / "version.py").write_text(f"__version__: str = '{installed}'\n")
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as archive:
        archive.writestr("pyspark/version.py", f"__version__: str = '{zipped}'\n")
    with zipfile.ZipFile(lib / "py4j-0.10.9.9-src.zip", "w") as archive:
        archive.writestr("py4j/__init__.py", "")
    if py4j_installed:
        (root / "py4j-0.10.9.9.dist-info").mkdir()
    (root / MODULE.name).write_bytes(MODULE.read_bytes())
    return [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]


def _left_after_start_up(root: Path, zips: list[str]) -> list[str]:
    saved = sys.path[:]
    sys.path[:0] = [*zips, "/elsewhere/pyspark.zip"]
    try:
        runpy.run_path(str(root / MODULE.name))
        return [Path(entry).name for entry in sys.path if entry in zips or entry.startswith("/elsewhere")]
    finally:
        sys.path[:] = saved


@pytest.mark.parametrize(
    ("installed", "py4j_installed", "left"),
    [
        ("4.3.0", True, ["pyspark.zip"]),  # only the other Spark's zip is kept
        ("4.2.0", True, ["pyspark.zip", "pyspark.zip"]),  # another release installed: its zip stays
        ("4.3.0", False, ["py4j-0.10.9.9-src.zip", "pyspark.zip"]),  # no py4j of the zip's version installed
    ],
)
def test_the_zips_are_dropped_only_for_the_release_site_packages_holds(
    tmp_path: Path, installed: str, py4j_installed: bool, left: list[str]
) -> None:
    zips = _site(tmp_path, installed=installed, zipped="4.3.0", py4j_installed=py4j_installed)
    assert _left_after_start_up(tmp_path, zips) == left
