"""What an evaluation writes: report.json (PROTOCOL.md §6), report.md (a Table IV), TREC run files
with their qrels, and a plot of NDCG@k per system with 95% confidence intervals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from scoring.protocol import CUTOFFS, REPORTED_DECIMALS, EvalSet, SystemResult, confidence_halfwidth, paired_test

REFERENCE = "bm25"  # PROTOCOL.md §5: significance against BM25
ALPHA = 0.05


def summarise(eval_set: EvalSet, results: list[SystemResult], relevant_at: float) -> dict[str, Any]:
    """The report.json document; per system the §6 keys plus MRR, MAP, CIs and p-values vs BM25."""
    reference = next((r for r in results if r.system == REFERENCE), None)
    systems: dict[str, Any] = {}
    for r in results:
        entry: dict[str, Any] = {f"ndcg@{k}": round(r.mean(f"ndcg@{k}"), REPORTED_DECIMALS) for k in CUTOFFS}
        entry["mrr"] = round(r.mean("rr"), REPORTED_DECIMALS)
        entry["map"] = round(r.mean("ap"), REPORTED_DECIMALS)
        halfwidths = {k: confidence_halfwidth(r.per_query[f"ndcg@{k}"]) for k in CUTOFFS}
        entry["ci95"] = {f"ndcg@{k}": round(w, REPORTED_DECIMALS) for k, w in halfwidths.items()}
        if reference is not None and r is not reference:
            entry["p_vs_bm25"] = {
                f"ndcg@{k}": paired_test(r.per_query[f"ndcg@{k}"], reference.per_query[f"ndcg@{k}"]) for k in CUTOFFS
            }
        systems[r.system] = entry
    return {
        "dataset": eval_set.name,
        "dataset_sha256": eval_set.sha256,
        "eval_queries": len(eval_set.queries),
        "eval_pairs": eval_set.n_pairs,
        "split": eval_set.split,
        "relevant_at": relevant_at,
        "systems": systems,
    }


def markdown(report: dict[str, Any]) -> str:
    """Table IV: systems by NDCG@1; † marks a significant difference from BM25 (paired t-test, p<0.05)."""
    rows = sorted(report["systems"].items(), key=lambda kv: -kv[1]["ndcg@1"])
    graded = " (graded from clicks)" if report.get("judged_set", {}).get("graded_from") == "clicks" else ""
    lines = [
        f"**{report['dataset']}** ({report['split']} split): {report['eval_queries']} queries, "
        f"{report['eval_pairs']} judged pairs{graded}",
        "",
        "| system | NDCG@1 | NDCG@3 | NDCG@10 | MRR | MAP |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in rows:
        cells = []
        for k in CUTOFFS:
            p = s.get("p_vs_bm25", {}).get(f"ndcg@{k}")
            mark = "†" if p is not None and p < ALPHA else ""
            cells.append(f"{s[f'ndcg@{k}']:.1f}{mark}")
        lines.append(f"| {name} | {' | '.join(cells)} | {s['mrr']:.1f} | {s['map']:.1f} |")
    lines += [
        "",
        f"† differs from BM25 at p < {ALPHA} (paired two-sided t-test over queries). "
        f"MRR/MAP count a pair relevant at label ≥ {report['relevant_at']:g}.",
    ]
    if "retrieval" in report:
        lines += ["", *retrieval_markdown(report["retrieval"], report["relevant_at"])]
    return "\n".join(lines) + "\n"


def retrieval_markdown(retrieval: dict[str, Any], relevant_at: float) -> list[str]:
    """The full-catalogue table (PROTOCOL.md §8), systems by strict NDCG@10; † as in Table IV."""
    lines = [
        f"**Retrieval from the whole catalogue** ({retrieval['catalogue_titles']:,} titles, "
        f"{retrieval['queries']} queries; unjudged titles count as not relevant)",
        "",
        "| system | NDCG@10 | Recall@10 | Recall@100 | Recall@1000 | judged@10 | condensed NDCG@10 |",
        "|---|---|---|---|---|---|---|",
    ]
    columns = ("ndcg@10", "recall@10", "recall@100", "recall@1000", "judged@10", "condensed_ndcg@10")
    for name, s in sorted(retrieval["systems"].items(), key=lambda kv: -kv[1]["ndcg@10"]):
        p = s.get("p_vs_bm25", {})
        cells = [f"{s[c]:.1f}{'†' if p.get(c) is not None and p[c] < ALPHA else ''}" for c in columns]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    lines.append(f"Recall counts titles labelled ≥ {relevant_at:g}; judged@10: the share of the top 10 judged.")
    return lines


def write_trec(out: Path, eval_set: EvalSet, results: list[SystemResult]) -> None:
    """runs/SYSTEM.run (`qid Q0 docno rank score tag`) and qrels.txt; docno is the pair's file row."""
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    with open(out / "qrels.txt", "w") as f:
        for q in eval_set.queries:
            for row, label in zip(q.rows, q.labels, strict=True):
                f.write(f"{q.qid} 0 {row} {label - eval_set.min_label:g}\n")
    for r in results:
        with open(runs / f"{r.system}.run", "w") as f:
            for q, scores in zip(eval_set.queries, r.scores, strict=True):
                order = np.argsort(-scores, kind="stable")
                for rank, i in enumerate(order, 1):
                    f.write(f"{q.qid} Q0 {q.rows[i]} {rank} {scores[i]:.6f} {r.system}\n")


def plot(out: Path, report: dict[str, Any]) -> Path:
    """Grouped bars of NDCG@1/3/10 per system with 95% CI whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(report["systems"], key=lambda n: -report["systems"][n]["ndcg@1"])
    fig, axes = plt.subplots(1, len(CUTOFFS), figsize=(4 + 1.1 * len(names) * len(CUTOFFS) / 2, 4.2), sharey=False)
    for ax, k in zip(axes, CUTOFFS, strict=True):
        values = [report["systems"][n][f"ndcg@{k}"] for n in names]
        errors = [report["systems"][n]["ci95"][f"ndcg@{k}"] for n in names]
        colors = ["#888888" if n == REFERENCE else "#1f77b4" for n in names]
        ax.bar(names, values, yerr=errors, capsize=3, color=colors)
        low = min(v - e for v, e in zip(values, errors, strict=True))
        ax.set_ylim(max(0.0, low - 3), min(100.0, max(values) + 3))
        ax.set_title(f"NDCG@{k}")
        ax.tick_params(axis="x", labelrotation=45)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{report['dataset']}: {report['eval_queries']} queries ({report['split']} split), 95% CI")
    fig.tight_layout()
    path = out / "ndcg.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(
    out: Path,
    eval_set: EvalSet,
    results: list[SystemResult],
    relevant_at: float,
    run_ids: dict[str, str],
    retrieval: dict[str, Any] | None = None,
    judged_set: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write every report file into `out`; `run_ids` are the systems' MLflow runs; `retrieval` is
    scoring/catalogue.py's full-catalogue section; `judged_set` says which judged set decided."""
    out.mkdir(parents=True, exist_ok=True)
    report = summarise(eval_set, results, relevant_at)
    if judged_set is not None:
        report["judged_set"] = judged_set
    if retrieval is not None:  # per-query values in a file of their own, for seed-mean paired tests
        systems = {
            name: {k: v for k, v in entry.items() if k != "per_query"} for name, entry in retrieval["systems"].items()
        }
        per_query = {name: entry["per_query"] for name, entry in retrieval["systems"].items()}
        report["retrieval"] = {k: v for k, v in retrieval.items() if k not in ("qids", "systems")} | {
            "systems": systems
        }
        (out / "retrieval-per-query.json").write_text(json.dumps({"qids": retrieval["qids"], "systems": per_query}))
    for name, entry in report["systems"].items():
        entry["mlflow_run_id"] = run_ids.get(name)
    write_trec(out, eval_set, results)
    (out / "report.md").write_text(markdown(report))
    plot(out, report)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
