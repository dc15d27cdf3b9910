"""What the scripts of benchmarks/, reproductions/ and studies/ share; not part of the product.

Every script is run from the repository root as `python FOLDER/NAME.py` and starts by putting the
root on sys.path, so that it can import this module (and a script of another folder as
`reproductions.homedepot_table4`). The product packages (PROJECT_PACKAGES in core/artifacts.py)
never import from here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from scoring.protocol import ndcg, paired_test, pairs_in_order

ROOT = Path(__file__).resolve().parent
SHARED_DATA = ROOT.parent / "shared" / "data"  # the real data sets, beside the repository (README, "Data")
HOME_DEPOT = SHARED_DATA / "homedepot-search-relevance" / "train.csv.zip"
TABLE4 = ROOT / "configs" / "homedepot_table4"  # Table IV's chosen `dssm run` configs, one per encoder


def training_keys(run_config: Path, encoder: str = "", device: str = "cpu") -> list[str]:
    """A `dssm run` config file's training recipe for `encoder` (default: its model.encoder) on `device`
    as `dssm train` KEY=VALUEs: its train section with that encoder's per_encoder keys (and those of
    ENCODER@DEVICE) applied, the flow's own keys (train.models, ...) left out."""
    from flows.config import load_run_config
    from modeling.config import TrainRecipe

    section = load_run_config(run_config).train
    given, defaults = section.for_encoder(encoder or section.model.encoder, device).flat(), TrainRecipe().flat()
    return [f"{key}={value}" for key, value in given.items() if value != defaults[key]]


def dssm(*args: str) -> None:
    """Run a dssm command, tracked in the workdir's own MLflow store: a shell set up for the local
    stack (`eval "$(dssm stack env)"`) must not register benchmark models in the team's registry
    and move its champion alias."""
    cmd = [str(Path(sys.executable).parent / "dssm"), *args]
    print("+", " ".join(cmd), flush=True)
    started = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    subprocess.run(cmd, check=True, env=env)
    print(f"  ({time.perf_counter() - started:.0f}s)", flush=True)


def run_measured(args: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in GiB of the process tree) of `dssm ARGS`: the largest resident set of the
    process and all its children (the Spark JVM, Python workers), sampled every 0.2 s."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dssm.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode != 0:
        sys.exit(f"dssm {' '.join(args)} failed:\n{output.decode()[-3000:]}")
    return time.perf_counter() - started, peak / 2**30


def read_qrels(report: Path) -> dict[str, dict[str, float]]:
    """query id -> {docno: label} from a report's qrels.txt."""
    qrels: dict[str, dict[str, float]] = {}
    for line in (report / "qrels.txt").read_text().splitlines():
        query, _, doc, label = line.split()
        qrels.setdefault(query, {})[doc] = float(label)
    return qrels


def read_run(report: Path, system: str) -> dict[str, list[str]]:
    """query id -> its docnos, best first, from a report's runs/SYSTEM.run (written in rank order)."""
    ranked: dict[str, list[str]] = {}
    for line in (report / "runs" / f"{system}.run").read_text().splitlines():
        query, _, doc, *_ = line.split()
        ranked.setdefault(query, []).append(doc)
    return ranked


def per_query_ndcg(report: Path, system: str, k: int) -> dict[str, float]:
    """NDCG@k of each query from the report's TREC files (qrels.txt, runs/SYSTEM.run)."""
    qrels = read_qrels(report)
    min_label = min(v for docs in qrels.values() for v in docs.values())
    ranked = read_run(report, system)
    return {
        q: ndcg(np.array([qrels[q][d] for d in docs]), -np.arange(len(docs), dtype=float), k, min_label)
        for q, docs in ranked.items()
    }


def per_query_pairs_in_order(report: Path, system: str) -> dict[str, float]:
    """`scoring.protocol.pairs_in_order` of each query with more than one label, from the TREC files."""
    qrels = read_qrels(report)
    shares = {}
    for q, docs in read_run(report, system).items():
        share = pairs_in_order(np.array([qrels[q][d] for d in docs]), -np.arange(len(docs), dtype=float))
        if share is not None:
            shares[q] = share
    return shares


def paired_cell(metric: str, a: dict[str, float], b: dict[str, float]) -> str:
    """`METRIC +d (p=…)`: the mean per-query difference b − a (×100) and its paired t-test p-value."""
    queries = sorted(a)
    x, y = np.array([a[q] for q in queries]), np.array([b[q] for q in queries])
    return f"{metric} {100 * (y.mean() - x.mean()):+.2f} (p={paired_test(y, x):.3g})"


def seed_mean(per_seed: list[dict[str, float]]) -> dict[str, float]:
    """Per query, a metric averaged over the seeds' models (one {query: value} per seed)."""
    return {q: float(np.mean([run[q] for run in per_seed])) for q in per_seed[0]}
