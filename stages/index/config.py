"""The index stage's settings (the faiss index kind and its HNSW parameters) and `dssm search`'s."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, get_args

from core.config import Between
from core.errors import DssmError

Kind = Literal["auto", "flat", "hnsw"]
KINDS = get_args(Kind)
Device = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True)
class IndexConfig:
    # flat (exact), hnsw (graph ANN) or auto: flat up to flat_max titles and flat_max_mb of vectors, else hnsw
    kind: Kind = "auto"
    # auto's limit for flat, in titles: an exact search of 200k 96-d vectors is ~10 ms per query on one core
    flat_max: Annotated[int, Between(0, 100_000_000)] = 200_000
    # ... and in MB of float32 vectors: an exact search reads them all (one core: ~0.4 ms for 44,839 x 96, 17 MB;
    # 4.9 ms for 44,839 x 384, 69 MB), too slow at a service's rates
    flat_max_mb: Annotated[int, Between(0, 1_000_000)] = 32
    hnsw_m: Annotated[int, Between(2, 512)] = 32  # HNSW graph degree: recall and memory grow with it
    # HNSW candidates kept while building: graph quality against build time
    ef_construction: Annotated[int, Between(1, 100_000)] = 80
    # HNSW candidates kept per query search: recall against latency
    ef_search: Annotated[int, Between(1, 100_000)] = 128
    rows_per_file: Annotated[int, Between(1_000, 100_000_000)] = 100_000  # rows per embeddings/ Parquet file, about
    # where the titles are embedded: auto, a GPU where torch sees one (on a cluster with GPU resources: the
    # GPU Spark assigned the task, infra/README.md), else the CPU
    device: Device = "auto"
    # the flow's index stage: titles to index, Parquet/CSV with a `title` column; empty: the clean stage's title
    # pool (`dssm index` takes --titles)
    catalogue: str = ""


def check_config(cfg: IndexConfig | SearchConfig) -> None:
    """The index stage's settings, or `dssm search`'s."""
    if isinstance(cfg, SearchConfig):
        if cfg.k < 1:
            raise DssmError(f"-k must be at least 1, got {cfg.k}")
        if cfg.ef_search < 0:
            raise DssmError(f"--ef-search must be 0 (the index's) or more, got {cfg.ef_search}")
        return
    if cfg.kind not in KINDS:
        raise DssmError(f"index.kind must be one of {', '.join(KINDS)}, not {cfg.kind!r}")
    if cfg.catalogue and "://" not in cfg.catalogue and not Path(cfg.catalogue).exists():
        raise DssmError(f"index.catalogue {cfg.catalogue}: not found")


@dataclass(frozen=True)
class SearchConfig:
    k: int = 10  # titles per query
    ef_search: int = 0  # HNSW candidates kept per query search; 0: the index's own (index.ef_search when built)
