"""Spark's S3A on a real S3 server (Versity's gateway on 127.0.0.1), with the 35-jar set of make tools.

What the lake formats build on: the gateway is up and signs like S3; S3A's conditional create
(HADOOP-19256) refuses an existing key with a 412, through the JVM from PySpark and through the lake's
own store; a DataFrame goes to ``s3a://`` and back; a multipart-sized copy works (the asynchronous HTTP
client, netty-nio-client, is in the set); and pyarrow, delta-rs and pyiceberg reach the same bucket with
settings made from the same :class:`S3Settings`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from liftbridge_provider.core.lake import MissingFileError
from liftbridge_provider.core.object_store import S3Settings
from liftbridge_provider.devserver.s3 import S3Server
from liftbridge_provider.spark.lake_store import CONDITIONAL_CREATE, HadoopStore

MiB = 1 << 20


def jvm_of(spark: SparkSession) -> Any:
    """The session's JVM view (py4j), where Hadoop's FileSystem API is."""
    return spark._jvm


def hadoop_path(spark: SparkSession, path: str) -> Any:
    return jvm_of(spark).org.apache.hadoop.fs.Path(path)


def hadoop_fs(spark: SparkSession, uri: str, **settings: str) -> Any:
    """A new (uncached) Hadoop filesystem for ``uri``, with ``settings`` over the session's configuration."""
    jvm = jvm_of(spark)
    conf = jvm.org.apache.hadoop.conf.Configuration(spark._jsc.hadoopConfiguration())
    for key, value in settings.items():
        conf.set(key, value)
    return jvm.org.apache.hadoop.fs.FileSystem.newInstance(jvm.java.net.URI(uri), conf)


def write(fs: Any, spark: SparkSession, path: str, data: bytes, *, conditional: bool) -> None:
    """Write ``data`` to ``path``: with ``If-None-Match: *`` at close when ``conditional``."""
    builder = fs.createFile(hadoop_path(spark, path)).overwrite(not conditional)
    if conditional:
        builder = builder.must(CONDITIONAL_CREATE, True)
    stream = builder.build()
    try:
        stream.write(bytearray(data))
    finally:
        stream.close()


def read(fs: Any, spark: SparkSession, path: str) -> bytes:
    stream = fs.open(hadoop_path(spark, path))
    try:
        return bytes(stream.readAllBytes())
    finally:
        stream.close()


def test_the_gateway_is_up_and_the_session_has_the_s3a_jars(s3_server: S3Server, s3a_spark: SparkSession) -> None:
    assert s3_server.request("GET").status == 200
    jvm = jvm_of(s3a_spark)
    conf = s3a_spark._jsc.hadoopConfiguration()
    loaded = jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass("s3a", conf)
    assert str(loaded.getName()) == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf.get("fs.s3a.endpoint") == s3_server.endpoint
    settings = "\n".join(f"{key}={value}" for key, value in s3a_spark.sparkContext.getConf().getAll())
    assert s3_server.settings.secret_key not in settings  # the JVM's environment carries the keys


def test_conditional_create_through_s3a_refuses_an_existing_key(s3a_spark: SparkSession, s3_bucket: str) -> None:
    fs = hadoop_fs(s3a_spark, f"s3a://{s3_bucket}/")
    path = f"s3a://{s3_bucket}/ledger/claim-0"
    try:
        assert fs.hasPathCapability(hadoop_path(s3a_spark, path), CONDITIONAL_CREATE)
        write(fs, s3a_spark, path, b"first", conditional=True)
        with pytest.raises(Exception, match=r"RemoteFileChangedException") as refused:  # py4j's Py4JJavaError
            write(fs, s3a_spark, path, b"second", conditional=True)
        java = getattr(refused.value, "java_exception")  # noqa: B009 - py4j's attribute, untyped
        assert java.getClass().getName() == "org.apache.hadoop.fs.s3a.RemoteFileChangedException"
        assert int(java.getCause().statusCode()) == 412
        assert read(fs, s3a_spark, path) == b"first"
    finally:
        fs.close()


def test_a_plain_create_without_overwrite_is_not_conditional_under_the_create_performance_flag(
    s3a_spark: SparkSession, s3_bucket: str
) -> None:
    """Why the settings leave fs.s3a.performance.flags unset: with ``create`` in it, create(path, false)
    skips its existence check and replaces the object (docs/spark.md, "Object storage")."""
    fs = hadoop_fs(s3a_spark, f"s3a://{s3_bucket}/", **{"fs.s3a.performance.flags": "create"})
    path = hadoop_path(s3a_spark, f"s3a://{s3_bucket}/plain")
    try:
        for data in (b"first", b"second"):
            stream = fs.create(path, False)
            stream.write(bytearray(data))
            stream.close()
        assert read(fs, s3a_spark, f"s3a://{s3_bucket}/plain") == b"second"
    finally:
        fs.close()


def test_the_lake_store_creates_exclusively_on_s3a(s3a_spark: SparkSession, s3_bucket: str) -> None:
    store = HadoopStore(s3a_spark, f"s3a://{s3_bucket}/lake")
    assert store.conditional
    store.check_create_exclusive()
    assert store.create_exclusive(f"s3a://{s3_bucket}/lake/_ledger/0.json", b"claim one")
    assert not store.create_exclusive(f"s3a://{s3_bucket}/lake/_ledger/0.json", b"claim two")
    assert store.read(f"s3a://{s3_bucket}/lake/_ledger/0.json") == b"claim one"


def test_a_file_deleted_between_its_open_and_its_read_reads_as_missing_on_s3a(
    s3a_spark: SparkSession, s3_bucket: str
) -> None:
    """A ledger lists its folder, then reads each file; a run compacting at once may delete one in between
    (chaos seed 306: two runs at once on S3), and the reader lists again on MissingFileError. S3A asks for
    the object's metadata when it opens it and for its bytes when they are read, so the delete can also
    fall between the two: that must be MissingFileError too, not py4j's raw error that failed the run."""
    store = HadoopStore(s3a_spark, f"s3a://{s3_bucket}/lake")
    path = f"s3a://{s3_bucket}/lake/_ledger/partition=0/claim-0000000000.commit.json"
    assert store.create_exclusive(path, b"{}")
    real = store._fs

    class DeletedOnceOpened:
        """The lake's own filesystem, but the file is deleted (by another writer) right after it is opened."""

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def open(self, hadoop_path: Any) -> Any:
            stream = real.open(hadoop_path)
            real.delete(hadoop_path, False)
            return stream

    store._fs = DeletedOnceOpened()
    with pytest.raises(MissingFileError, match=r"claim-0000000000\.commit\.json"):
        store.read(path)
    store._fs = real
    with pytest.raises(MissingFileError, match=r"claim-0000000000\.commit\.json"):
        store.read(path)  # and once deleted, as before: S3A's open finds it missing


def test_a_dataframe_goes_to_s3a_and_back(s3a_spark: SparkSession, s3_bucket: str) -> None:
    rows = [(p, o, f"v{p}-{o}".encode()) for p in range(3) for o in range(200)]
    frame = s3a_spark.createDataFrame(rows, "partition int, offset long, value binary")
    target = f"s3a://{s3_bucket}/lake/stream=s"
    frame.write.partitionBy("partition").parquet(target)
    back = s3a_spark.read.parquet(target)
    assert sorted((r.partition, r.offset, bytes(r.value)) for r in back.collect()) == sorted(rows)
    assert {r.partition for r in back.select("partition").distinct().collect()} == {0, 1, 2}


def test_a_multipart_sized_object_is_uploaded_and_copied(s3a_spark: SparkSession, s3_bucket: str) -> None:
    """Above the multipart threshold S3A uploads in parts and copies with its transfer manager, on the SDK's
    asynchronous client: netty-nio-client must be in the jar set (and work on pyspark's netty)."""
    fs = hadoop_fs(
        s3a_spark, f"s3a://{s3_bucket}/", **{"fs.s3a.multipart.size": "5M", "fs.s3a.multipart.threshold": "5M"}
    )
    jvm = jvm_of(s3a_spark)
    source, target = f"s3a://{s3_bucket}/big/source", f"s3a://{s3_bucket}/big/target"
    data = bytes(range(256)) * (6 * MiB // 256)  # two parts of 5 MiB and 1 MiB
    try:
        write(fs, s3a_spark, source, data, conditional=False)
        assert fs.rename(jvm.org.apache.hadoop.fs.Path(source), jvm.org.apache.hadoop.fs.Path(target))
        assert int(fs.getFileStatus(jvm.org.apache.hadoop.fs.Path(target)).getLen()) == len(data)
        assert read(fs, s3a_spark, target) == data
    finally:
        fs.close()


def test_pyarrow_reaches_the_bucket_with_the_same_settings(s3_settings: S3Settings, s3_bucket: str) -> None:
    import pyarrow.parquet as pq  # noqa: PLC0415
    from pyarrow import fs as pafs  # noqa: PLC0415 - pyarrow's S3 part starts its AWS SDK on import

    filesystem = pafs.S3FileSystem(**s3_settings.pyarrow_options())
    table = pa.table({"offset": pa.array(range(10), pa.int64())})
    pq.write_table(table, f"{s3_bucket}/arrow/part-0.parquet", filesystem=filesystem)
    assert pq.read_table(f"{s3_bucket}/arrow/part-0.parquet", filesystem=filesystem).equals(table)


def test_a_staging_task_that_fails_part_way_leaves_no_object_on_s3(s3_settings: S3Settings, s3_bucket: str) -> None:
    """A staging task whose read fails after some rows of a piece were written: the piece is never committed
    (its row is never returned), and on S3 its upload, which closing completes, is deleted too, so a failed
    attempt leaves no truncated object behind (pyarrow's S3 stream has no abort)."""
    from pyarrow import fs as pafs  # noqa: PLC0415 - pyarrow's S3 part starts its AWS SDK on import

    from liftbridge_provider.spark.piece_writer import StagingTarget, stage_pieces  # noqa: PLC0415

    folder = f"{s3_bucket}/lake/stream=s/_staging/run-1"
    target = StagingTarget(folder, "_staging/run-1", "claim", s3=s3_settings)
    rows = pa.RecordBatch.from_pydict(
        {
            "partition": pa.array([0] * 5, pa.int32()),
            "offset": pa.array(range(5), pa.int64()),
            "claim": pa.array([7] * 5, pa.int64()),
        }
    )

    def read_then_fail() -> Iterator[pa.RecordBatch]:
        yield rows
        raise ConnectionError("the leader went away")

    with pytest.raises(ConnectionError, match="went away"):
        list(stage_pieces(target)(read_then_fail()))
    filesystem = pafs.S3FileSystem(**s3_settings.pyarrow_options())
    left = filesystem.get_file_info(pafs.FileSelector(folder, allow_not_found=True, recursive=True))
    assert [info.path for info in left if info.type == pafs.FileType.File] == []
    (written,) = stage_pieces(target)(iter([rows]))  # the same rows, unbroken: one piece staged
    assert written.to_pylist()[0]["rows"] == 5


def test_delta_rs_appends_to_the_bucket_with_the_same_settings(s3_settings: S3Settings, s3_bucket: str) -> None:
    from deltalake import DeltaTable, write_deltalake  # noqa: PLC0415 - optional dependency

    uri = f"s3://{s3_bucket}/delta/t"
    options = s3_settings.delta_storage_options()
    for first in (0, 10):
        table = pa.table({"offset": pa.array(range(first, first + 10), pa.int64())})
        write_deltalake(uri, table, mode="append", storage_options=options)
    read_back = DeltaTable(uri, storage_options=options)
    assert read_back.version() == 1
    assert sorted(read_back.to_pyarrow_table().column("offset").to_pylist()) == list(range(20))


def test_pyiceberg_writes_to_the_bucket_with_the_same_settings(
    s3_settings: S3Settings, s3_bucket: str, tmp_path: Any
) -> None:
    from pyiceberg.catalog.sql import SqlCatalog  # noqa: PLC0415 - optional dependency

    catalog = SqlCatalog(
        "objects",
        uri=f"sqlite:///{tmp_path}/catalog.db",
        warehouse=f"s3://{s3_bucket}/iceberg",
        **s3_settings.pyiceberg_properties(),
    )
    catalog.create_namespace("lake")
    table = catalog.create_table("lake.t", schema=pa.schema([pa.field("offset", pa.int64())]))
    table.append(pa.table({"offset": pa.array(range(5), pa.int64())}))
    assert table.location().startswith(f"s3://{s3_bucket}/iceberg/")
    assert sorted(catalog.load_table("lake.t").scan().to_arrow().column("offset").to_pylist()) == list(range(5))


def test_a_session_token_reaches_the_store_through_s3a_pyarrow_delta_rs_and_pyiceberg(
    s3a_spark: SparkSession, s3_settings: S3Settings, s3_bucket: str
) -> None:
    """Temporary credentials: each consumer's settings from one ``S3Settings`` with a session token send the
    token with the keys. The gateway issues no tokens and refuses one it did not issue (400 InvalidToken), so a
    refusal naming the token proves it was sent, where the same request without it succeeds (a consumer that
    dropped the token would pass and fail this test)."""
    import dataclasses  # noqa: PLC0415

    import pyarrow.parquet as pq  # noqa: PLC0415
    from deltalake import write_deltalake  # noqa: PLC0415 - optional dependency
    from pyarrow import fs as pafs  # noqa: PLC0415
    from pyiceberg.io import load_file_io  # noqa: PLC0415 - optional dependency

    from liftbridge_provider.core.s3_sources import s3a_conf_with_keys  # noqa: PLC0415

    tokened = dataclasses.replace(s3_settings, session_token="not-a-token-the-gateway-issued")
    table = pa.table({"offset": pa.array(range(3), pa.int64())})
    refused: dict[str, str] = {}

    def attempt(name: str, settings: S3Settings) -> None:
        key = f"{s3_bucket}/temporary/{name}-{'with' if settings.session_token else 'without'}"
        if name == "pyarrow":
            pq.write_table(table, f"{key}.parquet", filesystem=pafs.S3FileSystem(**settings.pyarrow_options()))
        elif name == "delta-rs":
            write_deltalake(f"s3://{key}", table, storage_options=settings.delta_storage_options())
        elif name == "pyiceberg":
            with load_file_io(settings.pyiceberg_properties(), f"s3://{key}").new_output(f"s3://{key}").create() as out:
                out.write(b"x")
        else:
            fs = hadoop_fs(s3a_spark, f"s3a://{s3_bucket}/", **s3a_conf_with_keys(settings))
            try:
                write(fs, s3a_spark, f"s3a://{key}", b"x", conditional=False)
            finally:
                fs.close()

    for name in ("pyarrow", "delta-rs", "pyiceberg", "s3a"):
        attempt(name, s3_settings)  # the same request without the token is accepted
        try:
            attempt(name, tokened)
        except Exception as exc:  # each library wraps the store's answer in its own error
            refused[name] = str(exc)
    assert set(refused) == {"pyarrow", "delta-rs", "pyiceberg", "s3a"}, refused
    for name, message in refused.items():  # the token's refusal (a HEAD's 400 has no body to name it)
        assert any(sign in message for sign in ("InvalidToken", "provided token", "status 400", "400 Bad")), (
            name,
            message[:500],
        )
