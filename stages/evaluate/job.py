"""`dssm evaluate`: score trained models and baselines on a judged set, write the report and log every
system as its own MLflow run in the dataset's experiment. Registering the trained models and moving
the champion alias are the next stages' (stages/register/job.py, stages/gate/job.py): evaluate hands
them its eval set and its registrable models as files (scoring/handoff.py)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.artifacts import code_fingerprint, publish, read_manifest, sha256_file
from core.errors import DssmError
from core.judgments import JudgedSet
from core.stopping import is_stop
from core.text import is_test_query
from core.tracking import (
    absolute_store,
    default_tracking_uri,
    existing_store,
    experiment_id,
    log_datasets,
    parent_run_id,
    parent_tags,
    use_store,
)
from core.tracking import client as mlflow_client
from scoring.baselines import BaselineParams
from scoring.catalogue import Catalogue, embedding, evaluate_retrieval, fit_fusion
from scoring.handoff import Registrable, ScoredOn, eval_key, write_eval_set, write_models
from scoring.hybrid import HybridScorer, fit_weights
from scoring.protocol import CUTOFFS, EvalSet, SystemResult, build_eval_set, evaluate_scores, metric_key
from scoring.protocol import relevant_threshold as default_threshold
from scoring.quality import METRICS as RETRIEVAL_METRICS
from scoring.systems import System, build_baseline, is_mlflow_model, load_trained, unique_names
from stages.evaluate.config import EvaluateConfig, check_config
from stages.evaluate.report import write_report

log = logging.getLogger(__name__)


@dataclass
class EvaluateJob:
    judgments: JudgedSet  # resolved once (core.judgments.resolve_judged_set)
    out: Path
    models: list[str] = field(default_factory=list)
    settings: EvaluateConfig = field(default_factory=EvaluateConfig)  # what is scored, and how
    dataset: str | None = None  # default: the judged set's name
    all_queries: bool = False
    dev: Path | None = None  # a `dssm negatives` output: evaluate on its validation queries instead
    hybrid_dev: Path | None = None  # a `dssm negatives` output: add the `fusions`, fit on its validation queries
    relevant_at: float | None = None
    min_label: float | None = None
    mlflow_uri: str | None = None  # default: sqlite store in the output's parent dir
    experiment: str | None = None  # default: the dataset name
    force: bool = False  # evaluate even when --out already holds this evaluation


def evaluate(cfg: EvaluateJob) -> dict[str, Any]:
    """Run the evaluation; returns report.json's content."""
    started = time.perf_counter()
    out = Path(cfg.out)
    uri = absolute_store(cfg.mlflow_uri) if cfg.mlflow_uri else default_tracking_uri(out.resolve().parent)
    done: dict[str, Any] = {}

    def build(tmp: Path) -> dict[str, Any]:
        judged = cfg.judgments
        pairs = judged.pairs()
        name = cfg.dataset or judged.name
        only = dev_queries(cfg.dev) if cfg.dev else None
        eval_set = build_eval_set(pairs, name, judged.sha256, cfg.all_queries, cfg.min_label, judged.spec, only)
        threshold = default_threshold(eval_set) if cfg.relevant_at is None else cfg.relevant_at
        log.info("%s: %d queries, %d judged pairs", name, len(eval_set.queries), eval_set.n_pairs)

        if logged := [m for m in cfg.models if is_mlflow_model(m)]:  # resolved in this evaluation's store
            existing_store(uri, f"dssm evaluate --model {logged[0]}")
            use_store(uri)
        trained = [load_trained(m) for m in cfg.models]
        unique_names(trained)
        settings, params = cfg.settings, cfg.settings.baseline_params()
        wanted = ["bm25", *[b for b in settings.baselines if b != "bm25"]]  # BM25 is the significance reference
        baselines = [build_timed(b, pairs, params) for b in wanted]
        systems = [*baselines, *trained]
        # A hybrid's retrieval fusion is fit whenever there is a hybrid: `dssm search` serves it.
        catalogue = Catalogue.of_judged(pairs) if settings.retrieval or cfg.hybrid_dev is not None else None
        if cfg.hybrid_dev is not None:
            dev_set = (cfg.hybrid_dev, settings.fusions, params)
            fused = hybrids(trained, baselines, pairs, judged, *dev_set, catalogue)
            systems = [*baselines, *trained, *fused]
        queries, titles = eval_set.pairs()
        results: list[SystemResult] = []
        for system in systems:
            t = time.perf_counter()
            results.append(evaluate_scores(eval_set, system.name, system.scorer.score(queries, titles), threshold))
            system.params["score_seconds"] = round(time.perf_counter() - t, 2)
            shown = " / ".join(f"{results[-1].mean(f'ndcg@{k}'):.2f}" for k in CUTOFFS)
            log.info("%-10s NDCG@1/3/10 %s", system.name, shown)

        retrieval = evaluate_retrieval(eval_set, catalogue, systems, threshold) if settings.retrieval else None
        datasets = [(name, str(judged.path), judged.sha256, "evaluation")]
        if cfg.hybrid_dev is not None:
            dev = inputs["hybrid_dev"]  # hashed once, below, for the output's input key
            datasets.append(("hybrid_dev", dev["path"], dev["sha256"], "tuning"))
        run_ids: dict[str, str] = {}
        try:  # from the first run on: a stop or a failure half-way ends every run already created
            _start_runs(uri, cfg.experiment or name, eval_set, systems, results, datasets, retrieval, run_ids)
            # which set, by content, and how its test queries were chosen: PROTOCOL.md §3's query split, of the
            # test day's traffic alone under the time split
            about = {"path": judged.path, "graded_from": judged.graded_from, "dataset_sha256": judged.sha256}
            about["split"] = {"test": "time" if judged.test_day else "query"}.get(eval_set.split, eval_set.split)
            about |= {"test_day": judged.test_day} if judged.test_day else {}
            report = write_report(tmp, eval_set, results, threshold, run_ids, retrieval, about)
            titles = catalogue.titles if retrieval is not None else None
            write_eval_set(tmp, ScoredOn(eval_set, threshold, titles))
            write_models(tmp, eval_set.name, eval_key(eval_set), registrable(systems, run_ids, report))
            _finish_runs(uri, systems, run_ids, tmp)
        except BaseException as e:
            _end_runs(uri, run_ids, "KILLED" if is_stop(e) else "FAILED")  # a stop (SIGTERM, ^C) is no failure
            raise
        done["report"] = report
        return {"mlflow_uri": uri, "counts": {"queries": report["eval_queries"], "pairs": report["eval_pairs"]}}

    inputs, params = _inputs(cfg, uri)
    manifest = publish(out, "evaluate", code_fingerprint(__name__), inputs, params, build, cfg.force)
    seconds = round(time.perf_counter() - started, 1)
    if manifest["skipped"]:
        return read_report(out) | {"skipped": True, "seconds": seconds}
    return done["report"] | {"seconds": seconds}


def read_report(out: Path) -> dict[str, Any]:
    """A finished evaluation's report.json."""
    return json.loads((out / "report.json").read_text())


def _inputs(cfg: EvaluateJob, uri: str) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """What determines an evaluation: the judged file, the model files, every setting, the store."""
    inputs = {"judgments": cfg.judgments.describe()}
    for m in cfg.models:
        path = Path(m) / "last.pt" if Path(m).is_dir() else Path(m)
        # an MLflow URI stands for itself
        inputs[f"model:{m}"] = {"path": str(m), "sha256": sha256_file(path) if path.is_file() else m}
    for key in ("dev", "hybrid_dev"):
        negatives = getattr(cfg, key)
        if negatives:
            dev_hash = (read_manifest(Path(negatives)) or {}).get("content_sha256", str(negatives))
            inputs[key] = {"path": str(negatives), "sha256": dev_hash}
    excluded = ("judgments", "out", "models", "force", "hybrid_dev")
    params = {k: str(v) for k, v in asdict(cfg).items() if k not in excluded}
    return inputs, params | {"mlflow_uri": uri, "spec": asdict(cfg.judgments.spec)}


def dev_queries(negatives: Path) -> set[str]:
    """The validation queries of a `dssm negatives` output: train queries whose clicks the model never
    trained on, so their labels may be used for tuning (PROTOCOL.md §3 forbids only test labels)."""
    import pyarrow.parquet as pq

    from core.artifacts import require_manifest

    require_manifest(negatives, "negatives")
    queries = pq.read_table(Path(negatives) / "valid", columns=["query"]).column("query").to_pylist()
    return {q for q in queries if not is_test_query(q)}  # real logs may hold test queries: never tune on them


MODEL = "MODEL"  # in a fusion spec: each trained model in turn


def fusion_names(spec: str, model: str | None) -> list[str] | None:
    """The component names of a fusion spec ("MODEL+bm25+minilm") for one trained model (None: the
    spec's without MODEL); None when the spec does not apply (it names MODEL and there is no model,
    or none and there is one, or the model twice)."""
    names = [n.strip() for n in spec.split("+") if n.strip()]
    if (MODEL in names) != (model is not None):
        return None
    names = [model if n == MODEL else n for n in names]
    return names if len(set(names)) == len(names) else None


def hybrids(
    trained: list[System],
    baselines: list[System],
    pairs,
    judged: JudgedSet,
    negatives: Path,
    specs: list[str],
    params: BaselineParams,
    catalogue: Catalogue | None = None,
) -> list[System]:
    """Each fusion of `specs` (scoring/hybrid.py): "MODEL+..." once per trained model, a spec
    without MODEL once; the re-ranking weights fit on the validation queries of `negatives`, and with a
    `catalogue` also the retrieval fusion (scoring/catalogue.py), fit on the same queries. A
    partner named bm25 or minilm is that baseline (built here when `baselines` lacks it and appended
    to it, so it is reported too); any other name, the trained model of that name. None when the
    judged set has no dev query."""
    try:
        dev = build_eval_set(pairs, judged.name, judged.sha256, only=dev_queries(negatives), spec=judged.spec)
    except DssmError as e:
        log.warning("no hybrid: %s", e)
        return []
    systems = {s.name: s for s in [*baselines, *trained]}
    out = []
    for spec in specs:
        for model in [*(s.name for s in trained if s.kind == "trained"), None]:
            names = fusion_names(spec, model)
            if names is None or "+".join(names) in {h.name for h in out}:  # MODEL+bm25 for minilm-ft and minilm-ft+bm25
                continue
            for name in names:
                if name not in systems and name in ("bm25", "minilm"):
                    systems[name] = build_timed(name, pairs, params)
                    baselines.append(systems[name])
            unknown = [n for n in names if n not in systems]
            if unknown:
                log.warning("fusion %s: no system %s here; left out", "+".join(names), ", ".join(unknown))
                continue
            # a partner is BM25, the bundled MiniLM or a trained two-tower model: what fusion.json can carry
            odd = [n for n in names[1:] if n not in ("bm25", "minilm") and systems[n].kind != "trained"]
            if odd or embedding(systems[names[0]].scorer) is None:
                log.warning("fusion %s: %s cannot be fused (bm25, minilm or trained models only); left out",
                            "+".join(names), ", ".join(odd or names[:1]))  # fmt: skip
                continue
            out.append(fused_system([systems[n] for n in names], dev, catalogue))
    return out


def fused_system(components: list[System], dev: EvalSet, catalogue: Catalogue | None) -> System:
    """The hybrid of `components` (its model first), its weights fit on `dev`."""
    model, partners = components[0], components[1:]
    fit = fit_weights(dev, model.scorer, [p.scorer for p in partners])
    scorers = {c.name: c.scorer for c in components}
    fusion: dict[str, Any] = {
        "components": [{"name": c.name, "kind": component_kind(c, i)} for i, c in enumerate(components)],
        "weights": list(fit.weights),
    }
    bm25 = next((c for c in components if c.name == "bm25"), None)
    if bm25 is not None:
        fusion["bm25"] = bm25.scorer.to_dict()
    params = model.params | fit.params() | {"components": "+".join(scorers)}
    if catalogue is not None:
        chosen, grid = fit_fusion(dev, catalogue, scorers)
        fusion["retrieval"] = chosen.to_dict()
        params |= {"retrieval_method": chosen.method, "retrieval_depth": chosen.depth}
        params["retrieval_weights"] = " ".join(f"{w:g}" for w in chosen.weights)
        best = sorted(grid.items(), key=lambda kv: -kv[1])[:20]  # MLflow params are short: the best of the grid
        params["retrieval_dev_grid_top"] = " ".join(f"{k}={v:.2f}" for k, v in best)
    tags = model.tags | {"fused_with": "+".join(p.name for p in partners)}
    partner_checkpoints = {p.name: p.checkpoint for p in partners if p.checkpoint is not None}
    return System(
        "+".join(scorers),
        "hybrid",
        HybridScorer(model.scorer, [p.scorer for p in partners], fit.weights),
        params,
        tags,
        model.checkpoint,
        fusion,
        scorers,
        partner_checkpoints,
    )


def component_kind(system: System, position: int) -> str:
    """How a fusion.json names a component: the model (position 0), bm25, minilm (the bundled one), or
    a trained partner's checkpoint."""
    if position == 0:
        return "model"
    if system.checkpoint is not None:
        return "checkpoint"
    return system.name


def build_timed(name: str, pairs, params: BaselineParams) -> System:
    t = time.perf_counter()
    system = build_baseline(name, pairs, params)
    system.params["fit_seconds"] = round(time.perf_counter() - t, 2)
    return system


def _tags(eval_set: EvalSet, system: System) -> dict[str, str]:
    return {
        "dataset": eval_set.name,
        "dataset_sha256": eval_set.sha256,
        "eval_key": eval_key(eval_set),
        "split": eval_set.split,
        "system": system.name,
        "kind": system.kind,
        "code_version": code_fingerprint(__name__)[:16],
        **system.tags,
    }


def _start_runs(
    uri: str,
    experiment: str,
    eval_set: EvalSet,
    systems: list[System],
    results: list[SystemResult],
    datasets: list[tuple[str, str, str, str]],
    retrieval: dict[str, Any] | None,
    ids: dict[str, str],
) -> None:
    """One finished-later run per system with its tags, params, metrics and dataset inputs (the judged
    set; for a hybrid also the dev queries its weight was fit on), nested under the flow run's parent
    run inside a flow; each run's id goes into `ids` (by system) as soon as it exists."""
    client = mlflow_client(uri)
    exp = experiment_id(uri, experiment)
    nested = parent_tags(parent_run_id())
    for system, result in zip(systems, results, strict=True):
        run = client.create_run(exp, run_name=system.name, tags=_tags(eval_set, system) | nested)
        ids[system.name] = run.info.run_id
        log_datasets(uri, run.info.run_id, datasets if system.kind == "hybrid" else datasets[:1])
        for key, value in list(system.params.items())[:100]:
            client.log_param(run.info.run_id, key, str(value)[:500])
        metrics = {metric_key(f"ndcg@{k}"): result.mean(f"ndcg@{k}") for k in CUTOFFS}
        metrics |= {"mrr": result.mean("rr"), "map": result.mean("ap"), "eval_queries": len(eval_set.queries)}
        measured = (retrieval or {}).get("systems", {}).get(system.name, {})
        metrics |= {metric_key(f"retrieval_{m}"): measured[m] for m in RETRIEVAL_METRICS if m in measured}
        metrics |= training_metrics(client, system.tags.get("train_run_id", ""))
        for key, value in metrics.items():
            client.log_metric(run.info.run_id, key, value)


TRAINING_METRICS = ("train_loss", "valid_loss", "train_examples_per_s")  # as the training run names them


def training_metrics(client, train_run_id: str) -> dict[str, float]:
    """A trained model's training numbers under the training run's names, for its evaluation runs:
    compared beside NDCG in one view. Losses: the run's last values; throughput: the mean of its
    logged windows after the first (warm-up). None when the training run is not in this store."""
    from mlflow.exceptions import MlflowException

    if not train_run_id:
        return {}
    try:
        logged = client.get_run(train_run_id).data.metrics
        rates = [
            m.value for m in sorted(client.get_metric_history(train_run_id, TRAINING_METRICS[2]), key=lambda m: m.step)
        ]
    except MlflowException:
        return {}
    out = {k: logged[k] for k in TRAINING_METRICS[:2] if k in logged}
    steady = rates[1:] or rates
    return out | ({TRAINING_METRICS[2]: sum(steady) / len(steady)} if steady else {})


def registrable(systems: list[System], run_ids: dict[str, str], report: dict[str, Any]) -> list[Registrable]:
    """The trained models and hybrids that have a checkpoint (not one loaded from MLflow), for register."""
    measured = report.get("retrieval", {}).get("systems", {})
    models = []
    for system in systems:
        if system.kind not in ("trained", "hybrid") or system.checkpoint is None:
            continue
        metrics = {"ndcg@10": report["systems"][system.name]["ndcg@10"]}
        if system.name in measured:
            metrics["retrieval_ndcg@10"] = measured[system.name]["ndcg@10"]
        partners = {k: str(v) for k, v in system.partner_checkpoints.items()}
        checkpoint = str(system.checkpoint)
        models.append(
            Registrable(system.name, system.kind, run_ids[system.name], checkpoint, metrics, system.fusion, partners)
        )
    return models


def _finish_runs(uri: str, systems: list[System], run_ids: dict[str, str], out: Path) -> None:
    """Attach the report to every run and end it."""
    client = mlflow_client(uri)
    for system in systems:
        run_id = run_ids[system.name]
        for artifact in ("report.json", "report.md", "ndcg.png", "qrels.txt"):
            client.log_artifact(run_id, str(out / artifact))
        client.log_artifact(run_id, str(out / "runs" / f"{system.name}.run"), "runs")
        client.set_terminated(run_id, "FINISHED")


def _end_runs(uri: str, run_ids: dict[str, str], status: str) -> None:
    client = mlflow_client(uri)
    for run_id in run_ids.values():
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_terminated(run_id, status)


def add_arguments(p) -> None:
    """`dssm evaluate`'s options: the inputs and plumbing, EvaluateConfig' fields, the judged set's columns."""
    from core.judgments import add_judgment_options
    from core.options import add_config_options

    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="PATH_OR_URI",
        help="a trained model: checkpoint file, `dssm train` out dir, or MLflow URI (models:/NAME@champion, "
        "runs:/ID/model); repeat for several",
    )
    p.add_argument("--judgments", type=Path, required=True, help="judged set: CSV/TSV or a .zip holding one")
    p.add_argument("--out", type=Path, required=True, help="report directory (replaced atomically)")
    p.add_argument(
        "--all-queries",
        action="store_true",
        help="every query with enough judgments, not only PROTOCOL.md's test split (for a set no model trained on)",
    )
    p.add_argument(
        "--dev",
        type=Path,
        metavar="NEGATIVES_DIR",
        help="evaluate on the validation queries of this `dssm negatives` output instead (for tuning)",
    )
    p.add_argument(
        "--hybrid-dev",
        type=Path,
        metavar="NEGATIVES_DIR",
        help="also evaluate the --fusions (hybrids), their weights fit on the validation queries of this "
        "`dssm negatives` output",
    )
    p.add_argument("--dataset", help="dataset name for the report and MLflow (default: from the file path)")
    p.add_argument("--min-label", type=float, help="bottom of the label scale (default: the smallest label)")
    p.add_argument("--relevant-at", type=float, help="label threshold for MRR/MAP (default: 3/4 up the scale)")
    p.add_argument("--mlflow-uri", help="tracking URI (default: sqlite:///<parent of --out>/mlflow.db)")
    p.add_argument("--experiment", help="MLflow experiment (default: the dataset name)")
    p.add_argument("--force", action="store_true", help="evaluate again even if --out holds this evaluation")
    add_config_options(p.add_argument_group("what is scored, and how (the flow's evaluate.* keys)"), EvaluateConfig)
    add_judgment_options(p)


def config_from_args(args) -> EvaluateJob:
    from core.judgments import resolve_judged_set, spec_from_args
    from core.options import config_from_options

    settings = config_from_options(EvaluateConfig, args)
    check_config(settings)
    return EvaluateJob(
        judgments=resolve_judged_set(args.judgments, spec_from_args(args)),
        out=args.out,
        models=args.model,
        settings=settings,
        dataset=args.dataset,
        all_queries=args.all_queries,
        dev=args.dev,
        hybrid_dev=args.hybrid_dev,
        relevant_at=args.relevant_at,
        min_label=args.min_label,
        mlflow_uri=args.mlflow_uri,
        experiment=args.experiment,
        force=args.force,
    )


def command(args) -> None:
    """`dssm evaluate`."""
    cfg = config_from_args(args)
    report = evaluate(cfg)
    print((Path(cfg.out) / "report.md").read_text(), end="")
    print(f"report: {cfg.out}/report.json ({report['seconds']:.0f}s)")
    if cfg.models:
        print(f"register its models: dssm register --evaluation {cfg.out} --out REGISTER_DIR")
