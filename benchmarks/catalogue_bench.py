"""Retrieval from the whole catalogue: quality on the test queries, latency, index build and memory.

    python benchmarks/catalogue_bench.py --model bench-work/hd/train/lstm/last.pt \\
        --dev bench-work/hd/negatives --synthetic 1000000

Home Depot's test queries (PROTOCOL.md §3-4) each retrieve from every distinct title of the judged
file; judged labels are the gains and unjudged titles count as not relevant (scoring/quality.py).
Systems: the model through an exact (flat) and an HNSW faiss index, BM25 (bm25s), and the hybrid
(cos + w·BM25, w fit on the dev queries of --dev as `dssm evaluate` does) re-scoring the model's top
100, or the union of the model's and BM25's top 100 (what `dssm search` does). Latency is one query
at a time, query encoding included. Then --synthetic titles (random title-like word strings drawn
from the catalogue's words) measure embedding, index build, size and latency at that scale.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

import numpy as np

from core.judgments import JudgedSetSpec, resolve_judged_set
from core.text import norm
from scoring.bm25 import CatalogueBM25
from scoring.protocol import build_eval_set, paired_test, relevant_threshold
from scoring.quality import DEPTH, catalogue_metrics
from scoring.retriever import Retriever, unit_rows
from scripts_common import HOME_DEPOT, ROOT
from stages.index.config import IndexConfig
from stages.index.job import build_faiss


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def index_bytes(index) -> int:
    import faiss

    return int(faiss.serialize_index(index).size)


def timed_build(vectors: np.ndarray, kind: str) -> tuple[object, float]:
    import faiss  # noqa: F401 (imported before the clock starts)

    started = time.perf_counter()
    index, _ = build_faiss(vectors, IndexConfig(kind=kind))
    return index, time.perf_counter() - started


def latencies(run_one, queries: list[str]) -> dict[str, float]:
    """p50/p99 milliseconds of `run_one([query])`, one query at a time."""
    run_one(queries[:1])  # warm caches and lazy initialisation
    times = []
    for q in queries:
        started = time.perf_counter()
        run_one([q])
        times.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99))}


def synthetic_titles(catalogue: list[str], n: int, seed: int = 0) -> list[str]:
    """n title-like strings: lengths and words drawn from the catalogue's (word frequencies kept)."""
    rng = np.random.default_rng(seed)
    tokens = [t.split() for t in catalogue]
    vocabulary = np.array([w for t in tokens for w in t], dtype=object)
    lengths = rng.choice(np.array([len(t) for t in tokens]), n)
    picks = rng.integers(0, len(vocabulary), lengths.sum())
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return [" ".join(vocabulary[picks[a:b]]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--judgments", type=Path, default=HOME_DEPOT)
    p.add_argument("--encoding", default="latin-1")
    p.add_argument("--model", type=Path, required=True, help="a `dssm train` checkpoint")
    p.add_argument("--dev", type=Path, help="a `dssm negatives` output: fit the hybrid's weight on its dev queries")
    p.add_argument("--synthetic", type=int, default=0, help="also index this many synthetic titles")
    p.add_argument("--latency-queries", type=int, default=500)
    p.add_argument("--out", type=Path, default=ROOT / "bench-work/catalogue_bench.json")
    args = p.parse_args()
    if not args.judgments.exists():
        sys.exit(f"{args.judgments} is absent: this benchmark needs ../shared/data")

    from scoring.hybrid import fit_weights
    from scoring.lexical import BM25, Collection
    from scoring.neural import TwoTowerEmbedder
    from stages.evaluate.job import dev_queries

    judged = resolve_judged_set(args.judgments, JudgedSetSpec(encoding=args.encoding))
    pairs = judged.pairs()
    eval_set = build_eval_set(pairs, judged.name, judged.sha256, spec=judged.spec)
    threshold = relevant_threshold(eval_set)
    catalogue = list(dict.fromkeys(norm(p.title) for p in pairs))
    queries = [q.query for q in eval_set.queries]
    result: dict = {"titles": len(catalogue), "queries": len(queries), "threshold": threshold, "systems": {}}
    print(f"{len(catalogue):,} titles, {len(queries):,} test queries")

    embedder = TwoTowerEmbedder(args.model)
    started = time.perf_counter()
    vectors = embedder.embed(catalogue, "doc")
    result["embed_titles_per_s"] = len(catalogue) / (time.perf_counter() - started)
    query_vectors = unit_rows(embedder.embed(queries, "query"))
    indexes = {}
    for kind in ("flat", "hnsw"):
        indexes[kind], seconds = timed_build(vectors, kind)
        result[f"{kind}_build_s"], result[f"{kind}_bytes"] = seconds, index_bytes(indexes[kind])

    def ranked(ids: np.ndarray) -> dict[str, list[str]]:
        return {q.qid: [catalogue[i] for i in row if i >= 0] for q, row in zip(eval_set.queries, ids, strict=True)}

    runs = {}
    for kind, index in indexes.items():
        _, ids = index.search(query_vectors, DEPTH)
        runs[f"{embedder.encoder_name} ({kind})"] = ids
    exact, approx = (runs[f"{embedder.encoder_name} ({k})"] for k in ("flat", "hnsw"))
    result["hnsw_recall_of_exact_top10"] = float(
        np.mean([len(set(a[:10]) & set(b[:10])) / 10 for a, b in zip(exact, approx, strict=True)])
    )

    started = time.perf_counter()
    bm25s_index = CatalogueBM25(catalogue)
    result["bm25_build_s"] = time.perf_counter() - started
    runs["bm25 (bm25s)"] = np.stack([bm25s_index.search(q, DEPTH)[0] for q in queries])

    if args.dev:
        bm25 = BM25.fit(Collection([p.title for p in pairs]))
        dev = build_eval_set(pairs, judged.name, judged.sha256, only=dev_queries(args.dev), spec=judged.spec)
        fusion = {"bm25": bm25.to_dict(), "weight": fit_weights(dev, embedder, [bm25]).weights[0]}
        dense_only = Retriever(indexes["flat"], catalogue, embedder, fusion)
        searcher = Retriever(indexes["flat"], catalogue, embedder, fusion, lexical=bm25s_index)  # `dssm search`
        row_of = {t: i for i, t in enumerate(catalogue)}

        def hybrid_run(retriever: Retriever) -> np.ndarray:
            return np.array([[row_of[h.title] for h in hits] for hits in retriever.search(queries, DEPTH)])

        runs[f"{embedder.encoder_name}+bm25 (model's top 100 re-scored)"] = hybrid_run(dense_only)
        runs[f"{embedder.encoder_name}+bm25 (union of both top 100, re-scored)"] = hybrid_run(searcher)

    baseline = None
    for name, ids in runs.items():
        metrics = catalogue_metrics(eval_set, ranked(ids), threshold)
        per_query = metrics.pop("per_query")["ndcg@10"]
        baseline = per_query if name.startswith("bm25") else baseline
        result["systems"][name] = metrics | {"_per_query": per_query}
    for metrics in result["systems"].values():
        metrics["p_vs_bm25"] = paired_test(np.array(metrics.pop("_per_query")), np.array(baseline))

    sample = queries[: args.latency_queries]
    flat, hnsw = indexes["flat"], indexes["hnsw"]
    one = {
        "model (flat)": Retriever(flat, catalogue, embedder).search,
        "model (hnsw)": Retriever(hnsw, catalogue, embedder).search,
        "bm25 (bm25s)": lambda q: bm25s_index.search(q[0], 10),
    }
    if args.dev:
        one["hybrid (model's top 100 re-scored)"] = dense_only.search
        one["hybrid (union of both top 100, re-scored)"] = searcher.search
    result["latency"] = {name: latencies(fn, sample) for name, fn in one.items()}
    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps({k: v for k, v in result.items() if k != "systems"}, indent=1))
    for name, m in result["systems"].items():
        print(f"| {name} | {m['ndcg@10']:.1f} | {m['recall@10']:.1f} | {m['recall@100']:.1f} | {m['p_vs_bm25']:.2g} |")

    if args.synthetic:
        big = synthetic_titles(catalogue, args.synthetic)
        started = time.perf_counter()
        big_vectors = embedder.embed(big, "doc")
        scale = {"titles": len(big), "embed_titles_per_s": len(big) / (time.perf_counter() - started)}
        built = {}
        for kind in ("flat", "hnsw"):
            built[kind], seconds = timed_build(big_vectors, kind)
            scale[f"{kind}_build_s"], scale[f"{kind}_bytes"] = seconds, index_bytes(built[kind])
        del big_vectors
        _, exact_ids = built["flat"].search(query_vectors[:200], 10)
        _, approx_ids = built["hnsw"].search(query_vectors[:200], 10)
        scale["hnsw_recall_of_exact_top10"] = float(
            np.mean([len(set(a) & set(b)) / 10 for a, b in zip(exact_ids, approx_ids, strict=True)])
        )
        scale["latency"] = {
            kind: latencies(Retriever(ix, big, embedder).search, sample[:200]) for kind, ix in built.items()
        }
        scale["peak_rss_mb"] = peak_rss_mb()
        result["synthetic"] = scale
        print(json.dumps(scale, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
