"""`dssm search "cordless drill"`: the top k titles of the whole catalogue, from an index.

From an index directory (default: the work dir's, which `dssm run` keeps for the champion), or from
MLflow with --model: a retriever URI (models:/NAME-retriever@champion, runs:/ID/retriever) or a
registered two-tower model whose version was indexed (models:/NAME@champion).

An empty or whitespace-only query is refused; a query of which the model knows no letter trigram
(every token <unk>) is answered with a warning on stderr: the model sees it as an unknown text.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from core.errors import DssmError
from core.layout import Layout
from stages.index.config import SearchConfig, check_config


def retriever_uri(uri: str, tracking_uri: str) -> str:
    """A retriever's model URI: itself, or the `retriever_uri` tag of the two-tower version `uri` names."""
    from core.tracking import client, resolve_model

    if not uri.startswith("models:/") or uri[len("models:/") :].split("@")[0].split("/")[0].endswith("-retriever"):
        return uri
    model = resolve_model(uri, tracking_uri)
    tag = client(tracking_uri).get_model_version(model.name, model.version).tags.get("retriever_uri")
    if not tag:
        raise DssmError(f"--model {uri}: {model.label} has no index yet; run `dssm index --model {uri} ...`")
    return tag


def load(args: argparse.Namespace, ef_search: int = 0):
    """The Retriever of --model (through MLflow) or of --index, searching `ef_search` HNSW candidates (0: its own)."""
    from scoring.retriever import Retriever

    if not args.model:
        return Retriever.load(args.index or Layout(args.workdir).index, ef_search)
    from core.tracking import default_tracking_uri, use_store
    from scoring.serving import logged_files

    tracking = args.mlflow_uri or default_tracking_uri(Path(args.workdir))
    use_store(tracking)
    uri = retriever_uri(args.model, tracking)
    try:
        files, _ = logged_files(uri)  # the index directory as data: its python_model.pkl is never loaded
    except DssmError as e:
        raise DssmError(f"--model {e}") from None
    if "index" not in files:
        raise DssmError(f"--model {uri}: not a dssm retriever (no index among its artifacts)")
    return Retriever.load(files["index"], ef_search)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm search`'s options: the queries, where the index comes from, then SearchConfig' fields."""
    from core.options import add_config_options

    p.add_argument("query", nargs="+", help="one or more queries (quote each one)")
    p.add_argument("--workdir", default="work", help="the work dir of `dssm run` (default: %(default)s)")
    p.add_argument("--index", type=Path, help="a `dssm index` output (default: WORKDIR/index)")
    p.add_argument("--model", metavar="URI", help="load from MLflow instead: a retriever or an indexed model URI")
    p.add_argument("--mlflow-uri", help="tracking URI for --model (default: $MLFLOW_TRACKING_URI, else WORKDIR's)")
    add_config_options(p, SearchConfig)


def command(args: argparse.Namespace) -> None:
    """`dssm search`."""
    from core.options import config_from_options
    from core.text import checked_texts

    settings = config_from_options(SearchConfig, args)
    check_config(settings)
    checked_texts(args.query, "query")  # before the index loads: an empty query is refused at once
    started = time.perf_counter()
    retriever = load(args, settings.ef_search)
    retriever.warm()  # MiniLM and a transformer's graph load on first use: loading time, not search time
    loaded = time.perf_counter() - started
    started = time.perf_counter()
    results = retriever.search(args.query, settings.k)
    took = time.perf_counter() - started
    model = retriever.model.get("name") and f"{retriever.model['name']} v{retriever.model['version']}"
    unit = {"words": "word", "wordpieces": "word piece"}.get(retriever.embedder.tokenizer.vocab.kind, "letter trigram")
    for query, hits in zip(args.query, results, strict=True):
        if not retriever.embedder.knows(query):
            print(
                f"dssm search: warning: no {unit} of {query!r} is in the model's vocabulary; "
                "the model ranks it as an unknown text",
                file=sys.stderr,
            )
        print(f"{query!r}: top {len(hits)} of {len(retriever.titles):,} titles ({model or retriever.model['uri']})")
        for hit in hits:
            print(f"  {hit.rank:>3}  {hit.score:7.4f}  {hit.title}")
    print(f"searched in {took * 1000:.0f} ms (loaded in {loaded:.1f}s)")
