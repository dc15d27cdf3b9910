"""The Spark master's and worker's web UIs behind a Host-header allow-list (infra/spark/HostFilter.java).

Spark's UIs answer any Host header, so a page in an operator's browser whose DNS name was rebound to
127.0.0.1 could read them (jobs, executors, logs). Spark applies servlet filters named in
`spark.ui.filters` to its UIs, the standalone master's and worker's included; `dssm stack up` compiles
the filter with the JDK's javac against the servlet API in the pyspark package (once per source, cached
under STACK_DIR/spark/) and passes it to both daemons.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from core.errors import DssmError

SOURCE = Path(__file__).resolve().parent / "spark" / "HostFilter.java"
FILTER = "dssm.HostFilter"


def _tool(name: str) -> str:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / name) if home and (Path(home) / "bin" / name).exists() else shutil.which(name)
    if not found:
        raise DssmError(f"dssm stack up needs a JDK's {name} (Java 17) to build the Spark UIs' Host filter")
    return found


def host_filter_jar(root: Path) -> Path:
    """The compiled filter under ROOT/spark/, built when missing (its name holds the source's hash)."""
    import pyspark

    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    jar = Path(root) / "spark" / f"host-filter-{digest}.jar"
    if jar.exists():
        return jar
    servlet = sorted((Path(pyspark.__file__).parent / "jars").glob("jakarta.servlet-api-*.jar"))
    if not servlet:
        raise DssmError("the pyspark package has no jakarta.servlet-api jar to build the Spark UIs' Host filter with")
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent) as build:
        classes = Path(build) / "classes"
        for argv in (
            [_tool("javac"), "--release", "17", "-cp", str(servlet[-1]), "-d", str(classes), str(SOURCE)],
            [_tool("jar"), "cf", str(Path(build) / jar.name), "-C", str(classes), "."],
        ):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            if done.returncode:
                raise DssmError(f"building the Spark UIs' Host filter failed: {done.stderr.strip()[-500:]}")
        os.replace(Path(build) / jar.name, jar)
    return jar


def daemon_env(root: Path, hosts: list[str]) -> dict[str, str]:
    """The environment that puts the filter on the master's and the worker's UI, allowing `hosts`."""
    opts = f"-Dspark.ui.filters={FILTER} -Dspark.{FILTER}.param.hosts={','.join(hosts)}"
    return {"SPARK_DAEMON_CLASSPATH": str(host_filter_jar(root)), "SPARK_MASTER_OPTS": opts, "SPARK_WORKER_OPTS": opts}
