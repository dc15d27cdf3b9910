"""`dssm serve`: one long-lived process that holds the champion's retriever in memory and answers HTTP JSON
queries (service/app.py), swapping in a new champion while it serves (service/champion.py).

Where the retriever comes from:
- default: WORKDIR's MLflow store, the retriever of `models:/NAME@champion` (NAME: the model WORKDIR/index
  was built from, or --model), followed as the gate moves the alias;
- --index DIR: one `dssm index` output, served again when the index stage replaces it.
Settings: `--config RUN.yaml`'s `serve` section, then the flags (docs/retrieval.md#the-search-service).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from pathlib import Path

from core.errors import DssmError
from core.layout import Layout
from service.config import ServeConfig, check_config

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from core.options import add_config_options

    p.add_argument("--workdir", default="work", help="the work dir of `dssm run` (default: %(default)s)")
    p.add_argument("--index", type=Path, help="serve this `dssm index` output instead of the registry's champion")
    p.add_argument(
        "--model", metavar="NAME", help="the registered model whose champion to serve (default: WORKDIR/index's)"
    )
    p.add_argument("--mlflow-uri", help="tracking URI (default: $MLFLOW_TRACKING_URI, else WORKDIR's sqlite store)")
    p.add_argument("--config", type=Path, help="a run config whose `serve` section holds the settings (flags win)")
    add_config_options(p, ServeConfig)


def settings(args: argparse.Namespace) -> ServeConfig:
    """The serve section of --config (if any), then the flags given."""
    from dataclasses import replace

    from core.options import config_from_options

    base = ServeConfig()
    if args.config:
        from core.config import apply, read_yaml

        section = read_yaml(args.config).get("serve") or {}
        if not isinstance(section, dict):
            raise DssmError(f"{args.config}: `serve` must be a section of keys, not {type(section).__name__}")
        base = apply(base, section, "serve.")
    given = config_from_options(ServeConfig, args)
    changed = {k: v for k, v in vars(given).items() if v != getattr(ServeConfig(), k)}
    cfg = replace(base, **changed)
    check_config(cfg)
    return cfg


def source_of(args: argparse.Namespace):
    from service.champion import ChampionSource, IndexSource, registered_name

    if args.index:
        if not Path(args.index).is_dir():
            raise DssmError(f"--index {args.index}: not a directory")
        return IndexSource(args.index)
    from core.tracking import default_tracking_uri, existing_store

    tracking = args.mlflow_uri or default_tracking_uri(Path(args.workdir))
    existing_store(tracking, "dssm serve")
    return ChampionSource(tracking, args.model or registered_name(tracking, Layout(args.workdir).index))


def set_threads(threads: int) -> int:
    """torch's threads for the model call (OpenVINO's read the same number from DSSM_THREADS), faiss's one."""
    import os

    from core.machine import usable_cpus

    threads = threads or usable_cpus()
    os.environ["DSSM_THREADS"] = str(threads)
    import faiss
    import torch

    torch.set_num_threads(threads)
    # a served batch is a few queries: faiss searches them fastest on one thread (a flat index of 44,839 titles:
    # 0.44 ms on one, 2.6 ms on two, for one query)
    faiss.omp_set_num_threads(1)
    return threads


def command(args: argparse.Namespace) -> None:
    """`dssm serve`."""
    import os

    # before torch and faiss load OpenMP: its idle threads sleep instead of spinning, so between two small model
    # calls they leave the cores to the event loop and the other pools (on 2 cores: p99 at 100 requests/s
    # 55-60 ms spinning, 26-29 ms passive; benchmarks/serve_bench.py, BENCHMARKS.md)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import uvicorn

    from service.app import build_app
    from service.champion import Champion
    from service.metrics import Metrics

    cfg = settings(args)
    source = source_of(args)
    threads = set_threads(cfg.threads)
    metrics = Metrics()
    champion = Champion(source, cfg.poll_seconds)
    served = {"label": None}

    def on_swap() -> None:
        label = champion.label
        if label != served["label"]:
            metrics.serving(label, served["label"])
            served["label"] = label

    champion.on_swap = on_swap
    app = build_app(champion, cfg, metrics)
    stop_logging = threading.Event()

    def log_windows() -> None:
        while not stop_logging.wait(cfg.log_every):
            metrics.log_window(champion.label)

    champion.start()
    if cfg.log_every:
        threading.Thread(target=log_windows, name="dssm-serve-log", daemon=True).start()
    log.info(
        "serve: http://%s:%d/search (POST {\"query\": ...}), /ready, /metrics; %d threads; loading the champion",
        cfg.host, cfg.port, threads,
    )  # fmt: skip
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=cfg.host,
            port=cfg.port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            limit_concurrency=cfg.max_queue + 64,  # connections past it get 503 from uvicorn itself
            timeout_graceful_shutdown=5,
        )
    )
    try:
        asyncio.run(server.serve())
    finally:
        stop_logging.set()
        champion.stop()
        metrics.log_window(champion.label)
    if not server.started:
        raise DssmError(f"could not listen on {cfg.host}:{cfg.port} (in use?)")
