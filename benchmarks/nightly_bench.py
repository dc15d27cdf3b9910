"""A windowed nightly retrain: the "next night" run against a full rerun of the same night.

Three `dssm run`s of a two-day window, as a scheduled deployment would start them, each its own
process on Spark `local[2]`:

1. night 1 (run_date D1): simulates day 1 into WORKDIR/logs/dt=D1, cleans it, trains from scratch;
2. night 2 (run_date D2): simulates day 2, cleans only day 2 (day 1 is cached), sums the window,
   trains warm-started from night 1's champion: the "next night";
3. the same night 2 again from nothing but the logs (every cache and output deleted): the full rerun.

Simulating a day stands for logs landing; it is shown per stage and left out of the compared
totals. Results are printed as a Markdown table and written as JSON.

    python benchmarks/nightly_bench.py --impressions 10_000_000
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

import psutil

from core.layout import Layout
from scripts_common import HOME_DEPOT, ROOT, run_measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impressions", type=lambda s: int(s.replace("_", "")), default=1_000_000, help="per day")
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench-work" / "nightly")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-work" / "nightly_bench.json")
    parser.add_argument("--log-format", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument(
        "--judgments",
        type=Path,
        default=HOME_DEPOT if HOME_DEPOT.exists() else None,
        help="judged set to simulate from (default: Home Depot if present; the embedded catalogue's 1,187 titles "
        "are too few for 10M impressions a day: a query gets clicks on every title)",
    )
    args = parser.parse_args()

    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    common = [
        "run",
        "--workdir",
        str(work),
        "--window-days",
        "2",
        "--impressions",
        str(args.impressions),
        "--epochs",
        str(args.epochs),
        "--master",
        "local[2]",
        "--no-index",
        "--no-analyze",
        f"simulate.log_format={args.log_format}",
        *(["--judgments", str(args.judgments)] if args.judgments else []),
    ]
    runs = []
    for label, day in (("night 1", "2026-01-01"), ("night 2 (next night)", "2026-01-02"), ("night 2, full rerun", "")):
        if not day:  # everything but the logs goes: the same night computed from scratch
            for path in work.iterdir():
                if path.name != Layout(work).logs.name:
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            day = "2026-01-02"
        seconds, peak = run_measured([*common, "--run-date", day])
        stages = json.loads(Layout(work).report.read_text())["pipeline"]["stages"]
        per_stage = {s["stage"]: (0.0 if s["skipped"] else s["seconds"]) for s in stages}
        runs.append(
            {
                "run": label,
                "seconds": round(seconds, 1),
                "without_simulate": round(seconds - per_stage.get("simulate", 0.0), 1),
                "peak_rss_gib": round(peak, 2),
                "stages": per_stage,
                "days_cleaned": next(s for s in stages if s["stage"] == "clean")["counts"].get("days_cleaned"),
            }
        )
        print(f"{label:<22} {seconds:7.1f}s  {per_stage}", flush=True)

    machine = f"{platform.node()}: {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB"
    names = ["simulate", "clean", "vocab", "negatives", "train", "evaluate"]
    data = args.judgments.name if args.judgments else "the embedded catalogue"
    print(f"\nmachine: {machine}; {args.impressions:,} impressions a day from {data}, log format v{args.log_format}\n")
    print("| run | days cleaned | " + " | ".join(names) + " | total | total without simulate |")
    print("|---|---:|" + "---:|" * (len(names) + 2))
    for r in runs:
        cells = [r["run"], r["days_cleaned"], *(f"{r['stages'].get(n, 0.0):.1f}" for n in names)]
        print("| " + " | ".join(map(str, [*cells, r["seconds"], r["without_simulate"]])) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {"machine": machine, "judgments": str(args.judgments), "impressions_per_day": args.impressions}
    record["runs"] = runs
    args.out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
