"""`dssm clean`: raw impression logs -> clicked (query, title) pairs, the title pool, the kept
impressions (shown titles in rank order, clicks, dwell) and rejects.

Every line read ends up either kept or in `rejects/` with a reason, so that
read = kept + rejected holds exactly (checked before anything is published):

- malformed lines (kept verbatim in `raw`): empty_line, invalid_json, not_an_object,
  wrong_type, missing_field, unsupported_version, bad_value;
- rule drops (docs/raw-log-format.md): duplicate_event (an impression_id seen on an earlier
  line), empty_query (nothing left after normalisation), bot_user (a user with more than
  `bot_max_per_minute` impressions in any 60 seconds, or with at least `bot_min_impressions`
  impressions of which `bot_min_click_rate` of all shown results were clicked).

Lines are parsed and validated by `stages.clean.rawlog.parse_line` (queries and titles normalised exactly
as PROTOCOL.md §2) once, into a temporary Parquet file (local files by Python tasks, small files sharing one,
`stages.clean.filetasks`); the rules read only the small columns they need from it, bucketed by hand
between rounds of Python tasks (`stages.clean.rules`), and one pass of Python tasks reads the kept lines'
lists with pyarrow to write `impressions/` and count clicks per pair (`stages.clean.impressions.scan_file`).
Spark schedules those tasks, sums the pair counts and writes the outputs.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from core.artifacts import MANIFEST, code_fingerprint, content_sha256, data_files, publish, read_manifest
from core.errors import DssmError
from core.schemas import CLICK_PAIRS, REJECTS, TITLES
from core.spark import cluster_errors, distinct_count, stable_layout, write_parquet
from stages.clean.config import CleanConfig
from stages.clean.filetasks import UNREADABLE
from stages.clean.hadoopfs import HadoopPath
from stages.clean.rawlog import MALFORMED_REASONS, PARSED, Catalogue, parse_batches, read_catalogue
from stages.clean.rules import rule_drops

log = logging.getLogger(__name__)


def log_dir(path: Path) -> Path:
    """Where the lines of a local input are: a `dssm simulate` output dir's logs/, else itself."""
    if (path / "logs").is_dir() and (read_manifest(path) or {}).get("stage") == "simulate":
        return path / "logs"
    return path


def fs_log_dir(path: HadoopPath) -> HadoopPath:
    """`log_dir` on any Hadoop file system: a `dssm simulate` output dir's logs/, else itself."""
    logs, manifest = path / "logs", path / MANIFEST
    if logs.is_dir() and manifest.is_file():
        try:
            stage = json.loads(manifest.read_text()).get("stage")
        except (ValueError, AttributeError):  # not a manifest of ours: the directory is the logs
            stage = None
        if stage == "simulate":
            return logs
    return path


def resolve_input(path: str) -> str:
    """A `dssm simulate` output dir means its logs/; a missing local path is a clear error."""
    if "://" in path:
        return path
    p = log_dir(Path(path))
    if not p.exists() and not any(ch in path for ch in "*?["):
        raise DssmError(f"raw log input not found: {p}")
    if p.is_dir() and not data_files(p):  # files in subdirectories count: Spark reads them too
        raise DssmError(f"raw log input is an empty directory: {p}")
    if p.is_file() and p.stat().st_size == 0:
        raise DssmError(f"raw log input is an empty file: {p}")
    return str(p)


def parse(raw: DataFrame, doc_ids: dict[str, int] | None = None) -> DataFrame:
    """One row per line (schema `stages.clean.rawlog.PARSED`), parsed by `stages.clean.rawlog.parse_line`; v2 lines
    look their doc ids up in `doc_ids` (`Catalogue.ids`), broadcast once to the executors."""
    from pyspark.sql.pandas.types import from_arrow_schema

    numbered = raw.select(
        F.col("_metadata.file_path").alias("source"), F.monotonically_increasing_id().alias("line"), "value"
    )
    if not doc_ids:
        return numbered.mapInArrow(parse_batches, from_arrow_schema(PARSED))
    shared = raw.sparkSession.sparkContext.broadcast(doc_ids)
    return numbered.mapInArrow(lambda batches: parse_batches(batches, shared.value), from_arrow_schema(PARSED))


def parse_input(
    spark: SparkSession, source: str, cfg: CleanConfig, doc_ids: dict[str, int] | None, scratch: Path
) -> dict[str, Any]:
    """The input's rows, JSON lines or a Parquet table (stages/clean/parquetlog.py), parsed into `scratch`
    as PARSED rows; returns what was read ({format, and for a table its shape}). Local files are
    read by Python tasks (small files share one; stages/clean/filetasks.py), anything else by Spark's readers."""
    from stages.clean.filetasks import json_lines, local_files, parquet_rows, parse_files
    from stages.clean.parquetlog import impression_batches, input_format, parse_table, read_layout

    found, paths = input_format(spark, source, cfg.input_format)
    if found == "json" and cfg.columns:
        raise DssmError(f"clean.columns maps a Parquet table's columns, but {source} is read as JSON lines")
    files = local_files(spark, paths) if cfg.reader == "auto" else None
    shared = spark.sparkContext.broadcast(doc_ids) if doc_ids else None

    def ids() -> dict[str, int] | None:
        return shared.value if shared is not None else None

    if found == "json":
        if files is not None:
            parse_files(spark, files, scratch, lambda batches: parse_batches(batches, ids()), json_lines)
            return {"format": "json"}
        parsed, info = parse(spark.read.option("recursiveFileLookup", "true").text(source), doc_ids), {"format": "json"}
    else:
        table, layout = read_layout(spark, source, paths, cfg.columns)
        if files is not None and layout.shape == "impression_rows":
            from pyspark.sql.pandas.types import to_arrow_schema

            read = parquet_rows({f: layout.names[f] for f in layout.present}, to_arrow_schema(table.schema))
            context = layout.context()
            parse_files(spark, files, scratch, lambda batches: impression_batches(batches, context, ids()), read)
            return {"format": "parquet", "shape": layout.shape}
        parsed, info = parse_table(spark, table, layout, doc_ids)
    parsed.write.parquet(str(scratch))
    return info


def resolve_catalogue(input_path: str, cfg: CleanConfig) -> Path | None:
    """The catalogue side table: the configured one, else a `dssm simulate` output's own (v2 logs)."""
    from core.schemas import CATALOGUE_FILE

    if cfg.catalogue:
        path = Path(cfg.catalogue)
        if not path.exists():
            raise DssmError(f"catalogue not found: {path}")
        return path
    own = Path(input_path) / CATALOGUE_FILE
    return own if "://" not in input_path and own.is_file() else None


def clean(
    spark: SparkSession,
    input_path: str,
    out: Path,
    cfg: CleanConfig = CleanConfig(),
    force: bool = False,
    listed: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """`listed`: (where the lines are, their `stages.clean.hadoopfs.fingerprint`), for an input already
    resolved and fingerprinted on its Hadoop file system (a window's day, stages/clean/window.py); else the
    input is resolved here: a local path hashed byte for byte, a URI (`file://`, `hdfs://`,
    `s3a://`) fingerprinted through Hadoop's FileSystem (which needs the Spark session)."""
    from stages.clean.hadoopfs import fingerprint

    glob = any(ch in input_path for ch in "*?[")
    if listed is None and "://" in input_path and not glob:
        root = HadoopPath(spark, input_path)
        if not root.exists():
            raise DssmError(f"raw log input not found: {input_path}")
        logs = fs_log_dir(root)
        listed = (logs.uri, fingerprint(logs.files()))
    if listed is not None:
        (source, source_hash), remote = listed, False
    else:
        source = resolve_input(input_path)
        remote = glob  # a glob's files are not listed here, so it is never taken as unchanged
        source_hash = None if remote else content_sha256(Path(source))
    inputs = {"raw": {"path": source, "sha256": source_hash}}
    catalogue_path = resolve_catalogue(input_path, cfg)
    if catalogue_path is not None:
        inputs["catalogue"] = {"path": str(catalogue_path), "sha256": content_sha256(catalogue_path)}

    def build(tmp: Path) -> dict[str, Any]:
        scratch = tmp / "_parsed"
        with timed("parse and validate"):
            try:
                catalogue = read_catalogue(catalogue_path) if catalogue_path else None
                read_info = parse_input(spark, source, cfg, catalogue.ids if catalogue else None, scratch)
            except DssmError:
                raise
            except Exception as e:
                damaged = unreadable_file(str(e)) or damaged_input(spark, source)
                if damaged:  # Spark's own message names no file
                    raise DssmError(damaged) from None
                raise
        parsed = spark.read.parquet(str(scratch))
        lines_read = parsed.count()
        if lines_read == 0:
            raise DssmError(f"no lines to read in {source}")

        with timed("rules (duplicates, empty queries, bots)"):
            files = [str(f) for f in sorted(scratch.glob("*.parquet"))]
            dropped = rule_drops(spark, files, tmp / "_rules", cfg, lines_read)
            drops = spark.read.parquet(str(dropped)).persist()
        # Not persisted: each action below re-reads only the Parquet columns it needs.
        status = parsed.join(F.broadcast(drops), "line", "left").withColumn(
            "status", F.coalesce("reason", "rule", F.lit("kept"))
        )
        with timed("reconcile counts"):
            counts = rejected_by_reason(files, dropped)
        rejected = sum(counts.values())
        kept_n = lines_read - rejected
        malformed = sum(n for reason, n in counts.items() if reason in MALFORMED_REASONS)
        if kept_n == 0:
            raise DssmError(f"no usable impression in {source}: {lines_read} lines read, all rejected ({_top(counts)})")
        if malformed > cfg.max_malformed_rate * lines_read:
            raise DssmError(
                f"{source}: {malformed} of {lines_read} lines are malformed ({_top(counts)}); "
                f"is this a dssm raw log (docs/raw-log-format.md)?"
            )

        step = "count clicks per pair" + (", write impressions" if cfg.impressions else "")
        with timed(step):
            where = tmp / "impressions" if cfg.impressions else None
            n_impressions, partial = scan_kept(scratch, drops, catalogue, where, tmp / "_counts")
            # A sum of counts is never null; coalesce says so to Spark, so that the written
            # schema (its nullability) stays the contract's.
            all_pairs = (
                partial.groupBy("query", "title")
                .agg(F.sum("clicks").alias("clicks"), F.coalesce(F.sum("impressions"), F.lit(0)).alias("impressions"))
                .persist()
            )
            pairs_total = all_pairs.count()
        with timed("write pairs and titles"):
            clicked = all_pairs.where(F.col("clicks") > 0)
            pairs_df = stable_layout(clicked, pairs_total, cfg.rows_per_file, "query", "title")
            n_pairs = write_parquet(pairs_df, tmp / "pairs", CLICK_PAIRS)

            titles = all_pairs.groupBy("title").agg(
                F.sum("impressions").alias("impressions"), F.sum("clicks").alias("clicks")
            )
            titles_df = stable_layout(titles, pairs_total, cfg.rows_per_file, "title")
            n_titles = write_parquet(titles_df, tmp / "titles", TITLES)

        rejects = status.where(F.col("status") != "kept").select(
            F.col("source"),
            F.col("status").alias("reason"),
            F.coalesce(
                "detail", F.when(F.col("status") == "bot_user", F.concat(F.lit("user "), F.col("user_id")))
            ).alias("detail"),
            "raw",
            "impression_id",
            "user_id",
            "line",
        )
        with timed("write rejects"):
            rejects_df = stable_layout(rejects, rejected, cfg.rows_per_file, "source", "line")
            n_rejects = write_parquet(rejects_df.drop("line"), tmp / "rejects", REJECTS)
        spark.catalog.clearCache()  # drops, all_pairs and the rules' persisted rows
        shutil.rmtree(scratch)
        shutil.rmtree(tmp / "_counts")
        shutil.rmtree(tmp / "_rules")

        if lines_read != kept_n + rejected or n_rejects != rejected or n_impressions != kept_n:
            raise DssmError(
                f"internal error: counts do not reconcile: read {lines_read} != kept {kept_n} + rejected {rejected}"
                f" (rejects written {n_rejects}, impressions written {n_impressions})"
            )
        queries = distinct_count(tmp / "pairs", "query")
        log.info("clean: read %d lines = kept %d + rejected %d (%s)", lines_read, kept_n, rejected, _top(counts))
        return {
            "counts": {
                "lines_read": lines_read,
                "kept": kept_n,
                "rejected": rejected,
                "rejected_by_reason": dict(sorted(counts.items())),
                "pairs": n_pairs,
                "queries": queries,
                "titles": n_titles,
                **({"rows_read": read_info["rows_read"]} if "rows_read" in read_info else {}),
            },
            "input": read_info,
            "outputs": {
                "pairs": "pairs/",
                "titles": "titles/",
                "rejects": "rejects/",
                **({"impressions": "impressions/"} if cfg.impressions else {}),
            },
        }

    with cluster_errors(out):
        params = {k: v for k, v in asdict(cfg).items() if k != "catalogue"}  # its hash is an input
        return publish(out, "clean", code_fingerprint(__name__), inputs, params, build, force=force or remote)


def scan_kept(
    scratch: Path, drops: DataFrame, catalogue: Catalogue | None, impressions: Path | None, counts: Path
) -> tuple[int, DataFrame]:
    """One pass over the kept lines of the parsed scratch (`stages.clean.impressions.scan_file` per file, a
    task per core): `impressions/` written (unless `impressions` is None) and the clicks and
    impressions per (query, title) of each task. Returns the kept lines seen and those counts
    (not yet summed across tasks). Impressions keep line order within a file, and a rerun parses
    into the same files, so the bytes are the same too."""
    import numpy as np
    import pyarrow as pa

    from core.schemas import IMPRESSIONS, check_parquet
    from core.spark import python_tasks
    from stages.clean.impressions import PairCounts, scan_file

    spark = drops.sparkSession
    files = [str(f) for f in sorted(scratch.glob("*.parquet"))]
    dropped = np.sort(drops.select("line").toArrow().column("line").to_numpy())
    shared = spark.sparkContext.broadcast((files, dropped, catalogue.titles if catalogue is not None else None))
    counts.mkdir()
    if impressions is not None:
        impressions.mkdir()

    # A task per core, not per file: each task's pair counts are summed over all its files, so
    # Spark sums one partial row per pair and task (at 10M impressions, 40 files: 17M rows, most
    # of this step's time, against ~1M).
    tasks = max(1, min(len(files), spark.sparkContext.defaultParallelism))

    def scan(task: int) -> int:
        files, dropped, titles = shared.value
        pairs, kept = PairCounts(pa.array(titles or [], pa.string())), 0
        for i in range(task, len(files), tasks):
            written = impressions / f"part-{i:05d}.parquet" if impressions is not None else None
            kept += scan_file(files[i], dropped, pairs, written)
        pq.write_table(pairs.table(), counts / f"part-{task:05d}.parquet")
        return kept

    kept = python_tasks(spark, tasks, scan)
    if impressions is not None:
        for i, part in enumerate(sorted(impressions.glob("part-*.parquet"))):
            part.rename(impressions / f"part-{i:05d}.parquet")
        check_parquet(impressions, IMPRESSIONS)
    return kept, spark.read.parquet(str(counts))


def rejected_by_reason(scratch: list[str], drops: Path) -> dict[str, int]:
    """Lines per reject reason: the malformed ones' reasons in the parsed scratch, the rules' in
    their drops (no line has both: the rules read well-formed lines only). Read with pyarrow, one
    column each."""
    counts: Counter[str] = Counter()
    for table, column in [*((f, "reason") for f in scratch), (drops, "rule")]:
        for item in pq.read_table(table, columns=[column]).column(column).combine_chunks().value_counts().to_pylist():
            if item["values"] is not None:
                counts[item["values"]] += item["counts"]
    return dict(counts)


def unreadable_file(error: str) -> str | None:
    """The file a parse task could not read (filetasks.UNREADABLE in Spark's message), or None."""
    found = re.search(rf"{re.escape(UNREADABLE)} ([^\n]*)", error)
    return f"{found.group(1)}; repair it or move it out of the input" if found else None


def damaged_input(spark: SparkSession, source: str) -> str | None:
    """What is wrong with an unreadable input on any Hadoop file system (a truncated or corrupt
    .gz), or None; a glob is not looked into. Read in full, so only after a failure."""
    if any(ch in source for ch in "*?["):
        return None
    try:
        damaged = HadoopPath(spark, source).damaged_gzip()
    except Exception:  # the input itself unreadable: Spark's own error stands
        return None
    return f"{damaged}; repair it or move it out of the input" if damaged else None


@contextmanager
def timed(step: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    log.debug("clean: %s took %.1fs", step, time.perf_counter() - started)  # `dssm -v` shows the steps


def _top(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm clean`'s options: the input and output, Spark's, and CleanConfig's fields."""
    from core.options import add_config_options
    from core.spark import add_spark_options

    p.add_argument(
        "--input",
        required=True,
        help="raw log file, directory, glob or a `dssm simulate` output: JSON lines, or a Parquet table (a file, a "
        "directory, dt=YYYY-MM-DD partitions; impression rows or result rows, docs/raw-log-format.md)",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory")
    add_spark_options(p)
    add_config_options(p.add_argument_group("rules and outputs"), CleanConfig)


def command(args: argparse.Namespace) -> None:
    """`dssm clean`."""
    from core.options import config_from_options
    from core.spark import LazySpark

    cfg = config_from_options(CleanConfig, args)
    m = clean(LazySpark(args.master, "dssm-clean"), args.input, args.out, cfg, args.force)
    c = m["counts"]
    read = (
        f"{c['lines_read']:,} lines"
        if m.get("input", {}).get("format") != "parquet"
        else f"{c['lines_read']:,} impressions"
    )
    if "rows_read" in c:
        read += f" ({c['rows_read']:,} result rows)"
    print(
        f"read {read} = kept {c['kept']:,} + rejected {c['rejected']:,}; "
        f"{c['pairs']:,} clicked pairs, {c['titles']:,} titles -> {args.out}"
    )
