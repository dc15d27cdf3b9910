"""One way to get a Spark session: `local[*]` by default, any master URL for a cluster.

The master comes from the `--master` option, else `DSSM_SPARK_MASTER`, else `local[*]`, so the
same job code runs unchanged on a standalone, Kubernetes or YARN cluster.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from core.errors import NO_SPACE, DssmError, TransientError, no_space
from core.schemas import check_parquet

log = logging.getLogger(__name__)
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "16",
    "spark.sql.adaptive.enabled": "true",
    # Local-FS checksum and _SUCCESS files are not data: keep outputs to the data files.
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.sql.parquet.compression.codec": "zstd",
    "spark.driver.memory": "4g",
}


def add_spark_options(p: argparse.ArgumentParser) -> None:
    """--master and --force, shared by the Spark commands."""
    p.add_argument("--master", help="Spark master URL (default: $DSSM_SPARK_MASTER or local[*])")
    p.add_argument("--force", action="store_true", help="recompute even if the output is up to date")


def resolve_master(master: str | None = None) -> str:
    return master or os.environ.get("DSSM_SPARK_MASTER") or "local[*]"


def get_spark(master: str | None = None, app: str = "dssm", conf: dict[str, Any] | None = None) -> SparkSession:
    """The active session if one exists (tests share one), else a new one for `master`."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    # Python UDFs (the raw-log parser) must run in this interpreter, with its packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    master = resolve_master(master)
    local = master.startswith("local")
    builder = SparkSession.builder.master(master).appName(app)
    settings = dict(DEFAULT_CONF)
    # Warnings and errors only, without the start-up lines of Spark's default log4j profile.
    settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}"
    if local:
        # A local job's driver listens on loopback only, not on the machine's external interface (set
        # before the JVM starts, it also spares the "hostname resolves to a loopback address" warning).
        host = os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings |= {"spark.driver.bindAddress": host, "spark.driver.host": host}
    # Spark's stage progress bar on a terminal: long jobs (clean, index at scale) show they move.
    settings["spark.ui.showConsoleProgress"] = str(sys.stderr.isatty()).lower()
    settings |= conf or {}
    if "DSSM_SPARK_DRIVER_MEMORY" in os.environ:
        settings["spark.driver.memory"] = os.environ["DSSM_SPARK_DRIVER_MEMORY"]
    for key, value in settings.items():
        builder = builder.config(key, str(value))
    try:
        with _sigint_kept():
            spark = builder.getOrCreate()
    except Exception as e:  # py4j/JVM start-up failures arrive as many exception types
        raise TransientError(f"could not start Spark with master {master!r}: {str(e).splitlines()[0]}") from None
    spark.sparkContext.setLogLevel("ERROR")
    if not local:
        global _watch
        _watch = ClusterWatch(spark, master, float(os.environ.get(NO_EXECUTOR_TIMEOUT_ENV, "120")))
        _watch.start()
    return spark


@contextmanager
def _sigint_kept() -> Iterator[None]:
    """SIGINT's handler as it was before the block, where a dssm command set its own (core.stopping): a new
    SparkContext installs one that raises KeyboardInterrupt wherever the main thread is, without the command's
    watchdog, so a ^C that landed in a py4j callback was printed as "Exception ignored" and the run went on to
    exit 0. Elsewhere (Python's default handler: a notebook, a script) pyspark's stays: it cancels the jobs."""
    before = signal.getsignal(signal.SIGINT)
    # None: set from C, not restorable; off the main thread no handler can be set
    if before in (None, signal.default_int_handler) or threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is not before:
            signal.signal(signal.SIGINT, before)


NO_EXECUTOR_TIMEOUT_ENV = "DSSM_SPARK_NO_EXECUTOR_TIMEOUT"
_watch: ClusterWatch | None = None


class ClusterWatch(threading.Thread):
    """Cancels the running jobs when a cluster has had no executor for `timeout` seconds (its
    workers or master went away): Spark's driver would otherwise wait for resources for ever."""

    def __init__(self, spark: SparkSession, master: str, timeout: float, poll: float = 2.0):
        super().__init__(daemon=True, name="dssm-spark-watch")
        self.spark, self.master, self.timeout, self.poll = spark, master, timeout, poll
        self.reason: str | None = None

    def run(self) -> None:
        sc = self.spark.sparkContext
        since = None
        while True:
            time.sleep(self.poll)
            try:
                busy = bool(sc.statusTracker().getActiveJobsIds())
                executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # the driver is listed too
            except Exception:  # the context was stopped
                return
            if not busy or executors > 0:
                since = None
                continue
            since = since or time.monotonic()
            if time.monotonic() - since >= self.timeout:
                self.reason = (
                    f"the Spark cluster {self.master} has had no executors for {self.timeout:.0f}s while a job waited "
                    f"(is it down?); the job was cancelled ({NO_EXECUTOR_TIMEOUT_ENV} sets the wait)"
                )
                log.error(self.reason)
                sc.cancelAllJobs()
                since = None


@contextmanager
def cluster_errors(out: Path | str | None = None) -> Iterator[None]:
    """A job cancelled by the ClusterWatch fails with the watch's reason, not Spark's; a job that
    ran out of disk says so, naming `out` (Spark's own message is a JVM or worker trace whose
    first line, all the CLI shows, names neither the cause nor the path)."""
    try:
        yield
    except DssmError:
        raise
    except Exception as e:
        if _watch is not None and _watch.reason:
            reason, _watch.reason = _watch.reason, None
            raise TransientError(reason) from None
        if out is not None and out_of_space(e):
            where = "a Spark job's write failed: on the output's file system or in spark.local.dir"
            raise no_space(out, where) from None
        raise


def out_of_space(error: BaseException) -> bool:
    """Whether a (Spark, py4j or Python) exception, or one it was raised from, is a full disk."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in NO_SPACE:
            return True
        try:  # str() of a py4j error asks the JVM for its trace; a dead JVM answers with an error
            text = f"{error} {getattr(error, '_stackTrace', '') or ''}"
        except Exception:
            text = ""
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        error = error.__cause__ or error.__context__
    return False


class LazySpark:
    """Stands in for the session of `get_spark(master, app)` and starts it on first use, so a stage
    whose output is already up to date never starts a JVM."""

    def __init__(self, master: str | None = None, app: str = "dssm"):
        self._master, self._app = master, app
        self._session: SparkSession | None = None

    def __getattr__(self, name: str) -> Any:
        if self._session is None:
            self._session = get_spark(self._master, self._app)
        return getattr(self._session, name)


def run_session(master: str | None) -> LazySpark:
    """The session of a flow run's Spark stages (started by the first stage that needs it)."""
    return LazySpark(master, "dssm-run")


def stable_layout(df: DataFrame, rows: int, rows_per_file: int, *keys: str) -> DataFrame:
    """Hash-partitioned by `keys` into ceil(rows / rows_per_file) files and sorted within them, so
    a rerun writes the same bytes whatever the input layout."""
    return df.repartition(max(1, -(-rows // rows_per_file)), *keys).sortWithinPartitions(*keys)


def write_parquet(df: DataFrame, path: Path, schema, partitions: int | None = None) -> int:
    """Write `df` cast to the contract `schema` as `path/part-NNNNN.parquet`; returns its row count.

    Part files get stable names (Spark's carry a random job id) and canonical footers
    (core/spark/footer.py), so a rerun with the same data is a byte-identical rewrite, in another JVM too,
    and the written files are checked against the contract.
    """
    from core.schemas import spark_schema
    from core.spark.footer import canonicalize

    target = spark_schema(schema)
    df = df.select([df[f.name].cast(f.dataType).alias(f.name) for f in target.fields])
    if partitions is not None:
        df = df.coalesce(partitions)
    df.write.mode("overwrite").parquet(str(path))
    parts = sorted(path.glob("part-*.parquet"))
    for i, part in enumerate(parts):
        part = part.rename(path / f"part-{i:05d}.parquet")
        canonicalize(part)  # the same data writes the same bytes in any JVM
    for junk in list(path.glob(".*.crc")) + list(path.glob("_*")):
        junk.unlink()
    check_parquet(path, schema)
    return _count_rows(path)


def _count_rows(path: Path) -> int:
    return sum(pq.ParquetFile(p).metadata.num_rows for p in path.glob("*.parquet"))


def distinct_count(path: Path, column: str) -> int:
    """Distinct values of one column of a written dataset, read back with pyarrow (no Spark job)."""
    return len(pq.read_table(path, columns=[column]).column(column).unique())


def python_tasks(
    spark: SparkSession, count: int, task: Callable[[int], int], schema: str = "task long, rows long"
) -> int:
    """`task(i)` for i in range(count), one Spark task each (Python work that reads and writes its
    own files: Spark only schedules it); returns the sum of what the tasks returned."""

    def run(ids: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in ids:
            for i in batch.column(0).to_pylist():
                yield pa.RecordBatch.from_pydict({"task": [i], "rows": [task(i)]})

    done = spark.range(count, numPartitions=max(1, count)).mapInArrow(run, schema).collect()
    return sum(r["rows"] for r in done)
