"""`dssm`: the command line. Each subcommand is one pipeline stage (or `run`, all of them).

Each command's options and its body live in the module of its stage (`add_arguments(parser)` and
`command(args)`); this file only lists the commands and imports a stage's module when that command
runs (or its --help is asked for), so `dssm --help` starts no Spark, torch or Prefect.

Errors a user can fix are printed as one line and exit with status 2; see `dssm COMMAND --help`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from dataclasses import dataclass

import dssm
from core.errors import DssmError
from core.stopping import end_children, is_stop, signal_of, signals_stop


@dataclass(frozen=True)
class Command:
    module: str  # holds add_arguments(parser) and command(args)
    help: str
    description: str
    # imported before logging is set up when the command runs (not for --help): Prefect sets up its console
    # logging on import, and this process's own handler must then not print its records a second time
    before_logging: str = ""


COMMANDS: dict[str, Command] = {
    "simulate": Command(
        "stages.simulate.job",
        "simulate raw click logs from a judged set",
        "Write raw impression logs (docs/raw-log-format.md) for the train queries of a judged set and its held-out "
        "test pairs as Parquet (PROTOCOL.md split).",
    ),
    "clean": Command(
        "stages.clean.job",
        "raw logs -> clicked pairs, title pool, impressions, rejects (Spark)",
        "Parse and validate raw logs (JSON lines, or a Parquet table of impression rows or result rows; "
        "docs/raw-log-format.md), quarantine malformed lines with a reason, drop duplicates, empty queries and "
        "bots, count clicks per (query, title), and keep each impression's shown titles, clicks and dwell.",
    ),
    "propensity": Command(
        "stages.propensity.job",
        "estimate position bias (examination per rank) from the impressions (Spark + EM)",
        "Estimate the examination probability of each rank from a `dssm clean` output's impressions/, by EM under "
        "the position-based model, relative to rank 1; writes propensity.json and a plot. See docs/training.md.",
    ),
    "judge": Command(
        "stages.judge.job",
        "a judged set graded from the logs' clicks, for logs without human grades (Spark)",
        "Grade each query's shown titles in a `dssm clean` output's impressions/ by their clicks over expected "
        "examinations (a `dssm propensity` curve; debias=false: over impressions) on a 1..3 scale, and write "
        "judged.csv (the flow evaluates it as `dssm evaluate --judgments OUT/judged.csv --encoding utf-8 "
        "--min-label 1 --relevant-at 2.5`). Its test queries (PROTOCOL.md split) are held out of every "
        "data stage that training reads. See docs/evaluation.md#judged-sets-from-clicks.",
    ),
    "paraphrase": Command(
        "stages.paraphrase.job",
        "sentence pairs (paraphrases) -> the layout of a clean output, for vocab/negatives (Spark)",
        "Read a file of sentence pairs (Wiki-Auto, SICK or STS-B train, any TSV of paraphrases), normalise both "
        "sentences, quarantine unusable lines with a reason and write them as clicked pairs (query = sentence 1, "
        "title = sentence 2), so `dssm vocab` and `dssm negatives -n 0` prepare them for "
        "`dssm train --objective paraphrase`. See docs/paraphrase.md.",
    ),
    "vocab": Command(
        "stages.vocab.job",
        "letter-trigram and word vocabularies (Spark)",
        "Build the letter-trigram vocabulary (word hashing) and a word vocabulary from a `dssm clean` output.",
    ),
    "negatives": Command(
        "stages.negatives.job",
        "sample negative titles per clicked pair (Spark)",
        "For each clicked pair draw n negative titles from the title pool, never one clicked for the same query, "
        "and split queries into train and validation.",
    ),
    "mine": Command(
        "stages.mine.job",
        "hard negatives from an earlier model's index (or BM25) in place of some sampled ones",
        "Replace a share (--hard) of each train row's sampled negatives with titles an earlier model's `dssm index` "
        "output (or BM25 over the title pool) ranks between --min-rank and --max-rank for the row's query, never a "
        "title clicked for the query nor one within --relative-margin of the positive's cosine. The output is a "
        "`dssm negatives` output for `dssm train`. See docs/retrieval.md.",
    ),
    "teacher": Command(
        "stages.teacher.job",
        "teacher lists of hard candidates per train query, to distil into the student (loss.listwise)",
        "For each train query take the top --depth titles of each source ranker (BM25, MiniLM, an earlier model's "
        "index) and the titles clicked for it, score the list with the teacher (a z-score fusion of bm25, minilm, "
        "index or checkpoint:PATH) and write its softmax as the query's listwise targets: the output is a `dssm "
        "negatives` output that `dssm train loss.listwise=0.5` distils. See docs/training.md.",
    ),
    "train": Command(
        "modeling.launch",
        "train a two-tower model on `dssm negatives` output (torch, DDP via torchrun)",
        "Train the LSTM-RNN (or another encoder of model.encoder: {encoders}) on clicked pairs and their negatives "
        "with the paper's loss and optimiser. One config per run: defaults < --config YAML < KEY=VALUE overrides; "
        "the resolved config is saved with each checkpoint. See docs/training.md.",
    ),
    "evaluate": Command(
        "stages.evaluate.job",
        "NDCG@1/3/10 of trained models and baselines on a judged set (PROTOCOL.md), logged to MLflow",
        "Score trained models and baselines on the test queries of a judged set (or --all-queries), write "
        "report.json, report.md, TREC run files and ndcg.png to --out and log every system as an MLflow run; "
        "`dssm register` and `dssm gate` take it from there. See docs/evaluation.md.",
    ),
    "register": Command(
        "stages.register.job",
        "log the models a `dssm evaluate` scored as MLflow models and register them as versions",
        "Log each trained model and hybrid of a `dssm evaluate` output as an MLflow pyfunc model into its "
        "evaluation run and register it as a version of dssm-DATASET; writes OUT/registered.json. A rerun "
        "registers nothing twice. See docs/evaluation.md#the-champion-gate.",
    ),
    "gate": Command(
        "stages.gate.job",
        "move the `champion` alias to a registered version that beats the champion",
        "For each version of a `dssm register` output: compare its NDCG@10 (or retrieval NDCG@10) with the "
        "champion's on the same eval set (scoring the champion there when it was never measured) and move the "
        "`champion` alias when it is better; writes OUT/gate.json and gate-history.png. "
        "See docs/evaluation.md#the-champion-gate.",
    ),
    "sts": Command(
        "stages.sts.job",
        "Pearson's r of trained models (and MiniLM) on STS 2012-2016, STS-B and SICK, logged to MLflow",
        "Embed both sentences of every pair of the STS 2012-2016 test sets, STS-B test and SICK test with each "
        "--model (its query tower) and baseline, and report Pearson's r x 100 (and Spearman) of the cosine against "
        "the gold scores, per dataset and per year, as Wieting & Gimpel's tables do. Writes OUT/sts.json and "
        "sts.md; every system is an MLflow run in --experiment. See docs/paraphrase.md.",
    ),
    "index": Command(
        "stages.index.job",
        "embed a catalogue's titles with a registered model (Spark pandas UDF) and build an ANN index",
        "Embed every title of a catalogue (a `dssm clean` title pool, or Parquet/CSV with a `title` column) with "
        "an MLflow model in a Spark pandas UDF (its files read as data: no pickle is loaded), build a faiss index "
        "of the vectors, and log the index as the model version's pyfunc `retriever` (registered as "
        "NAME-retriever). See docs/retrieval.md.",
    ),
    "search": Command(
        "stages.index.search",
        "the top k titles of the whole catalogue for a query, from an index",
        "Answer queries from a `dssm index` output (default: WORKDIR/index, the champion's after `dssm run`) or "
        "from MLflow (--model). See docs/retrieval.md.",
    ),
    "serve": Command(
        "service.command",
        "serve the champion's retriever over HTTP: micro-batched, bounded, swapped when the champion moves",
        "Hold the champion's retriever in memory and answer HTTP JSON queries (POST /search {\"query\": ...}, "
        "/health, /ready, /metrics): concurrent requests share one model call, every input and the queue are "
        "bounded (4xx, 503 when full), and a new champion (the gate moved the alias, the index stage indexed it) "
        "is loaded in the background and swapped in. Serves WORKDIR's champion from its MLflow store, or one "
        "--index. See docs/retrieval.md#the-search-service.",
    ),
    "analyze": Command(
        "stages.analyze.job",
        "what a trained LSTM-RNN reads: gates and cells per word, keywords, topics, RNN vs LSTM, cost curves",
        "Palangi et al. section V-A for one trained recurrent model: per chosen query/title pair the input gate, "
        "cell state, output gate and output word by word (Figs. 4-5), the most active cells (Fig. 6) and the "
        "keywords (Tables I-II); over the judged set's test queries, the words the input gates attenuate and the "
        "keywords each of the most active cells picks up (Table III); with --compare, a second model on the same "
        "pairs (Tables V-VIII); both models' training cost from MLflow (Fig. 7); doc2vec's nearest words with "
        "--probes. Writes OUT/analysis.md, analysis.json and PNGs, and logs them to the model's MLflow training run. "
        "See docs/analysis.md.",
    ),
    "run": Command(
        "flows.run_command",
        "the retrain flow, ad hoc: simulate, clean, propensity, judge, vocab, negatives, mine, teacher, train, "
        "evaluate, register, gate, index, analyze",
        "Run the Prefect retrain flow (docs/flows.md) with one run config: defaults < --config YAML < the flags given"
        " < KEY=VALUE overrides (e.g. negatives.seed=7 train.epochs=10). Every stage (listed below) runs into the "
        "work dir, ending with the trained model and the baselines evaluated on the judged set's test queries, the "
        "model registered, the champion alias moved through the validation gate, and the LSTM-RNN analysed. Prints "
        "the comparison table and writes WORKDIR/report.json (with the resolved config). Finished stages whose "
        "inputs, settings and code are unchanged are skipped; a killed or failed run, run again, resumes (training "
        "from its last checkpoint). Without --judgments it uses the embedded catalogue.",
        before_logging="flows.retrain",
    ),
    "schedule": Command(
        "flows.schedule",
        "serve the retrain flow as a deployment with a cron schedule (needs a Prefect server)",
        "Register deployment retrain/NAME with a cron schedule on the Prefect server in $PREFECT_API_URL (e.g. "
        "`dssm stack up`) and run its scheduled flow runs until stopped (Ctrl-C pauses the schedule). Takes the same "
        "run config as `dssm run`; it becomes the deployment's `config` parameter, editable in the Prefect UI. "
        "See docs/flows.md.",
    ),
    "stack": Command(
        "infra.stack",
        "start, stop or check the local stack: Prefect server, MLflow server, Spark master and worker",
        "`up` starts every service on 127.0.0.1 as a real process and waits for its health check; `down` stops "
        "them; `status` checks them; `env` prints the exports that point `dssm run` at the stack "
        '(eval "$(dssm stack env)"). See infra/README.md.',
    ),
}


def _chosen(argv: list[str]) -> str | None:
    """The command named on the line (its module is the only one imported)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the full options of the command in `argv` (all of them when argv is None)."""
    parser = argparse.ArgumentParser(
        prog="dssm",
        description="Learn search embeddings from click logs: simulate logs, clean them, build vocabularies, "
        "sample negatives, train, evaluate and analyse models, or run it all as a Prefect flow.",
    )
    parser.add_argument("--version", action="version", version=f"dssm {dssm.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = set(COMMANDS) if argv is None else {_chosen(argv)}
    for name, spec in COMMANDS.items():
        description = spec.description
        if "{encoders}" in description:
            description = description.format(encoders=_encoders() if name in wanted else "see docs/training.md")
        p = sub.add_parser(name, help=spec.help, description=description)
        if name in wanted:
            module = importlib.import_module(spec.module)
            module.add_arguments(p)
            p.set_defaults(func=module.command)
    return parser


def _encoders() -> str:
    from modeling.encoders import ENCODERS

    return ", ".join(ENCODERS)


class _Unactionable(logging.Filter):
    """MLflow notices about choices this project made on purpose: a PythonModel object (not models
    from code) and the input example's check."""

    NOTICES = ("Passing a Python object as `python_model`", "Validating input example")

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.NOTICES)


def main(argv: list[str] | None = None) -> int:
    standalone = argv is None  # the process is this command (not a caller's, as a test's)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    if COMMANDS[args.command].before_logging:
        importlib.import_module(COMMANDS[args.command].before_logging)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    # MLflow draws a "Downloading artifacts" bar for every small file it reads back when logging a model
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # mlflow.store.db.utils: "Creating initial MLflow database tables..." at every new sqlite store;
    # graphviz (imported by a dependency): ~20 "deprecate positional args" lines under -v
    for noisy in ("py4j", "pyspark", "httpx", "mlflow.store.db.utils", "faiss.loader", "graphviz"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Prefect's "Task run 'clean-e9e' - Finished in state Completed()": each stage prints its own line
    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    logging.getLogger("mlflow.models.flavor_backend_registry").setLevel(logging.WARNING)
    logging.getLogger("mlflow.pyfunc").addFilter(_Unactionable())
    # PySpark logs every analysis error as a JSON blob with the Java trace; main() prints one line.
    logging.getLogger("DataFrameQueryContextLogger").setLevel(logging.CRITICAL)
    try:
        with signals_stop():
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
    except BaseException as e:  # ^C, SIGTERM (core/stopping.py; Prefect's TerminationSignal in a flow run)
        if not is_stop(e):
            raise
        why = f"stopped by {signal.Signals(signal_of(e)).name}"
        if standalone:
            end_children()  # Spark's JVM and other children stop with the command, not minutes later
        print(f"dssm {args.command}: {why}; finished outputs are kept, partial ones discarded", file=sys.stderr)
        return 128 + signal_of(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
