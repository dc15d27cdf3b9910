"""A catalogue of a million titles, indexed and served: what the index kind, its build and its service cost.

    python benchmarks/million_catalogue.py --model models:/dssm-homedepot-search-relevance-train/1

1. Synthesises `--titles` (1,000,000) distinct titles from the judged set's (Home Depot's): each a real
   title with one to three of its words replaced by words drawn from the catalogue's vocabulary (by their
   frequency) and a size appended, seeded; written as Parquet (WORKDIR/million/titles/).
2. `dssm index --model MODEL --titles ... --out WORKDIR/million/index --no-register`: the index stage
   as the flow runs it; above `index.flat_max` titles it builds HNSW and reports its recall@10 against
   exact search (the manifest's counts).
3. `benchmarks/serve_bench.py --index WORKDIR/million/index` at `--rate` requests/s: the service on it.
Prints the index's counts and the service's line per rate. Each step is skipped when its output is there.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

from scripts_common import HOME_DEPOT, ROOT

SIZES = ("1/2 in.", "3/4 in.", "1 in.", "2 ft.", "4 ft.", "8 ft.", "10 oz.", "1 gal.", "5 gal.", "12-pack", "2-pack")


def synthesise(judgments: Path, n: int, out: Path, seed: int = 0) -> int:
    """`n` distinct titles made from the judged set's, into OUT/part-*.parquet; returns how many."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from core.judgments import resolve_judged_set
    from core.text import norm

    real = list(dict.fromkeys(norm(p.title) for p in resolve_judged_set(judgments).pairs()))
    words, counts = np.unique([w for t in real for w in t.split()], return_counts=True)
    p = counts / counts.sum()
    rng = np.random.default_rng(seed)
    seen: set[str] = set(real)
    titles = list(real[:n])
    while len(titles) < n:
        batch = rng.integers(0, len(real), 100_000)
        swaps = rng.choice(words, size=(len(batch), 3), p=p)
        for row, i in enumerate(batch):
            tokens = real[i].split()
            for j in range(int(rng.integers(1, 4))):
                tokens[int(rng.integers(0, len(tokens)))] = swaps[row, j]
            title = " ".join(tokens) + " " + SIZES[int(rng.integers(0, len(SIZES)))]
            if title not in seen:
                seen.add(title)
                titles.append(title)
                if len(titles) == n:
                    break
    out.mkdir(parents=True, exist_ok=True)
    per_file = 250_000
    for k, start in enumerate(range(0, n, per_file)):
        pq.write_table(pa.table({"title": titles[start : start + per_file]}), out / f"part-{k:05d}.parquet")
    return len(titles)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=ROOT / "bench-work" / "hd", help="a `dssm run` work dir")
    p.add_argument("--model", required=True, help="the registered model version to index with")
    p.add_argument("--judgments", type=Path, default=HOME_DEPOT)
    p.add_argument("--titles", type=int, default=1_000_000)
    p.add_argument("--rate", type=float, nargs="+", default=[100.0])
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args()
    if not args.judgments.exists():
        sys.exit(f"{args.judgments} is absent: this benchmark needs ../shared/data")
    root = args.workdir / "million"
    titles, index = root / "titles", root / "index"
    if not titles.is_dir():
        started = time.perf_counter()
        made = synthesise(args.judgments, args.titles, titles)
        print(f"{made:,} titles synthesised in {time.perf_counter() - started:.0f}s -> {titles}", flush=True)
    dssm = str(ROOT / ".venv" / "bin" / "dssm")
    uri = f"sqlite:///{args.workdir.resolve()}/mlflow.db"
    started = time.perf_counter()
    cmd = [dssm, "index", "--model", args.model, "--titles", str(titles), "--out", str(index), "--no-register"]
    subprocess.run([*cmd, "--mlflow-uri", uri], check=True)
    print(f"dssm index took {time.perf_counter() - started:.0f}s", flush=True)
    counts = json.loads((index / "manifest.json").read_text())["counts"]
    print(json.dumps(counts), flush=True)
    bench = [sys.executable, str(ROOT / "benchmarks" / "serve_bench.py"), "--workdir", str(args.workdir)]
    bench += ["--index", str(index), "--seconds", str(args.seconds), "--rate", *map(str, args.rate)]
    subprocess.run(bench, check=True)


if __name__ == "__main__":
    main()
