"""Study for issue 50: do grades from clicks rank systems as human grades do? On Home Depot, where both exist.

    .venv/bin/python studies/click_judged_agreement.py --workdir bench-work/clicks

1. `dssm run` of Table IV's LSTM-RNN config with `simulate.test_traffic=true` (the simulated log carries
   the test queries' traffic, as a team's own log does; the data stages hold those queries out of
   training) training three encoders, lstm, rnn and dssm (the same training keys, EPOCHS epochs);
2. `dssm judge` of that log twice: debiased (clicks over expected examinations) and raw CTR;
3. one `dssm evaluate --retrieval` per judged set (Home Depot's human grades, the two click-derived
   sets) of the same eight systems: BM25, MiniLM off the shelf, the three models and each one's
   fusion with BM25 (fit on the validation queries);
4. per metric (re-ranking NDCG@1/3/10, retrieval NDCG@10), Kendall's τ-b between each click-derived
   ranking of the systems and the human one, and the champion each set's gate would pick among the
   trained candidates (the models and their hybrids) by the gate's metrics.
Decided before the runs (issue 50's bars): the click-derived set is usable for the gate when τ ≥ 0.8
at NDCG@10 and at retrieval NDCG@10 and both sets pick the same champion; goal τ ≥ 0.9, and the
debiased grades at least as close to the human ranking as raw CTR. Finished stages are kept: a rerun
redoes nothing that is up to date. Writes WORKDIR/agreement.json and WORKDIR/agreement.png (each system's
NDCG@10 by human grades against by click grades; BENCHMARKS.md's figure) and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

from scipy import stats

from core.layout import Layout
from scripts_common import HOME_DEPOT, TABLE4, dssm

ENCODERS = ("lstm", "rnn", "dssm")
SYSTEMS = ("bm25", "minilm", *ENCODERS, *(f"{e}+bm25" for e in ENCODERS))
CANDIDATES = SYSTEMS[2:]  # what the gate chooses among: trained models and their hybrids
METRICS = ("ndcg@1", "ndcg@3", "ndcg@10", "retrieval ndcg@10")
GATE_METRICS = ("ndcg@10", "retrieval ndcg@10")


def value(report: dict, system: str, metric: str) -> float:
    if metric.startswith("retrieval "):
        return report["retrieval"]["systems"][system][metric.removeprefix("retrieval ")]
    return report["systems"][system][metric]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--judgments", type=Path, default=HOME_DEPOT)
    p.add_argument("--workdir", type=Path, default=Path("bench-work/clicks"))
    p.add_argument("--epochs", type=int, default=4, help="per model (Table IV's CI row: 4; the table: 10)")
    args = p.parse_args()
    if not args.judgments.exists():
        sys.exit(f"{args.judgments} not found: this study needs ../shared/data (see README)")
    work = args.workdir.resolve()
    layout = Layout(work)
    keys = [
        "simulate.test_traffic=true",
        f"train.models=[{','.join(ENCODERS)}]",
        f"train.epochs={args.epochs}",
        "evaluate.fusions=[MODEL+bm25]",
        "evaluate.retrieval=false",
        "gate.metric=ndcg@10",
    ]
    dssm("run", *keys, "--config", str(TABLE4 / "lstm.yaml"), "--workdir", str(work), "--judgments",
         str(args.judgments), "--no-index", "--no-analyze")  # fmt: skip
    judged = {"human": (args.judgments, [])}
    for name, debias in (("clicks", "--debias"), ("ctr", "--no-debias")):
        out = work / f"judge-{name}"
        dssm("judge", "--clean", str(layout.clean), "--propensity", str(layout.propensity), "--out", str(out), debias)
        judged[name] = (out / "judged.csv", ["--encoding", "utf-8", "--min-label", "1", "--relevant-at", "2.5"])
    store = f"sqlite:///{layout.mlflow_db}"
    reports = {}
    for name, (path, spec) in judged.items():
        out = work / f"agree-{name}"
        models = [a for e in ENCODERS for a in ("--model", str(layout.train(e)))]
        dssm("evaluate", "--judgments", str(path), *spec, "--out", str(out), "--baselines", "bm25,minilm",
             "--retrieval", "--hybrid-dev", str(layout.negatives), "--fusions", "MODEL+bm25",
             f"--mlflow-uri={store}", *models)  # fmt: skip
        reports[name] = json.loads((out / "report.json").read_text())
    result = agreement(reports)
    (work / "agreement.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, work / "agreement.png")
    print(markdown(result))
    print(f"figure: {work / 'agreement.png'}")


def agreement(reports: dict[str, dict]) -> dict:
    """Per judged set its values, per click-derived set τ-b against the human ranking, and the champions."""
    values = {n: {m: {s: round(value(r, s, m), 2) for s in SYSTEMS} for m in METRICS} for n, r in reports.items()}
    queries = {n: {"re-ranking": r["eval_queries"], "retrieval": r["retrieval"]["queries"]} for n, r in reports.items()}
    tau = {}
    for name in reports:
        if name != "human":
            tau[name] = {}
            for m in METRICS:
                human, clicks = ([values[n][m][s] for s in SYSTEMS] for n in ("human", name))
                tau[name][m] = round(float(stats.kendalltau(human, clicks).statistic), 3)
    champions = {n: {m: max(CANDIDATES, key=lambda s: values[n][m][s]) for m in GATE_METRICS} for n in reports}
    return {"systems": list(SYSTEMS), "queries": queries, "values": values, "tau": tau, "champions": champions}


def plot(result: dict, path: Path) -> None:
    """Each system's NDCG@10 by human grades (x) against by click grades (y), re-ranking and retrieval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    for ax, metric in zip(axes, GATE_METRICS, strict=True):
        human = result["values"]["human"][metric]
        for name, marker in (("clicks", "o"), ("ctr", "x")):
            ax.scatter([human[s] for s in SYSTEMS], [result["values"][name][metric][s] for s in SYSTEMS], marker=marker,
                       label=f"{name} (τ = {result['tau'][name][metric]:.2f})")  # fmt: skip
        for s in SYSTEMS:
            ax.annotate(s, (human[s], result["values"]["clicks"][metric][s]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")  # fmt: skip
        ax.set(xlabel=f"{metric}, human grades", ylabel=f"{metric}, grades from clicks", title=metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Home Depot: systems ranked by human grades and by grades from the simulated clicks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(result: dict) -> str:
    sets = list(result["values"])
    lines = []
    for m in METRICS:
        kind = "retrieval" if m.startswith("retrieval") else "re-ranking"
        counted = ", ".join(f"{n}: {result['queries'][n][kind]} queries" for n in sets)
        lines += [f"\n{m} ({counted})", "| system | " + " | ".join(sets) + " |", "|---|" + "---|" * len(sets)]
        for s in result["systems"]:
            lines.append(f"| {s} | " + " | ".join(f"{result['values'][n][m][s]:.1f}" for n in sets) + " |")
        lines.append("| Kendall τ-b vs human | | " + " | ".join(f"{result['tau'][n][m]:.3f}" for n in sets[1:]) + " |")
    lines.append("\nchampion by the gate's metric: " + "; ".join(f"{n}: {c}" for n, c in result["champions"].items()))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
