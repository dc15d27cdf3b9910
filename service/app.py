"""The HTTP API of `dssm serve` (Starlette on uvicorn, both pinned already through MLflow and Prefect).

    POST /search   {"query": "cordless drill", "k": 10}              -> {"model", "hits": [{rank, title, score}]}
                   {"queries": ["cordless drill", "deck screws"]}     -> {"model", "results": [{"hits": [...]}, ...]}
    GET  /search?q=cordless+drill&k=5                                 -> as the first
    GET  /health   200 while the process runs
    GET  /ready    200 with the model served once a champion is loaded, else 503
    GET  /metrics  Prometheus text: request latency histogram, status codes, batch sizes, queue, swaps

Every input is bounded (serve.*): the body (413), the number of queries, each query's length and k (422);
a body that is not a JSON object of these keys with these types is a 400 naming what is wrong; a full
queue is a 503 with Retry-After; a query is never echoed back. Each answer names the model that made it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from service.batcher import Batcher, Overloaded
from service.champion import Champion
from service.config import ServeConfig
from service.metrics import Metrics

log = logging.getLogger(__name__)
KEYS = {"query", "queries", "k"}


class Refused(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def answer(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) past `limit` bytes without reading the rest."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise Refused(413, f"the body is larger than serve.max_body_bytes ({limit:,} bytes)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise Refused(413, f"the body is larger than serve.max_body_bytes ({limit:,} bytes)")
    return bytes(body)


def parse_search(payload: Any, cfg: ServeConfig) -> tuple[list[str], int, bool]:
    """(queries, k, whether one `query` was sent) of a decoded body, or Refused naming the problem."""
    if not isinstance(payload, dict):
        raise Refused(400, f"the body must be a JSON object, not {type(payload).__name__}")
    unknown = sorted(set(payload) - KEYS)
    if unknown:
        raise Refused(
            400, f"unknown key(s) {', '.join(repr(k)[:40] for k in unknown[:5])}; expected query or queries, k"
        )
    if ("query" in payload) == ("queries" in payload):
        raise Refused(400, "send either `query` (a string) or `queries` (a list of strings)")
    single = "query" in payload
    queries = [payload["query"]] if single else payload["queries"]
    if not isinstance(queries, list):
        raise Refused(400, f"`queries` must be a list of strings, not {type(queries).__name__}")
    if not queries:
        raise Refused(400, "`queries` is empty")
    if len(queries) > cfg.max_queries:
        raise Refused(422, f"{len(queries)} queries in one request; serve.max_queries is {cfg.max_queries}")
    for i, query in enumerate(queries):
        where = "`query`" if single else f"query {i + 1}"
        if not isinstance(query, str):
            raise Refused(400, f"{where} must be a string, not {type(query).__name__}")
        if not query.split():
            raise Refused(400, f"{where} is empty or whitespace only")
        if len(query) > cfg.max_query_chars:
            raise Refused(422, f"{where} has {len(query):,} characters; serve.max_query_chars is {cfg.max_query_chars}")
    k = payload.get("k", cfg.k)
    if not isinstance(k, int) or isinstance(k, bool):
        raise Refused(400, f"`k` must be an integer, not {type(k).__name__}")
    if not 1 <= k <= cfg.max_k:
        raise Refused(422, f"`k` must be between 1 and serve.max_k ({cfg.max_k}), got {k}")
    return queries, k, single


def build_app(champion: Champion, cfg: ServeConfig, metrics: Metrics) -> Starlette:
    def search(queries: list[str], k: int) -> list:
        loaded = champion.current
        if loaded is None:
            raise Overloaded("no champion is loaded yet")
        return [(loaded.wanted.label, hits) for hits in loaded.retriever.search(queries, k)]

    batcher = Batcher(search, cfg.max_batch, cfg.batch_wait_ms / 1000, cfg.max_queue, metrics.model_call)

    async def handle(request: Request) -> Response:
        started = time.perf_counter()
        try:
            if request.method == "GET":
                raw_k = request.query_params.get("k")
                payload: Any = {"query": request.query_params.get("q", "")}
                if raw_k is not None:
                    if not raw_k.lstrip("-").isdigit() or len(raw_k) > 9:
                        raise Refused(400, "`k` must be an integer")
                    payload["k"] = int(raw_k)
            else:
                try:
                    payload = orjson.loads(await read_body(request, cfg.max_body_bytes))
                except orjson.JSONDecodeError as e:
                    raise Refused(400, f"the body is not JSON ({str(e).splitlines()[0][:120]})") from None
            queries, k, single = parse_search(payload, cfg)
            if champion.current is None:
                raise Overloaded("no champion is loaded yet")
            metrics.queued.set(batcher.queued + len(queries))
            found = await batcher.submit(queries, k)
        except Refused as e:
            metrics.request(e.status, time.perf_counter() - started)
            return answer(e.status, {"error": str(e)})
        except Overloaded as e:
            metrics.request(503, time.perf_counter() - started)
            return answer(503, {"error": f"overloaded: {e}; retry shortly"}, {"Retry-After": "1"})
        except Exception as e:
            log.exception("serve: a search failed")
            metrics.request(500, time.perf_counter() - started)
            return answer(500, {"error": f"the search failed ({type(e).__name__}); the service logs say why"})
        results = [{"hits": [{"rank": h.rank, "title": h.title, "score": h.score} for h in hits]} for _, hits in found]
        took = time.perf_counter() - started
        metrics.request(200, took)
        body = {"model": found[0][0], "took_ms": round(took * 1000, 2)}
        return answer(200, body | (results[0] if single else {"results": results}))

    async def health(request: Request) -> Response:
        return answer(200, {"status": "alive"})

    async def ready(request: Request) -> Response:
        loaded = champion.current
        if loaded is None:
            return answer(503, {"status": "loading", "error": champion.error or None})
        return answer(
            200,
            {
                "status": "ready",
                "model": loaded.wanted.label,
                "titles": len(loaded.retriever.titles),
                "loaded_at": loaded.loaded_at,
                "swaps": champion.swaps,
                "error": champion.error or None,
            },
        )

    async def prometheus(request: Request) -> Response:
        metrics.queued.set(batcher.queued)
        return Response(metrics.text(), media_type="text/plain; version=0.0.4")

    routes = [
        Route("/search", handle, methods=["GET", "POST"]),
        Route("/health", health),
        Route("/ready", ready),
        Route("/metrics", prometheus),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.batcher = batcher
    return app
