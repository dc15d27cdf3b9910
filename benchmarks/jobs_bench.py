"""Throughput of the data jobs: impressions per second through clean, vocab and negatives.

Each stage runs as its own `dssm` process on `local[2]`, as a user would run it; peak memory is
the largest resident set of that process and all its children (the Spark JVM, Python workers),
sampled every 0.2 s. Results are printed as a Markdown table and written as JSON.

    python benchmarks/jobs_bench.py --sizes 1_000_000 10_000_000
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from core.layout import Layout

ROOT = Path(__file__).resolve().parents[1]
HOME_DEPOT = ROOT.parent / "shared" / "data" / "homedepot-search-relevance" / "train.csv.zip"


def run_measured(args: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in GiB of the process tree) of `dssm ARGS`."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dssm.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode != 0:
        sys.exit(f"dssm {' '.join(args)} failed:\n{output.decode()[-3000:]}")
    return time.perf_counter() - started, peak / 2**30


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
    args = parser.parse_args()

    results = []
    for size in args.sizes:
        work = args.workdir / f"{size}"
        judged = ["--judgments", str(args.judgments)] if args.judgments else []
        row = {"impressions": size}
        for stage, stage_args in [
            ("simulate", ["simulate", "--out", str(Layout(work).simulate), "--impressions", str(size), *judged]),
            ("clean", ["clean", "--input", str(Layout(work).simulate), "--out", str(Layout(work).clean)]),
            ("vocab", ["vocab", "--clean", str(Layout(work).clean), "--out", str(Layout(work).vocab)]),
            ("negatives", ["negatives", "--clean", str(Layout(work).clean), "--out", str(Layout(work).negatives)]),
        ]:
            extra = ["--master", "local[2]", "--force"] if stage != "simulate" else ["--force"]
            seconds, peak = run_measured([*stage_args, *extra])
            row[stage] = {
                "seconds": round(seconds, 1),
                "impressions_per_s": round(size / seconds),
                "peak_rss_gib": round(peak, 2),
            }
            print(
                f"{size:>11,} {stage:<10} {seconds:8.1f}s {size / seconds:>10,.0f} imp/s  peak {peak:5.2f} GiB",
                flush=True,
            )
        results.append(row)

    machine = f"{platform.node()}: {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB"
    print(f"\nmachine: {machine}; judged set: {args.judgments or 'embedded default catalogue'}\n")
    print("| impressions | stage | seconds | impressions/s | peak RSS (GiB) |")
    print("|---:|---|---:|---:|---:|")
    for row in results:
        for stage in ("simulate", "clean", "vocab", "negatives"):
            r = row[stage]
            cells = [f"{row['impressions']:,}", stage, r["seconds"], f"{r['impressions_per_s']:,}", r["peak_rss_gib"]]
            print("| " + " | ".join(map(str, cells)) + " |")
    if len(results) >= 2:
        small, large = results[0], results[-1]
        for stage in ("clean", "vocab", "negatives"):
            ratio = large[stage]["seconds"] / small[stage]["seconds"]
            print(f"{stage}: {large['impressions'] / small['impressions']:.0f}x the data in {ratio:.1f}x the time")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": machine, "judgments": str(args.judgments), "results": results}, indent=2)
    )


if __name__ == "__main__":
    main()
