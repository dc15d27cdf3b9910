"""Wieting & Gimpel 2017's comparison on our data, with one command:

    .venv/bin/python reproductions/paraphrase_sts.py

1. `dssm paraphrase` reads the Wiki-Auto normal -> simple pairs (../shared/data), `dssm vocab` and
   `dssm negatives -n 0` prepare them like click pairs;
2. `dssm train --objective paraphrase` trains every configuration of CONFIGS below with the same
   settings (COMMON) into WORKDIR/train/NAME (finished runs are kept, not redone);
3. `dssm sts` scores them, MiniLM and, if present, the click-trained LSTM-RNN of `make table4`
   (bench-work/hd/train/lstm) on STS 2012-2016, STS-B test and SICK test.

The supervised setting trains on a scored set's high-scoring train pairs instead, e.g.

    .venv/bin/python reproductions/paraphrase_sts.py --pairs ../shared/data/stsbenchmark/sts-train.csv \\
        --format stsb --min-score 4 --workdir bench-work/sts-sup --configs gran --set epochs=20 --no-minilm
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

from core.layout import Layout
from scripts_common import SHARED_DATA, dssm

WIKI_AUTO = SHARED_DATA / "wikiauto-gem2021-valid" / "valid.tsv.gz"
CLICK_LSTM = Path("bench-work/hd/train/lstm")
COMMON = ["epochs=5", "data.batch_size=100", "model.ncell=128", "optim.name=adam", "optim.lr=0.001", "seed=1"]
FORGET = ["model.forget_gate=true", "model.peepholes=true"]  # the LSTM of Wieting & Gimpel's code (lasagne's)
CONFIGS = {
    "avg": ["model.encoder=avg"],
    "lstm": ["model.encoder=lstm"],
    "lstm-worddrop": ["model.encoder=lstm", "data.word_dropout=0.3"],
    "lstm-scramble": ["model.encoder=lstm", "data.scramble=0.5"],
    "lstm-dropout": ["model.encoder=lstm", "model.dropout=0.3"],
    "lstm-l2": ["model.encoder=lstm", "loss.l2_composition=1e-5"],
    "lstm_avg": ["model.encoder=lstm_avg"],
    "lstm-forget": ["model.encoder=lstm", *FORGET],
    "lstm_avg-forget": ["model.encoder=lstm_avg", *FORGET],
    "gran": ["model.encoder=gran"],
    "gran-2": ["model.encoder=gran", "model.gran_type=2"],
    "gran-3": ["model.encoder=gran", "model.gran_type=3"],
    "gran-4": ["model.encoder=gran", "model.gran_type=4"],
    "gran-5": ["model.encoder=gran", "model.gran_type=5"],
    "bigran": ["model.encoder=bigran"],
}


def dataset_tags(pairs: Path) -> list[str]:
    """The MLflow experiment and dataset tag of runs trained on `pairs`, named after its ../shared/data
    folder: wikiauto-gem2021-valid -> experiment wikiauto-paraphrase."""
    dataset = pairs.parent.name
    return [f"experiment={dataset.split('-')[0]}-paraphrase", f"dataset={dataset}"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=Path, default=WIKI_AUTO, help="paraphrase pairs (default: %(default)s)")
    p.add_argument("--workdir", type=Path, default=Path("bench-work/para"))
    p.add_argument("--format", default="pairs", help="dssm paraphrase --format (default: %(default)s)")
    p.add_argument("--min-score", help="dssm paraphrase --min-score, for scored sets")
    p.add_argument("--configs", default=",".join(CONFIGS), help="(default: %(default)s)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides, applied last, e.g. epochs=20")
    p.add_argument("--no-minilm", action="store_true", help="leave the MiniLM row out (it takes ~2 min on CPU)")
    args = p.parse_args()
    if not args.pairs.exists():
        sys.exit(f"{args.pairs} not found: this benchmark needs ../shared/data (see README)")
    work = args.workdir
    scored = ["--min-score", args.min_score] if args.min_score else []
    dssm("paraphrase", "--input", str(args.pairs), "--format", args.format, *scored, "--out", str(Layout(work).clean))
    dssm("vocab", "--clean", str(Layout(work).clean), "--out", str(Layout(work).vocab))
    layout = Layout(work)
    dssm("negatives", "--clean", str(layout.clean), "--out", str(layout.negatives), "-n", "0", "--shards", "2")
    common = [*COMMON, *dataset_tags(args.pairs)]
    models = []
    for name in args.configs.split(","):
        out = Layout(work).train(name)
        overrides = [*common, *CONFIGS[name], *args.set, f"out={out}"]
        # --resume: a finished run is kept, a killed one continues from its checkpoint
        dssm("train", "--workdir", str(work), "--objective", "paraphrase", "--resume", *overrides)
        models += ["--model", str(out)]
    if CLICK_LSTM.exists():
        models += ["--model", str(CLICK_LSTM)]
    baselines = [] if args.no_minilm else ["--baselines", "minilm"]
    dssm("sts", *models, *baselines, "--data", str(args.pairs.parents[1]), "--out", str(work / "sts"))


if __name__ == "__main__":
    main()
