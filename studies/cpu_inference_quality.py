"""Does the transformer's bfloat16 CPU path cost the served fusion any quality? (docs/studies/cpu-inference.md)

    .venv/bin/python studies/cpu_inference_quality.py --workdir bench-work/hd

The champion a work dir serves (`models:/NAME@champion`, e.g. Home Depot's lstm+bm25+minilm-ft of
`configs/homedepot_search.yaml`) ranks the judged set's whole catalogue for its test queries (PROTOCOL.md §8,
as `dssm evaluate --retrieval` measures it) twice in this process: with the transformer's towers compiled by
OpenVINO in float32 (`DSSM_CPU_PRECISION=f32`: the float32 model's arithmetic) and in bfloat16 (what a CPU
with native bfloat16 runs by default). It prints NDCG@10 and Recall@100 of the fusion and of each dense
component alone under both, their difference and the paired t-test's p over queries. The bar, set before
the run: the fusion's NDCG@10 within 0.2 points.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

from scripts_common import HOME_DEPOT


def measure(model_uri: str, eval_set, titles: list[str], threshold: float, precision: str) -> dict[str, dict]:
    """Each ranking system's §8 metrics (per_query included) with the towers compiled in `precision`."""
    from modeling.inference import PRECISION_ENV
    from scoring.catalogue import Catalogue, dense, embedding, rankings
    from scoring.quality import DEPTH, catalogue_metrics
    from scoring.systems import load_trained

    os.environ[PRECISION_ENV] = precision
    system = load_trained(model_uri)
    catalogue = Catalogue(titles)
    queries = [q.query for q in eval_set.queries]
    runs = {system.name: rankings(system, catalogue, queries)}
    for name, scorer in system.components.items():
        embed = embedding(scorer)
        if embed is not None and name != system.name:
            runs[name] = list(dense(catalogue, embed, queries, DEPTH)[1])
    out = {}
    for name, ids in runs.items():
        retrieved = {q.qid: [titles[i] for i in row] for q, row in zip(eval_set.queries, ids, strict=True)}
        out[name] = catalogue_metrics(eval_set, retrieved, threshold)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("bench-work/hd"))
    p.add_argument("--model", help="the model to measure (default: models:/dssm-DATASET@champion of the work dir)")
    p.add_argument("--judgments", type=Path, default=HOME_DEPOT)
    args = p.parse_args()
    if not args.judgments.exists():
        sys.exit(f"{args.judgments} is absent: this study needs ../shared/data")
    from scipy import stats

    from core.judgments import resolve_judged_set
    from core.tracking import default_tracking_uri, use_store
    from scoring.catalogue import catalogue_titles
    from scoring.protocol import load_eval_set, relevant_threshold
    from scoring.serving import registered_name

    judged = resolve_judged_set(args.judgments)
    eval_set = load_eval_set(judged)
    titles = catalogue_titles(judged.pairs())
    use_store(default_tracking_uri(args.workdir.resolve()))
    model = args.model or f"models:/{registered_name(judged.name)}@champion"
    threshold = relevant_threshold(eval_set)
    f32 = measure(model, eval_set, titles, threshold, "f32")
    bf16 = measure(model, eval_set, titles, threshold, "bf16")
    print(f"{model}: {len(eval_set.queries):,} test queries, {len(titles):,} titles")
    print("| system | NDCG@10 float32 | NDCG@10 bfloat16 | difference | p (paired) | Recall@100 float32 | bfloat16 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in f32:
        a, b = f32[name]["per_query"]["ndcg@10"], bf16[name]["per_query"]["ndcg@10"]
        same = np.allclose(a, b)
        p_value = 1.0 if same else float(stats.ttest_rel(a, b).pvalue)
        print(
            f"| {name} | {f32[name]['ndcg@10']:.2f} | {bf16[name]['ndcg@10']:.2f} | "
            f"{bf16[name]['ndcg@10'] - f32[name]['ndcg@10']:+.2f} | {p_value:.3g} | "
            f"{f32[name]['recall@100']:.1f} | {bf16[name]['recall@100']:.1f} |"
        )


if __name__ == "__main__":
    main()
