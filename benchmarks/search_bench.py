"""What `dssm search` costs with each kind of served model: load time, per-query latency and size on disk.

    python benchmarks/search_bench.py bench-work/hd/index-lstm bench-work/hd/index-lstm+bm25+minilm

Each argument is a `dssm index` output (its manifest names the model version). The queries are
Home Depot's test queries (PROTOCOL.md §3-4), answered one at a time through `Retriever.search`
(what `dssm search` and the pyfunc `retriever` call), top 10, query encoding included: for a hybrid
every component's query encoding, search and the fusion. The indexes are measured one after the
other in one process; run nothing else beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

from benchmarks.catalogue_bench import latencies, peak_rss_mb
from core.judgments import JudgedSetSpec, resolve_judged_set
from scoring.protocol import build_eval_set
from scoring.retriever import Retriever
from scripts_common import HOME_DEPOT


def disk_bytes(index_dir: Path) -> dict[str, int]:
    """Bytes of what search reads: the faiss indexes, BM25's index, the model files."""
    files = [p for p in index_dir.rglob("*") if p.is_file() and not p.name.startswith(".")]
    faiss = sum(p.stat().st_size for p in files if p.suffix == ".faiss")
    bm25 = sum(p.stat().st_size for p in files if "bm25" in p.relative_to(index_dir).parts)
    model = sum(p.stat().st_size for p in files if p.relative_to(index_dir).parts[0] == "model")
    return {"faiss_bytes": faiss, "bm25_bytes": bm25, "model_bytes": model}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("indexes", nargs="+", type=Path, help="`dssm index` output directories")
    p.add_argument("--judgments", type=Path, default=HOME_DEPOT)
    p.add_argument("--queries", type=int, default=500, help="test queries timed (default: %(default)s)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    if not args.judgments.exists():
        sys.exit(f"{args.judgments} is absent: this benchmark needs ../shared/data")
    judged = resolve_judged_set(args.judgments, JudgedSetSpec(encoding="latin-1"))
    eval_set = build_eval_set(judged.pairs(), judged.name, judged.sha256, spec=judged.spec)
    queries = [q.query for q in eval_set.queries][: args.queries]
    results = {}
    for index_dir in args.indexes:
        started = time.perf_counter()
        retriever = Retriever.load(index_dir)
        loaded = time.perf_counter() - started
        name = "+".join(retriever.components) or retriever.embedder.system_name
        timed = latencies(lambda q, r=retriever: r.search(q, 10), queries)
        results[str(index_dir)] = {"system": name, "titles": len(retriever.titles), "load_s": round(loaded, 2)}
        results[str(index_dir)] |= timed | disk_bytes(index_dir) | {"peak_rss_mb": round(peak_rss_mb())}
        print(json.dumps(results[str(index_dir)]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
