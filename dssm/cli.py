"""`dssm`: the command line. Each subcommand is one pipeline stage (or `run`, all of them).

Errors a user can fix are printed as one line and exit with status 2; see `dssm COMMAND --help`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import dssm
from dssm.artifacts import read_manifest
from dssm.errors import DssmError
from dssm.judgments import add_judgment_options, spec_from_args

log = logging.getLogger("dssm")


def _add_spark_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", help="Spark master URL (default: $DSSM_SPARK_MASTER or local[*])")
    p.add_argument("--force", action="store_true", help="recompute even if the output is up to date")


def _add_simulate_options(p: argparse.ArgumentParser) -> None:
    from jobs.simulate import SimulationConfig

    d = SimulationConfig()
    p.add_argument(
        "--judgments", type=Path, help="judged set (CSV/TSV or a .zip of one); default: the embedded catalogue"
    )
    add_judgment_options(p)
    g = p.add_argument_group("simulation")
    g.add_argument(
        "--impressions",
        type=lambda s: int(s.replace("_", "")),
        default=d.impressions,
        help="impressions to simulate, e.g. 10_000_000 (default: %(default)s)",
    )
    g.add_argument("--seed", type=int, default=d.seed, help="random seed (default: %(default)s)")
    g.add_argument("--shards", type=int, default=d.shards, help="output files (default: one per 250k impressions)")
    g.add_argument("--workers", type=int, default=d.workers, help="parallel processes (default: CPUs)")
    g.add_argument("--no-gzip", dest="gzip", action="store_false", help="write plain .jsonl")


def cmd_simulate(args: argparse.Namespace) -> None:
    from flows.stages import simulate_stage

    settings = {"impressions": args.impressions, "seed": args.seed, "shards": args.shards, "workers": args.workers}
    judged = str(args.judgments) if args.judgments else None
    simulate_stage(args.out, judged, spec_from_args(args), settings | {"gzip": args.gzip}, args.force)
    c = read_manifest(args.out)["counts"]
    print(
        f"simulated {c['impressions']:,} impressions ({c['lines']:,} lines) of {c['train_queries']:,} train queries "
        f"-> {args.out / 'logs'}; {c['test_pairs']:,} held-out test pairs -> {args.out / 'test_pairs.parquet'}"
    )


def cmd_clean(args: argparse.Namespace) -> None:
    from jobs.clean import CleanConfig, clean
    from jobs.spark import LazySpark

    cfg = CleanConfig(
        bot_max_per_minute=args.bot_max_per_minute,
        bot_min_impressions=args.bot_min_impressions,
        bot_min_click_rate=args.bot_min_click_rate,
        max_malformed_rate=args.max_malformed_rate,
    )
    m = clean(LazySpark(args.master, "dssm-clean"), args.input, args.out, cfg, force=args.force)
    c = m["counts"]
    print(
        f"read {c['lines_read']:,} lines = kept {c['kept']:,} + rejected {c['rejected']:,}; "
        f"{c['pairs']:,} clicked pairs, {c['titles']:,} titles -> {args.out}"
    )


def cmd_paraphrase(args: argparse.Namespace) -> None:
    from jobs.paraphrase import ParaphraseConfig, paraphrase
    from jobs.spark import LazySpark

    cfg = ParaphraseConfig(args.format, args.min_score)
    m = paraphrase(LazySpark(args.master, "dssm-paraphrase"), args.input, args.out, cfg, force=args.force)
    c = m["counts"]
    print(
        f"read {c['lines_read']:,} lines = kept {c['kept']:,} + rejected {c['rejected']:,}; "
        f"{c['pairs']:,} distinct sentence pairs -> {args.out}"
    )


def cmd_vocab(args: argparse.Namespace) -> None:
    from jobs.spark import LazySpark
    from jobs.vocab import VocabConfig, vocab

    cfg = VocabConfig(args.min_count, args.max_size, args.word_min_count, args.word_max_size)
    m = vocab(LazySpark(args.master, "dssm-vocab"), args.clean, args.out, cfg, force=args.force)
    c = m["counts"]
    print(f"{c['trigrams']['size']:,} trigrams, {c['words']['size']:,} words -> {args.out}")


def cmd_negatives(args: argparse.Namespace) -> None:
    from jobs.negatives import NegativesConfig, negatives
    from jobs.spark import LazySpark

    cfg = NegativesConfig(n=args.n, seed=args.seed, valid_fraction=args.valid_fraction, shards=args.shards)
    m = negatives(LazySpark(args.master, "dssm-negatives"), args.clean, args.out, cfg, force=args.force)
    c = m["counts"]
    print(f"{c['train_rows']:,} train rows, {c['valid_rows']:,} validation rows -> {args.out}")


def run_parameters(args: argparse.Namespace) -> dict:
    """`dssm run`/`dssm schedule` options as the retrain flow's parameters."""
    return {
        "workdir": str(args.workdir),
        "judgments": str(args.judgments) if args.judgments else None,
        "query_col": args.query_col,
        "title_col": args.title_col,
        "label_col": args.label_col,
        "encoding": args.encoding,
        "logs": args.logs,
        "impressions": args.impressions,
        "seed": args.seed,
        "shards": args.shards,
        "workers": args.workers,
        "negatives_per_pair": args.n,
        "models": [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None,
        "epochs": args.epochs,
        "train_overrides": list(args.train),
        "nproc": args.nproc,
        "baselines": [b.strip() for b in args.baselines.split(",") if b.strip()],
        "mlflow_uri": args.mlflow_uri,
        "spark_master": args.master,
        "analyze": args.analyze,
        "force": args.force,
    }


def _number(value) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:.4f}" if isinstance(value, float) else str(value)


def cmd_run(args: argparse.Namespace) -> None:
    from flows.retrain import retrain

    started = time.time()
    summary = retrain(**run_parameters(args))
    work: Path = args.workdir
    if (work / "eval" / "report.md").exists() and "systems" in summary:
        print("\n" + (work / "eval" / "report.md").read_text(), end="")
    print(f"\npipeline finished in {time.time() - started:.0f}s (flow run {summary['pipeline']['flow_run_id']}):")
    for out in summary["pipeline"]["stages"]:
        state = "skipped " if out["skipped"] else f"{out['seconds']:6.1f}s "
        shown = ", ".join(f"{k} {_number(v)}" for k, v in out["counts"].items())
        print(f"  {out['stage']:<10} {state} {out['path']}  ({shown})")
    for gate in summary.get("gate", []):
        print(f"  {gate['model']} v{gate['version']}: {'promoted' if gate['promoted'] else 'kept'} ({gate['reason']})")
    print(f"report: {work / 'report.json'}")


def cmd_schedule(args: argparse.Namespace) -> None:
    from flows.schedule import serve_retrain

    serve_retrain(args.name, args.cron, run_parameters(args), args.timezone)


def cmd_stack(args: argparse.Namespace) -> None:
    from infra import stack

    if args.action == "up":
        cfg = stack.StackConfig(
            root=args.dir,
            prefect_port=args.prefect_port,
            mlflow_port=args.mlflow_port,
            spark_port=args.spark_port,
            spark_ui_port=args.spark_ui_port,
            spark_worker_ui_port=args.spark_worker_ui_port,
            mlflow_backend=args.mlflow_backend,
        )
        state = stack.up(cfg)
        print('stack up; point a shell at it with:  eval "$(dssm stack env)"')
        for name, url in state["urls"].items():
            print(f"  {name:<9} {url}")
    elif args.action == "down":
        stack.down(args.dir)
    elif args.action == "status":
        health = stack.status(args.dir)
        if not health:
            raise DssmError(f"no stack recorded in {args.dir}; start one with `dssm stack up`")
        for name, ok in health.items():
            print(f"{name:<13} {'healthy' if ok else 'DOWN'}")
        if not all(health.values()):
            raise DssmError("some services are down (their logs are in " + str(args.dir / "logs") + ")")
    else:
        state = stack.read_state(args.dir)
        if state is None:
            raise DssmError(f"no stack recorded in {args.dir}; start one with `dssm stack up`")
        for key, value in stack.environment(state["urls"]).items():
            print(f"export {key}={value}")


def cmd_analyze(args: argparse.Namespace) -> None:
    from analysis.report import REPORT, analyze, config_from_args

    cfg = config_from_args(args)
    result = analyze(cfg)
    state = "up to date, skipped" if result.get("skipped") else f"{result['seconds']:.0f}s"
    print(f"analysis of {len(result['pairs'])} pair(s) -> {cfg.out / REPORT} ({state})")
    if result.get("mlflow"):
        logged = result["mlflow"]
        print(f"logged to MLflow run {logged['run_id']} ({logged['tracking_uri']}) under analysis/")


def cmd_sts(args: argparse.Namespace) -> None:
    from evaluation.sts import StsConfig, run_sts

    baselines = [b.strip() for b in args.baselines.split(",") if b.strip()]
    report = run_sts(StsConfig(args.data, args.out, args.model, baselines, args.mlflow_uri, args.experiment))
    print((args.out / "sts.md").read_text(), end="")
    print(f"report: {args.out}/sts.json ({report['seconds']:.0f}s)")


def cmd_train(args: argparse.Namespace) -> None:
    from modeling.train import config_from_args, launch, train

    if args.nproc < 1:
        raise DssmError("--nproc must be at least 1")
    if args.nproc > 1:
        from modeling.data import plan, train_files

        cfg = config_from_args(args)  # a bad config or data layout fails here, before N processes start
        plan(train_files(Path(cfg.data.negatives)), cfg.data.batch_size, args.nproc)
        if launch(args) != 0:
            raise DssmError(f"training failed in one of the {args.nproc} processes (their messages are above)")
        return
    s = train(config_from_args(args), resume=args.resume)
    val = "n/a" if s["valid_loss"] is None else f"{s['valid_loss']:.4f}"
    rate = "" if s["examples_per_s"] is None else f", {s['examples_per_s']:,.0f} examples/s"
    print(
        f"trained {s['steps']:,} steps{rate}; validation loss {val}; checkpoint {s['checkpoint']}; "
        f"MLflow run {s['mlflow_run_id']}"
    )


def cmd_evaluate(args: argparse.Namespace) -> None:
    from evaluation.evaluate import config_from_args, evaluate

    cfg = config_from_args(args)
    report = evaluate(cfg)
    print((Path(cfg.out) / "report.md").read_text(), end="")
    for gate in report["gate"]:
        print(f"{gate['model']} v{gate['version']}: {'promoted' if gate['promoted'] else 'kept'} ({gate['reason']})")
    print(f"report: {cfg.out}/report.json ({report['seconds']:.0f}s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dssm",
        description="Learn search embeddings from click logs: simulate logs, clean them, build vocabularies, "
        "sample negatives and train models.",
    )
    parser.add_argument("--version", action="version", version=f"dssm {dssm.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "simulate",
        help="simulate raw click logs from a judged set",
        description="Write raw impression logs (docs/raw-log-format.md) for the train queries of a "
        "judged set and its held-out test pairs as Parquet (PROTOCOL.md split).",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--force", action="store_true", help="recompute even if the output is up to date")
    _add_simulate_options(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser(
        "clean",
        help="raw logs -> clicked pairs, title pool, rejects (Spark)",
        description="Parse and validate raw logs, quarantine malformed lines with a reason, drop "
        "duplicates, empty queries and bots, and count clicks per (query, title).",
    )
    p.add_argument("--input", required=True, help="raw log file, directory, glob or a `dssm simulate` output")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    _add_spark_options(p)
    from jobs.clean import CleanConfig

    d = CleanConfig()
    g = p.add_argument_group("rules")
    g.add_argument(
        "--bot-max-per-minute",
        type=int,
        default=d.bot_max_per_minute,
        help="a user with more impressions in one minute is a bot (default: %(default)s)",
    )
    g.add_argument(
        "--bot-min-impressions",
        type=int,
        default=d.bot_min_impressions,
        help="... or with at least this many impressions (default: %(default)s)",
    )
    g.add_argument(
        "--bot-min-click-rate",
        type=float,
        default=d.bot_min_click_rate,
        help="... clicking at least this share of shown results (default: %(default)s)",
    )
    g.add_argument(
        "--max-malformed-rate",
        type=float,
        default=d.max_malformed_rate,
        help="refuse input with a larger share of malformed lines (default: %(default)s)",
    )
    p.set_defaults(func=cmd_clean)

    from jobs.vocab import VocabConfig

    d = VocabConfig()
    p = sub.add_parser(
        "paraphrase",
        help="sentence pairs (paraphrases) -> the layout of a clean output, for vocab/negatives (Spark)",
        description="Read a file of sentence pairs (Wiki-Auto, SICK or STS-B train, any TSV of paraphrases), "
        "normalise both sentences, quarantine unusable lines with a reason and write them as clicked pairs "
        "(query = sentence 1, title = sentence 2), so `dssm vocab` and `dssm negatives -n 0` prepare them for "
        "`dssm train objective=paraphrase`. See docs/paraphrase.md.",
    )
    p.add_argument("--input", required=True, help="sentence-pair file (plain or .gz)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument(
        "--format",
        choices=["pairs", "sts", "stsb", "sick"],
        default="pairs",
        help="pairs: s1<TAB>s2; sts: score, s1, s2; stsb: STS Benchmark; sick: SICK (default: %(default)s)",
    )
    p.add_argument("--min-score", type=float, help="scored formats: keep pairs scored at least this")
    _add_spark_options(p)
    p.set_defaults(func=cmd_paraphrase)

    p = sub.add_parser(
        "vocab",
        help="letter-trigram and word vocabularies (Spark)",
        description="Build the letter-trigram vocabulary (word hashing) and a word vocabulary "
        "from a `dssm clean` output.",
    )
    p.add_argument("--clean", type=Path, required=True, help="a `dssm clean` output directory")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--min-count", type=int, default=d.min_count, help="trigram min count (default: %(default)s)")
    p.add_argument("--max-size", type=int, default=d.max_size, help="trigram ids incl. <unk> (default: %(default)s)")
    p.add_argument("--word-min-count", type=int, default=d.word_min_count, help="(default: %(default)s)")
    p.add_argument("--word-max-size", type=int, default=d.word_max_size, help="(default: %(default)s)")
    _add_spark_options(p)
    p.set_defaults(func=cmd_vocab)

    from jobs.negatives import NegativesConfig

    d = NegativesConfig()
    p = sub.add_parser(
        "negatives",
        help="sample negative titles per clicked pair (Spark)",
        description="For each clicked pair draw n negative titles from the title pool, never one "
        "clicked for the same query, and split queries into train and validation.",
    )
    p.add_argument("--clean", type=Path, required=True, help="a `dssm clean` output directory")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument(
        "-n", type=int, default=d.n, help="negatives per pair; 0 for objective=paraphrase (default: %(default)s)"
    )
    p.add_argument("--seed", type=int, default=d.seed, help="(default: %(default)s)")
    p.add_argument("--valid-fraction", type=float, default=d.valid_fraction, help="(default: %(default)s)")
    p.add_argument("--shards", type=int, default=d.shards, help="train files (default: %(default)s)")
    _add_spark_options(p)
    p.set_defaults(func=cmd_negatives)

    from modeling.train import add_arguments as add_train_arguments

    p = sub.add_parser(
        "train",
        help="train a two-tower model on `dssm negatives` output (torch, DDP via torchrun)",
        description="Train the LSTM-RNN (or rnn, bilstm, dssm, clsm, lstm_avg, gran) on clicked pairs and "
        "their negatives with the paper's loss and optimiser. One config per run: defaults < --config YAML "
        "< KEY=VALUE overrides; the resolved config is saved with each checkpoint. See docs/training.md.",
    )
    add_train_arguments(p)
    p.set_defaults(func=cmd_train)

    from analysis.report import add_arguments as add_analyze_arguments
    from evaluation.evaluate import add_arguments as add_evaluate_arguments

    p = sub.add_parser(
        "evaluate",
        help="NDCG@1/3/10 of trained models and baselines on a judged set (PROTOCOL.md), logged to MLflow",
        description="Score trained models and baselines on the test queries of a judged set (or --all-queries), "
        "write report.json, report.md, TREC run files and ndcg.png to --out, log every system as an MLflow run, "
        "register trained models and move the `champion` alias when NDCG@10 beats the champion's. "
        "See docs/evaluation.md.",
    )
    add_evaluate_arguments(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser(
        "sts",
        help="Pearson's r of trained models (and MiniLM) on STS 2012-2016, STS-B and SICK, logged to MLflow",
        description="Embed both sentences of every pair of the STS 2012-2016 test sets, STS-B test and SICK test "
        "with each --model (its query tower) and baseline, and report Pearson's r x 100 (and Spearman) of the "
        "cosine against the gold scores, per dataset and per year, as Wieting & Gimpel's tables do. Writes "
        "OUT/sts.json and sts.md; every system is an MLflow run in --experiment. See docs/paraphrase.md.",
    )
    p.add_argument("--model", action="append", default=[], metavar="PATH_OR_URI", help="a trained model (repeatable)")
    p.add_argument("--baselines", default="", help="minilm: all-MiniLM-L6-v2 off the shelf (default: none)")
    default_data = Path(os.environ.get("DSSM_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    p.add_argument("--data", type=Path, default=default_data, help="the shared data folder (default: %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="report directory (replaced atomically)")
    p.add_argument("--mlflow-uri", help="tracking URI (default: sqlite:///<parent of --out>/mlflow.db)")
    p.add_argument("--experiment", default="sts", help="MLflow experiment (default: %(default)s)")
    p.set_defaults(func=cmd_sts)

    p = sub.add_parser(
        "analyze",
        help="what a trained LSTM-RNN reads: gates and cells per word, keywords, topics, RNN vs LSTM, cost curves",
        description="Palangi et al. section V-A for one trained recurrent model: per chosen query/title pair the "
        "input gate, cell state, output gate and output word by word (Figs. 4-5), the most active cells (Fig. 6) "
        "and the keywords (Tables I-II); over the judged set's test queries, the words the input gates attenuate "
        "and the keywords each of the most active cells picks up (Table III); with --compare, a second model on "
        "the same pairs (Tables V-VIII); both models' training cost from MLflow (Fig. 7); doc2vec's nearest words "
        "with --probe. Writes OUT/analysis.md, analysis.json and PNGs, and logs them to the model's MLflow "
        "training run. See docs/analysis.md.",
    )
    add_analyze_arguments(p)
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser(
        "run",
        help="the retrain flow, ad hoc: simulate -> clean -> vocab -> negatives -> train -> evaluate -> analyze",
        description=(
            "Run the Prefect retrain flow (docs/flows.md) into --workdir: every stage, ending with the trained "
            "model and --baselines evaluated on the judged set's test queries, the model registered, the champion "
            "alias moved through the validation gate, and the LSTM-RNN analysed (WORKDIR/analysis, "
            "docs/analysis.md). Prints the comparison table and writes WORKDIR/report.json. Finished stages with "
            "unchanged inputs are skipped; a killed or failed run, run again, resumes (training from its last "
            "checkpoint). Without --judgments it uses the embedded catalogue."
        ),
    )
    _add_run_options(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "schedule",
        help="serve the retrain flow as a deployment with a cron schedule (needs a Prefect server)",
        description="Register deployment retrain/NAME with a cron schedule on the Prefect server in $PREFECT_API_URL "
        "(e.g. `dssm stack up`) and run its scheduled flow runs until stopped (Ctrl-C pauses the schedule). "
        "Takes the same stage options as `dssm run`; they become the deployment's parameters. See docs/flows.md.",
    )
    p.add_argument("--cron", required=True, help='cron expression, e.g. "0 3 * * *" (03:00 every day)')
    p.add_argument("--timezone", default="UTC", help="the cron expression's time zone (default: %(default)s)")
    p.add_argument("--name", default="scheduled", help="deployment name (default: %(default)s)")
    _add_run_options(p)
    p.set_defaults(func=cmd_schedule)

    from infra.stack import StackConfig

    d = StackConfig()
    p = sub.add_parser(
        "stack",
        help="start, stop or check the local stack: Prefect server, MLflow server, Spark master and worker",
        description="`up` starts every service on 127.0.0.1 as a real process and waits for its health check; "
        "`down` stops them; `status` checks them; `env` prints the exports that point `dssm run` at the stack "
        '(eval "$(dssm stack env)"). See infra/README.md.',
    )
    p.add_argument("action", choices=["up", "down", "status", "env"])
    p.add_argument("--dir", type=Path, default=d.root, help="state, data and logs of the stack (default: %(default)s)")
    p.add_argument("--prefect-port", type=int, default=d.prefect_port, help="(default: %(default)s)")
    p.add_argument("--mlflow-port", type=int, default=d.mlflow_port, help="(default: %(default)s)")
    p.add_argument("--spark-port", type=int, default=d.spark_port, help="Spark master (default: %(default)s)")
    p.add_argument("--spark-ui-port", type=int, default=d.spark_ui_port, help="(default: %(default)s)")
    p.add_argument("--spark-worker-ui-port", type=int, default=d.spark_worker_ui_port, help="(default: %(default)s)")
    p.add_argument(
        "--mlflow-backend",
        default="",
        help="MLflow backend store URI (default: sqlite under --dir; e.g. postgresql://user:pw@host:5432/mlflow)",
    )
    p.set_defaults(func=cmd_stack)
    return parser


def _add_run_options(p: argparse.ArgumentParser) -> None:
    from jobs.negatives import NegativesConfig

    p.add_argument("--workdir", type=Path, default=Path("work"), help="where stage outputs go (default: %(default)s)")
    p.add_argument(
        "--logs", help="raw click logs to ingest instead of simulating (file, dir or glob; docs/raw-log-format.md)"
    )
    p.add_argument("-n", type=int, default=NegativesConfig().n, help="negatives per pair (default: %(default)s)")
    p.add_argument("--models", help="encoders to train and evaluate side by side, e.g. lstm,rnn,dssm (default: lstm)")
    p.add_argument("--epochs", type=int, help="training epochs (default: the training config's)")
    p.add_argument(
        "--train",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="training config overrides, e.g. --train optim.lr=0.05 loss.pair_weight=log_clicks (docs/training.md)",
    )
    p.add_argument(
        "--nproc", type=int, default=0, help="training processes under torchrun (default: one per GPU, else 1)"
    )
    p.add_argument(
        "--baselines",
        default="bm25",
        help="baselines evaluated beside the trained model (bm25,doc2vec,ulm,plsa,minilm; default: %(default)s)",
    )
    p.add_argument("--mlflow-uri", help="MLflow tracking URI (default: sqlite store WORKDIR/mlflow.db)")
    p.add_argument(
        "--no-analyze",
        dest="analyze",
        action="store_false",
        help="skip the last stage, `dssm analyze` of the trained LSTM-RNN into WORKDIR/analysis (docs/analysis.md)",
    )
    _add_spark_options(p)
    _add_simulate_options(p)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("py4j", "pyspark", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # PySpark logs every analysis error as a JSON blob with the Java trace; main() prints one line.
    logging.getLogger("DataFrameQueryContextLogger").setLevel(logging.CRITICAL)
    try:
        args.func(args)
    except DssmError as e:
        print(f"dssm {args.command}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # Spark/JVM failures: one line, the trace only with -v
        if args.verbose:
            raise
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        print(
            f"dssm {args.command}: error: {type(e).__name__}: {first[:400]} (rerun with -v for the trace)",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        print(f"dssm {args.command}: interrupted; finished outputs are kept, partial ones discarded", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
