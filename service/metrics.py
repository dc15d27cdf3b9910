"""What the service measures: a latency histogram and counters at /metrics (Prometheus' text format, in a
registry of its own), and a log line every `log_every` seconds with the window's requests, errors,
refusals, latency percentiles and mean batch."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

log = logging.getLogger(__name__)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "dssm_serve_request_seconds", "search request latency, received to answered", registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.requests = Counter(
            "dssm_serve_requests", "search requests by status code", ["code"], registry=self.registry
        )
        self.batch = Histogram("dssm_serve_batch_queries", "queries per model call", registry=self.registry,
                               buckets=BATCH_BUCKETS)  # fmt: skip
        self.model_seconds = Histogram("dssm_serve_model_seconds", "seconds per model call", registry=self.registry,
                                       buckets=LATENCY_BUCKETS)  # fmt: skip
        self.queued = Gauge("dssm_serve_queued_queries", "queries waiting for the model", registry=self.registry)
        self.swaps = Counter("dssm_serve_model_swaps", "champions swapped in while serving", registry=self.registry)
        self.model = Gauge("dssm_serve_model_info", "the model served (1)", ["model"], registry=self.registry)
        self._window: list[float] = []
        self._codes: dict[int, int] = {}
        self._batches: list[int] = []
        self._lock = threading.Lock()
        self._since = time.monotonic()

    def request(self, code: int, seconds: float) -> None:
        self.requests.labels(str(code)).inc()
        if code == 200:
            self.latency.observe(seconds)
        with self._lock:
            self._codes[code] = self._codes.get(code, 0) + 1
            if code == 200:
                self._window.append(seconds)

    def model_call(self, queries: int, seconds: float) -> None:
        self.batch.observe(queries)
        self.model_seconds.observe(seconds)
        with self._lock:
            self._batches.append(queries)

    def serving(self, label: str, previous: str | None) -> None:
        if previous is not None:
            self.model.remove(previous)
            self.swaps.inc()
        self.model.labels(label).set(1)

    def text(self) -> bytes:
        return generate_latest(self.registry)

    def log_window(self, model: str) -> None:
        """One line for the requests since the last call (nothing when there were none)."""
        with self._lock:
            window, codes, batches = self._window, self._codes, self._batches
            self._window, self._codes, self._batches = [], {}, []
            seconds, self._since = time.monotonic() - self._since, time.monotonic()
        total = sum(codes.values())
        if not total:
            return
        ms = np.percentile(np.array(window) * 1000, [50, 99]) if window else (float("nan"),) * 2
        refused = sum(n for c, n in codes.items() if c in (413, 422, 400, 503))
        errors = sum(n for c, n in codes.items() if c >= 500 and c != 503)
        log.info(
            "serve: %d requests in %.0fs (%.1f/s), p50 %.1f ms, p99 %.1f ms, %d refused, %d errors, "
            "mean batch %.1f queries; serving %s",
            total, seconds, total / max(seconds, 1e-9), ms[0], ms[1], refused, errors,
            float(np.mean(batches)) if batches else 0.0, model,
        )  # fmt: skip
