"""Study for issue 63: under a drifting query mix, does the time split rank systems differently from the
query split, and which agrees with the next days' truth? docs/studies/time-split-drift.md has the
question, the method and the rule decided before the runs.

    .venv/bin/python studies/time_split_drift.py --workdir bench-work/drift

Per seed (the logs' and the models' seed):
1. `dssm simulate --day` of six days, 2026-01-01..06, of the embedded catalogue with the test queries'
   traffic and a drifting query mix (`--drift`: the popularity ranking rotates by drift·n queries a day);
2. one nightly `dssm run` on 2026-01-04 over a 3-day window (judge.split=time): three encoders (lstm, rnn,
   dssm) trained on 01-02..03; its judged set T graded from the clicks of 01-04 alone;
3. the query split's set Q graded by `dssm judge` from the whole window's clicks (01-02..04);
4. the truth: human grades (the catalogue's labels) of the test queries users sent at least
   MIN_SENT times on the next two days, 01-05..06 (and of the other queries, whose validation queries fit
   the hybrids);
5. one `dssm evaluate` per set of the same eight systems (BM25, MiniLM, the three models and each one's
   fusion with BM25) and Kendall's τ-b between the sets' rankings of them.
Finished outputs are kept: a rerun redoes nothing that is up to date. Writes WORKDIR/drift.json and
prints the tables.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

from scipy import stats

from core.judgments import CLICK_SPEC, DEFAULT_CATALOGUE, read_judgments
from core.layout import Layout
from core.text import is_test_query, norm
from scripts_common import dssm

DAYS = [f"2026-01-0{d}" for d in range(1, 7)]
WINDOW, NIGHT, NEXT = DAYS[1:4], DAYS[3], DAYS[4:6]
ENCODERS = ("lstm", "rnn", "dssm")
SYSTEMS = ("bm25", "minilm", *ENCODERS, *(f"{e}+bm25" for e in ENCODERS))
CUTS = ("ndcg@1", "ndcg@3", "ndcg@10")
MIN_SENT = 5  # a query users sent at least this often on the next days is one the truth measures
CLICK_SCALE_ARGS = ["--encoding", "utf-8", "--min-label", "1", "--relevant-at", "2.5"]  # the flow's for click sets


def run_seed(work: Path, seed: int, impressions: int, drift: float) -> dict:
    from core.spark import run_session
    from stages.clean.config import CleanConfig
    from stages.clean.window import clean_window
    from stages.judge.job import judge

    root, layout = work / "logs", Layout(work / "flow")
    for day in DAYS:
        dssm("simulate", "--out", str(root), "--day", day, "--impressions", str(impressions), "--seed", str(seed),
             "--workers", "1", "--test-traffic", "--drift", str(drift))  # fmt: skip
    keys = [f"train.models=[{','.join(ENCODERS)}]", f"train.seed={seed}", "evaluate.fusions=[MODEL+bm25]",
            "evaluate.retrieval=false", "gate.metric=ndcg@10", "judge.split=time"]  # fmt: skip
    dssm("run", "--workdir", str(layout.workdir), "--logs", str(root), "--window-days", str(len(WINDOW)),
         "--run-date", NIGHT, "--no-index", "--no-analyze", *keys)  # fmt: skip
    spark = run_session(None)
    whole = clean_window(spark, str(root), WINDOW, layout.clean_days, work / "clean-query", CleanConfig())
    assert "held_out" not in whole
    judge(spark, work / "clean-query", work / "judge-query", propensity_dir=layout.propensity)
    clean_window(spark, str(root), NEXT, layout.clean_days, work / "clean-next", CleanConfig())
    truth = truth_set(work / "clean-next", work / "truth.csv")
    sets = {
        "time": (layout.output("judge") / "judged.csv", CLICK_SCALE_ARGS),
        "query": (work / "judge-query" / "judged.csv", CLICK_SCALE_ARGS),
        "truth": (truth, CLICK_SCALE_ARGS),
    }
    reports = {}
    models = [a for e in ENCODERS for a in ("--model", str(layout.train(e)))]
    for name, (path, spec) in sets.items():
        out = work / f"eval-{name}"
        dssm("evaluate", "--judgments", str(path), *spec, "--out", str(out), "--baselines", "bm25,minilm",
             "--no-retrieval", "--hybrid-dev", str(layout.negatives), "--fusions", "MODEL+bm25",
             f"--mlflow-uri=sqlite:///{work / 'study.db'}", "--dataset", f"drift-{name}", *models)  # fmt: skip
        reports[name] = json.loads((out / "report.json").read_text())
    return compare(reports)


def truth_set(next_days: Path, path: Path) -> Path:
    """The catalogue's human grades of the test queries sent at least MIN_SENT times on the next days, and of
    every other query (evaluate fits the hybrids on the validation queries' grades; it scores test queries only)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    sent = pq.read_table(next_days / "impressions", columns=["query"]).column("query")
    counts = pc.value_counts(sent).to_pylist()
    queries = {c["values"] for c in counts if c["counts"] >= MIN_SENT and is_test_query(c["values"])}
    rows = [p for p in read_judgments(DEFAULT_CATALOGUE) if (q := norm(p.query)) in queries or not is_test_query(q)]
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([CLICK_SPEC.query_col, CLICK_SPEC.title_col, CLICK_SPEC.label_col])
        writer.writerows((p.query, p.title, p.label) for p in rows)
    return path


def compare(reports: dict[str, dict]) -> dict:
    values = {n: {m: {s: r["systems"][s][m] for s in SYSTEMS} for m in CUTS} for n, r in reports.items()}
    tau = {}
    for a, b in (("time", "truth"), ("query", "truth"), ("time", "query")):
        tau[f"{a}~{b}"] = {
            m: round(
                float(
                    stats.kendalltau([values[a][m][s] for s in SYSTEMS], [values[b][m][s] for s in SYSTEMS]).statistic
                ),
                3,
            )  # fmt: skip
            for m in CUTS
        }
    queries = {n: r["eval_queries"] for n, r in reports.items()}
    return {"values": values, "tau": tau, "eval_queries": queries}


def summary(per_seed: dict[int, dict]) -> dict:
    out = {}
    for pair in ("time~truth", "query~truth", "time~query"):
        out[pair] = {}
        for m in CUTS:
            taus = [r["tau"][pair][m] for r in per_seed.values()]
            out[pair][m] = {"mean": round(statistics.mean(taus), 3), "sd": round(statistics.stdev(taus), 3)
                            if len(taus) > 1 else 0.0, "seeds": taus}  # fmt: skip
    gaps = [r["tau"]["time~truth"]["ndcg@10"] - r["tau"]["query~truth"]["ndcg@10"] for r in per_seed.values()]
    mean_gap = statistics.mean(gaps)
    if mean_gap >= 0.1 and sum(g > 0 for g in gaps) >= 2:
        verdict = "the time split agrees better with the next days' truth"
    elif mean_gap <= -0.1 and sum(g < 0 for g in gaps) >= 2:
        verdict = "the query split agrees better with the next days' truth"
    else:
        verdict = "no difference measurable at this size"
    differ = out["time~query"]["ndcg@10"]["mean"] < 0.8
    return out | {"gap_at_10": [round(g, 3) for g in gaps], "verdict": verdict, "rank_differently": differ}


def markdown(per_seed: dict[int, dict], result: dict) -> str:
    lines = ["| seed | set | eval queries | " + " | ".join(f"{s} @10" for s in SYSTEMS) + " |",
             "|---|---|---|" + "---|" * len(SYSTEMS)]  # fmt: skip
    for seed, r in per_seed.items():
        for name in ("time", "query", "truth"):
            row = " | ".join(f"{r['values'][name]['ndcg@10'][s]:.1f}" for s in SYSTEMS)
            lines.append(f"| {seed} | {name} | {r['eval_queries'][name]} | {row} |")
    lines += ["", "| τ-b | " + " | ".join(CUTS) + " |", "|---|" + "---|" * len(CUTS)]
    for pair in ("time~truth", "query~truth", "time~query"):
        cells = " | ".join(f"{result[pair][m]['mean']:.3f} ± {result[pair][m]['sd']:.3f} {result[pair][m]['seeds']}"
                           for m in CUTS)  # fmt: skip
        lines.append(f"| {pair} | {cells} |")
    ranked = "differently" if result["rank_differently"] else "alike"
    lines.append(f"\nverdict: {result['verdict']} (τ gaps at NDCG@10: {result['gap_at_10']}); the splits rank the "
                 f"systems {ranked} (mean τ-b < 0.8: differently)")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("bench-work/drift"))
    p.add_argument("--seeds", default="13,14,15", help="comma-separated: each one's logs and models")
    p.add_argument("--impressions", type=int, default=6_000, help="per day")
    p.add_argument("--drift", type=float, default=0.1, help="share of the query ranking the mix moves a day")
    args = p.parse_args()
    work = args.workdir.resolve()
    per_seed = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        per_seed[seed] = run_seed(work / f"seed-{seed}", seed, args.impressions, args.drift)
    result = summary(per_seed)
    (work / "drift.json").write_text(json.dumps({"per_seed": per_seed, "summary": result}, indent=2) + "\n")
    print(markdown(per_seed, result))


if __name__ == "__main__":
    main()
