"""`dssm sts`: semantic textual similarity as Wieting & Gimpel (2017) report it. Each system embeds
both sentences of a pair; its score is their cosine; per dataset we report Pearson's r × 100 (and
Spearman's ρ) against the gold scores, per STS year the mean over that year's datasets, plus STS-B
test and SICK test. Every system is an MLflow run in experiment `sts` (docs/paraphrase.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from core.artifacts import code_fingerprint, publish, sha256_file
from core.errors import DssmError
from core.sentence_pairs import read_pairs, sentence_norm
from core.tracking import client as mlflow_client
from core.tracking import default_tracking_uri, experiment_id, log_datasets
from scoring.neural import cosine_scores
from stages.sts.config import StsConfig, check_config

log = logging.getLogger(__name__)
SUITES = ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK")


@dataclass(frozen=True)
class StsFile:
    suite: str
    name: str
    path: Path
    fmt: str


def sts_files(data: Path) -> list[StsFile]:
    """The evaluation files under ../shared/data: STS 2012-2016 test sets, STS-B test, SICK test."""
    found = []
    for year in range(2012, 2017):
        for path in sorted((data / "semeval-sts-2012-2016" / str(year)).glob("*.test.tsv")):
            found.append(StsFile(f"STS{year % 100}", path.name.removesuffix(".test.tsv"), path, "sts"))
    for suite, path, fmt in (
        ("STS-B", data / "stsbenchmark" / "sts-test.csv", "stsb"),
        ("SICK", data / "sick2014" / "SICK_test_annotated.txt", "sick"),
    ):
        if path.exists():
            found.append(StsFile(suite, suite, path, fmt))
    if not found:
        raise DssmError(f"no STS files under {data} (expected semeval-sts-2012-2016/, stsbenchmark/, sick2014/)")
    return found


@dataclass
class StsResult:
    system: str
    files: dict[str, dict[str, float]] = field(default_factory=dict)  # "STS14/images": {pearson, spearman, n}
    suites: dict[str, float] = field(default_factory=dict)  # mean Pearson × 100 per suite

    def table_row(self) -> list[str]:
        return [f"{self.suites[s]:.1f}" if s in self.suites else "–" for s in SUITES]


@dataclass(frozen=True)
class StsSet:
    """One file's scored pairs, normalised as the training data is (read once for every system)."""

    file: StsFile
    s1: list[str]
    s2: list[str]
    gold: np.ndarray


def load_sets(files: list[StsFile]) -> list[StsSet]:
    sets = []
    for f in files:
        pairs, _ = read_pairs(f.path, f.fmt)
        s1 = [sentence_norm(p.s1) for p in pairs]
        s2 = [sentence_norm(p.s2) for p in pairs]
        sets.append(StsSet(f, s1, s2, np.array([p.score for p in pairs])))
    return sets


def score_system(name: str, embed, sets: list[StsSet]) -> StsResult:
    """Pearson/Spearman × 100 of cos(embed(s1), embed(s2)) against gold, per file and per suite."""
    result = StsResult(name)
    per_suite: dict[str, list[float]] = {}
    for data in sets:
        f = data.file
        predicted = cosine_scores(data.s1, data.s2, embed)
        pearson = 100 * float(stats.pearsonr(predicted, data.gold).statistic)
        spearman = 100 * float(stats.spearmanr(predicted, data.gold).statistic)
        result.files[f"{f.suite}/{f.name}"] = {"pearson": pearson, "spearman": spearman, "n": len(data.gold)}
        per_suite.setdefault(f.suite, []).append(pearson)
    result.suites = {s: float(np.mean(v)) for s, v in per_suite.items()}
    result.suites["STS avg"] = float(np.mean([v for s, v in result.suites.items() if s.startswith("STS1")]))
    return result


@dataclass
class StsJob:
    data: Path
    out: Path
    models: list[str] = field(default_factory=list)
    settings: StsConfig = field(default_factory=StsConfig)
    mlflow_uri: str | None = None
    experiment: str = "sts"


def run_sts(cfg: StsJob) -> dict[str, Any]:
    """Score every model and baseline on every STS file; write sts.json and sts.md; log to MLflow."""
    from scoring.systems import load_trained

    started = time.perf_counter()
    check_config(cfg.settings)
    files = sts_files(Path(cfg.data))
    systems: list[tuple[str, Any, dict[str, str]]] = []
    for spec in cfg.models:
        system = load_trained(spec)
        embedder = system.scorer
        systems.append((_name(system.name, spec), lambda t, e=embedder: e.embed(t, "query"), system.tags))
    if "minilm" in cfg.settings.baselines:  # the one STS baseline
        from scoring.neural import MiniLMEmbedder

        systems.append(("minilm", MiniLMEmbedder().embed, {"kind": "baseline"}))
    if not systems:
        raise DssmError("nothing to score: give --model and/or --baselines minilm")
    results = []
    sets = load_sets(files)
    for name, embed, _ in systems:
        t = time.perf_counter()
        results.append(score_system(name, embed, sets))
        log.info("%-12s STS avg %.1f  (%.0fs)", name, results[-1].suites["STS avg"], time.perf_counter() - t)
    data_sha = hashlib.sha256("".join(sha256_file(f.path) for f in files).encode()).hexdigest()
    uri = cfg.mlflow_uri or default_tracking_uri(Path(cfg.out).resolve().parent)
    run_ids = {}
    for (name, _, tags), result in zip(systems, results, strict=True):
        run_ids[name] = _start_run(uri, cfg, name, tags, result, data_sha)
    report = {
        "dataset": "sts",
        "dataset_sha256": data_sha,
        "files": [f"{f.suite}/{f.name}" for f in files],
        "systems": {
            r.system: {"suites": r.suites, "files": r.files, "mlflow_run_id": run_ids[r.system]} for r in results
        },
    }
    client = mlflow_client(uri)
    try:

        def build(tmp: Path) -> dict[str, Any]:
            (tmp / "sts.json").write_text(json.dumps(report, indent=2) + "\n")
            (tmp / "sts.md").write_text(markdown(results))
            return {"counts": {"files": len(files), "systems": len(results)}}

        # Always recomputed (force): the report is the record of the MLflow runs just made.
        inputs = {"sts_data": {"path": str(cfg.data), "sha256": data_sha}}
        params = {"models": list(cfg.models), "baselines": list(cfg.settings.baselines)}
        publish(Path(cfg.out), "sts", code_fingerprint(__name__), inputs, params, build, force=True)
        for run_id in run_ids.values():
            client.log_artifact(run_id, str(Path(cfg.out) / "sts.md"))
            client.log_artifact(run_id, str(Path(cfg.out) / "sts.json"))
            client.set_terminated(run_id)
    except BaseException:
        for run_id in run_ids.values():
            client.set_terminated(run_id, "FAILED")
        raise
    report["seconds"] = round(time.perf_counter() - started, 1)
    return report


def _name(encoder: str, spec: str) -> str:
    """A readable, distinct system name: WORKDIR/RUN for a `dssm train` run dir (para/lstm, hd/lstm),
    the run dir's name for other paths, the encoder for an MLflow URI."""
    from scoring.systems import is_mlflow_model

    if is_mlflow_model(spec):
        return encoder
    path = Path(spec)
    run = path.parent if path.suffix == ".pt" else path
    return f"{run.parent.parent.name}/{run.name}" if run.parent.name == "train" else run.name


def markdown(results: list[StsResult]) -> str:
    """Wieting & Gimpel's Table 1 layout: Pearson's r × 100 per suite (mean over its datasets)."""
    head = ["system", *SUITES[:5], "STS avg", *SUITES[5:]]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in results:
        row = r.table_row()
        lines.append("| " + " | ".join([r.system, *row[:5], f"{r.suites['STS avg']:.1f}", *row[5:]]) + " |")
    lines += ["", "Pearson's r × 100 of the cosine against gold; STS12-16: mean over each year's datasets.", ""]
    return "\n".join(lines)


def _start_run(uri: str, cfg: StsJob, name: str, tags: dict[str, str], result: StsResult, data_sha: str) -> str:
    """One MLflow run per system, tagged like the retrieval runs, with its Pearson/Spearman metrics."""
    client = mlflow_client(uri)
    run_tags = {
        "dataset": "sts",
        "dataset_sha256": data_sha,
        "split": "test",
        "system": name,
        "kind": tags.get("kind", "trained"),
        "code_version": code_fingerprint(__name__)[:16],
        **{k: v for k, v in tags.items() if k != "kind"},
    }
    run = client.create_run(experiment_id(uri, cfg.experiment), run_name=name, tags=run_tags)
    log_datasets(uri, run.info.run_id, [("sts", str(cfg.data), data_sha, "evaluation")])
    for suite, value in result.suites.items():
        client.log_metric(run.info.run_id, "pearson_" + suite.lower().replace(" ", "_").replace("-", ""), value)
    for key, value in result.files.items():
        metric = key.lower().replace("/", "_").replace("-", "").replace(" ", "_")
        client.log_metric(run.info.run_id, f"pearson_{metric}", value["pearson"])
        client.log_metric(run.info.run_id, f"spearman_{metric}", value["spearman"])
    return run.info.run_id


def add_arguments(p) -> None:
    """`dssm sts`'s options: the models, data and plumbing, then StsConfig' fields."""
    import os

    from core.options import add_config_options

    p.add_argument("--model", action="append", default=[], metavar="PATH_OR_URI", help="a trained model (repeatable)")
    default_data = Path(os.environ.get("DSSM_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
    p.add_argument("--data", type=Path, default=default_data, help="the shared data folder (default: %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="report directory (replaced atomically)")
    p.add_argument("--mlflow-uri", help="tracking URI (default: sqlite:///<parent of --out>/mlflow.db)")
    p.add_argument("--experiment", default="sts", help="MLflow experiment (default: %(default)s)")
    add_config_options(p, StsConfig)


def command(args) -> None:
    """`dssm sts`."""
    from core.options import config_from_options

    settings = config_from_options(StsConfig, args)
    report = run_sts(StsJob(args.data, args.out, args.model, settings, args.mlflow_uri, args.experiment))
    print((args.out / "sts.md").read_text(), end="")
    print(f"report: {args.out}/sts.json ({report['seconds']:.0f}s)")
