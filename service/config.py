"""The search service's settings (`dssm serve`'s flags, the run config's `serve` section), in a module that
imports no pyspark, mlflow, torch or web server."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import DssmError
from core.text import MAX_QUERY_CHARS


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"  # address to listen on (0.0.0.0: every interface; there is no authentication)
    port: int = 8765  # TCP port to listen on
    k: int = 10  # titles per query when a request names no k
    max_k: int = 100  # the most titles a request may ask for per query (more: 422)
    max_query_chars: int = MAX_QUERY_CHARS  # the longest query accepted, in characters (longer: 422)
    max_queries: int = 64  # queries one request may send (more: 422)
    max_body_bytes: int = 65536  # the largest request body read (larger: 413)
    max_batch: int = 64  # queries embedded and searched in one model call (concurrent requests share it)
    # how long the batcher waits for more requests once one is there, in ms: latency traded for larger batches
    batch_wait_ms: float = 0.0
    max_queue: int = 512  # queries waiting for the model; a request that would pass it gets 503 at once
    poll_seconds: float = 5.0  # how often the registry is asked whether the champion moved (0: never)
    threads: int = 0  # torch, faiss and OpenVINO threads of the model call; 0: the cores this process may use
    log_every: float = 60.0  # seconds between the log lines of requests, latency and batches (0: none)


def check_config(cfg: ServeConfig) -> None:
    """Refuse settings the service could not honour, naming the key."""
    positive = ("k", "max_k", "max_query_chars", "max_queries", "max_body_bytes", "max_batch", "max_queue")
    for key in positive:
        if getattr(cfg, key) < 1:
            raise DssmError(f"serve.{key} must be at least 1, got {getattr(cfg, key)}")
    if cfg.k > cfg.max_k:
        raise DssmError(f"serve.k ({cfg.k}) must not be above serve.max_k ({cfg.max_k})")
    if cfg.max_k > 10_000:
        raise DssmError(f"serve.max_k must be at most 10000, got {cfg.max_k}")
    if not 0 < cfg.port < 65536:
        raise DssmError(f"serve.port must be 1-65535, got {cfg.port}")
    if cfg.max_queue < cfg.max_queries:
        raise DssmError(f"serve.max_queue ({cfg.max_queue}) must hold one request of serve.max_queries")
    for key in ("batch_wait_ms", "poll_seconds", "log_every"):
        if not 0 <= getattr(cfg, key) <= 3600:
            raise DssmError(f"serve.{key} must be between 0 and 3600, got {getattr(cfg, key)}")
    if cfg.threads < 0:
        raise DssmError(f"serve.threads must be 0 (every core) or more, got {cfg.threads}")
