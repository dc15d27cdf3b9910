"""A class-data-sharing archive for the Spark drivers of a run of the suite on pytest-xdist workers (`make test`):
the classes a small pipeline loads, parsed and verified once per run, then mapped by every driver JVM started once
it is in place (each `dssm` subprocess and flow run; not the workers' own sessions, started in the run's first
seconds). The archive is a layer on the JDK's default one, so a driver started before it exists, or one whose class
path or JDK differs, runs on that default as before.

Run as a script, it is that pipeline: simulate -> clean -> vocab -> negatives on 2,000 impressions, in a driver
that writes the archive as it exits.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


def default_archive() -> Path | None:
    """The JDK's own archive (lib/server/classes.jsa) of the java Spark starts: $JAVA_HOME's, else the PATH's."""
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else shutil.which("java")
    if java is None:
        return None
    base = Path(java).resolve().parents[1] / "lib" / "server" / "classes.jsa"
    return base if base.is_file() else None


class ArchiveBuild:
    """The archive, built in the background (about 45 s of one core) in a folder of its own, where it appears whole
    (renamed into place); `option` is the drivers' JVM option for it ("" where the JDK has no default archive to
    layer it on: no build). `close` ends a build still running (its driver with it) and removes the folder."""

    def __init__(self, java_options: str):
        self.folder = Path(tempfile.mkdtemp(prefix="dssm-tests-jvm-"))
        archive, base = self.folder / "spark.jsa", default_archive()
        self.option = f"-XX:SharedArchiveFile={base}:{archive}" if base else ""
        self.process = None
        if base:
            with open(self.folder / "build.log", "w") as log:
                self.process = subprocess.Popen(
                    [sys.executable, __file__, str(archive), f"{java_options} -Djava.io.tmpdir={self.folder}"],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "TMPDIR": str(self.folder), "SPARK_LOCAL_DIRS": str(self.folder)},
                    start_new_session=True,  # not stopped by a ^C to the suite: close() ends it, without its dump
                )

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _build(archive: Path, java_options: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from conftest import data_stages

    from core.judgments import DEFAULT_CATALOGUE, read_judgments
    from core.spark import get_spark

    partial = archive.with_name(archive.name + ".partial")
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f'--conf "spark.driver.defaultJavaOptions={java_options} -XX:ArchiveClassesAtExit={partial}" pyspark-shell'
    )
    work = Path(tempfile.mkdtemp())
    spark = get_spark("local[1]", "dssm-jvm-archive")
    data_stages(spark, read_judgments(DEFAULT_CATALOGUE), work, 2_000, negatives_shards=2)
    jvm = spark.sparkContext._gateway.proc  # the driver: it writes the archive as it exits
    spark.stop()
    jvm.stdin.close()  # the launcher's signal to exit
    jvm.wait(timeout=120)
    shutil.rmtree(work, ignore_errors=True)
    print(f"driver exited {jvm.returncode}; archive {'written' if partial.is_file() else 'not written'}", flush=True)
    if jvm.returncode == 0 and partial.is_file():
        partial.rename(archive)


if __name__ == "__main__":
    _build(Path(sys.argv[1]), sys.argv[2])
