"""Dev-split ablations on Home Depot: seed means and spreads of config variants of one encoder.

    .venv/bin/python studies/homedepot_ablation.py \\
        --variant separate= --variant shared=model.shared_towers=true --seeds 1,2,3

A variant's `negatives.KEY=VALUE`s (e.g. `negatives.skip_above=0.5`) build its own negatives
(`dssm negatives --KEY VALUE` into WORKDIR/negatives-VARIANT), which it trains on
(`negatives.debias=true` reads the examination curve of `dssm propensity`, run into WORKDIR/propensity);
`--eta`, `--ranker-noise`, `--ranker-bias`, `--promotion` and `--promoted-brands` simulate a log with another
position bias or ranker.

1. the data stages of `dssm run` (simulate, clean, vocab, negatives; as `make table4`) prepare WORKDIR;
2. each variant × seed trains with `dssm train` into WORKDIR/train/ablation-VARIANT-sSEED, on the
   same negatives, with homedepot_table4's chosen config, then the variant's KEY=VALUEs, then seed=
   (`--resume`: a finished run is kept, a killed one continues from its checkpoint), seed by seed;
   `--train-only` stops here (a study too long for one sitting trains over several calls);
3. one `dssm evaluate --dev` scores every model of this call's variants on the validation queries
   (train queries whose clicks were held out of training: never the test queries) into
   WORKDIR/ablation-dev (`--report NAME`: WORKDIR/NAME-dev), and the script prints, per variant, the mean
   and standard deviation over seeds of NDCG@1/3/10 and of the share of differently graded title
   pairs a query's ranking puts in the grades' order (per-query concordance, averaged over queries),
   and each variant against the first (the mean of the per-seed differences, and a paired t-test
   over queries on the seed-averaged metric; with two seeds or more also Welch's t-test over the
   seeds' values, which does not take one seed's luck on every query for an effect);
4. with --test, the same models and table on the test queries (PROTOCOL.md §3), once the variants
   were chosen on the dev split.
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
from scripts_common import (
    HOME_DEPOT,
    TABLE4,
    dssm,
    paired_cell,
    per_query_ndcg,
    per_query_pairs_in_order,
    seed_mean,
    training_keys,
)
from stages.simulate.config import PROMOTED_BRANDS


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, _, overrides = text.partition("=")
    return name, [o for o in overrides.split(";") if o]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--judgments", type=Path, default=HOME_DEPOT)
    p.add_argument("--workdir", type=Path, default=Path("bench-work/hd"))
    p.add_argument("--impressions", type=int, default=1_000_000)
    p.add_argument(
        "--variant",
        action="append",
        type=parse_variant,
        required=True,
        metavar="NAME=KEY=VALUE;KEY=VALUE",
        help="a config variant (repeatable); the first is the reference",
    )
    p.add_argument("--seeds", default="1,2,3", help="training seeds, e.g. 1,2,3 or 11-55 (default: %(default)s)")
    p.add_argument("--eta", type=float, help="the simulated log's position bias (dssm simulate --eta)")
    p.add_argument("--ranker-noise", type=float, help="the simulated log's ranker noise (dssm simulate --ranker-noise)")
    p.add_argument("--ranker-bias", type=float, help="the simulated log's ranker bias (dssm simulate --ranker-bias)")
    p.add_argument("--promotion", type=float, help="the simulated log's brand promotion (dssm simulate --promotion)")
    p.add_argument(
        "--promoted-brands", choices=PROMOTED_BRANDS, help="which brands the promotion lifts (dssm simulate's)"
    )
    p.add_argument(
        "--train",
        nargs="*",
        default=None,
        metavar="KEY=VALUE",
        help="common config, before variants (default: Table IV's LSTM-RNN, configs/homedepot_table4/lstm.yaml)",
    )
    p.add_argument("--test", action="store_true", help="also score the models on the test queries")
    p.add_argument(
        "--train-only",
        action="store_true",
        help="train the runs and stop: a study planned at N seeds is trained over several calls and read once, at N",
    )
    p.add_argument(
        "--report",
        default="ablation",
        help="the evaluations go to WORKDIR/REPORT-dev and REPORT-test, replacing an earlier call's "
        "(default: %(default)s): name a call's own to keep it",
    )
    args = p.parse_args()
    if args.train is None:  # read here, not while building the parser: --help reads no config
        args.train = training_keys(TABLE4 / "lstm.yaml")
    if not args.judgments.exists():
        sys.exit(f"{args.judgments} not found: this benchmark needs ../shared/data (see README)")

    layout = Layout(args.workdir)
    # the data stages of `dssm run` (same jobs, same settings: the same outputs), each skipped when up to date
    judged = ["--judgments", str(args.judgments)]
    settings = [(k, getattr(args, k)) for k in ("eta", "ranker_noise", "ranker_bias", "promotion", "promoted_brands")]
    click_model = [f"--{k.replace('_', '-')}={v}" for k, v in settings]
    click_model = [a for a in click_model if not a.endswith("=None")]
    dssm("simulate", *judged, "--out", str(layout.simulate), "--impressions", str(args.impressions), *click_model)
    dssm("clean", "--input", str(layout.simulate), "--out", str(layout.clean))
    dssm("propensity", "--clean", str(layout.clean), "--out", str(layout.propensity))
    dssm("vocab", "--clean", str(layout.clean), "--out", str(layout.vocab))
    dssm("negatives", "--clean", str(layout.clean), "--out", str(layout.negatives))
    seeds = parse_seeds(args.seeds)
    variants = []
    for name, overrides in args.variant:
        # A negatives.* override is a variant of the data: its own negatives, trained on.
        data = [o.removeprefix("negatives.").split("=", 1) for o in overrides if o.startswith("negatives.")]
        if data:
            variant_negatives = layout.workdir / f"negatives-{name}"
            options = [a for k, v in data for a in negatives_options(k, v)]
            if ["debias", "true"] in data:
                options += ["--propensity", str(layout.propensity)]
            dssm("negatives", "--clean", str(layout.clean), "--out", str(variant_negatives), *options)
            overrides = [o for o in overrides if not o.startswith("negatives.")]
            overrides.append(f"data.negatives={variant_negatives}")
        variants.append((name, overrides))
    runs: dict[str, list[Path]] = {name: [] for name, _ in variants}
    # seed by seed, every variant: a study stopped part way has as many seeds of each
    for seed in seeds:
        for name, overrides in variants:
            out = layout.train(f"ablation-{name}-s{seed}")
            runs[name].append(out)
            # --resume: trains afresh, continues a killed run, or does nothing when the run finished
            config = [*args.train, *overrides, f"seed={seed}", f"out={out}"]
            dssm("train", "--workdir", str(layout.workdir), "--resume", *config)
    if args.train_only:
        return
    models = [a for outs in runs.values() for out in outs for a in ("--model", str(out))]
    evaluate = ["evaluate", "--judgments", str(args.judgments), "--baselines", "bm25", *models]
    dev, test = (layout.workdir / f"{args.report}-{split}" for split in ("dev", "test"))
    dssm(*evaluate, "--out", str(dev), "--dev", str(layout.negatives))
    table(dev, f"dev split ({layout.negatives})", args, runs)
    if args.test:
        dssm(*evaluate, "--out", str(test))
        table(test, "test split (PROTOCOL.md §3)", args, runs)


def parse_seeds(spec: str) -> list[int]:
    """`1,2,3`, `11-55` or a mix (`1,4-6`) -> the seeds in that order."""
    seeds = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        seeds += list(range(int(first), int(last or first) + 1))
    return seeds


def negatives_options(key: str, value: str) -> list[str]:
    """`dssm negatives` options for a `negatives.KEY=VALUE`: a flag for true, nothing for false."""
    flag = f"--{key.replace('_', '-')}"
    if value.lower() in ("true", "false"):
        return [flag] if value.lower() == "true" else []
    return [flag, value]


def table(report: Path, split: str, args: argparse.Namespace, runs: dict[str, list[Path]]) -> None:
    """Print the seed means of every variant in `report` and each variant against the first: NDCG@k,
    and the share of differently graded title pairs each query ranks in the grades' order."""
    systems = json.loads((report / "report.json").read_text())["systems"]
    names = system_names(runs)
    scored = [s for v, _ in args.variant for s in names[v]]  # bm25 needs only its own line
    in_order = {s: per_query_pairs_in_order(report, s) for s in ["bm25", *scored]}
    print(f"\n{split}, seeds {args.seeds}; × 100, mean ± sd over seeds\n")
    print("| variant | overrides | " + " | ".join(f"NDCG@{k}" for k in CUTOFFS) + " | pairs in order |")
    print("|---|---|" + "---|" * (len(CUTOFFS) + 1))
    bm25 = [systems["bm25"][f"ndcg@{k}"] for k in CUTOFFS] + [100 * np.mean(list(in_order["bm25"].values()))]
    print("| bm25 | | " + " | ".join(f"{v:.2f}" for v in bm25) + " |")
    per_seed = {}
    for name, overrides in args.variant:
        columns = [[systems[s][f"ndcg@{k}"] for s in names[name]] for k in CUTOFFS]
        columns.append([100 * np.mean(list(in_order[s].values())) for s in names[name]])
        per_seed[name] = columns
        cells = [f"{np.mean(v):.2f} ± {np.std(v, ddof=1) if len(v) > 1 else 0:.2f}" for v in columns]
        print(f"| {name} | {' '.join(overrides) or '(common config)'} | " + " | ".join(cells) + " |")
    per_query = {f"NDCG@{k}": {s: per_query_ndcg(report, s, k) for s in scored} for k in CUTOFFS}
    per_query["pairs in order"] = in_order
    # per metric and variant, each query's value averaged over the variant's seeds
    means = {m: {v: seed_mean([by[s] for s in names[v]]) for v, _ in args.variant} for m, by in per_query.items()}
    reference = args.variant[0][0]
    for name, _ in args.variant[1:]:
        cells = [paired_cell(metric, by[reference], by[name]) for metric, by in means.items()]
        print(f"{name} − {reference}: " + ", ".join(cells))
    if len(parse_seeds(args.seeds)) > 1 and len(args.variant) > 1:
        # The paired test above takes queries as the unit and so counts a seed's luck, shared by all
        # its queries, as effect; with a few seeds this one, with the seeds as the unit, is the honest one.
        print("seeds as the unit (Welch's t-test over the seeds' values):")
        for name, _ in args.variant[1:]:
            cells = [
                f"{metric} p={stats.ttest_ind(a, b, equal_var=False).pvalue:.3g}"
                for metric, a, b in zip(means, per_seed[name], per_seed[reference], strict=True)
            ]
            print(f"  {name} − {reference}: " + ", ".join(cells))


def system_names(runs: dict[str, list[Path]]) -> dict[str, list[str]]:
    """The names `dssm evaluate` gives the models (scoring.systems.unique_names): a lone model of an
    encoder is named after the encoder, several after their run directories."""
    from collections import Counter

    from modeling.checkpoint import read_checkpoint

    encoders = {out: read_checkpoint(out)["config"]["model"]["encoder"] for outs in runs.values() for out in outs}
    shared = Counter(encoders.values())
    return {v: [out.name if shared[encoders[out]] > 1 else encoders[out] for out in outs] for v, outs in runs.items()}


if __name__ == "__main__":
    main()
