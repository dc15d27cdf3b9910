"""`dssm index`: embed every title of a catalogue with a registered model and build its ANN index.

The titles are embedded on Spark by a pandas UDF (the model's files reach each executor as an archive
through SparkContext.addFile and load once per Python worker as data, never from the logged model's
pickle; the job runs unchanged on a cluster) into `embeddings/`; the
driver then builds a faiss index of the unit vectors (`titles.faiss`) and copies the model's
checkpoint into `model/`, so the directory answers queries on its own (scoring/retriever.py).
With a tracking store, the directory is logged as the pyfunc `retriever` in the model version's
run, registered as NAME-retriever with the version's aliases, and the version is tagged with it.

The manifest records every file's sha256 and the model version; `Retriever.load` checks them, so a
file swapped in from another index or damaged since is refused by name. The retriever is
registered after the directory is published (the logged copy carries that manifest), and a rebuild
with the same content as a version already registered for this model version (after --force or a
lost directory) reuses that version rather than registering a copy.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.artifacts import amend_manifest, code_fingerprint, content_sha256, publish, read_manifest
from core.errors import DssmError
from core.schemas import embeddings_schema
from core.tracking import ModelRef, resolve_model
from scoring.retriever import INDEX_FILE, component_index_file, unit_rows
from scoring.serving import log_retriever
from stages.index.config import IndexConfig, check_config

if TYPE_CHECKING:
    import mlflow
    from mlflow.entities.model_registry import ModelVersion

log = logging.getLogger(__name__)


def catalogue_titles(spark, source: Path):
    """A DataFrame of distinct, non-empty titles: a `dssm clean` output (its titles/), or a Parquet
    or CSV file or directory with a `title` column (normalised here as clean does)."""
    from pyspark.sql import functions as F

    source = Path(source)
    if (source / "titles").is_dir() and (read_manifest(source) or {}).get("stage") == "clean":
        df = spark.read.parquet(str(source / "titles"))
    elif source.suffix == ".csv":
        df = spark.read.option("header", True).option("multiLine", True).option("escape", '"').csv(str(source))
    elif source.exists():
        df = spark.read.parquet(str(source))
    else:
        raise DssmError(f"--titles {source}: not found")
    if "title" not in df.columns:
        raise DssmError(f"--titles {source}: no `title` column (columns: {', '.join(df.columns)})")
    from core.text import norm

    normalised = F.pandas_udf(lambda titles: titles.fillna("").map(norm), "string")  # exactly PROTOCOL.md §2
    return df.select(normalised(F.col("title").cast("string")).alias("title")).where(F.col("title") != "").distinct()


def partner_column(position: int) -> str:
    """The embeddings/ column of a hybrid's dense partner at `position` of its components."""
    return f"embedding_{position}"


def _fusion(model_dir: Path) -> dict[str, Any] | None:
    path = model_dir / "fusion.json"
    return json.loads(path.read_text()) if path.is_file() else None


def dense_partners(model_dir: Path) -> dict[int, str]:
    """A hybrid's components after the model that embed texts (MiniLM, trained partners): position -> name."""
    from scoring.hybrid import fusion_components

    fusion = _fusion(model_dir)
    if fusion is None:
        return {}
    components, _ = fusion_components(fusion)
    return {i: c["name"] for i, c in enumerate(components) if c["kind"] in ("minilm", "checkpoint")}


def has_lexical(model_dir: Path) -> bool:
    from scoring.hybrid import fusion_components

    fusion = _fusion(model_dir)
    return fusion is not None and any(c["kind"] == "bm25" for c in fusion_components(fusion)[0])


def build_faiss(vectors, cfg: IndexConfig):
    """The faiss index of unit `vectors` (row i = id i): exact inner product, or HNSW over it."""
    import faiss

    n, dim = vectors.shape
    small = n <= cfg.flat_max and n * dim * 4 <= cfg.flat_max_mb * 2**20
    kind = cfg.kind if cfg.kind != "auto" else ("flat" if small else "hnsw")
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    else:
        index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.ef_construction
        index.hnsw.efSearch = cfg.ef_search
    index.add(unit_rows(vectors))
    return index, kind


RECALL_QUERIES = 500  # catalogue vectors an HNSW index is checked with against exact search


def hnsw_recall(vectors, index, k: int = 10, queries: int = RECALL_QUERIES) -> float:
    """The share of the exact top k (inner product of unit vectors) that the index returns, over a seeded
    sample of the catalogue's own vectors as queries: what HNSW trades for its speed (1.0 for a flat index)."""
    import faiss
    import numpy as np

    if not hasattr(index, "hnsw"):
        return 1.0
    unit = unit_rows(vectors)
    picked = np.random.default_rng(0).choice(len(unit), min(queries, len(unit)), replace=False)
    k = min(k, len(unit))
    _, exact = faiss.knn(unit[picked], unit, k, metric=faiss.METRIC_INNER_PRODUCT)
    _, found = index.search(unit[picked], k)
    return float(np.mean([len(set(e) & set(f)) / k for e, f in zip(exact, found, strict=True)]))


def read_vectors(embeddings: Path, column_name: str = "embedding"):
    """The embeddings' vectors (of the model, or of a partner's column) as one float32 matrix, in index order."""
    import numpy as np
    import pyarrow.parquet as pq

    blocks = []
    for part in sorted(embeddings.glob("part-*.parquet")):
        column = pq.read_table(part, columns=[column_name]).column(column_name).combine_chunks()
        blocks.append(column.flatten().to_numpy().reshape(len(column), -1))
    return np.concatenate(blocks).astype(np.float32, copy=False)


def shipped_model(spark, model_dir: Path, device: str = "auto", threads: int = 0) -> Callable[[str], Any]:
    """`embedder(component)`: a pandas UDF that embeds a title column with the model files in
    `model_dir` ("" for the model's own tower, else a hybrid's dense component). The directory reaches
    the executors as a tar archive through SparkContext.addFile (a cluster shares no disk), and each
    Python worker loads it once as data (scoring/serving.model_from_files): no pickled model runs.
    Each worker embeds on `device` (executor_device) with `threads` CPU threads (0: spark.task.cpus)."""
    import numpy as np
    from pyspark.sql.functions import pandas_udf

    # Spark serves an added file from where it was added for as long as the context lives (an executor that
    # joins later fetches it then): the archive stays until this process exits.
    staging = Path(tempfile.mkdtemp(prefix="dssm-index-"))
    atexit.register(shutil.rmtree, staging, True)
    archive = Path(shutil.make_archive(str(staging / f"dssm-model-{uuid.uuid4().hex}"), "tar", model_dir))
    spark.sparkContext.addFile(str(archive))
    name = archive.name

    def embedder(component: str):
        def embed(titles):  # a pandas Series of titles -> their vectors (no hints: a scalar pandas UDF)
            import pandas as pd

            vectors = executor_model(name, device, threads).embedder_of(component).embed(titles.tolist(), "doc")
            return pd.Series(list(np.asarray(vectors, dtype=np.float32)))

        return pandas_udf(embed, "array<float>")

    return embedder


_EXECUTOR_MODEL: dict[str, Any] = {}  # per Python worker: the archive name -> its model (the last one only)


def executor_device(device: str) -> str:
    """Where this Spark task embeds: the GPU Spark assigned it (a cluster with task GPU resources,
    infra/README.md), else `device` ("auto": cuda where torch sees a GPU, as in local mode)."""
    from pyspark import TaskContext

    from scoring.neural import resolve_device

    context = TaskContext.get()
    gpus = context.resources().get("gpu") if context is not None else None
    if gpus is not None and gpus.addresses and device != "cpu":
        return f"cuda:{gpus.addresses[0]}"
    return resolve_device(device)


def executor_model(archive_name: str, device: str = "cpu", threads: int = 0):
    """The model of a shipped_model archive, unpacked into this worker's Spark files directory (removed
    with the Spark context) and loaded on first use, on `device` (executor_device) with `threads` CPU
    threads (0: the task's spark.task.cpus): tasks running side by side share the cores, not each all of them."""
    from pyspark import SparkFiles, TaskContext

    from modeling.inference import THREADS_ENV
    from scoring.serving import model_dir_files, model_from_files

    loaded = _EXECUTOR_MODEL.get(archive_name)
    if loaded is None:
        import torch

        context = TaskContext.get()
        threads = threads or (context.cpus() if context is not None else 0) or 1
        os.environ[THREADS_ENV] = str(threads)
        torch.set_num_threads(threads)
        root = Path(SparkFiles.getRootDirectory())
        target = root / f"{archive_name}.{os.getpid()}"
        if not target.is_dir():  # unpacked whole, then renamed: a failed unpack leaves no partial model
            partial = Path(tempfile.mkdtemp(dir=root))
            shutil.unpack_archive(SparkFiles.get(archive_name), partial, "tar")
            os.replace(partial, target)
        _EXECUTOR_MODEL.clear()  # a reused worker keeps one model, not every index's
        files = model_dir_files(target)
        loaded = _EXECUTOR_MODEL[archive_name] = model_from_files(files, archive_name, executor_device(device))
        log.info("index: worker %d embeds on %s with %d thread(s)", os.getpid(), loaded.embedder.device, threads)
    return loaded


def task_threads(spark, partitions: int) -> int:
    """CPU threads per embedding task: in local mode the driver's cores shared among the tasks that run at
    once (one partition: every core); on a cluster 0, the task's own spark.task.cpus."""
    from core.machine import usable_cpus

    sc = spark.sparkContext
    if not sc.master.startswith("local"):
        return 0
    return max(1, usable_cpus() // max(1, min(partitions, sc.defaultParallelism)))


def index(
    spark,
    model_uri: str,
    titles: Path,
    out: Path,
    tracking_uri: str,
    cfg: IndexConfig = IndexConfig(),
    register: bool = True,
    force: bool = False,
) -> dict[str, Any]:
    """Embed the catalogue with the model, build the index into `out` and (with `register`) log it;
    skipped when the model version, the titles and the settings are those of the index already there."""
    from pyspark.sql import functions as F

    from core.spark import cluster_errors, stable_layout, write_parquet
    from scoring.serving import copy_logged_model

    check_config(cfg)
    model = resolve_model(model_uri, tracking_uri)
    titles = Path(titles)
    upstream = read_manifest(titles) if titles.is_dir() else None  # a stage output names its content hash
    inputs = {
        # a registered version is immutable: its name, version and run stand for its content
        "model": {"path": model.uri, "sha256": f"{model.label}:{model.run_id}"},
        "titles": {"path": str(titles), "sha256": (upstream or {}).get("content_sha256") or content_sha256(titles)},
    }

    def build(tmp: Path) -> dict[str, Any]:
        started = time.perf_counter()
        copy_logged_model(model.uri, tmp / "model")  # the index serves on its own
        partners = dense_partners(tmp / "model")

        df = catalogue_titles(spark, titles)
        rows = df.count()
        if rows == 0:
            raise DssmError(f"--titles {titles}: no titles")
        df = stable_layout(df, rows, cfg.rows_per_file, "title")
        embedder = shipped_model(spark, tmp / "model", cfg.device, task_threads(spark, df.rdd.getNumPartitions()))
        extra = [embedder(name)("title").alias(partner_column(p)) for p, name in partners.items()]
        df = df.select(
            "title", embedder("")("title").alias("embedding"), F.lit(model.label).alias("model_version"), *extra
        )
        write_parquet(df, tmp / "embeddings", embeddings_schema(list(partners)))
        embed_seconds = time.perf_counter() - started
        vectors = read_vectors(tmp / "embeddings")
        import faiss

        started = time.perf_counter()
        built, kind = build_faiss(vectors, cfg)
        faiss.write_index(built, str(tmp / INDEX_FILE))
        # each HNSW index's recall@10 against exact search (MLflow metric names allow no '@')
        dims, recalls = {}, ({"recall_at_10": hnsw_recall(vectors, built)} if kind == "hnsw" else {})
        for position in partners:
            partner_vectors = read_vectors(tmp / "embeddings", partner_column(position))
            dims[f"dim_{position}"] = int(partner_vectors.shape[1])
            partner_index, partner_kind = build_faiss(partner_vectors, cfg)
            faiss.write_index(partner_index, str(tmp / component_index_file(position)))
            dims[f"kind_{position}"] = partner_kind
            if partner_kind == "hnsw":
                recalls[f"recall_at_10_{position}"] = hnsw_recall(partner_vectors, partner_index)
        build_seconds = time.perf_counter() - started
        if has_lexical(tmp / "model"):  # a hybrid with BM25 also takes BM25's best titles as candidates
            from scoring.bm25 import CatalogueBM25
            from scoring.retriever import read_titles

            CatalogueBM25(read_titles(tmp)).save(tmp / "bm25")
        (tmp / "model.json").write_text(json.dumps(asdict(model), indent=2) + "\n")
        counts = {
            "titles": rows,
            "dim": int(vectors.shape[1]),
            **dims,
            "kind": kind,
            **{k: round(v, 4) for k, v in recalls.items()},
            "embed_seconds": round(embed_seconds, 2),
            "build_seconds": round(build_seconds, 3),
            "index_bytes": (tmp / INDEX_FILE).stat().st_size,
        }
        log.info(
            "index: %s titles x %d dims embedded in %.1fs (%.0f titles/s), %s index built in %.2fs (%.1f MB)%s",
            f"{rows:,}",
            counts["dim"],
            embed_seconds,
            rows / max(embed_seconds, 1e-9),
            kind,
            build_seconds,
            counts["index_bytes"] / 1e6,
            f"; HNSW recall@10 against exact {', '.join(f'{v:.3f}' for v in recalls.values())}" * bool(recalls),
        )
        return {"counts": counts, "model": asdict(model)}

    with cluster_errors(out):
        # every file hashed before the index counts as up to date: dssm search refuses a same-size corruption
        params = {k: v for k, v in asdict(cfg).items() if k != "catalogue"}  # the flow's; `titles` is the input
        manifest = publish(out, "index", code_fingerprint(__name__), inputs, params, build, force, None, True)
    # After the rename, so the logged copy carries the manifest its loader checks every file against;
    # an index whose registration failed is up to date next time and only registered then.
    if register and model.name and "retriever" not in manifest:
        retriever = register_index(Path(out), model, tracking_uri, manifest)
        manifest = amend_manifest(out, {"retriever": retriever}) | {"skipped": manifest["skipped"]}
    return manifest


CONTENT_TAG = "index_sha256"  # on a NAME-retriever version: the content hash of the index directory it holds


def registered_copy(
    client: mlflow.MlflowClient, retriever_name: str, model_label: str, content: str
) -> ModelVersion | None:
    """The NAME-retriever version that already holds this very index (same model version, same
    files: the content hash of a rebuild after --force or a lost directory), or None."""
    from mlflow.exceptions import MlflowException

    try:
        versions = client.search_model_versions(f"name='{retriever_name}'")
    except MlflowException:  # no such registered model yet
        return None
    same = [v for v in versions if v.tags.get("model_version") == model_label and v.tags.get(CONTENT_TAG) == content]
    return max(same, key=lambda v: int(v.version), default=None)


def register_index(out: Path, model: ModelRef, tracking_uri: str, manifest: dict[str, Any]) -> dict[str, str]:
    """Log the index as the pyfunc `retriever` in the model version's run, register it as
    NAME-retriever with the version's aliases, and tag the version with where it went. An index
    byte-identical to one already registered for this model version reuses that version."""
    import mlflow

    from core.tracking import client as mlflow_client
    from core.tracking import log_datasets

    client = mlflow_client(tracking_uri)
    retriever_name = f"{model.name}-retriever"
    counts, titles, content = manifest["counts"], manifest["inputs"]["titles"], manifest["content_sha256"]
    existing = registered_copy(client, retriever_name, model.label, content)
    if existing is not None:
        uri, version = existing.source, str(existing.version)
        log.info("index: %s v%s already holds this index; not registered again", retriever_name, version)
    else:
        with mlflow.start_run(run_id=model.run_id):
            uri, version = log_retriever(out, retriever_name)
            numbers = {k: v for k, v in counts.items() if isinstance(v, int | float)}
            mlflow.log_metrics({k if k.startswith("index_") else f"index_{k}": v for k, v in numbers.items()})
        log_datasets(tracking_uri, model.run_id, [("catalogue", titles["path"], titles["sha256"], "catalogue")])
        client.set_model_version_tag(retriever_name, version, "model_version", model.label)
        # last: a registration cut short before this line is never taken for a complete one
        client.set_model_version_tag(retriever_name, version, CONTENT_TAG, content)
        log.info("index: logged as %s, registered %s v%s", uri, retriever_name, version)
    for alias in client.get_model_version(model.name, model.version).aliases:
        client.set_registered_model_alias(retriever_name, alias, version)
    tags = {"retriever_uri": uri, "retriever_version": f"{retriever_name}/{version}"}
    tags |= {f"index.{k}": str(v) for k, v in counts.items()}
    for key, value in tags.items():
        client.set_model_version_tag(model.name, model.version, key, value)
    return {"uri": uri, "name": retriever_name, "version": version}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm index`'s options: the model, titles and output, IndexConfig's fields, MLflow's, Spark's."""
    from core.options import add_config_options
    from core.spark import add_spark_options

    p.add_argument(
        "--model",
        required=True,
        metavar="URI",
        help="the model to embed with: models:/NAME@champion, models:/NAME/VERSION or runs:/ID/model",
    )
    p.add_argument(
        "--titles",
        type=Path,
        required=True,
        help="the catalogue: a `dssm clean` output (its title pool) or Parquet/CSV with a `title` column",
    )
    p.add_argument("--out", type=Path, required=True, help="index directory (replaced atomically)")
    p.add_argument(
        "--mlflow-uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///<parent of --out>/mlflow.db)"
    )
    add_config_options(p, IndexConfig, skip=("catalogue",))  # --titles
    p.add_argument(
        "--no-register",
        dest="register",
        action="store_false",
        help="do not log the index to MLflow as the version's `retriever`",
    )
    add_spark_options(p)


def command(args: argparse.Namespace) -> None:
    """`dssm index`."""
    from core.options import config_from_options
    from core.spark import LazySpark
    from core.tracking import default_tracking_uri, existing_store

    cfg = config_from_options(IndexConfig, args)
    uri = args.mlflow_uri or default_tracking_uri(Path(args.out).resolve().parent)
    if str(args.model).startswith("models:/"):  # a registered version: opening no store would create an empty one
        existing_store(uri, f"dssm index --model {args.model}")
    m = index(
        LazySpark(args.master, "dssm-index"), args.model, args.titles, args.out, uri, cfg, args.register, args.force
    )
    c = m["counts"]
    state = "up to date" if m["skipped"] else f"built in {c['build_seconds']:.2f}s"
    print(f"{c['titles']:,} titles x {c['dim']} ({c['kind']}, {c['index_bytes'] / 1e6:.1f} MB) {state} -> {args.out}")
    if "retriever" in m:
        print(f"retriever: {m['retriever']['uri']} (registered {m['retriever']['name']} v{m['retriever']['version']})")
