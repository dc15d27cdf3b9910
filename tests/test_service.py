"""`dssm serve`: the HTTP API and its bounds in process (Starlette's test client over the real app and a real
retriever), the batcher's queue, and a real server process whose champion moves while it takes 100 requests/s."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import mlflow
import pytest
from conftest import TINY_ATTRIBUTES, TINY_PRODUCTS, evaluate_register_gate, free_port, hand_built_index, tiny_model
from conftest import write_judged as judged_csv

from service.batcher import Batcher, Overloaded
from service.champion import Champion, IndexSource
from service.config import ServeConfig
from service.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
TITLES = [f"{a} {p} {s}" for p in TINY_PRODUCTS for a in TINY_ATTRIBUTES for s in ("kit", "pro")]


@pytest.fixture(scope="module")
def store(tiny_data, tmp_path_factory) -> dict:
    """Two tiny models registered as dssm-tiny v1 and v2 in a sqlite store, each indexed (by hand, as
    the index stage writes it) and tagged with its retriever as the index stage tags it; v1 the champion."""
    from core.tracking import ModelRef
    from stages.index.job import register_index

    root = tmp_path_factory.mktemp("service")
    uri = f"sqlite:///{root}/mlflow.db"
    judged = judged_csv(root / "judged.csv")
    indexes = {}
    for version, seed in (("1", "0"), ("2", "7")):
        model = tiny_model(tiny_data, root / f"model-{seed}", "epochs=2", f"seed={seed}")
        out = root / f"eval-{seed}"
        args = ["--model", str(model), "--judgments", str(judged), "--out", str(out), "--mlflow-uri", uri]
        evaluate_register_gate(*args, "--dataset", "tiny", "--encoding", "utf-8")
        run_id = mlflow.MlflowClient(uri).get_model_version("dssm-tiny", version).run_id
        described = {"uri": f"models:/dssm-tiny/{version}", "name": "dssm-tiny", "version": version, "run_id": run_id}
        index = hand_built_index(root / f"index-{version}", model / "last.pt", TITLES, model=described)
        manifest = json.loads((index / "manifest.json").read_text())
        manifest |= {"counts": {"titles": len(TITLES)}, "inputs": {"titles": {"path": "tiny", "sha256": "tiny"}}}
        register_index(index, ModelRef(**described), uri, manifest)
        indexes[version] = index
    client = mlflow.MlflowClient(uri)
    client.set_registered_model_alias("dssm-tiny", "champion", "1")
    return {"root": root, "uri": uri, "indexes": indexes}


@pytest.fixture
def app_client(store):
    from starlette.testclient import TestClient

    from service.app import build_app

    champion = Champion(IndexSource(store["indexes"]["1"]), poll_seconds=0)
    cfg = ServeConfig(max_k=20, max_query_chars=100, max_queries=4, max_body_bytes=2048)
    app = build_app(champion, cfg, Metrics())
    with TestClient(app) as client:
        yield client, champion


def same(hits: list[dict], others: list[dict]) -> bool:
    """The same titles in the same ranks, their scores equal to float rounding (a batch's arithmetic)."""
    return [(h["rank"], h["title"]) for h in hits] == [(h["rank"], h["title"]) for h in others] and all(
        abs(h["score"] - o["score"]) < 1e-5 for h, o in zip(hits, others, strict=True)
    )


def test_the_service_answers_one_or_several_queries_and_says_when_it_is_ready(app_client):
    client, champion = app_client
    assert client.get("/health").status_code == 200
    not_ready = client.get("/ready")
    assert not_ready.status_code == 503 and not_ready.json()["status"] == "loading"
    assert client.post("/search", json={"query": "cordless drill"}).status_code == 503
    assert champion.check()  # what the watcher thread does: load the index, warm it, swap it in
    ready = client.get("/ready").json()
    assert ready["status"] == "ready" and ready["model"] == "dssm-tiny v1" and ready["titles"] == len(TITLES)

    one = client.post("/search", json={"query": "cordless drill", "k": 3}).json()
    assert one["model"] == "dssm-tiny v1" and [h["rank"] for h in one["hits"]] == [1, 2, 3]
    assert "query" not in one and all(set(h) == {"rank", "title", "score"} for h in one["hits"])
    several = client.post("/search", json={"queries": ["cordless drill", "white lamp"]}).json()
    assert len(several["results"]) == 2 and len(several["results"][1]["hits"]) == 10  # serve.k
    assert same(several["results"][0]["hits"][:3], one["hits"])  # batched with another query or alone
    assert same(client.get("/search", params={"q": "cordless drill", "k": 3}).json()["hits"], one["hits"])
    # the top 10 do not depend on the k asked
    top20 = client.post("/search", json={"query": "cordless drill", "k": 20}).json()["hits"]
    assert same(top20[:10], several["results"][0]["hits"])
    metrics = client.get("/metrics").text
    assert 'dssm_serve_requests_total{code="200"} 4.0' in metrics and 'code="503"} 1.0' in metrics
    assert "dssm_serve_request_seconds_bucket" in metrics
    assert not champion.check()  # the same index: nothing to swap


@pytest.mark.parametrize(
    "body, status, says",
    [
        (b"{not json", 400, "not JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"query": {"nested": ["a"]}}', 400, "must be a string"),
        (b'{"queries": [["cordless drill"]]}', 400, "must be a string"),
        (b'{"queries": "cordless drill"}', 400, "list of strings"),
        (b'{"query": "   "}', 400, "empty"),
        (b'{"query": "drill", "queries": ["drill"]}', 400, "either"),
        (b'{"query": "drill", "limit": 3}', 400, "unknown key"),
        (b'{"query": "drill", "k": "3"}', 400, "integer"),
        (b'{"query": "drill", "k": true}', 400, "integer"),
        (b'{"query": "drill", "k": 0}', 422, "between 1 and"),
        (b'{"query": "drill", "k": 1000}', 422, "serve.max_k"),
        (b'{"query": "' + b"drill " * 40 + b'"}', 422, "serve.max_query_chars"),
        (b'{"queries": ["a", "b", "c", "d", "e"]}', 422, "serve.max_queries"),
        (b'{"query": "' + b"d" * 3000 + b'"}', 413, "serve.max_body_bytes"),
    ],
)
def test_bad_requests_are_refused_with_a_clear_4xx_and_the_service_keeps_answering(app_client, body, status, says):
    client, champion = app_client
    champion.check()
    refused = client.post("/search", content=body, headers={"content-type": "application/json"})
    assert refused.status_code == status and says in refused.json()["error"]
    assert len(refused.text) < 400  # a refusal never echoes the input
    assert client.post("/search", json={"query": "cordless drill"}).status_code == 200


def test_a_full_queue_refuses_at_once_and_the_batcher_keeps_serving():
    """Requests wait in one bounded queue; one model call answers many; past max_queue a request is refused."""
    calls: list[int] = []
    gate = threading.Event()

    def search(queries: list[str], k: int) -> list:
        gate.wait(5)
        calls.append(len(queries))
        return [[f"{q}:{i}" for i in range(k)] for q in queries]

    async def scenario() -> tuple[list, list]:
        batcher = Batcher(search, max_batch=8, wait_s=0.01, max_queue=10, observe=lambda n, s: None)
        batcher.start()
        first = asyncio.ensure_future(batcher.submit(["a"], 2))  # taken by the worker, which then waits on `gate`
        await asyncio.sleep(0.05)
        waiting = [asyncio.ensure_future(batcher.submit([f"q{i}", f"r{i}"], 3)) for i in range(5)]  # 10 queued
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded):
            await batcher.submit(["one too many"], 1)
        gate.set()
        answers = await asyncio.gather(first, *waiting)
        await batcher.stop()
        return answers, calls

    answers, calls = asyncio.run(scenario())
    assert answers[0] == [["a:0", "a:1"]] and answers[1] == [["q0:0", "q0:1", "q0:2"], ["r0:0", "r0:1", "r0:2"]]
    assert calls[0] == 1 and sum(calls) == 11 and max(calls) <= 8 and len(calls) == 3  # 1, then 8, then 2


@pytest.mark.integration
def test_a_champion_moved_during_100_requests_a_second_is_served_within_30s_and_no_request_fails(store, tmp_path):
    """A real `dssm serve` on the store: 100 requests/s, open loop; the alias moves from v1 to v2 after 4 s;
    every request is answered 200, v2 answers within 30 s of the move, and SIGTERM ends the process in seconds."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from serve_bench import offer, wait_ready

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "dssm.cli", "serve", "--workdir", str(store["root"]), "--port", str(port)]
    cmd += ["--mlflow-uri", store["uri"], "--model", "dssm-tiny", "--poll-seconds", "1", "--threads", "1"]
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        assert wait_ready(url, proc, 120)["model"] == "dssm-tiny v1"
        result: dict = {}
        load = threading.Thread(target=lambda: result.update(asyncio.run(offer(url, TITLES, 100, 14, 5))))
        load.start()
        time.sleep(4)
        mlflow.MlflowClient(store["uri"]).set_registered_model_alias("dssm-tiny", "champion", "2")
        moved = time.perf_counter()
        load.join()
        assert result["errors"] == {}, log.read_text()[-3000:]
        assert len(result["latencies_ms"]) == result["sent"] > 1000
        assert set(result["models"]) == {"dssm-tiny v1", "dssm-tiny v2"}
        first_v2 = min(t for t, model in result["answers"] if model == "dssm-tiny v2")
        assert first_v2 - moved < 30
        assert "now serving dssm-tiny v2" in log.read_text() and "replacing dssm-tiny v1" in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        started = time.perf_counter()
        code = proc.wait(30)
    assert time.perf_counter() - started < 10 and code == 128 + signal.SIGTERM, log.read_text()[-2000:]
