"""The same clean job on a real Spark standalone master and worker on 127.0.0.1."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dssm.artifacts import read_manifest

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port}")


@pytest.fixture
def standalone_cluster(tmp_path):
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(tmp_path / "worker"),
        "SPARK_LOG_DIR": str(tmp_path / "logs"),
        "PYSPARK_PYTHON": sys.executable,
    }
    port = free_port()
    master = subprocess.Popen(
        [
            str(spark_class),
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(free_port()),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker = None
    try:
        wait_for_port(port)
        worker = subprocess.Popen(
            [
                str(spark_class),
                "org.apache.spark.deploy.worker.Worker",
                f"spark://127.0.0.1:{port}",
                "--cores",
                "2",
                "--memory",
                "2g",
                "--webui-port",
                str(free_port()),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        yield f"spark://127.0.0.1:{port}", env
    finally:
        for proc in (worker, master):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()


def test_clean_runs_unchanged_on_a_standalone_cluster(standalone_cluster, pipeline, tmp_path):
    url, env = standalone_cluster
    out = tmp_path / "clean"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dssm.cli",
            "clean",
            "--input",
            str(pipeline["simulate"]),
            "--out",
            str(out),
            "--master",
            url,
        ],
        env={**env, "DSSM_SPARK_DRIVER_MEMORY": "1g"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    local = read_manifest(pipeline["clean"])
    remote = read_manifest(out)
    # Same counts and the same rows, in the same order, as the local[2] run of the session pipeline
    # (compressed bytes may differ between JVM set-ups; a rerun on one set-up is byte-identical).
    assert remote["counts"] == local["counts"]
    for dataset in ("pairs", "titles", "rejects"):
        assert pq.read_table(out / dataset).equals(pq.read_table(pipeline["clean"] / dataset))
