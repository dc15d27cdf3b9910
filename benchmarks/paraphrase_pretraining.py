"""Does paraphrase pre-training help retrieval? One command (after `make table4`, whose Home Depot
work dir and scratch LSTM-RNN it reuses):

    .venv/bin/python benchmarks/paraphrase_pretraining.py

1. `dssm train --objective paraphrase` trains the paper's LSTM-RNN (ncell 96, no forget gate) on the
   Wiki-Auto pairs of `benchmarks/paraphrase_sts.py` (its best LSTM regulariser: word dropout 0.3);
2. `dssm train init_from=...` trains the Home Depot click model from it, with Table IV's chosen
   config (homedepot_table4.CHOSEN), both towers starting from the one paraphrase encoder;
3. `dssm evaluate` scores it beside the scratch model on the validation queries (--dev) and on the
   test queries. Finished runs are kept, not redone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from homedepot_table4 import CHOSEN, HOME_DEPOT, compare, dssm
from paraphrase_sts import COMMON, WIKI_AUTO, dataset_tags

from core.layout import Layout

# later keys win
PRETRAIN = [*COMMON, *dataset_tags(WIKI_AUTO), "model.ncell=96", "model.encoder=lstm", "data.word_dropout=0.3"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--para-workdir", type=Path, default=Path("bench-work/para"))
    p.add_argument("--hd-workdir", type=Path, default=Path("bench-work/hd"))
    args = p.parse_args()
    para, hd = args.para_workdir, args.hd_workdir
    scratch = Layout(hd).train("lstm")
    if not HOME_DEPOT.exists() or not WIKI_AUTO.exists():
        sys.exit("this benchmark needs ../shared/data (see README)")
    if not (scratch / "last.pt").exists():
        sys.exit(f"{scratch}: no scratch LSTM-RNN; run `make table4` first")
    dssm("paraphrase", "--input", str(WIKI_AUTO), "--out", str(Layout(para).clean))
    dssm("vocab", "--clean", str(Layout(para).clean), "--out", str(Layout(para).vocab))
    layout = Layout(para)
    dssm("negatives", "--clean", str(layout.clean), "--out", str(layout.negatives), "-n", "0", "--shards", "2")
    pretrained = Layout(para).train("lstm96")
    # --resume: a finished run is kept, a killed one continues from its checkpoint
    dssm("train", "--workdir", str(para), "--objective", "paraphrase", "--resume", *PRETRAIN, f"out={pretrained}")
    warm = Layout(hd).train("lstm-para")
    overrides = ["model.encoder=lstm", *CHOSEN, f"init_from={pretrained}", f"out={warm}", "run_name=lstm-para"]
    dssm("train", "--workdir", str(hd), "--resume", *overrides)
    models = ["--model", str(scratch), "--model", str(warm)]
    common = ["evaluate", "--judgments", str(HOME_DEPOT), "--baselines", "bm25", "--no-register", *models]
    dssm(*common, "--dev", str(Layout(hd).negatives), "--out", str(hd / "pretrain-dev"))
    dssm(*common, "--out", str(hd / "pretrain-test"))
    for split in ("dev", "test"):
        report = hd / f"pretrain-{split}"
        print(f"## {split}\n" + (report / "report.md").read_text())
        print(compare(report, "lstm", "lstm-para") + "\n")


if __name__ == "__main__":
    main()
