"""Table IV of Palangi et al. on Home Depot, from the raw judged file, with one command:

    .venv/bin/python reproductions/homedepot_table4.py            # the table on the test queries
    .venv/bin/python reproductions/homedepot_table4.py --dev      # the same on validation queries (tuning)

1. `dssm run --config configs/homedepot_table4/lstm.yaml` simulates click logs from the train
   queries (PROTOCOL.md §3), cleans them, builds the vocabulary and negatives, and trains the
   LSTM-RNN with the chosen config;
2. `dssm run` trains each other encoder on the same data with its own file of that folder (the same
   config, its own learning rate; finished runs are kept, not redone);
3. `dssm evaluate` scores every model, its hybrids (FUSIONS: with BM25, and with BM25 and the bundled
   all-MiniLM-L6-v2; weights and retrieval fusion fit on the validation queries), the untrained
   fusion minilm+bm25 and every baseline on the 1,580 test queries, writes the report to
   WORKDIR/eval (or WORKDIR/dev-eval) and logs every system to WORKDIR/mlflow.db;
4. the first encoder (the LSTM-RNN) is compared with each other trained model: mean NDCG
   differences and paired t-tests over queries, from the report's TREC run files;
5. with --seeds 1,2,3 the first encoder is also trained with the other seeds (`dssm train seed=S`,
   into WORKDIR/train/ENCODER-seedS) and evaluated beside it; the script then prints its seed-mean
   rows (the model and its hybrid with BM25: mean ± sd over seeds) and paired t-tests of the
   seed-averaged per-query NDCG against BM25 and MiniLM. The pinned row is that mean, not a seed;
   then the retrieval table (PROTOCOL.md §8) with each hybrid's seed mean and its paired t-test
   against BM25 and against the untrained fusion minilm+bm25.

The chosen config and learning rates were picked on the validation queries only
(docs/studies/table4-config.md lists the candidates).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

import numpy as np
from scipy import stats

from core.layout import Layout
from scoring.protocol import CUTOFFS
from scripts_common import HOME_DEPOT, TABLE4, dssm, paired_cell, per_query_ndcg, seed_mean, training_keys

ENCODERS = ("lstm", "rnn", "dssm")  # one chosen config each: TABLE4/ENCODER.yaml
BASELINES = "bm25,doc2vec,ulm,plsa,minilm"
FUSIONS = ("MODEL+bm25", "MODEL+bm25+minilm", "minilm+bm25")  # the hybrids evaluated (stages/evaluate/job.py)
UNTRAINED = "minilm+bm25"  # what a team gets without training anything: the reference of the retrieval table


def compare(report: Path, a: str, b: str) -> str:
    """Mean NDCG difference b − a per cutoff, with the paired t-test p-value over queries."""
    cells = [paired_cell(f"NDCG@{k}", per_query_ndcg(report, a, k), per_query_ndcg(report, b, k)) for k in CUTOFFS]
    return f"{b} − {a}: " + ", ".join(cells)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--judgments", type=Path, default=HOME_DEPOT)
    p.add_argument("--workdir", type=Path, default=Path("bench-work/hd"))
    p.add_argument("--impressions", help="impressions to simulate (default: the config files', 1_000_000)")
    p.add_argument("--encoders", default=",".join(ENCODERS), help="trained models in the table (default: %(default)s)")
    p.add_argument("--baselines", default=BASELINES, help="(default: %(default)s)")
    p.add_argument(
        "--train", nargs="*", default=[], metavar="KEY=VALUE", help="training keys of every model, after its file's"
    )
    p.add_argument("--dev", action="store_true", help="evaluate on the validation queries, not the test queries")
    p.add_argument("--seeds", default="1,2,3", help="seeds of the first encoder (default: %(default)s)")
    args = p.parse_args()
    if not args.judgments.exists():
        sys.exit(f"{args.judgments} not found: this benchmark needs ../shared/data (see README)")

    work = args.workdir
    data = ["--judgments", str(args.judgments), "--workdir", str(work)]
    data += ["--impressions", args.impressions] if args.impressions else []
    encoders = [e for e in args.encoders.split(",") if e]
    for encoder in encoders:  # the data stages run once; later calls find them up to date
        extra = ["--train", *args.train] if args.train else []
        dssm("run", "--config", str(TABLE4 / f"{encoder}.yaml"), *data, *extra)
    layout = Layout(work)
    seeds = [int(x) for x in args.seeds.split(",")]
    first, extra = encoders[0], []
    for seed in seeds[1:]:  # the flow trained seed 1 (the config's default seed)
        out = layout.train(f"{first}-seed{seed}")
        extra.append(out)
        # a finished run with this config, data and code is skipped; one made otherwise is retrained
        chosen = training_keys(TABLE4 / f"{first}.yaml")
        dssm("train", "--workdir", str(work), "--on-change", "restart", *chosen, *args.train, f"seed={seed}",
             f"out={out}")  # fmt: skip
    out = work / ("dev-eval" if args.dev else "eval")
    evaluate = ["evaluate", "--judgments", str(args.judgments), "--out", str(out), "--baselines", args.baselines]
    if args.dev:
        evaluate += ["--dev", str(Layout(work).negatives)]
    else:  # each model + BM25, the fusion weights fit on the validation queries (scoring/hybrid.py,
        # scoring/fusion.py), and PROTOCOL.md §8's retrieval from the whole catalogue beside Table IV
        evaluate += ["--hybrid-dev", str(Layout(work).negatives), "--retrieval", f"--fusions={','.join(FUSIONS)}"]
    models = [layout.train(e) for e in encoders] + extra
    dssm(*evaluate, *[a for m in models for a in ("--model", str(m))])
    print((out / "report.md").read_text())
    for other in encoders[1:]:  # the first encoder (the LSTM-RNN) against the other trained models
        print(compare(out, first, other))
    if extra:
        names = [first, *(m.name for m in extra)]  # evaluate names later models of an encoder by run dir
        hybrids = [f.removeprefix("MODEL") for f in FUSIONS if f.startswith("MODEL")]
        systems = {"": names} | ({h: [f"{n}{h}" for n in names] for h in hybrids} if not args.dev else {})
        print(seed_table(out, first, systems, [b for b in ("bm25", "minilm") if b in args.baselines.split(",")]))
        if not args.dev:
            print(retrieval_table(out, first, systems))


def seed_table(report: Path, first: str, systems: dict[str, list[str]], references: list[str]) -> str:
    """Mean ± sd over seeds of each system's NDCG@k, and paired t-tests of the seed-averaged
    per-query NDCG against each reference system."""
    result = json.loads((report / "report.json").read_text())["systems"]
    lines = [f"\nseed means over {len(next(iter(systems.values())))} seeds (NDCG × 100, mean ± sd)\n"]
    lines += ["| system | " + " | ".join(f"NDCG@{k}" for k in CUTOFFS) + " |", "|---|" + "---|" * len(CUTOFFS)]
    for suffix, names in systems.items():
        values = [np.array([result[n][f"ndcg@{k}"] for n in names]) for k in CUTOFFS]
        cells = " | ".join(f"{v.mean():.2f} ± {v.std(ddof=1):.2f}" for v in values)
        lines.append(f"| {first}{suffix} | {cells} |")
    for suffix, names in systems.items():
        for ref in references:
            cells = []
            for k in CUTOFFS:
                mean = seed_mean([per_query_ndcg(report, n, k) for n in names])
                cells.append(paired_cell(f"NDCG@{k}", per_query_ndcg(report, ref, k), mean))
            lines.append(f"{first}{suffix} (seed mean) − {ref}: " + ", ".join(cells))
    return "\n".join(lines)


def retrieval_table(report: Path, first: str, systems: dict[str, list[str]]) -> str:
    """PROTOCOL.md §8 from the whole catalogue: the single systems as measured, the first encoder's
    rows as mean ± sd over seeds, with the paired t-test of the seed-averaged per-query NDCG@10
    against BM25 and against the untrained fusion (UNTRAINED) where it was evaluated."""
    section = json.loads((report / "report.json").read_text())["retrieval"]
    per_query = json.loads((report / "retrieval-per-query.json").read_text())["systems"]
    metrics = ("ndcg@10", "recall@10", "recall@100", "recall@1000", "judged@10", "condensed_ndcg@10")
    seeded = {n for names in systems.values() for n in names}
    references = [r for r in ("bm25", UNTRAINED) if r in per_query]
    lines = [f"\nretrieval from all {section['catalogue_titles']:,} titles, {section['queries']} test queries"]
    p_heads = " | ".join(f"p (NDCG@10) vs {r}" for r in references)
    lines += [f"| system | {' | '.join(metrics)} | {p_heads} |", "|---|" + "---|" * (len(metrics) + len(references))]

    def p_cells(values: np.ndarray, name: str = "") -> str:
        cells = []
        for ref in references:
            ref_values = np.array(per_query[ref]["ndcg@10"], dtype=float)
            cells.append("" if ref == name else f"{stats.ttest_rel(values, ref_values).pvalue:.2g}")
        return " | ".join(cells)

    for name, s in section["systems"].items():
        if name not in seeded:
            values = np.array(per_query[name]["ndcg@10"], dtype=float)
            lines.append(f"| {name} | " + " | ".join(f"{s[m]:.1f}" for m in metrics) + f" | {p_cells(values, name)} |")
    for suffix, names in systems.items():
        cells = [np.array([section["systems"][n][m] for n in names]) for m in metrics]
        mean = np.mean([np.array(per_query[n]["ndcg@10"], dtype=float) for n in names], axis=0)
        shown = " | ".join(f"{v.mean():.1f} ± {v.std(ddof=1):.1f}" for v in cells)
        lines.append(f"| {first}{suffix}, {len(names)} seeds | {shown} | {p_cells(mean)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
