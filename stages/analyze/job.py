"""`dssm analyze`: the paper's section V-A and appendices for one trained model, as one Markdown
report with its PNGs and the numbers behind them (analysis.json), written atomically and logged
as artifacts of the model's MLflow training run.

Sections (stages/analyze/sections.py): chosen query/title pairs (Figs. 4-6, Tables I-II), a second model
on the same pairs (Tables V-VIII), the test queries (keywords, input-gate attenuation, Table III),
training cost curves from MLflow (Fig. 7) and doc2vec's nearest words (appendix F).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.artifacts import code_fingerprint, publish, sha256_file
from core.errors import DssmError
from core.judgments import JudgedSet
from scoring.neural import TwoTowerEmbedder
from stages.analyze.compare import plot_cost_curves, training_curve
from stages.analyze.config import AnalyzeConfig, check_config
from stages.analyze.sections import pair_section, probe_section, test_section

log = logging.getLogger(__name__)
REPORT = "analysis.md"


@dataclass
class AnalyzeJob:
    model: str  # a checkpoint, a `dssm train` run dir, or an MLflow model URI
    out: Path
    compare: str | None = None  # a second model (e.g. the RNN) for Tables V-VIII and Fig. 7
    judgments: JudgedSet | None = None  # its test queries feed Table III; pairs are drawn from them
    chosen: list[tuple[str, str]] = field(default_factory=list)  # (query, title) pairs to trace; else drawn
    settings: AnalyzeConfig = field(default_factory=AnalyzeConfig)
    mlflow_uri: str | None = None  # where models:/ URIs resolve (the training run is found in its own store)
    log_mlflow: bool = True
    force: bool = False


@dataclass
class Loaded:
    spec: str
    embedder: TwoTowerEmbedder
    checkpoint: Path
    run_id: str | None  # the MLflow training run
    tracking_uri: str | None


def load(spec: str, mlflow_uri: str | None) -> Loaded:
    from modeling.checkpoint import read_checkpoint
    from scoring.systems import load_trained

    if mlflow_uri:
        from core.tracking import use_store

        use_store(mlflow_uri)  # where a models:/ URI is resolved
    system = load_trained(spec)
    state = read_checkpoint(system.checkpoint)
    # The training run lives in the store the model was trained with; --mlflow-uri may only be the registry.
    uri = state["config"].get("mlflow_uri") or mlflow_uri or None
    return Loaded(spec, system.scorer, system.checkpoint, state.get("mlflow_run_id"), uri)


def analyze(cfg: AnalyzeJob) -> dict[str, Any]:
    """Write the report into cfg.out (skipped when it already holds this analysis); returns analysis.json."""
    started = time.perf_counter()
    out = Path(cfg.out)
    main = load(cfg.model, cfg.mlflow_uri)
    loaded = [main, load(cfg.compare, cfg.mlflow_uri)] if cfg.compare else [main]
    models = [m.embedder for m in loaded]
    settings = cfg.settings
    rule = settings.rule
    done: dict[str, Any] = {}

    def build(tmp: Path) -> dict[str, Any]:
        queries = _test_queries(cfg)
        pairs = cfg.chosen or _draw_pairs(queries, settings.pairs)
        if not pairs:
            raise DssmError("nothing to analyse: give --pair QUERY TITLE or --judgments FILE")
        md = [f"# What `{main.embedder.encoder_name}` reads", "", _preamble(cfg, main), ""]
        result: dict[str, Any] = {"model": cfg.model, "encoder": main.embedder.encoder_name, "rule": asdict(rule)}
        result["pairs"] = []
        for n, (query, title) in enumerate(pairs, 1):
            section, numbers = pair_section(n, query, title, models, rule, tmp)
            md += section
            result["pairs"].append(numbers)
        if queries:
            table = (settings.topic_cells, settings.topic_queries)
            section, result["test_queries"] = test_section(queries, models, rule, *table)
            md += section
        curves = _curves(loaded)
        if curves:
            plot_cost_curves(curves, tmp / "cost-curves.png")
            md += ["## Training cost (Fig. 7)", "", "![training cost](cost-curves.png)", ""]
            result["cost_curves"] = {k: {"first": v[0], "last": v[-1], "points": len(v)} for k, v in curves.items()}
        if settings.probes:
            if not queries:
                raise DssmError("--probes needs --judgments (doc2vec is trained on the judged set's text)")
            section, result["doc2vec_probe"] = probe_section(_judged_texts(cfg), settings.probes)
            md += section
        result["seconds"] = round(time.perf_counter() - started, 1)
        (tmp / REPORT).write_text("\n".join(md) + "\n")
        (tmp / "analysis.json").write_text(json.dumps(result, indent=2, default=_plain) + "\n")
        if cfg.log_mlflow:  # before publication: a published analysis is one MLflow has
            result["mlflow"] = _log_artifacts(main, tmp)
        done["result"] = result
        return {"model": cfg.model, "mlflow_run_id": main.run_id}

    inputs, params = _inputs(cfg, loaded)
    manifest = publish(out, "analyze", code_fingerprint(__name__), inputs, params, build, cfg.force)
    if manifest["skipped"]:
        return json.loads((out / "analysis.json").read_text()) | {"skipped": True}
    return done["result"]


def _preamble(cfg: AnalyzeJob, main: Loaded) -> str:
    rule = cfg.settings.rule
    both = " in both directions" if main.embedder.cfg.model.encoder == "bilstm" else ""
    return (
        f"Model `{cfg.model}` (checkpoint sha256 {sha256_file(main.checkpoint)[:12]}…). A word *moves* a cell when "
        f"reading it changes the cell's output y by more than {rule.threshold} × the text's largest |y| of its "
        f"{rule.top} most active cells (the cells with the largest output at the end of the text); a *keyword* "
        f"moves more than {rule.share:.0%} of them{both}."
    )


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else str(value)


def _inputs(cfg: AnalyzeJob, loaded: list[Loaded]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    inputs = {f"model{i}": {"path": str(m.spec), "sha256": sha256_file(m.checkpoint)} for i, m in enumerate(loaded)}
    if cfg.judgments:
        inputs["judgments"] = cfg.judgments.describe()
    params = {k: str(v) for k, v in asdict(cfg).items() if k not in ("model", "compare", "judgments", "out", "force")}
    return inputs, params


def _test_queries(cfg: AnalyzeJob) -> list[tuple[str, str]]:
    """(query, its best-graded title) of every test query of the judged set (PROTOCOL.md split), by qid."""
    if not cfg.judgments:
        return []
    from scoring.protocol import load_eval_set

    eval_set = load_eval_set(cfg.judgments)
    return [(q.query, q.titles[int(q.labels.argmax())]) for q in sorted(eval_set.queries, key=lambda q: q.qid)]


def _draw_pairs(queries: list[tuple[str, str]], n: int) -> list[tuple[str, str]]:
    """n test queries in qid (md5) order, an arbitrary but stable draw; queries of three words or
    more first, as they show more of what the model reads."""
    return sorted(queries, key=lambda pair: len(pair[0].split()) < 3)[:n]


def _judged_texts(cfg: AnalyzeJob) -> list[str]:
    pairs = cfg.judgments.pairs()
    return [p.title for p in pairs] + [p.query for p in pairs]


def _curves(loaded: list[Loaded]) -> dict[str, list[tuple[int, float]]]:
    """Training cost per model from its MLflow training run; a model whose run cannot be read is left out."""
    curves = {}
    for m in loaded:
        if not (m.run_id and m.tracking_uri):
            continue
        try:
            points = training_curve(m.tracking_uri, m.run_id)
        except Exception as e:  # a store that is gone or a run deleted since: the rest still stands
            log.warning("analyze: no training curve for %s (%s: %s)", m.spec, type(e).__name__, e)
            continue
        if points:
            curves[m.embedder.encoder_name if m.embedder.encoder_name not in curves else m.spec] = points
    return curves


def _log_artifacts(main: Loaded, out: Path) -> dict[str, str] | None:
    """The report as artifacts of the model's training run (analysis/ in its artifact store)."""
    if not (main.run_id and main.tracking_uri):
        log.warning("analyze: %s names no MLflow training run; the report is only in %s", main.spec, out)
        return None
    from core.tracking import client as mlflow_client

    try:
        client = mlflow_client(main.tracking_uri)
        client.log_artifacts(main.run_id, str(out), "analysis")
        client.set_tag(main.run_id, "analysis", f"analysis/{REPORT}")
    except Exception as e:  # the files on disk stand; say why MLflow has no copy
        raise DssmError(
            f"the report is in {out}, but logging it to MLflow run {main.run_id} at {main.tracking_uri} failed "
            f"({type(e).__name__}: {e}); pass --no-mlflow to skip"
        ) from e
    return {"tracking_uri": main.tracking_uri, "run_id": main.run_id, "artifact_path": "analysis"}


def add_arguments(p) -> None:
    """`dssm analyze`'s options: the models, inputs and plumbing, then AnalyzeConfig' fields."""
    from core.judgments import add_judgment_options
    from core.options import add_config_options

    p.add_argument(
        "--model",
        required=True,
        metavar="PATH_OR_URI",
        help="a recurrent model (lstm, rnn, bilstm, lstm_avg): checkpoint file, `dssm train` out dir, or MLflow "
        "model URI (models:/NAME@champion, runs:/ID/model)",
    )
    p.add_argument("--out", type=Path, required=True, help="report directory (replaced atomically)")
    p.add_argument("--compare", metavar="PATH_OR_URI", help="a second model (e.g. the RNN) for Tables V-VIII, Fig. 7")
    p.add_argument("--judgments", type=Path, help="judged set: its test queries feed Table III and the drawn pairs")
    p.add_argument(
        "--pair",
        nargs=2,
        action="append",
        default=[],
        metavar=("QUERY", "TITLE"),
        help="a query/title pair to trace (repeatable; default: --pairs test queries drawn from --judgments)",
    )
    p.add_argument(
        "--mlflow-uri",
        help="tracking URI that resolves a models:/ or runs:/ --model (default: $MLFLOW_TRACKING_URI); the report "
        "is logged to the model's training run, in the store it was trained with",
    )
    p.add_argument("--no-mlflow", dest="log_mlflow", action="store_false", help="do not log the report to MLflow")
    p.add_argument("--force", action="store_true", help="analyse again even if --out holds this analysis")
    add_config_options(p.add_argument_group("what is read, and how"), AnalyzeConfig, flatten=["rule"])
    add_judgment_options(p)


def config_from_args(args) -> AnalyzeJob:
    from core.judgments import resolve_judged_set, spec_from_args
    from core.options import config_from_options

    settings = config_from_options(AnalyzeConfig, args)
    check_config(settings)
    return AnalyzeJob(
        model=args.model,
        out=args.out,
        compare=args.compare,
        judgments=resolve_judged_set(args.judgments, spec_from_args(args)) if args.judgments else None,
        chosen=[tuple(p) for p in args.pair],
        settings=settings,
        mlflow_uri=args.mlflow_uri,
        log_mlflow=args.log_mlflow,
        force=args.force,
    )


def command(args) -> None:
    """`dssm analyze`."""
    cfg = config_from_args(args)
    result = analyze(cfg)
    state = "up to date, skipped" if result.get("skipped") else f"{result['seconds']:.0f}s"
    print(f"analysis of {len(result['pairs'])} pair(s) -> {cfg.out / REPORT} ({state})")
    if result.get("mlflow"):
        logged = result["mlflow"]
        print(f"logged to MLflow run {logged['run_id']} ({logged['tracking_uri']}) under analysis/")
