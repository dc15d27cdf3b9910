"""Dev study for issue 48: what the pretrained encoder adds inside the pipeline. Fusions of what exists
(BM25, the bundled all-MiniLM-L6-v2, the LSTM-RNN), the transformer's bounded CPU fine-tune, and
distillation into the LSTM-RNN from a teacher on hard candidates; docs/studies/pretrained-fusion-distillation.md.

    .venv/bin/python studies/pretrained_fusion.py --workdir bench-work/hd            # train what is missing, dev table
    .venv/bin/python studies/pretrained_fusion.py --workdir bench-work/hd --steps train   # only the training

Steps, each a `dssm` command whose finished output is kept (a rerun resumes where it stopped):
1. `dssm run --config configs/homedepot_table4/lstm.yaml`: the data stages and the seed-1 LSTM-RNN;
2. `dssm train` of the LSTM-RNN with seeds 2 and 3 (WORKDIR/train/lstm-seedS);
3. `dssm train model.encoder=minilm ...`: the bounded fine-tune (WORKDIR/train/minilm), as
   configs/homedepot_search.yaml trains it in the flow;
4. `dssm teacher`: each train query's top 10 of BM25 and of the seed-1 LSTM-RNN, and its clicks, scored
   by the teacher (the z-score fusion of the seed-1 LSTM-RNN, BM25 and the fine-tuned transformer,
   TEACHER_WEIGHTS), into WORKDIR/teacher-study;
5. `dssm train ... loss.listwise=0.5` on those lists, seeds 1-3 (WORKDIR/train/lstm-distill-sS);
6. one `dssm evaluate --dev` of every model with the fusions FUSIONS on the dev queries (never test),
   then the table: seed means ± sd of each variant, alone and fused (WORKDIR/study-dev).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

import numpy as np

from scripts_common import HOME_DEPOT, ROOT, TABLE4, dssm, training_keys

SEEDS = (1, 2, 3)
SEARCH = ROOT / "configs" / "homedepot_search.yaml"  # its per_encoder.minilm keys: the bounded fine-tune
TEACHER_DEPTH = 10
# the teacher: the best fusion on dev that the teacher stage can run (by the study's simplicity rule),
# lstm (seed 1) + bm25 + minilm-ft with the z-score weights its retrieval fusion chose on dev
TEACHER_WEIGHTS = "0.25,0.25,0.5"
DISTIL = ["loss.listwise=0.5"]
FUSIONS = ["MODEL+bm25", "MODEL+bm25+minilm", "MODEL+bm25+minilm-ft", "minilm+bm25"]
METRICS = ("ndcg@10", "recall@100", "condensed_ndcg@10")


def lstm_run(workdir: Path, seed: int, distilled: bool = False) -> Path:
    if distilled:
        return workdir / "train" / f"lstm-distill-s{seed}"
    return workdir / "train" / ("lstm" if seed == 1 else f"lstm-seed{seed}")


def train(workdir: Path, judgments: Path) -> None:
    store = [f"mlflow_uri=sqlite:///{workdir / 'study.db'}", "experiment=pretrained-fusion"]
    if not (lstm_run(workdir, 1) / "last.pt").is_file():
        dssm("run", "--config", str(TABLE4 / "lstm.yaml"), "--workdir", str(workdir), "--judgments", str(judgments),
             "--no-analyze", "--no-index")  # fmt: skip
    base = training_keys(TABLE4 / "lstm.yaml")
    data = [f"data.negatives={workdir / 'negatives'}", f"data.vocab={workdir / 'vocab'}"]
    for seed in SEEDS[1:]:
        dssm("train", "--resume", "--on-change", "resume", *base, *data, f"seed={seed}",
             f"out={lstm_run(workdir, seed)}", *store)  # fmt: skip
    dssm("train", "--resume", "--on-change", "resume", *data, *training_keys(SEARCH, "minilm"),
         f"out={workdir / 'train' / 'minilm'}",
         *store)  # fmt: skip
    teacher = workdir / "teacher-study"
    seed1, tuned = (f"checkpoint:{run / 'last.pt'}" for run in (lstm_run(workdir, 1), workdir / "train" / "minilm"))
    dssm("teacher", "--negatives", str(workdir / "negatives"), "--titles", str(workdir / "clean" / "titles"),
         "--out", str(teacher), "--scorers", f"{seed1},bm25,{tuned}", "--weights", TEACHER_WEIGHTS,
         "--sources", f"bm25,{seed1}", "--depth", str(TEACHER_DEPTH))  # fmt: skip
    distilled = [f"data.negatives={teacher}", f"data.vocab={workdir / 'vocab'}"]
    for seed in SEEDS:
        dssm("train", "--resume", "--on-change", "resume", *base, *DISTIL, *distilled, f"seed={seed}",
             f"out={lstm_run(workdir, seed, distilled=True)}", *store)  # fmt: skip


def evaluate(workdir: Path, judgments: Path, out: Path, test: bool = False) -> dict:
    models = [lstm_run(workdir, s) for s in SEEDS] + [lstm_run(workdir, s, True) for s in SEEDS]
    models.append(workdir / "train" / "minilm")
    split = [] if test else ["--dev", str(workdir / "negatives")]
    dssm("evaluate", "--judgments", str(judgments), "--out", str(out), "--baselines", "bm25,minilm", "--retrieval",
         "--hybrid-dev", str(workdir / "negatives"), *split,
         f"--mlflow-uri=sqlite:///{workdir / 'study.db'}", f"--fusions={','.join(FUSIONS)}",
         *(a for m in models for a in ("--model", str(m))))  # fmt: skip
    return json.loads((out / "report.json").read_text())


def table(report: dict) -> str:
    systems = report["retrieval"]["systems"]
    plain, distilled = ["lstm", "lstm-seed2", "lstm-seed3"], [f"lstm-distill-s{s}" for s in SEEDS]

    def cells(names: list[str]) -> str:
        found = [n for n in names if n in systems]
        if not found:
            return "| n/a " * len(METRICS)
        out = []
        for m in METRICS:
            values = np.array([systems[n][m] for n in found])
            sd = values.std(ddof=1) if len(values) > 1 else 0.0
            out.append(f"| {values.mean():.2f} ± {sd:.2f} " if len(values) > 1 else f"| {values[0]:.2f} ")
        return "".join(out)

    rows = [
        ("BM25", ["bm25"]),
        ("MiniLM off the shelf", ["minilm"]),
        ("minilm+bm25 (untrained fusion)", ["minilm+bm25"]),
        ("LSTM-RNN", plain),
        ("lstm+bm25", [f"{n}+bm25" for n in plain]),
        ("lstm+bm25+minilm", [f"{n}+bm25+minilm" for n in plain]),
        ("MiniLM fine-tuned (bounded)", ["minilm-ft"]),
        ("minilm-ft+bm25", ["minilm-ft+bm25"]),
        ("minilm-ft+bm25+minilm", ["minilm-ft+bm25+minilm"]),
        ("lstm+bm25+minilm-ft", [f"{n}+bm25+minilm-ft" for n in plain]),
        ("LSTM-RNN distilled", distilled),
        ("distilled+bm25", [f"{n}+bm25" for n in distilled]),
        ("distilled+bm25+minilm", [f"{n}+bm25+minilm" for n in distilled]),
        ("distilled+bm25+minilm-ft", [f"{n}+bm25+minilm-ft" for n in distilled]),
    ]
    head = f"{report['retrieval']['queries']} queries, all {report['retrieval']['catalogue_titles']:,} titles"
    lines = [head, "", "| system | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    lines += [f"| {label} {cells(names)}|" for label, names in rows]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--judgments", type=Path, default=HOME_DEPOT)
    p.add_argument("--workdir", type=Path, default=Path("bench-work/hd"))
    p.add_argument("--steps", default="train,evaluate", help="train, evaluate or both (default: %(default)s)")
    p.add_argument("--test", action="store_true", help="score on the test queries (after choosing on dev)")
    args = p.parse_args()
    if not args.judgments.exists():
        sys.exit(f"{args.judgments} is absent: this study needs ../shared/data")
    work = args.workdir.resolve()  # MLflow wants an absolute sqlite path
    steps = args.steps.split(",")
    if "train" in steps:
        train(work, args.judgments)
    if "evaluate" in steps:
        report = evaluate(work, args.judgments, work / ("study-test" if args.test else "study-dev"), args.test)
        print(table(report))


if __name__ == "__main__":
    main()
