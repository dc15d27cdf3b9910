"""Dev study for issue 40: mined hard negatives and masked in-batch negatives, measured by retrieval
from the whole catalogue (PROTOCOL.md §8) on the validation queries, seeds 1-3.

    .venv/bin/dssm run --config configs/homedepot_table4/lstm.yaml --workdir bench-work/hd   # data, seed 1, index
    .venv/bin/python studies/retrieval_mining.py --workdir bench-work/hd

Each variant trains Table IV's LSTM-RNN config (configs/homedepot_table4/lstm.yaml) with its own
training keys, on the run's negatives or on negatives mined by `dssm mine` from the run's index
(the seed-1 model's own index: what a second night would mine from), into
WORKDIR/study/VARIANT-sSEED (finished runs are kept). Every model is then scored on the dev queries
(the validation queries of `dssm negatives`, never test queries): full-catalogue strict NDCG@10,
Recall@100, judged@10 and condensed NDCG@10 of the model alone and of its z-score fusion with BM25
(union of both top 200, equal weights), and re-ranking NDCG@1/3/10 of the judged titles (Table IV's
task, which must not regress). Prints seed means ± sd per variant and writes WORKDIR/study/dev.json.
With --test, the same on the test queries (once the setting is chosen).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

import numpy as np

from scripts_common import HOME_DEPOT, TABLE4, dssm, training_keys

MINE = ["--source", "index", "--min-rank", "10", "--max-rank", "100", "--relative-margin", "0.05"]
# name: (training keys, `dssm mine` options or None for the sampled negatives)
VARIANTS = {
    "base": ([], None),
    "mask": (["loss.mask_in_batch=true"], None),
    "mine25": (["loss.mask_in_batch=true"], ["--hard", "0.25", *MINE]),
    "mine50": (["loss.mask_in_batch=true"], ["--hard", "0.5", *MINE]),
}


def checkpoint(workdir: Path, variant: str, seed: int) -> Path:
    if variant == "base" and seed == 1:  # the run's own model: the same config and seed
        return workdir / "train" / "lstm" / "last.pt"
    return workdir / "study" / f"{variant}-s{seed}" / "last.pt"


def train(workdir: Path, variant: str, seeds: list[int]) -> None:
    keys, mine = VARIANTS[variant]
    negatives = workdir / "negatives"
    if mine is not None:
        if not (workdir / "index" / "manifest.json").is_file():
            sys.exit(f"{workdir}/index is absent: the run's index stage builds it")
        negatives = workdir / "study" / f"negatives-{variant}"
        dssm("mine", "--negatives", str(workdir / "negatives"), "--index", str(workdir / "index"),
             "--out", str(negatives), *mine)  # fmt: skip
    base = training_keys(TABLE4 / "lstm.yaml")
    for seed in seeds:
        if variant == "base" and seed == 1:
            continue
        out = checkpoint(workdir, variant, seed).parent
        # a finished run is skipped and a killed one resumes; one trained by other code is an error, never
        # silently retrained (the study's numbers are of the models on disk)
        dssm("train", "--resume", "--on-change", "error", *base, *keys, f"seed={seed}", f"out={out}",
             f"data.negatives={negatives}",
             f"data.vocab={workdir / 'vocab'}", f"mlflow_uri=sqlite:///{workdir / 'study' / 'mlflow.db'}",
             "experiment=retrieval-mining")  # fmt: skip


def score(workdir: Path, judgments: Path, variants: list[str], seeds: list[int], test: bool) -> dict:
    from core.judgments import JudgedSetSpec, resolve_judged_set
    from scoring.catalogue import Catalogue, dense
    from scoring.catalogue import fused as fused_ids
    from scoring.fusion import RetrievalFusion
    from scoring.neural import TwoTowerEmbedder
    from scoring.protocol import CUTOFFS, build_eval_set, evaluate_scores, relevant_threshold
    from scoring.quality import catalogue_metrics
    from stages.evaluate.job import dev_queries

    judged = resolve_judged_set(judgments, JudgedSetSpec(encoding="latin-1"))
    pairs = judged.pairs()
    only = None if test else dev_queries(workdir / "negatives")
    eval_set = build_eval_set(pairs, judged.name, judged.sha256, only=only, spec=judged.spec)
    threshold = relevant_threshold(eval_set)
    catalogue = Catalogue.of_judged(pairs)
    queries = [q.query for q in eval_set.queries]
    fusion = RetrievalFusion("zscore", 200, (0.5, 0.5))
    print(f"{len(queries)} {'test' if test else 'dev'} queries, {len(catalogue.titles):,} titles")

    def measured(ids) -> dict[str, float]:
        retrieved = {q.qid: [catalogue.titles[i] for i in row] for q, row in zip(eval_set.queries, ids, strict=True)}
        m = catalogue_metrics(eval_set, retrieved, threshold)
        return {k: v for k, v in m.items() if k != "per_query"} | {"per_query": m["per_query"]["ndcg@10"].tolist()}

    out: dict = {"queries": len(queries), "split": "test" if test else "dev", "variants": {}}
    bm25 = measured([catalogue.bm25.search(q, 1000)[0] for q in queries])
    out["bm25"] = bm25
    for variant in variants:
        rows = out["variants"].setdefault(variant, {})
        for seed in seeds:
            embedder = TwoTowerEmbedder(checkpoint(workdir, variant, seed))
            model = measured(dense(catalogue, embedder.embed, queries, 1000)[1])
            fused = measured(fused_ids(catalogue, {variant: embedder, "bm25": None}, queries, fusion, 1000))
            q, t = eval_set.pairs()
            rerank = evaluate_scores(eval_set, variant, embedder.score(q, t), threshold)
            rows[str(seed)] = {"model": model, "zscore": fused} | {
                f"rerank_ndcg@{k}": rerank.mean(f"ndcg@{k}") for k in CUTOFFS
            }
            print(f"{variant} seed {seed}: model {model['ndcg@10']:.2f}, zscore {fused['ndcg@10']:.2f}", flush=True)
    return out


def table(result: dict) -> str:
    from scipy import stats

    def ms(values: list[float]) -> str:
        return f"{np.mean(values):.2f} ± {np.std(values, ddof=1) if len(values) > 1 else 0:.2f}"

    bm = result["bm25"]
    lines = [
        f"{result['split']} queries: {result['queries']}; BM25 NDCG@10 {bm['ndcg@10']:.2f}, "
        f"Recall@100 {bm['recall@100']:.2f}, judged@10 {bm['judged@10']:.2f}, condensed {bm['condensed_ndcg@10']:.2f}",
        "",
        "| variant | model NDCG@10 | Recall@100 | judged@10 | condensed NDCG@10 | z-score fusion NDCG@10 "
        "| p fusion vs BM25 | re-rank NDCG@1 / @3 / @10 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant, seeds in result["variants"].items():
        runs = list(seeds.values())
        metrics = ("ndcg@10", "recall@100", "judged@10", "condensed_ndcg@10")
        cell = {m: ms([r["model"][m] for r in runs]) for m in metrics}
        fused = np.mean([r["zscore"]["per_query"] for r in runs], axis=0)
        p = stats.ttest_rel(fused, bm["per_query"]).pvalue
        rerank = " / ".join(f"{np.mean([r[f'rerank_ndcg@{k}'] for r in runs]):.2f}" for k in (1, 3, 10))
        lines.append(
            f"| {variant} ({len(runs)} seeds) | {cell['ndcg@10']} | {cell['recall@100']} | {cell['judged@10']} | "
            f"{cell['condensed_ndcg@10']} | {ms([r['zscore']['ndcg@10'] for r in runs])} | {p:.2g} | {rerank} |"
        )
    return "\n".join(lines)


def evaluate(workdir: Path, judgments: Path, variants: list[str], seeds: list[int]) -> None:
    """One `dssm evaluate` of every variant's models on the test queries, then per variant the
    re-ranking and retrieval seed means with paired t-tests of the seed-averaged per-query values."""
    from reproductions.homedepot_table4 import retrieval_table, seed_table

    out = workdir / "study" / "test-eval"
    models = [a for v in variants for s in seeds for a in ("--model", str(checkpoint(workdir, v, s)))]
    dssm("evaluate", "--judgments", str(judgments), "--out", str(out), "--baselines", "bm25,minilm", "--retrieval",
         "--hybrid-dev", str(workdir / "negatives"), *models)  # fmt: skip
    print((out / "report.md").read_text())
    for v in variants:  # evaluate names models of one encoder by their run directory
        names = [checkpoint(workdir, v, s).parent.name for s in seeds]
        systems = {"": names, "+bm25": [f"{n}+bm25" for n in names]}
        print(f"\n## {v}")
        print(seed_table(out, v, systems, ["bm25", "minilm"]))
        print(retrieval_table(out, v, systems))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--judgments", type=Path, default=HOME_DEPOT)
    p.add_argument("--workdir", type=Path, default=Path("bench-work/hd"))
    p.add_argument("--variants", default=",".join(VARIANTS), help="(default: %(default)s)")
    p.add_argument("--seeds", default="1,2,3", help="(default: %(default)s)")
    p.add_argument("--test", action="store_true", help="score on the test queries (after choosing on dev)")
    p.add_argument("--score-only", action="store_true", help="train nothing; score the finished runs")
    p.add_argument(
        "--evaluate",
        action="store_true",
        help="after choosing on dev: `dssm evaluate --retrieval` of the variants' models on the test queries (each "
        "model and its hybrid with the retrieval fusion fit on dev, BM25 and MiniLM) into WORKDIR/study/test-eval, "
        "with seed-mean tables",
    )
    args = p.parse_args()
    if not args.judgments.exists():
        sys.exit(f"{args.judgments} is absent: this study needs ../shared/data")
    if not (args.workdir / "negatives").is_dir():
        sys.exit(f"{args.workdir} has no run: `dssm run --config {TABLE4}/lstm.yaml --workdir {args.workdir}` first")
    args.workdir = args.workdir.resolve()  # MLflow wants an absolute sqlite path
    variants, seeds = args.variants.split(","), [int(s) for s in args.seeds.split(",")]
    if not (args.score_only or args.evaluate):
        for variant in variants:
            train(args.workdir, variant, seeds)
    if args.evaluate:
        return evaluate(args.workdir, args.judgments, variants, seeds)
    result = score(args.workdir, args.judgments, variants, seeds, args.test)
    path = args.workdir / "study" / f"{result['split']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result) + "\n")
    print(table(result))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
