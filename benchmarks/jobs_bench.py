"""Throughput of the data jobs: impressions per second through clean, vocab and negatives.

Each stage runs as its own `dssm` process on `local[2]`, as a user would run it; peak memory is
the largest resident set of that process and all its children (the Spark JVM, Python workers),
sampled every 0.2 s. Results are printed as a Markdown table and written as JSON.

    python benchmarks/jobs_bench.py --sizes 1_000_000 10_000_000
    python benchmarks/jobs_bench.py --sizes 1_000_000 --log-formats 1 2 --stages simulate clean

--log-formats 1 2 runs each size in both raw-log formats, side by side: v1 lines carry titles, v2
lines carry doc ids with the titles in a catalogue side table (docs/raw-log-format.md).
`parquet` and `parquet-results` clean the v2 log's Parquet twin instead (docs/raw-log-format.md,
"Parquet tables": impression rows, or result rows; a UTC timestamp column), written by
`benchmarks._parquet_twin.write_twin` after simulate, not timed.
--no-impressions measures clean without its impressions/ output.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

import psutil

from core.layout import Layout
from scripts_common import HOME_DEPOT, ROOT, run_measured

STAGES = ("simulate", "clean", "vocab", "negatives")
FORMATS = {"1": 1, "2": 2, "parquet": 2, "parquet-results": 2}  # -> the log format simulated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", type=lambda s: int(s.replace("_", "")), default=[1_000_000, 10_000_000])
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench-work")
    parser.add_argument(
        "--judgments",
        type=Path,
        default=HOME_DEPOT if HOME_DEPOT.exists() else None,
        help="judged set to simulate from (default: Home Depot if present, else the embedded one)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench-work" / "jobs_bench.json")
    parser.add_argument(
        "--log-formats", nargs="+", default=["1"], choices=list(FORMATS), help="raw-log formats: " + ", ".join(FORMATS)
    )
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument(
        "--no-impressions", action="store_true", help="clean without impressions/ (`dssm clean --no-impressions`)"
    )
    args = parser.parse_args()
    clean_opts = ["--no-impressions"] if args.no_impressions else []

    results = []
    for size, log_format in [(size, f) for size in args.sizes for f in args.log_formats]:
        simulated = FORMATS[log_format]
        work = args.workdir / (f"{size}" if simulated == 1 else f"{size}-v{simulated}")
        judged = ["--judgments", str(args.judgments)] if args.judgments else []
        judged += ["--log-format", str(simulated)]
        row = {"impressions": size, "log_format": log_format}
        logs, clean_input = Layout(work).simulate, []
        if log_format.startswith("parquet"):
            logs = work / log_format
            clean_input = ["--catalogue", str(Layout(work).simulate / "catalogue.parquet")]
        for stage, stage_args in [
            ("simulate", ["simulate", "--out", str(Layout(work).simulate), "--impressions", str(size), *judged]),
            ("clean", ["clean", "--input", str(logs), *clean_input, "--out", str(Layout(work).clean), *clean_opts]),
            ("vocab", ["vocab", "--clean", str(Layout(work).clean), "--out", str(Layout(work).vocab)]),
            ("negatives", ["negatives", "--clean", str(Layout(work).clean), "--out", str(Layout(work).negatives)]),
        ]:
            if stage not in args.stages:
                continue
            if stage == "clean" and log_format.startswith("parquet") and not logs.exists():
                from benchmarks._parquet_twin import write_twin

                shape = "result_rows" if log_format == "parquet-results" else "impression_rows"
                write_twin(Layout(work).simulate / "logs", logs, shape)
            extra = ["--master", "local[2]", "--force"] if stage != "simulate" else ["--force"]
            seconds, peak = run_measured([*stage_args, *extra])
            row[stage] = {
                "seconds": round(seconds, 1),
                "impressions_per_s": round(size / seconds),
                "peak_rss_gib": round(peak, 2),
            }
            print(
                f"{size:>11,} {log_format:>15} {stage:<10} {seconds:8.1f}s {size / seconds:>10,.0f} imp/s"
                f"  peak {peak:5.2f} GiB",
                flush=True,
            )
        results.append(row)

    machine = f"{platform.node()}: {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB"
    print(f"\nmachine: {machine}; judged set: {args.judgments or 'embedded default catalogue'}\n")
    print("| impressions | log format | stage | seconds | impressions/s | peak RSS (GiB) |")
    print("|---:|---:|---|---:|---:|---:|")
    for row in results:
        for stage in (s for s in STAGES if s in row):
            r = row[stage]
            cells = [f"{row['impressions']:,}", row["log_format"], stage, r["seconds"]]
            cells += [f"{r['impressions_per_s']:,}", r["peak_rss_gib"]]
            print("| " + " | ".join(map(str, cells)) + " |")
    for log_format in args.log_formats:
        rows = [r for r in results if r["log_format"] == log_format]
        if len(rows) < 2:
            continue
        small, large = rows[0], rows[-1]
        for stage in (s for s in ("clean", "vocab", "negatives") if s in small):
            ratio = large[stage]["seconds"] / small[stage]["seconds"]
            growth = large["impressions"] / small["impressions"]
            print(f"{log_format} {stage}: {growth:.0f}x the data in {ratio:.1f}x the time")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": machine, "judgments": str(args.judgments), "results": results}, indent=2)
    )


if __name__ == "__main__":
    main()
