"""Object storage for Spark and the table libraries: what each URI scheme needs, and S3 settings from one source.

Two things, both pure:

- **What a Spark needs for an object-store output** (:data:`FILESYSTEMS`): the Hadoop filesystem class of
  each scheme, the Maven coordinates that hold it, and the settings that go with it. The ingest job checks
  that the class loads before anything is claimed (``spark/object_store.py``) and, when it does not, says
  exactly this (:func:`missing_filesystem_message`). For S3A on PySpark 4.3 (Hadoop 3.5.0) the jars are
  hadoop-aws and the AWS SDK v2 modules it loads, not the SDK's 686 MB ``bundle``
  (:data:`S3A_PACKAGES`; ``tools/s3a-jars/pom.xml`` fetches the same set for the tests: 35 jars, 12.3 MB).
- **One source of S3 credentials and endpoint** (:class:`S3Settings`), rendered for each consumer: Spark's
  S3A settings (the keys stay out of them: S3A reads ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` from
  the environment, so no secret is on a ``spark-submit`` command line), pyarrow's ``S3FileSystem``,
  delta-rs's ``storage_options`` and pyiceberg's FileIO properties.

Conditional create on S3A (HADOOP-19256, Hadoop 3.4.2+): ``fs.s3a.create.conditional.enabled`` (true by
default in 3.5.0) lets ``createFile(path).must("fs.option.create.conditional.overwrite", true)`` put with
``If-None-Match: *`` at ``close()``, which fails with ``RemoteFileChangedException`` (HTTP 412) when the
key exists. A plain ``create(path, overwrite=false)`` is *not* conditional: it checks with a HEAD first
(two racing writers can both pass), and ``fs.s3a.performance.flags=create`` drops even that check (tried on
Versity's gateway: the second create overwrote the first). So the lake asks for the builder option, and
:meth:`S3Settings.hadoop_conf` does not set the performance flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from liftbridge_provider.core.lake import LakeError

HADOOP_VERSION = "3.5.0"
"""The Hadoop client PySpark 4.3 ships (``pyspark/jars/hadoop-client-api-3.5.0.jar``); hadoop-aws must match."""

AWS_SDK_VERSION = "2.35.4"
"""The AWS SDK v2 version hadoop-project 3.5.0 builds hadoop-aws with (``aws-java-sdk-v2.version``)."""

S3A_PACKAGES = (
    f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",
    f"software.amazon.awssdk:s3:{AWS_SDK_VERSION}",
    f"software.amazon.awssdk:s3-transfer-manager:{AWS_SDK_VERSION}",
    "software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3:1.3.1",
)
"""The Maven artifacts S3A needs beside pyspark's own jars; their dependencies come along (``--packages``)."""

S3A_EXCLUDES = ("software.amazon.awssdk:bundle",)
"""What ``--exclude-packages`` leaves out: hadoop-aws's declared dependency on the 686 MB SDK bundle."""

S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"

ENVIRONMENT_CREDENTIALS = "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"
"""The AWS SDK's provider that reads ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (and
``AWS_SESSION_TOKEN``) from the JVM's environment: S3A takes it by name in ``fs.s3a.aws.credentials.provider``."""


@dataclass(frozen=True)
class FileSystemNeeds:
    """What a Spark needs to write one URI scheme: the Hadoop class, where it comes from, what to set."""

    scheme: str
    hadoop_class: str
    packages: tuple[str, ...]
    excludes: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()


_S3A_SETTINGS = (
    "spark.hadoop.fs.s3a.endpoint=<https://... or http://host:port of an S3-compatible store>",
    "spark.hadoop.fs.s3a.endpoint.region=<the region requests are signed for, e.g. us-east-1>",
    "spark.hadoop.fs.s3a.path.style.access=true (most S3-compatible stores)",
    f"spark.hadoop.fs.s3a.aws.credentials.provider={ENVIRONMENT_CREDENTIALS} with AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY in the driver's and executors' environment (no secret on the command line)",
    "spark.hadoop.fs.s3a.create.conditional.enabled=true (the ledger's create-if-absent)",
)

FILESYSTEMS: dict[str, FileSystemNeeds] = {
    "s3a": FileSystemNeeds("s3a", S3A_FILESYSTEM, S3A_PACKAGES, S3A_EXCLUDES, _S3A_SETTINGS),
    "s3": FileSystemNeeds(
        "s3",
        S3A_FILESYSTEM,
        S3A_PACKAGES,
        S3A_EXCLUDES,
        (
            f"spark.hadoop.fs.s3.impl={S3A_FILESYSTEM} (Hadoop maps no filesystem to s3://; or write s3a://)",
            *_S3A_SETTINGS,
        ),
    ),
    "gs": FileSystemNeeds(
        "gs",
        "org.apache.hadoop.fs.gs.GoogleHadoopFileSystem",
        (f"org.apache.hadoop:hadoop-gcp:{HADOOP_VERSION}",),
        settings=(
            "or Google's connector (com.google.cloud.bigdataoss:gcs-connector, its shaded jar) with "
            "spark.hadoop.fs.gs.impl=com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
        ),
    ),
    "abfs": FileSystemNeeds(
        "abfs",
        "org.apache.hadoop.fs.azurebfs.AzureBlobFileSystem",
        (f"org.apache.hadoop:hadoop-azure:{HADOOP_VERSION}",),
        settings=("spark.hadoop.fs.azure.account.auth.type.<account>.dfs.core.windows.net and its credentials",),
    ),
    "abfss": FileSystemNeeds(
        "abfss",
        "org.apache.hadoop.fs.azurebfs.SecureAzureBlobFileSystem",
        (f"org.apache.hadoop:hadoop-azure:{HADOOP_VERSION}",),
        settings=("spark.hadoop.fs.azure.account.auth.type.<account>.dfs.core.windows.net and its credentials",),
    ),
}
"""The object-store schemes the ingest job checks before it claims anything (``s3a``, ``s3``, ``gs``,
``abfs``, ``abfss``)."""


class MissingFileSystemError(LakeError):
    """Spark cannot load the Hadoop filesystem of the output's scheme (a jar or a setting is missing)."""


def scheme_of(uri: str) -> str:
    """The lower-case scheme of ``uri`` (``""`` for a plain path)."""
    return urlsplit(uri).scheme.lower()


def packages_line(needs: FileSystemNeeds) -> str:
    """The ``spark-submit`` options that fetch ``needs``'s jars from Maven Central."""
    line = "--packages " + ",".join(needs.packages)
    if needs.excludes:
        line += " --exclude-packages " + ",".join(needs.excludes)
    return line


def missing_filesystem_message(output: str, cause: str) -> str:
    """What to add, for an ``output`` whose filesystem class did not load (``cause``: the JVM's words)."""
    needs = FILESYSTEMS[scheme_of(output)]
    settings = "".join(f"\n  --conf {setting}" for setting in needs.settings)
    return (
        f"{output}: Spark cannot load the {needs.scheme}:// filesystem ({needs.hadoop_class}): {cause}. "
        f"Nothing was claimed or written. Add its jars to Spark, matching pyspark's Hadoop {HADOOP_VERSION}:\n"
        f"  {packages_line(needs)}\n"
        "(or the same jars in spark.jars / --jars), and set:"
        f"{settings or ' nothing more'}\n"
        "(docs/spark.md, 'Object storage')"
    )


@dataclass(frozen=True)
class S3Settings:
    """Where an S3-compatible store is and how to sign for it: the one source every consumer's settings
    come from (Spark's S3A, pyarrow, delta-rs, pyiceberg).

    :param endpoint: the store's URL, ``http://127.0.0.1:9000`` or ``https://...``; None for AWS itself
        (each library's default endpoint for ``region``).
    :param access_key: the access key id.
    :param secret_key: the secret access key (left out of ``repr``).
    :param region: the region requests are signed for (default ``us-east-1``, what most S3-compatible
        stores accept).
    :param path_style: address buckets as ``endpoint/bucket/key`` rather than ``bucket.endpoint/key``
        (default True: S3-compatible stores on one host need it).
    :param session_token: the session token of temporary credentials (an assumed role, SSO, an instance
        profile's), sent with every request beside the keys; default None: long-lived keys. Left out of
        ``repr``. The token expires with the credentials: a run must end before they do.
    """

    endpoint: str | None
    access_key: str
    secret_key: str = field(repr=False)
    region: str = "us-east-1"
    path_style: bool = True
    session_token: str | None = field(default=None, repr=False)

    def secrets(self) -> list[str]:
        """Every secret these settings hold (the secret key, the session token), for masking and redaction:
        one list, so a new secret field cannot be left out of one of them."""
        return [value for value in (self.secret_key, self.session_token) if value]

    @property
    def secure(self) -> bool:
        """Whether requests go over TLS (an ``https`` endpoint, or AWS itself)."""
        return self.endpoint is None or urlsplit(self.endpoint).scheme.lower() == "https"

    def environment(self) -> dict[str, str]:
        """The environment variables that carry the keys: S3A's :data:`ENVIRONMENT_CREDENTIALS` reads them
        in the driver's and executors' JVMs, and every AWS SDK reads them too."""
        variables = {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        if self.session_token:
            variables["AWS_SESSION_TOKEN"] = self.session_token
        return variables

    def hadoop_conf(self) -> dict[str, str]:
        """S3A's settings (Hadoop keys, ``fs.s3a.*``), without the keys: those come from
        :meth:`environment`. Conditional create is on (the ledger needs it); ``fs.s3a.performance.flags``
        is left unset (see the module's notes)."""
        conf = {
            "fs.s3a.aws.credentials.provider": ENVIRONMENT_CREDENTIALS,
            "fs.s3a.endpoint.region": self.region,
            "fs.s3a.path.style.access": str(self.path_style).lower(),
            "fs.s3a.connection.ssl.enabled": str(self.secure).lower(),
            "fs.s3a.create.conditional.enabled": "true",
        }
        if self.endpoint is not None:
            conf["fs.s3a.endpoint"] = self.endpoint
        return conf

    def spark_conf(self) -> dict[str, str]:
        """:meth:`hadoop_conf` as Spark settings (``spark.hadoop.fs.s3a.*``), for ``--conf`` or a session
        builder; the jars come separately (:func:`packages_line` or ``spark.jars``)."""
        return {f"spark.hadoop.{key}": value for key, value in self.hadoop_conf().items()}

    def pyarrow_options(self) -> dict[str, object]:
        """Keyword arguments of ``pyarrow.fs.S3FileSystem``."""
        options: dict[str, object] = {
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "region": self.region,
            "scheme": "https" if self.secure else "http",
            "force_virtual_addressing": not self.path_style,
        }
        if self.endpoint is not None:
            options["endpoint_override"] = self.endpoint
        if self.session_token:
            options["session_token"] = self.session_token
        return options

    def delta_storage_options(self) -> dict[str, str]:
        """delta-rs's ``storage_options`` (object_store's ``AWS_*`` keys). ``AWS_CONDITIONAL_PUT=etag``
        makes its commits conditional puts, so concurrent writers need no lock service."""
        options = {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not self.path_style).lower(),
            "AWS_CONDITIONAL_PUT": "etag",
        }
        if self.endpoint is not None:
            options["AWS_ENDPOINT_URL"] = self.endpoint
        if not self.secure:
            options["AWS_ALLOW_HTTP"] = "true"
        if self.session_token:
            options["AWS_SESSION_TOKEN"] = self.session_token
        return options

    def pyiceberg_properties(self) -> dict[str, str]:
        """pyiceberg's FileIO properties (``s3.*``), for a catalog's or a table's ``s3://`` files."""
        properties = {
            "s3.access-key-id": self.access_key,
            "s3.secret-access-key": self.secret_key,
            "s3.region": self.region,
            "s3.force-virtual-addressing": str(not self.path_style).lower(),
        }
        if self.endpoint is not None:
            properties["s3.endpoint"] = self.endpoint
        if self.session_token:
            properties["s3.session-token"] = self.session_token
        return properties
