"""A real S3-compatible server on 127.0.0.1: Versity's S3 gateway (``versitygw``, Apache-2.0) on a folder.

Python API::

    from liftbridge_provider.devserver.s3 import start_s3

    with start_s3() as server:               # a temporary folder, root keys made here, a free port
        bucket = server.create_bucket()      # "lbdev-3f2a..." (or give a name)
        server.settings.spark_conf()         # S3A settings; the keys: server.settings.environment()

The gateway serves the S3 API from its ``posix`` backend: each bucket is a folder of the data folder, each
object a file (the folder needs extended attributes: ext4, xfs and tmpfs have them). It honours
conditional writes (``If-None-Match: *`` and ``If-Match``: 412 when they do not hold), which the lake's
create-if-absent relies on. Like the Liftbridge launcher (:mod:`liftbridge_provider.devserver.cluster`): it
listens on 127.0.0.1 only, on a port picked free (in ``LIFTBRIDGE_DEVSERVER_PORTS`` when set: the pytest
plugin gives each xdist worker its own share), a new port when the picked one was taken meanwhile; it is
started through ``setpriv --pdeathsig KILL`` so it dies with its parent; it is ready when it answers a
signed ListBuckets with 200 (an open port is not enough); a server that exits or does not answer in time
raises DevServerError quoting its log. The keys reach it through its environment, never its command line.

The binary comes from ``.tools/bin`` (``make tools``: tools/install-s3-server.sh) or ``VERSITYGW_BIN``.
:func:`s3a_jars` finds the jars Spark's S3A needs (``make tools``: tools/install-s3a-jars.sh).
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.devserver import binaries, config
from liftbridge_provider.devserver.errors import DevServerError
from liftbridge_provider.devserver.process import ServerProcess
from liftbridge_provider.devserver.s3_requests import REQUEST_TIMEOUT, S3Response, s3_request

BINARY_VARIABLE = "VERSITYGW_BIN"
INSTALL_HINT = (
    "Install it with `make tools` (tools/install-s3-server.sh: `go install` of versitygw, pinned in "
    "tools/go-s3/go.mod, into .tools/bin), or point {env} at an existing binary."
)
JARS_VARIABLE = "LIFTBRIDGE_S3A_JARS"  # a folder that install-s3a-jars.sh filled, instead of .tools/jars/s3a
JARS_MARKER = ".complete"  # written by install-s3a-jars.sh once every jar matched its pinned SHA-256
PORT_ATTEMPTS = 5
ADDRESS_IN_USE = "address already in use"
STARTUP_TIMEOUT = 30.0  # seconds for the gateway to answer a signed ListBuckets (it takes about 0.2 s)
STOP_TIMEOUT = 10.0  # seconds from SIGINT to SIGKILL
PROBE_TIMEOUT = 1.0  # seconds for one readiness request (the gateway answers in milliseconds)
# The gateway reads its keys and options from these too; a value left in the caller's environment
# (ROOT_ACCESS_KEY_ID before ROOT_ACCESS_KEY, VGW_PORT...) would change the server this starts.
_ITS_VARIABLES = ("ROOT_", "VGW_")


@dataclass
class S3Server:
    """A running gateway: its endpoint and root keys (:attr:`settings`), folder and process.

    Use it as a context manager, or call :meth:`stop`.
    """

    root: Path
    port: int
    settings: S3Settings
    process: ServerProcess
    owns_root: bool

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://{config.LOOPBACK}:{self.port}"

    @property
    def data_dir(self) -> Path:
        """The folder the buckets are folders of."""
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    @property
    def running(self) -> bool:
        return self.process.running

    def request(
        self,
        method: str,
        bucket: str = "",
        key: str = "",
        *,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        timeout: float = REQUEST_TIMEOUT,
    ) -> S3Response:
        """One request signed with the root keys (:func:`s3_request`), e.g. a conditional PutObject;
        ``timeout`` in seconds (default 10)."""
        return s3_request(
            self.endpoint,
            method,
            bucket,
            key,
            access_key=self.settings.access_key,
            secret_key=self.settings.secret_key,
            region=self.settings.region,
            body=body,
            headers=headers,
            timeout=timeout,
        )

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket (default a new random name, ``lbdev-<hex>``) and return its name; DevServerError
        when the gateway refuses (a taken or invalid name)."""
        bucket = name or f"lbdev-{secrets.token_hex(6)}"
        answer = self.request("PUT", bucket)
        if answer.status != 200:
            raise DevServerError(f"CreateBucket {bucket!r}: HTTP {answer.status}: {answer.body[:500]!r}")
        return bucket

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the gateway (SIGINT, SIGKILL after ``timeout`` seconds, default 10); remove a temporary root."""
        self.process.stop(timeout)
        if self.owns_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def versitygw_binary() -> Path:
    """The gateway's binary: ``VERSITYGW_BIN``, ``.tools/bin`` or PATH (DevServerError saying how to install)."""
    return binaries.find_binary("versitygw", BINARY_VARIABLE, INSTALL_HINT)


def start_s3(
    *,
    data_dir: Path | str | None = None,
    access_key: str | None = None,
    secret_key: str | None = None,
    region: str = "us-east-1",
    timeout: float = STARTUP_TIMEOUT,
    tie_to_parent: bool = True,
) -> S3Server:
    """Start the gateway and return once it answers a signed request.

    :param data_dir: folder for its data (``data/``) and log (``versitygw.log``); default a new temporary
        folder, removed by :meth:`S3Server.stop`. A given folder is kept.
    :param access_key: the root access key; default a new random one (``lbdev`` and 16 hex digits).
    :param secret_key: the root secret key; default a new random one (40 hex digits).
    :param region: the region it signs for (default ``us-east-1``).
    :param timeout: seconds to wait for its answer (default 30; it takes about 0.2 s).
    :param tie_to_parent: kill it when the thread that started it exits (Linux; default True).
    """
    if data_dir is None:
        root, owns = Path(tempfile.mkdtemp(prefix="lbdev-s3-")), True
    else:
        root, owns = Path(data_dir).resolve(), False
    settings = S3Settings(
        endpoint=None,
        access_key=access_key or f"lbdev{secrets.token_hex(8)}",
        secret_key=secret_key or secrets.token_hex(20),
        region=region,
    )
    try:
        return _start(root, owns, settings, timeout, tie_to_parent)
    except BaseException:
        if owns:
            shutil.rmtree(root, ignore_errors=True)
        raise


def _start(root: Path, owns: bool, settings: S3Settings, timeout: float, tie_to_parent: bool) -> S3Server:
    binary = versitygw_binary()
    if not (root / "data").exists():  # a given folder's "data" is the gateway's to judge (it names what is wrong)
        (root / "data").mkdir(parents=True)
    environment = {k: v for k, v in os.environ.items() if not k.startswith(_ITS_VARIABLES)}
    environment.update(ROOT_ACCESS_KEY=settings.access_key, ROOT_SECRET_KEY=settings.secret_key)
    log_path = root / "versitygw.log"
    for _attempt in range(PORT_ATTEMPTS):
        port = config.free_port()
        argv = [str(binary), "--port", f"{config.LOOPBACK}:{port}", "--region", settings.region, "--quiet"]
        process = ServerProcess(
            [*argv, "posix", str(root / "data")], log_path, tie_to_parent=tie_to_parent, env=environment
        )
        server = S3Server(
            root, port, _with_endpoint(settings, f"http://{config.LOOPBACK}:{port}"), process, owns_root=owns
        )
        mark = process.log_size()
        process.start()
        try:
            process.wait_for(functools.partial(_answers, server), timeout, "a signed ListBuckets answered 200")
        except DevServerError:
            process.kill()
            if process.log_contains(ADDRESS_IN_USE, mark):
                continue
            raise
        except BaseException:
            process.kill()
            raise
        return server
    raise DevServerError(f"versitygw: ports kept clashing after {PORT_ATTEMPTS} attempts; see {log_path}")


def _with_endpoint(settings: S3Settings, endpoint: str) -> S3Settings:
    return S3Settings(endpoint, settings.access_key, settings.secret_key, settings.region, settings.path_style)


class _RefusedKeysError(DevServerError):
    """The gateway answered, but not with 200: it will not start accepting these keys by waiting."""


def _answers(server: S3Server) -> bool:
    """Whether the gateway answered a signed ListBuckets with 200 (False while nothing listens)."""
    try:
        answer = server.request("GET", timeout=PROBE_TIMEOUT)
    except OSError:  # refused, or a silent listener (another process's, on a port taken meanwhile)
        return False
    if answer.status != 200:
        raise _RefusedKeysError(
            f"versitygw answered ListBuckets with HTTP {answer.status}: {answer.body[:300]!r}; "
            f"log {server.log_path}:\n{server.process.log_tail()}"
        )
    return True


def s3a_jars() -> list[Path]:
    """The jars Spark's S3A needs, from ``LIFTBRIDGE_S3A_JARS`` or the project's ``.tools/jars/s3a``, as
    tools/install-s3a-jars.sh left them (checked against their pinned SHA-256 there). DevServerError saying
    how to fetch them when the folder is missing or was never completed."""
    explicit = os.environ.get(JARS_VARIABLE)
    if explicit:
        folders = [Path(explicit)]
    else:
        starts = (Path.cwd(), Path(__file__).resolve().parent)
        folders = list(dict.fromkeys(f / ".tools" / "jars" / "s3a" for s in starts for f in (s, *s.parents)))
    for folder in folders:
        marker = folder / JARS_MARKER
        if marker.is_file():
            names = [line.split()[1] for line in marker.read_text().splitlines() if line.strip()]
            jars = [folder / name for name in names]
            missing = [str(jar) for jar in jars if not jar.is_file()]
            if missing:
                raise DevServerError(f"S3A jars missing from {folder}: {missing}; run `make tools` again")
            return jars
    raise DevServerError(
        f"no complete S3A jar folder (looked in {JARS_VARIABLE} or {folders[0]}, ...): run `make tools` "
        "(tools/install-s3a-jars.sh fetches hadoop-aws 3.5.0 and the AWS SDK v2 modules, 12.3 MB)"
    )
