"""The installed wheel on this target: the versions it holds, every module imports, Airflow sees the provider."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

import liftbridge_provider
from liftbridge_provider import version_compat

# Modules that are Airflow's faces: a PySpark-only environment (no Airflow) cannot import them.
AIRFLOW_FACES = ("hooks", "operators", "sensors", "triggers", "queues", "assets", "events", "telemetry", "ui")
# What an Airflow face may lack where Airflow is not installed: Airflow, or FastAPI, which Airflow's API server
# brings (the Liftbridge page's app, ui/app.py).
AIRFLOW_ONLY = ("No module named 'airflow", "No module named 'fastapi'")


# Modules that need the OpenLineage provider (an optional companion, like Airflow's own providers' lineage
# parts): where it is not installed they fail for want of it, and only the liftbridge:// converter imports them.
OPENLINEAGE_ONLY = ("liftbridge_provider.assets.offsets_facet",)
OPENLINEAGE_MODULES = (
    "ModuleNotFoundError: No module named 'openlineage",
    "ModuleNotFoundError: No module named 'attr'",
)


def _modules() -> list[str]:
    found = [m.name for m in pkgutil.walk_packages(liftbridge_provider.__path__, "liftbridge_provider.")]
    return [*found, "pyspark_liftbridge"]


def _airflow_face(name: str) -> bool:
    return name.split(".")[1] in AIRFLOW_FACES if name.startswith("liftbridge_provider.") else False


def test_the_environment_holds_the_target_and_the_wheel(target: Any) -> None:
    """The package comes from the installed wheel (not the checkout), and the target's versions (Airflow,
    PySpark, Python) are the ones installed and the ones version_compat reads."""
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert Path(liftbridge_provider.__file__).resolve().is_relative_to(site), liftbridge_provider.__file__
    if target.python is not None:
        assert sys.version_info[:2] == target.python, sys.version
    if target.airflow is not None:
        assert version_compat.AIRFLOW_VERSION is not None
        assert version_compat.AIRFLOW_VERSION[:2] == target.airflow
        assert version_compat.AIRFLOW_V_3_3_PLUS is (target.airflow >= (3, 3))
        assert version_compat.AIRFLOW_V_3_2_PLUS is (target.airflow >= (3, 2))
    if target.pyspark is not None:
        import pyspark  # noqa: PLC0415 - the targets that run the Spark tests only

        assert version_compat.PYSPARK_VERSION is not None
        assert version_compat.PYSPARK_VERSION[:2] == target.pyspark
        assert tuple(int(n) for n in pyspark.__version__.split(".")[:2]) == target.pyspark
        jars = Path(pyspark.__file__).parent / "jars"
        core = [j.name for j in jars.glob("spark-core_*.jar")]
        assert len(core) == 1, core
        assert f"-{pyspark.__version__}.jar" in core[0], core


def test_the_wheel_is_this_pythons_and_its_compiled_decoder_is_in_use() -> None:
    """The wheel installed is the one built for this interpreter (its tag, e.g. cp313-cp313-linux_x86_64), and
    it carries the compiled decoder for it: the reads decode with it, not with the pure-Python twin."""
    from liftbridge_provider.client import columns  # noqa: PLC0415 - only here

    wheel = importlib.metadata.distribution("airflow-provider-liftbridge").read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    cp = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert tags == [f"{cp}-{cp}-{platform}"], wheel
    assert os.environ.get("LIFTBRIDGE_PURE_PYTHON", "") in ("", "0")
    assert columns.NATIVE is True
    spec = importlib.util.find_spec("liftbridge_provider.client._wire_columns")
    assert spec is not None
    assert spec.origin is not None
    assert spec.origin.endswith(sysconfig.get_config_var("EXT_SUFFIX")), spec.origin
    site = Path(sysconfig.get_paths()["platlib"]).resolve()
    assert Path(spec.origin).resolve().is_relative_to(site), spec.origin


def test_the_environment_is_consistent() -> None:
    """`pip check`: every installed distribution's requirements hold, the provider's ranges included, with the
    target's own Airflow or PySpark (so installing the provider into it keeps that version)."""
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


FLOORS_TARGET = "pyspark-4.0"
"""The target that installs grpcio and protobuf at the package's floors (tools/constraints.sh); the others install
the newest that resolve (README, "Versions")."""


def test_grpcio_and_protobuf_are_at_the_floors_on_the_floors_target_and_above_them_elsewhere(target: Any) -> None:
    """The floors are the versions the generated code checks for when imported (grpcio-tools 1.66.2 writes
    grpcio>=1.66.2 and protobuf>=5.28.0): one target runs the package on them, the others above them."""
    from packaging.requirements import Requirement  # noqa: PLC0415 - only here
    from packaging.version import Version  # noqa: PLC0415

    floors = {}
    for line in importlib.metadata.requires("airflow-provider-liftbridge") or []:
        requirement = Requirement(line)
        if requirement.name in ("grpcio", "protobuf") and requirement.marker is None:
            (floor,) = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
            floors[requirement.name] = floor
    assert set(floors) == {"grpcio", "protobuf"}, floors
    installed = {name: Version(importlib.metadata.version(name)) for name in floors}
    if target.name == FLOORS_TARGET:
        assert installed == floors
    else:
        assert all(installed[name] > floors[name] for name in floors), (installed, floors)


def test_every_module_imports(target: Any) -> None:
    """Every module of the package imports here; without Airflow (PySpark targets) only Airflow's faces
    fail, and only for want of Airflow."""
    failed: dict[str, str] = {}
    for name in _modules():
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"
    for name in OPENLINEAGE_ONLY:
        if name in failed and importlib.util.find_spec("openlineage") is None:
            assert failed.pop(name).startswith(OPENLINEAGE_MODULES), name
    if target.airflow is not None:
        assert failed == {}
    else:
        assert all(_airflow_face(name) for name in failed), failed
        assert all(any(want in error for want in AIRFLOW_ONLY) for error in failed.values()), failed
        assert not any(name.startswith(("liftbridge_provider.spark", "liftbridge_provider.client")) for name in failed)


def _airflow(*args: str) -> subprocess.CompletedProcess[str]:
    airflow = str(Path(sys.executable).with_name("airflow"))
    return subprocess.run([airflow, *args], capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.airflow_target
def test_airflow_lists_the_provider_its_connection_and_its_queue() -> None:
    """`airflow providers list` names the package; the connection type and the message-queue scheme are known."""
    listed = _airflow("providers", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert "airflow-provider-liftbridge" in {p["package_name"] for p in json.loads(listed.stdout)}
    hooks = _airflow("providers", "hooks", "-o", "json")
    assert hooks.returncode == 0, hooks.stderr[-3000:]
    assert "liftbridge" in {h["connection_type"] for h in json.loads(hooks.stdout)}
    queues = _airflow("providers", "queues", "-o", "json")
    assert queues.returncode == 0, queues.stderr[-3000:]
    assert "liftbridge_provider.queues.liftbridge.LiftbridgeMessageQueueProvider" in queues.stdout


@pytest.mark.airflow_target
def test_the_example_dags_parse_without_import_errors(project: Path, tmp_path: Path) -> None:
    """Every DAG file in dags/ parses here: no import error, and each DAG is found."""
    # DagBag moved to airflow.dag_processing.dagbag, and Airflow 3.3's takes no include_examples: the examples
    # stay out through [core] load_examples, which every Airflow version's DagBag follows.
    script = (
        "import json, sys\n"
        "try:\n"
        "    from airflow.dag_processing.dagbag import DagBag\n"
        "except ImportError:\n"
        "    from airflow.models.dagbag import DagBag\n"
        "bag = DagBag(dag_folder=sys.argv[1])\n"
        "print(json.dumps({'dags': sorted(bag.dag_ids), 'errors': bag.import_errors}))\n"
    )
    env = {**os.environ, "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    result = subprocess.run([sys.executable, "-c", script, str(project / "dags")], capture_output=True, text=True,
                            timeout=300, check=False, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    assert parsed["errors"] == {}
    assert parsed["dags"] == ["liftbridge_event_ingest", "liftbridge_spark_ingest", "liftbridge_stream_admin"]
