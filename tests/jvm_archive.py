"""A class-data-sharing archive for the suite's Spark drivers: the classes a small pipeline loads, parsed and
verified once per test run, then mapped by every driver JVM the suite starts (its own sessions, each `dssm`
subprocess and flow run). Started in the background when the run starts; a JVM started before it is in place
runs without it (a missing archive is no error), as does a JVM whose class path or version differs.

Run as a script, it is that pipeline: simulate -> clean -> vocab -> negatives on 2,000 impressions, in a
driver that writes the archive when it exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ARCHIVE_FLAG = "-XX:SharedArchiveFile="


def start(archive: Path, java_options: str) -> subprocess.Popen:
    """Build `archive` in a process of its own (about 20 s on one core); it appears whole (renamed into place)."""
    return subprocess.Popen(
        [sys.executable, __file__, str(archive), java_options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parents[1],
    )


def _build(archive: Path, java_options: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from core.judgments import DEFAULT_CATALOGUE, read_judgments
    from core.spark import get_spark
    from stages.clean.job import clean
    from stages.negatives.config import NegativesConfig
    from stages.negatives.job import negatives
    from stages.simulate.config import SimulationConfig
    from stages.simulate.job import simulate
    from stages.vocab.job import vocab

    partial = archive.with_name(archive.name + ".partial")
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f'--conf "spark.driver.defaultJavaOptions={java_options} -XX:ArchiveClassesAtExit={partial}" pyspark-shell'
    )
    with tempfile.TemporaryDirectory(prefix="dssm-jvm-archive-") as tmp:
        work = Path(tmp)
        simulate(read_judgments(DEFAULT_CATALOGUE), work / "simulate", SimulationConfig(impressions=2_000, shards=2,
                 workers=1), {"path": "default", "sha256": "default"})  # fmt: skip
        spark = get_spark("local[1]", "dssm-jvm-archive")
        clean(spark, str(work / "simulate"), work / "clean")
        vocab(spark, work / "clean", work / "vocab")
        negatives(spark, work / "clean", work / "negatives", NegativesConfig(shards=2))
        jvm = spark.sparkContext._gateway.proc  # the driver: it writes the archive as it exits
        spark.stop()
        jvm.stdin.close()  # the launcher's signal to exit
        jvm.wait(timeout=120)
    if partial.is_file():
        partial.rename(archive)


if __name__ == "__main__":
    _build(Path(sys.argv[1]), sys.argv[2])
