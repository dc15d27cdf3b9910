"""Shared fixtures: one real Spark session per test session, and one small pipeline run."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SHARED_DATA = Path(os.environ.get("DSSM_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
HOME_DEPOT = SHARED_DATA / "homedepot-search-relevance" / "train.csv.zip"


# Each module's summed test time in the last `make test-durations` run (setup, call and teardown of its tests):
# with `make test`'s two workers (pytest-xdist, a module per worker at a time) each takes the next longest as it
# finishes one, the many short modules fill in last, and neither is left alone with a long one at the end. xdist
# would otherwise hand out the modules with the most tests first (pytest_configure turns that off).
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help="write each module's summed test time to PATH (tests/durations.json orders `make test`'s modules)",
    )


def pytest_configure(config):
    """Each xdist worker (`make test` runs two) keeps to its own share of the CPUs, and Spark, torch
    and every process it starts see that share (core.machine.usable_cpus): left to share both cores,
    two workers oversubscribed them (docs/studies/test-suite-times.md, "Measured for the set-up").
    Every test session keeps its Prefect runs in its own database, not the user's ~/.prefect, so a
    worker's tests never read another's flow runs. Spark's drivers start on C1 and the
    serial GC and, in a run on workers that selects the integration tests, map a class-data archive built as it
    starts (tests/jvm_archive.py)."""
    import atexit
    import shutil
    import tempfile

    if getattr(config.option, "loadscopereorder", False):
        config.option.loadscopereorder = False  # the controller hands out modules in DURATIONS' order
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if worker and 1 < count <= len(cpus):
        i = int(worker.removeprefix("gw")) % count  # a worker xdist starts in place of a crashed one is gw2, gw3, ...
        os.sched_setaffinity(0, cpus[i * len(cpus) // count : (i + 1) * len(cpus) // count])
    # Every Spark driver the suite starts (its own session, each `dssm` subprocess and flow run) is a short-lived
    # JVM on one core, where the C2 compiler and parallel GC threads only take CPU from the job: C1 and the serial
    # GC start it faster (docs/studies/test-suite-times.md, "Measured for the set-up"). The stack's
    # executors (tests/test_stack.py) are as short-lived and on the same core. Spark's own options for it, left
    # alone where the user set them.
    fast_start = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    if "PYSPARK_SUBMIT_ARGS" not in os.environ and not worker:  # the workers inherit the controller's
        drivers = fast_start
        if getattr(config.option, "numprocesses", None) and "not integration" not in (config.option.markexpr or ""):
            # a run on xdist workers (`make test`): its drivers also map the classes a small pipeline loads from
            # one archive, built as the run starts (tests/jvm_archive.py): a `dssm clean` subprocess took 16.3 s
            # against 19.8 s (BENCHMARKS.md). Not for the unit tests alone (`make test-fast`): their few drivers
            # would not repay its 45 s of one core
            from jvm_archive import ArchiveBuild

            archive = ArchiveBuild(fast_start)
            atexit.register(archive.close)
            drivers += f" {archive.option}"
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f'--conf "spark.driver.defaultJavaOptions={drivers}" '
            f'--conf "spark.executor.defaultJavaOptions={fast_start}" pyspark-shell'
        )
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="dssm-tests-prefect-")
    # registered before Prefect's own exit handler, so run after it has stopped the ephemeral server
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)


def recorded_durations() -> dict[str, float]:
    import json

    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}  # no record (or a broken one): collection order


def pytest_collection_modifyitems(config, items):
    """The longest modules first, by their recorded time; a module not recorded yet goes after them."""
    seconds = recorded_durations()
    items.sort(key=lambda item: -seconds.get(item.path.name, 0.0))  # stable: a module's tests keep their order


_measured: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """On the controller, every test's phases as the workers report them (and in a run without workers)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        module = report.nodeid.split("::")[0].rsplit("/", 1)[-1]
        _measured[module] = _measured.get(module, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    path = session.config.getoption("--record-durations", None)
    if path and not os.environ.get("PYTEST_XDIST_WORKER") and _measured:
        import json

        ordered = dict(sorted(((m, round(s, 1)) for m, s in _measured.items()), key=lambda kv: -kv[1]))
        Path(path).write_text(json.dumps(ordered, indent=1) + "\n")


def pytest_unconfigure(config):
    """Prefect stops the ephemeral API server at interpreter exit and logs "Stopping temporary
    server" after pytest has closed the captured streams; that log call then printed a
    "--- Logging error ---" traceback. From here on a failing log handler stays silent."""
    import logging

    logging.raiseExceptions = False


@pytest.fixture(autouse=True, scope="session")
def _own_embedding_cache(tmp_path_factory):
    """MiniLM's on-disk vector cache (scoring/neural.py) in the test session's own directory: a
    test never reads vectors an earlier run or the user's commands left."""
    before = os.environ.get("DSSM_CACHE")
    os.environ["DSSM_CACHE"] = str(tmp_path_factory.mktemp("dssm-cache"))
    yield
    if before is None:
        os.environ.pop("DSSM_CACHE", None)
    else:
        os.environ["DSSM_CACHE"] = before


def _restore_mlflow_tracking_env():
    """mlflow.set_tracking_uri() writes MLFLOW_TRACKING_URI into os.environ; without a restore, a test
    that used a (since stopped) tracking server or its own store would hand that URI to every later
    subprocess (a `dssm run` child then logs its training run there)."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


# Per test, and per module: a module-scoped fixture (a registered model) is set up before any
# function-scoped one, so only a module-level restore undoes what it set.
_keep_mlflow_tracking_env = pytest.fixture(autouse=True)(_restore_mlflow_tracking_env)
_keep_mlflow_tracking_env_per_module = pytest.fixture(autouse=True, scope="module")(_restore_mlflow_tracking_env)


@pytest.fixture(scope="session")
def spark():
    from core.spark import get_spark

    session = get_spark("local[2]", "dssm-tests", {"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "2g"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def home_depot() -> Path:
    if not HOME_DEPOT.exists():
        pytest.skip(f"Home Depot judgments not found at {HOME_DEPOT} (../shared/data is absent)")
    return HOME_DEPOT


@pytest.fixture(scope="session")
def default_pairs():
    from core.judgments import DEFAULT_CATALOGUE, read_judgments

    return read_judgments(DEFAULT_CATALOGUE)


@contextmanager
def built_once_per_run(tmp_path_factory, name: str) -> Iterator[tuple[Path, bool]]:
    """(folder, build): a folder the whole test run shares. Every xdist worker of `make test` gets the
    same one; the first to ask builds it (build True) while the others wait on its lock, then read
    it. Tests only read what is in it."""
    import shutil

    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the parent of one run's workers
    folder, built = shared / name, shared / f"{name}.built"
    with FileLock(str(shared / f"{name}.lock")):
        if built.exists():
            yield folder, False
            return
        shutil.rmtree(folder, ignore_errors=True)  # what a failed build left
        folder.mkdir()
        yield folder, True
        built.touch()


def data_stages(spark, pairs, work: Path, impressions: int, negatives_shards: int) -> None:
    """simulate -> clean -> vocab -> negatives of `impressions` impressions of `pairs`, into WORK/STAGE."""
    from stages.clean.job import clean
    from stages.negatives.config import NegativesConfig
    from stages.negatives.job import negatives
    from stages.simulate.config import SimulationConfig
    from stages.simulate.job import simulate
    from stages.vocab.job import vocab

    simulate(pairs, work / "simulate", SimulationConfig(impressions=impressions, shards=2, workers=1),
             {"path": "default", "sha256": "default"})  # fmt: skip
    clean(spark, str(work / "simulate"), work / "clean")
    vocab(spark, work / "clean", work / "vocab")
    negatives(spark, work / "clean", work / "negatives", NegativesConfig(shards=negatives_shards))


@pytest.fixture(scope="session")
def pipeline(default_pairs, tmp_path_factory, request) -> dict[str, Path]:
    """The data stages on 20k impressions of the embedded catalogue, built once per test run (~45 s on one
    core): the workers of `make test` read the same folders."""
    with built_once_per_run(tmp_path_factory, "pipeline") as (work, build):
        if build:
            spark = request.getfixturevalue("spark")  # only the worker that builds it needs a session for it
            data_stages(spark, default_pairs, work, 20_000, negatives_shards=3)
    return {stage: work / stage for stage in ("simulate", "clean", "vocab", "negatives")}


TINY_PRODUCTS = ["drill", "hammer", "paint", "ladder", "faucet", "shovel", "mower", "lamp", "rug", "sink"]
TINY_ATTRIBUTES = ["cordless", "steel", "white", "outdoor", "led", "small", "heavy", "brass"]


@contextmanager
def http_service(cmd: list[str], log: Path, health_url: str, timeout: float = 120, **popen) -> Iterator[None]:
    """A real server process (`mlflow server`, `mlflow models serve`) that answers `health_url` with
    200 within `timeout` seconds; terminated on exit. Its output goes to `log`, shown if it fails."""
    import subprocess
    import time
    import urllib.request

    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, **popen)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    if urllib.request.urlopen(health_url, timeout=2).status == 200:
                        break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"{' '.join(cmd[:5])} did not start: {log.read_text()[-2000:]}")
                time.sleep(0.5)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


# The machine's PostgreSQL (CI machines have one too); DSSM_TEST_POSTGRES points elsewhere. Its
# database is only where the tests connect to create and drop their own.
POSTGRES = os.environ.get("DSSM_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def postgres_problem(url: str = POSTGRES) -> str | None:
    """None when PostgreSQL answers at `url` (and psycopg is installed), else why not."""
    from infra.database import answers_at

    return answers_at(url)


@contextmanager
def postgres_database(prefix: str = "dssm_test") -> Iterator[str]:
    """A fresh database name on the test PostgreSQL (PREFIX_<random>): yields its URL, which may also
    be used as a base name (`dssm stack up --database` makes NAME_mlflow and NAME_prefect). On exit
    every database named NAME or NAME_* is dropped, connections or not, so reruns start clean."""
    import uuid

    from sqlalchemy.engine import make_url

    problem = postgres_problem()
    if problem is not None:
        pytest.skip(f"no PostgreSQL answers at {POSTGRES} ({problem}); set DSSM_TEST_POSTGRES to use another")
    from psycopg import sql

    from infra.database import connect

    admin = make_url(POSTGRES)
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        yield admin.set(database=name).render_as_string(hide_password=False)
    finally:
        with connect(admin, admin.database) as conn:
            rows = conn.execute(
                "SELECT datname FROM pg_database WHERE datname = %s OR datname LIKE %s", (name, f"{name}\\_%")
            )
            for (found,) in rows.fetchall():
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(found)))


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database URL for this test, dropped after it; skips where none answers."""
    with postgres_database() as url:
        yield url


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_tiny_dataset(root: Path, shards: int = 4, rows_per_shard: int = 24, n: int = 4, seed: int = 0) -> Path:
    """A small, fixed `dssm vocab` + `dssm negatives` output (no Spark): queries are a product word
    and an attribute, the clicked title shares the product word, negatives are other products."""
    import random
    from collections import Counter

    import pyarrow as pa
    import pyarrow.parquet as pq

    from core.artifacts import write_manifest
    from core.schemas import NEGATIVES, VOCAB
    from core.text import word_trigrams

    rng = random.Random(seed)
    products, attributes = TINY_PRODUCTS, TINY_ATTRIBUTES
    fillers = ["pro", "kit", "with", "set", "2 pack", "24 in.", "for home"]

    def title(product: str) -> str:
        return " ".join([rng.choice(attributes), product, *rng.sample(fillers, rng.randint(0, 3))])

    def rows(count: int) -> list[dict]:
        out = []
        for i in range(count):
            product = rng.choice(products)
            others = [p for p in products if p != product]
            query = f"{rng.choice(attributes)} {product}"  # the draws in the order the golden loss was pinned
            positive, negatives = title(product), [title(rng.choice(others)) for _ in range(n)]
            # every third row carries a listwise target list: its titles, the clicked one most relevant
            shown = [positive, *negatives[: 1 + (i // 3) % 3]] if i % 3 == 0 else []
            out.append(
                {
                    "query": query,
                    "positive": positive,
                    "negatives": negatives,
                    "clicks": 1,
                    "impressions": 1,
                    "debiased_clicks": 1.0 + i % 2,
                    "shown": shown,
                    "relevance": [1.0, *[0.1 * k for k in range(len(shown) - 1)]] if shown else [],
                }
            )
        return out

    clean_sha = "0" * 64  # stands for the `dssm clean` output both were built from
    neg_dir, vocab_dir = root / "negatives", root / "vocab"
    counts: Counter = Counter()
    for split, files in (("train", shards), ("valid", 1)):
        (neg_dir / split).mkdir(parents=True)
        for i in range(files):
            part = rows(rows_per_shard)
            for r in part:
                for text in (r["query"], r["positive"], *r["negatives"]):
                    counts.update(t for w in text.split() for t in word_trigrams(w))
            pq.write_table(pa.Table.from_pylist(part, NEGATIVES), neg_dir / split / f"part-{i:05d}.parquet")
    inputs = {"clean": {"path": "tiny", "sha256": clean_sha}}
    params = {"n": n, "shards": shards, "debias": True, "list_size": 4}
    write_manifest(neg_dir, {"stage": "negatives", "inputs": inputs, "params": params})
    tokens = sorted(counts, key=lambda t: (-counts[t], t))[:-5]  # leave a few out: they map to <unk>
    (vocab_dir / "trigrams").mkdir(parents=True)
    table = {
        "id": list(range(len(tokens) + 1)),
        "token": ["<unk>", *tokens],
        "count": [0, *(counts[t] for t in tokens)],
    }
    pq.write_table(pa.Table.from_pydict(table, VOCAB), vocab_dir / "trigrams" / "part-00000.parquet")
    write_manifest(vocab_dir, {"stage": "vocab", "inputs": inputs, "params": {}})
    return root


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    return write_tiny_dataset(tmp_path_factory.mktemp("tiny"))


def tiny_model(data: Path, out: Path, *overrides: str) -> Path:
    """Train a tiny model on `write_tiny_dataset` output; its MLflow run goes to OUT/../train.db."""
    from modeling.config import load_config
    from modeling.train import resolve_paths, train

    cfg = load_config(None, ["model.ncell=8", "data.batch_size=16", "threads=1", f"out={out}", *overrides])
    cfg = resolve_paths(cfg, data)
    cfg.mlflow_uri = f"sqlite:///{out.parent}/train.db"
    train(cfg)
    return out


def evaluate_register_gate(*args: str) -> list[dict]:
    """`dssm evaluate ARGS`, then `dssm register` and `dssm gate` of its --out OUT into OUT-register and
    OUT-gate, as the flow's three stages do; returns the gate's decisions."""
    import json

    from dssm.cli import main

    assert main(["evaluate", *args]) == 0
    out = Path(args[args.index("--out") + 1])
    registered, gated = out.with_name(f"{out.name}-register"), out.with_name(f"{out.name}-gate")
    assert main(["register", "--evaluation", str(out), "--out", str(registered)]) == 0
    assert main(["gate", "--registered", str(registered), "--out", str(gated)]) == 0
    return json.loads((gated / "gate.json").read_text())


def write_judged(path: Path, test: bool = True) -> Path:
    """Queries `attribute product` from the tiny domain; two titles of the product (label 3), four of others (1)."""
    import csv

    from core.text import is_test_query

    queries = [f"{a} {p}" for p in TINY_PRODUCTS for a in TINY_ATTRIBUTES if is_test_query(f"{a} {p}") == test]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["search_term", "product_title", "relevance"])
        for i, q in enumerate(queries):
            product = q.split()[1]
            others = [p for p in TINY_PRODUCTS if p != product]
            for j in range(4):
                w.writerow([q, f"{TINY_ATTRIBUTES[(i + j) % 8]} {others[(i + j) % len(others)]} kit", 1])
            for j in range(2):
                w.writerow([q, f"{TINY_ATTRIBUTES[(i + j + 3) % 8]} {product} pro", 3])
    return path


def write_index(out: Path, titles: list[str], dim: int = 8) -> Path:
    """An index directory laid out as `dssm index` writes it (scoring/retriever.py), of random unit
    vectors and without model/model.pt: what `Retriever.load` reads before it loads the model, with
    the manifest (its files' sha256) that it checks first."""
    import json

    import faiss
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from core.artifacts import write_manifest
    from scoring.retriever import INDEX_FILE, unit_rows

    (out / "embeddings").mkdir(parents=True)
    (out / "model").mkdir()
    pq.write_table(pa.table({"title": titles}), out / "embeddings" / "part-00000.parquet")
    index = faiss.IndexFlatIP(dim)
    index.add(unit_rows(np.random.default_rng(0).normal(size=(len(titles), dim))))
    faiss.write_index(index, str(out / INDEX_FILE))
    (out / "model.json").write_text(json.dumps({"uri": "", "name": "", "version": "", "run_id": ""}) + "\n")
    write_manifest(out, {"stage": "index"})
    return out


def hand_built_index(
    out: Path, checkpoint: Path, titles: list[str], fusion: dict | None = None, model: dict | None = None
) -> Path:
    """A `dssm index` output written without Spark: the files stages/index/job.py writes (the title
    tower's vectors in a flat faiss index, the slim checkpoint, a hybrid's fusion.json and bm25/) and
    the manifest `publish` writes over them."""
    import json

    import faiss
    import pyarrow as pa
    import pyarrow.parquet as pq

    from core.artifacts import write_manifest
    from modeling.checkpoint import slim_checkpoint
    from scoring.bm25 import CatalogueBM25
    from scoring.neural import TwoTowerEmbedder
    from scoring.retriever import INDEX_FILE
    from stages.index.config import IndexConfig
    from stages.index.job import build_faiss

    (out / "embeddings").mkdir(parents=True)
    (out / "model").mkdir()
    vectors = TwoTowerEmbedder(checkpoint).embed(titles, "doc")
    columns = {"title": titles, "embedding": vectors.tolist(), "model_version": ["dssm-tiny/1"] * len(titles)}
    pq.write_table(pa.table(columns), out / "embeddings" / "part-00000.parquet")
    faiss.write_index(build_faiss(vectors, IndexConfig(kind="flat"))[0], str(out / INDEX_FILE))
    slim_checkpoint(checkpoint, out / "model" / "model.pt")
    if fusion is not None:
        (out / "model" / "fusion.json").write_text(json.dumps(fusion))
        CatalogueBM25(titles).save(out / "bm25")
    model = model or {"uri": "models:/dssm-tiny/1", "name": "dssm-tiny", "version": "1", "run_id": ""}
    (out / "model.json").write_text(json.dumps(model))
    write_manifest(out, {"stage": "index", "model": model})
    return out


def tiny_fusion(titles: list[str]) -> dict:
    """A hybrid's fusion.json: BM25 statistics of the titles, a re-ranking weight and a retrieval fusion."""
    from scoring.fusion import RetrievalFusion
    from scoring.lexical import BM25, Collection

    return {"bm25": BM25.fit(Collection(titles)).to_dict(), "weight": 0.3, "retrieval": RetrievalFusion().to_dict()}
