"""Apache Iceberg's reference REST catalog on 127.0.0.1, its warehouse on the test S3 gateway.

The server is iceberg-core's RESTCatalogAdapter and RESTCatalogServlet (what ``RESTCatalogServer`` of
``org.apache.iceberg:iceberg-open-api:1.10.0:test-fixtures``, the ``apache/iceberg-rest-fixture`` image,
serves) over a JdbcCatalog on a SQLite file, started by tests/IcebergRestOnLoopback.java (compiled here once
per start, about 2 s) so that it listens on loopback only. Its table metadata goes to the gateway through
Iceberg's S3FileIO; the keys reach it in its environment (``CATALOG_S3_*``), never its command line.

Jars: ``make tools`` (tools/install-iceberg-rest-jars.sh: .tools/jars/iceberg-rest, 21 jars, 29 MB), the S3A
set's AWS SDK modules (.tools/jars/s3a) and a few of pyspark's own jars (Hadoop's Configuration, Jackson,
Avro, logging, Apache HTTP client). A missing jar folder fails the test, saying to run ``make tools``.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyspark

from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.devserver import DevServerError, config
from liftbridge_provider.devserver.process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = Path(__file__).with_name("IcebergRestOnLoopback.java")
JARS = ROOT / ".tools" / "jars" / "iceberg-rest"
S3A_JARS = ROOT / ".tools" / "jars" / "s3a"
PYSPARK_JARS = Path(pyspark.__file__).parent / "jars"
PYSPARK_PREFIXES = (
    "hadoop-client-api-",
    "hadoop-client-runtime-",
    "jackson-core-",
    "jackson-databind-",
    "jackson-annotations-",
    "slf4j-api-",
    "log4j-api-",
    "log4j-core-",
    "log4j-slf4j2-impl-",
    "jcl-over-slf4j-",
    "httpclient-4",
    "httpcore-4",
    "commons-codec-",
    "commons-compress-",
    "avro-1",
)
"""The pyspark jars the server needs (the whole folder, 250 jars, took it 3x longer to start)."""
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx256m")
STARTUP_TIMEOUT = 90.0
PORT_ATTEMPTS = 3


@dataclass
class IcebergRest:
    """A running REST catalog: its URI and process."""

    uri: str
    process: ServerProcess

    def stop(self) -> None:
        self.process.stop(10.0)


def _classpath(classes: Path) -> str:
    marker = JARS / ".complete"
    if not marker.is_file() or not (S3A_JARS / ".complete").is_file():
        raise DevServerError(
            f"the Iceberg REST catalog's jars are missing ({JARS}, {S3A_JARS}): run `make tools` "
            "(tools/install-iceberg-rest-jars.sh and tools/install-s3a-jars.sh)"
        )
    spark_jars = sorted(p for p in PYSPARK_JARS.glob("*.jar") if p.name.startswith(PYSPARK_PREFIXES))
    return ":".join([str(classes), str(JARS / "*"), str(S3A_JARS / "*"), *map(str, spark_jars)])


def start_iceberg_rest(s3: S3Settings, warehouse: str, root: Path) -> IcebergRest:
    """Start the catalog with its warehouse at ``warehouse`` (``s3://bucket/prefix``) on ``s3``'s store, its
    SQLite file, classes and log under ``root``; return once ``GET /v1/config`` answers."""
    classes = root / "classes"
    classes.mkdir(parents=True, exist_ok=True)
    javac = shutil.which("javac") or "javac"
    classpath = _classpath(classes)
    compiled = subprocess.run(
        [javac, "-d", str(classes), "-cp", classpath, str(LAUNCHER)], capture_output=True, text=True, check=False
    )
    if compiled.returncode != 0:
        raise DevServerError(f"compiling {LAUNCHER.name} failed: {compiled.stderr[-2000:]}")
    environment = {
        "PATH": "/usr/bin:/bin",
        "CATALOG_WAREHOUSE": warehouse,
        "CATALOG_URI": f"jdbc:sqlite:file:{root / 'catalog.db'}",
        "CATALOG_IO__IMPL": "org.apache.iceberg.aws.s3.S3FileIO",
        "CATALOG_S3_ENDPOINT": s3.endpoint or "",
        "CATALOG_S3_PATH__STYLE__ACCESS": str(s3.path_style).lower(),
        "CATALOG_S3_ACCESS__KEY__ID": s3.access_key,
        "CATALOG_S3_SECRET__ACCESS__KEY": s3.secret_key,
        "CATALOG_CLIENT_REGION": s3.region,
    }
    java = shutil.which("java") or "java"
    for _attempt in range(PORT_ATTEMPTS):
        port = config.free_port()
        process = ServerProcess(
            [java, *JVM_OPTIONS, "-cp", classpath, "IcebergRestOnLoopback", str(port)],
            root / "iceberg-rest.log",
            env=environment,
        )
        mark = process.log_size()
        process.start()
        uri = f"http://{config.LOOPBACK}:{port}"
        try:
            process.wait_for(functools.partial(_answers, uri), STARTUP_TIMEOUT, "GET /v1/config answered 200")
        except DevServerError:
            process.kill()
            if process.log_contains("BindException", mark):  # the port was taken meanwhile: another one
                continue
            raise
        except BaseException:
            process.kill()
            raise
        return IcebergRest(uri, process)
    raise DevServerError(f"the Iceberg REST catalog: ports kept clashing after {PORT_ATTEMPTS} attempts")


def _answers(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/v1/config", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False
