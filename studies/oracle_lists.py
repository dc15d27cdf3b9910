"""The most listwise targets could give: a `dssm negatives --list-size K` output whose targets are
the simulator's own attractiveness of each shown title, computed from the human grades.

    .venv/bin/python studies/oracle_lists.py --negatives bench-work/hd-ranker/negatives-listwise-map-debiased \\
        --out bench-work/hd-ranker/negatives-oracle
    .venv/bin/python studies/homedepot_ablation.py --workdir bench-work/hd-ranker --eta 2 --ranker-bias 0.5 \\
        --seeds 1,2 --variant 'clicks=' \\
        --variant 'oracle=data.negatives=bench-work/hd-ranker/negatives-oracle;loss.listwise=0.5'

Every row stays as it is but `relevance`: each listed title gets the click probability of an
examined title under `dssm simulate`'s click model (ClickModel's attract_min + (attract_max −
attract_min)·(4^grade − 1)/3, grade = the judged label scaled to [0, 1]; the simulator's random
fillers, unjudged for the query, get grade 0). No estimate from clicks can do better, so a model
trained on these lists bounds what debiasing the list targets can gain on that log.
The output gets its own manifest (params.list_targets = "oracle"), so training accepts it.

`--only-clicked` keeps the true attractiveness only of the titles the log clicked for the query
(the input's target > 0) and gives the others 0, as any click-based target does: a model trained on
those lists shows how much of the oracle's gain lies in titles the log never clicked.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from core.artifacts import read_manifest, require_manifest, write_manifest
from core.judgments import JudgedPair, read_judgments
from core.text import norm
from scripts_common import HOME_DEPOT
from stages.simulate.config import ClickModel
from stages.simulate.job import attractiveness


def mean_labels(pairs: Iterable[JudgedPair]) -> dict[tuple[str, str], float]:
    """The mean label of every judged (query, title), both normalised as the clean log has them."""
    labels: dict[tuple[str, str], list[float]] = defaultdict(list)
    for pair in pairs:
        labels[norm(pair.query), norm(pair.title)].append(pair.label)
    return {pair: float(np.mean(values)) for pair, values in labels.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--judgments", type=Path, default=HOME_DEPOT, help="the judged set the log was simulated from")
    p.add_argument("--negatives", type=Path, required=True, help="a `dssm negatives --list-size K` output")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--only-clicked", action="store_true", help="0 for every title the input's targets give 0 (never clicked)"
    )
    args = p.parse_args()
    if not args.judgments.exists():
        sys.exit(f"{args.judgments} not found: this benchmark needs ../shared/data (see README)")
    manifest = require_manifest(args.negatives, "negatives")
    if not manifest["params"].get("list_size"):
        sys.exit(f"{args.negatives} has no lists: build it with `dssm negatives --list-size K`")

    grades = mean_labels(read_judgments(args.judgments))
    low, high = min(grades.values()), max(grades.values())
    model = ClickModel()
    if args.out.exists():
        shutil.rmtree(args.out)
    tmp = args.out.with_name(args.out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(args.negatives, tmp)
    judged = unjudged = zeroed = 0
    mass = zeroed_mass = 0.0
    for path in sorted(tmp.glob("*/*.parquet")):
        table = pq.read_table(path)
        targets = []
        rows = zip(table["query"].to_pylist(), table["shown"].to_pylist(), table["relevance"].to_pylist(), strict=True)
        for query, shown, observed in rows:
            labels = [grades.get((query, title)) for title in shown]
            judged += sum(g is not None for g in labels)
            unjudged += sum(g is None for g in labels)
            grade = np.array([0.0 if g is None else (g - low) / (high - low) for g in labels])
            target = attractiveness(grade, model)
            if args.only_clicked:
                never_clicked = np.array(observed) <= 0
                zeroed += int(never_clicked.sum())
                mass, zeroed_mass = mass + target.sum(), zeroed_mass + target[never_clicked].sum()
                target = np.where(never_clicked, 0.0, target)
            targets.append(target.tolist())
        field = table.schema.field("relevance")
        table = table.set_column(table.schema.get_field_index("relevance"), field, pa.array(targets, field.type))
        pq.write_table(table, path)
    upstream = read_manifest(tmp) or {}
    write_manifest(
        tmp,
        {
            **upstream,
            "params": {**upstream["params"], "list_targets": "oracle-clicked" if args.only_clicked else "oracle"},
        },
    )
    tmp.rename(args.out)
    print(f"{judged:,} listed titles judged for their query, {unjudged:,} not (fillers, grade 0) -> {args.out}")
    if args.only_clicked:
        slots = judged + unjudged
        print(
            f"never clicked, set to 0: {zeroed:,} of {slots:,} listed titles ({zeroed / slots:.1%}), "
            f"{zeroed_mass / mass:.1%} of the oracle's target mass"
        )


if __name__ == "__main__":
    main()
