"""Position bias estimated from the logs (`dssm propensity`) against the simulator's truth rank^-eta.

For each eta: simulate a v2 log from the judged set with that examination exponent, clean it
(its impressions/), estimate the curve by EM under the position-based model, and compare it
rank by rank with rank^-eta. One Spark session (`local[2]`), in process. Prints a Markdown
table and writes JSON.

    python benchmarks/propensity_bench.py --impressions 200_000 --etas 1.0 1.5 2.0
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

import psutil

from scripts_common import HOME_DEPOT, ROOT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impressions", type=lambda s: int(s.replace("_", "")), default=200_000)
    parser.add_argument("--etas", type=float, nargs="+", default=[1.0, 1.5, 2.0])
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench-work" / "propensity")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-work" / "propensity_bench.json")
    parser.add_argument(
        "--judgments", type=Path, default=HOME_DEPOT if HOME_DEPOT.exists() else None, help="default: Home Depot"
    )
    args = parser.parse_args()
    # imported once the arguments are read: --help answers without starting Spark's libraries
    from core.judgments import DEFAULT_CATALOGUE, JudgedSetSpec, resolve_judged_set
    from core.spark import get_spark
    from stages.clean.job import clean
    from stages.propensity.job import propensity, read_curve
    from stages.simulate.config import ClickModel, SimulationConfig
    from stages.simulate.job import simulate

    judged = resolve_judged_set(args.judgments, JudgedSetSpec(), DEFAULT_CATALOGUE)
    pairs = judged.pairs()
    spark = get_spark("local[2]")
    results = []
    for eta in args.etas:
        work = args.workdir / f"eta-{eta:g}"
        shutil.rmtree(work, ignore_errors=True)
        model = ClickModel(eta=eta)
        cfg = SimulationConfig(impressions=args.impressions, seed=args.seed, log_format=2, model=model)
        simulate(pairs, work / "simulate", cfg, judged.describe())
        clean(spark, str(work / "simulate"), work / "clean")
        started = time.perf_counter()
        propensity(spark, work / "clean", work / "propensity")
        seconds = time.perf_counter() - started
        curve = read_curve(work / "propensity")
        rows = [
            {"rank": r, "estimated": v, "truth": round(r**-eta, 6), "error": round(v / r**-eta - 1, 4)}
            for r, v in zip(curve["ranks"], curve["examination"], strict=True)
        ]
        results.append({"eta": eta, "seconds": round(seconds, 1), "curve": curve, "rows": rows})
        print(
            f"eta {eta:g}: {curve['impressions']:,} impressions, {curve['cells']:,} cells, "
            f"{curve['iterations']} EM iterations, {seconds:.1f}s",
            flush=True,
        )

    machine = f"{platform.node()}: {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB"
    print(f"\nmachine: {machine}; judged set: {judged.name}; {args.impressions:,} impressions per log\n")
    print("| rank | " + " | ".join(f"η={r['eta']:g}: estimated / truth (error)" for r in results) + " |")
    print("|---:|" + "---:|" * len(results))
    for i in range(max(len(r["rows"]) for r in results)):
        cells = []
        for r in results:
            row = r["rows"][i] if i < len(r["rows"]) else None
            cells.append(f"{row['estimated']:.3f} / {row['truth']:.3f} ({row['error']:+.1%})" if row else "")
        print(f"| {i + 1} | " + " | ".join(cells) + " |")
    args.out.write_text(json.dumps({"machine": machine, "judgments": judged.name, "results": results}, indent=2))


if __name__ == "__main__":
    main()
