"""A rolling window over date-partitioned logs: each day cleaned once, the window's counts summed.

Logs that land one day at a time (`ROOT/dt=YYYY-MM-DD/…`, as `dssm simulate --day` writes them) are
cleaned day by day by `stages.clean.job.clean` into `DAYS/dt=…/`, each cached by its own partition's
fingerprint (stages/clean/hadoopfs.py: its files' names, lengths, modification times and file-system
checksums): a nightly run parses only the day that is new, or a day with a file added, removed or
rewritten. ROOT is a path or URI on any Hadoop file system (`file://`, `hdfs://`, `s3a://`, a
relative path): partitions are listed and fingerprinted through Spark's Hadoop FileSystem, never
by reading their bytes, so a remote root is cached as a local one is. The
window's clean output (the `clean` stage's usual `pairs/` and `titles/`) is the sum of its days'
per-(query, title) clicks and impressions; counts reconcile per day (in each day's manifest) and
for the window (read = kept + rejected, summed).

The rules run per day: a duplicate impression id or a bot's minute that straddles midnight is
judged within each day only (docs/raw-log-format.md).

A day of the window without logs (no partition, an empty one) is left out and listed in the
manifest with why; a `dt=…` entry that is not a dated directory (`dt=2026-13-40`, `dt=2026-2-2`) is
not read, with a warning, and listed too.

Under the judge's time split one day, the test day, is cleaned but held out of the window's sums
(pairs, titles, impressions): the manifest's `held_out` names its own clean output, which only the
judge stage reads (stages/judge/stage.py). A window whose only day with logs is the test day (a first
night) holds nothing out: that night's set is graded on the query split.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.artifacts import code_fingerprint, publish, read_manifest
from core.errors import DssmError
from core.schemas import CLICK_PAIRS, TITLES, check_parquet
from stages.clean.config import CleanConfig
from stages.clean.hadoopfs import FileInfo, HadoopPath, fingerprint
from stages.clean.job import clean, fs_log_dir

PARTITION = re.compile(r"^dt=(\d{4}-\d{2}-\d{2})$")
log = logging.getLogger(__name__)


def partitions(spark, root: str | Path) -> tuple[dict[str, HadoopPath], dict[str, str]]:
    """(date -> directory of each `dt=YYYY-MM-DD` partition under a log root on any Hadoop file
    system, name -> why not read of each other `dt=…` entry: not a date, or not a directory). Other
    names are not partitions."""
    base = HadoopPath(spark, str(root))
    if not base.is_dir():
        why = "is not a directory" if base.exists() else "not found"
        raise DssmError(f"log root {why}: {root} (expected dt=YYYY-MM-DD partitions in it)")
    found, bad = {}, {}
    for name, is_dir in base.children():
        if not name.startswith("dt="):
            continue
        match = PARTITION.match(name)
        if not match:
            bad[name] = "not a dt=YYYY-MM-DD name"
            continue
        try:
            date.fromisoformat(match.group(1))
        except ValueError as e:
            bad[name] = f"not a date ({e})"
            continue
        if not is_dir:
            bad[name] = "not a directory"
            continue
        found[match.group(1)] = base / name
    return found, bad


def day_logs(partition: HadoopPath) -> tuple[HadoopPath, list[FileInfo]]:
    """Where a partition's lines are (a `dssm simulate` output's logs/, else itself) and its data files."""
    logs = fs_log_dir(partition)
    return logs, logs.files()


def no_logs(partition: HadoopPath, files: list[FileInfo]) -> str | None:
    """Why a partition holds no log lines to read (no files, or only empty ones), else None: such a
    day is a day without logs, not a failed night."""
    if not files:
        return f"{partition.name} is an empty directory"
    if not any(f.length for f in files):
        return f"{partition.name} holds only empty files"
    return None


def clean_window(
    spark,
    root: str | Path,
    dates: list[str],
    days_dir: Path,
    out: Path,
    cfg: CleanConfig,
    force: bool = False,
    hold_out: str = "",
) -> dict[str, Any]:
    """Clean each partition of `dates` present under `root` (a path or URI on any Hadoop file system)
    into `days_dir/dt=…` (skipped when its fingerprint is unchanged), then write the window's pairs
    and titles to `out`; returns its manifest. `hold_out`: a day cleaned but left out of the window's
    sums (the time split's test day, unless it is the only day with logs), named in the manifest's `held_out`."""
    present, bad = partitions(spark, root)
    for name, why in bad.items():
        log.warning("%s/%s is not read: %s", root, name, why)
    listed = {d: day_logs(present[d]) for d in dates if d in present}
    # A day without logs (no partition, or an empty one) is left out and listed, not fatal: a
    # nightly run still trains on the days that landed.
    why_missing = {d: f"no partition dt={d}" for d in dates if d not in present}
    why_missing |= {d: why for d, (_, files) in listed.items() if (why := no_logs(present[d], files))}
    why_missing = dict(sorted(why_missing.items()))
    for day, why in why_missing.items():
        log.warning("window %s..%s of %s: day %s left out (%s)", dates[0], dates[-1], root, day, why)
    days = [d for d in dates if d not in why_missing]
    if not days:
        raise DssmError(
            f"{root}: no logs in the window {dates[0]}..{dates[-1]} ({'; '.join(why_missing.values())}; "
            f"partitions found: {_span(present)})"
        )
    # Spark reads the qualified path that was listed, whatever its working directory.
    fingerprints = {d: (listed[d][0].qualified, fingerprint(listed[d][1])) for d in days}
    manifests = {
        d: clean(spark, str(present[d]), days_dir / f"dt={d}", cfg, force, listed=fingerprints[d]) for d in days
    }
    cleaned = sum(not m["skipped"] for m in manifests.values())
    held_out = {}
    if days == [hold_out] == dates[-1:]:  # a first night: the set is graded from the window (query split)
        log.warning("window %s..%s: %s, the test day, is its only day with logs: not held out", dates[0], dates[-1],
                    hold_out)  # fmt: skip
    elif hold_out in manifests:
        days.remove(hold_out)
        held_out = {"date": hold_out, "path": str(days_dir / f"dt={hold_out}")}
        held_out["sha256"] = manifests.pop(hold_out)["content_sha256"]
        log.info("window %s..%s: day %s held out of the window's sums (the test day)", dates[0], dates[-1], hold_out)
        if not days:  # the kept evaluation set's day is all that landed: training would read its traffic
            raise DssmError(
                f"{root}: the window {dates[0]}..{dates[-1]} has logs on {hold_out} alone, the test day of the "
                "evaluation set in use, which training must not read: no day is left to train on (wait for "
                "tonight's logs, or set judge.split=query)"
            )
    inputs = {f"dt={d}": {"path": str(days_dir / f"dt={d}"), "sha256": manifests[d]["content_sha256"]} for d in days}
    params = {"window": [dates[0], dates[-1]], "rows_per_file": cfg.rows_per_file, "impressions": cfg.impressions}
    # In the key, so that the manifest's lists stay true when only they change (a bad name appears).
    params |= {"missing": why_missing, "bad_partitions": bad, "held_out": held_out}

    def build(tmp: Path) -> dict[str, Any]:
        pairs = _summed([days_dir / f"dt={d}" / "pairs" for d in days], ["query", "title"], CLICK_PAIRS)
        titles = _summed([days_dir / f"dt={d}" / "titles" for d in days], ["title"], TITLES)
        n_pairs = _write(pairs, tmp / "pairs", CLICK_PAIRS, cfg.rows_per_file)
        n_titles = _write(titles, tmp / "titles", TITLES, cfg.rows_per_file)
        if cfg.impressions:
            _link_impressions({d: days_dir / f"dt={d}" / "impressions" for d in days}, tmp / "impressions")
        per_day = {d: manifests[d]["counts"] for d in days}
        reasons: dict[str, int] = {}
        for counts in per_day.values():
            for reason, n in counts["rejected_by_reason"].items():
                reasons[reason] = reasons.get(reason, 0) + n
        total = {k: sum(c[k] for c in per_day.values()) for k in ("lines_read", "kept", "rejected")}
        if total["lines_read"] != total["kept"] + total["rejected"]:
            raise DssmError(f"internal error: the window's counts do not reconcile: {total}")
        return {
            "counts": {
                **total,
                "rejected_by_reason": dict(sorted(reasons.items())),
                "pairs": n_pairs,
                "queries": len(pc.unique(pairs.column("query"))),
                "titles": n_titles,
                "days": len(days),
            },
            "window": {
                "dates": dates,
                "days": {
                    d: {
                        "path": str(present[d]),
                        "sha256": manifests[d]["inputs"]["raw"]["sha256"],
                        "lines_read": per_day[d]["lines_read"],
                        "kept": per_day[d]["kept"],
                        "rejected": per_day[d]["rejected"],
                    }
                    for d in days
                },
                "missing": list(why_missing),
                "why_missing": why_missing,
                "bad_partitions": bad,
            },
            **({"held_out": held_out} if held_out else {}),
            "outputs": {
                "pairs": "pairs/",
                "titles": "titles/",
                **({"impressions": "impressions/"} if cfg.impressions else {}),
                "rejects": "per day: " + str(days_dir),
            },
        }

    manifest = publish(out, "clean", code_fingerprint(__name__), inputs, params, build, force=force)
    # The stage did work when one of its days was (re)cleaned, even if the window's sums came out the same.
    return manifest | {
        "counts": manifest["counts"] | {"days_cleaned": cleaned},
        "skipped": manifest["skipped"] and not cleaned,
    }


def _summed(paths: list[Path], keys: list[str], schema: pa.Schema) -> pa.Table:
    """Rows of every path summed by `keys` (clicks, impressions), sorted by them: the bytes depend
    on the data only."""
    table = pa.concat_tables([pq.read_table(p, schema=schema) for p in paths])
    sums = table.group_by(keys).aggregate([("clicks", "sum"), ("impressions", "sum")])
    sums = sums.rename_columns([c.removesuffix("_sum") for c in sums.column_names])
    return sums.select(schema.names).sort_by([(k, "ascending") for k in keys]).cast(schema)


def _write(table: pa.Table, path: Path, schema: pa.Schema, rows_per_file: int) -> int:
    path.mkdir(parents=True)
    for i, start in enumerate(range(0, max(table.num_rows, 1), rows_per_file)):
        pq.write_table(table.slice(start, rows_per_file), path / f"part-{i:05d}.parquet", compression="zstd")
    check_parquet(path, schema)
    return table.num_rows


def _link_impressions(days: dict[str, Path], out: Path) -> None:
    """The window's impressions are its days' own files, hard-linked (no copy of the largest
    output; a day recleaned later gets new files, so the window keeps what it was built from)."""
    out.mkdir(parents=True)
    for day, path in days.items():
        for part in sorted(path.glob("*.parquet")):
            target = out / f"dt={day}-{part.name}"
            try:
                os.link(part, target)
            except OSError:  # another filesystem
                shutil.copy2(part, target)


def _span(present: dict[str, HadoopPath]) -> str:
    return f"{min(present)}..{max(present)}" if present else "none"


def window_inputs(clean_dir: Path) -> list[tuple[str, str, str]]:
    """(name, path, raw partition sha256) of each day of a window's clean output; empty for a
    clean output that is not a window."""
    window = (read_manifest(clean_dir) or {}).get("window") or {}
    return [(f"logs/dt={d}", day["path"], day["sha256"]) for d, day in window.get("days", {}).items()]
