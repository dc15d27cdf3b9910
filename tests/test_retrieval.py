"""Retrieval over the whole catalogue: the index stage (Spark pandas UDF over the model files, faiss), `dssm search`,
the pyfunc retriever in a fresh process, the registered model behind `mlflow models serve`, the
full-catalogue metrics and bm25s against PROTOCOL.md's BM25."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import (
    TINY_ATTRIBUTES,
    TINY_PRODUCTS,
    evaluate_register_gate,
    free_port,
    hand_built_index,
    http_service,
    tiny_fusion,
    tiny_model,
    write_index,
    write_judged,
)

from dssm.cli import main as dssm_main
from modeling.checkpoint import read_checkpoint
from scoring.neural import TwoTowerEmbedder


@pytest.fixture(scope="module")
def registered(tiny_data, tmp_path_factory) -> dict:
    """A tiny model evaluated into a sqlite store: registered as dssm-tiny, champion v1."""
    root = tmp_path_factory.mktemp("retrieval")
    model = tiny_model(tiny_data, root / "model", "epochs=3")
    judged = write_judged(root / "judged.csv")
    uri = f"sqlite:///{root}/mlflow.db"
    args = ["--judgments", str(judged), "--out", str(root / "eval"), "--mlflow-uri", uri, "--dataset", "tiny"]
    evaluate_register_gate("--model", str(model), *args, "--encoding", "utf-8")
    return {"root": root, "uri": uri, "checkpoint": model / "last.pt"}


def catalogue(path: Path) -> list[str]:
    """160 distinct titles of the tiny domain, written with messy case and spacing (index normalises)."""
    titles = [f"{a} {p} {s}" for p in TINY_PRODUCTS for a in TINY_ATTRIBUTES for s in ("kit", "pro")]
    messy = [t.upper().replace(" ", "  ") if i % 7 == 0 else t for i, t in enumerate(titles)]
    pq.write_table(pa.table({"title": messy + messy[:5], "other": list(range(len(messy) + 5))}), path)
    return sorted(titles)


def test_index_embeds_on_spark_searches_exactly_and_logs_a_retriever(spark, registered, tmp_path, capsys):
    from scoring.retriever import Retriever
    from stages.index.job import index

    titles = catalogue(tmp_path / "titles.parquet")
    out = tmp_path / "index"
    manifest = index(spark, "models:/dssm-tiny@champion", tmp_path / "titles.parquet", out, registered["uri"])
    assert not manifest["skipped"] and manifest["counts"]["titles"] == len(titles) == 160
    assert manifest["counts"]["kind"] == "flat" and manifest["model"]["version"] == "1"

    # the Spark UDF's vectors are the checkpoint's title tower
    table = pq.read_table(out / "embeddings")
    assert sorted(table.column("title").to_pylist()) == titles
    assert set(table.column("model_version").to_pylist()) == {"dssm-tiny/1"}
    embedder = TwoTowerEmbedder(registered["checkpoint"])
    expected = embedder.embed(table.column("title").to_pylist(), "doc")
    np.testing.assert_allclose(np.array(table.column("embedding").to_pylist()), expected, atol=1e-5)

    # search is the exact cosine top k
    retriever = Retriever.load(out)
    hits = retriever.search(["cordless drill", "white lamp"], 5)
    q = embedder.embed(["cordless drill"], "query")[0]
    t = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    cos = t @ (q / np.linalg.norm(q))
    best = np.argsort(-cos)[:5]
    assert [h.title for h in hits[0]] == [table.column("title")[int(i)].as_py() for i in best]
    np.testing.assert_allclose([h.score for h in hits[0]], cos[best], atol=1e-5)
    assert [h.rank for h in hits[1]] == [1, 2, 3, 4, 5]

    assert dssm_main(["search", "cordless drill", "-k", "3", "--index", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "top 3 of 160 titles (dssm-tiny v1)" in shown and hits[0][0].title in shown

    # a rerun with the same champion and titles is a no-op
    args = ["index", "--model", "models:/dssm-tiny@champion", "--titles", str(tmp_path / "titles.parquet")]
    assert dssm_main([*args, "--out", str(out), "--mlflow-uri", registered["uri"]]) == 0
    assert "160 titles x 8 (flat" in capsys.readouterr().out and json.loads((out / "manifest.json").read_text()) == {
        k: v for k, v in manifest.items() if k != "skipped"
    }

    # MLflow: the retriever is registered with the champion alias, the version points at it,
    # and the version's run records the catalogue as a dataset input
    client = mlflow.MlflowClient(registered["uri"])
    version = client.get_model_version("dssm-tiny", "1")
    assert version.tags["retriever_uri"] == manifest["retriever"]["uri"] and version.tags["index.titles"] == "160"
    assert str(client.get_model_version_by_alias("dssm-tiny-retriever", "champion").version) == "1"
    inputs = client.get_run(version.run_id).inputs.dataset_inputs
    assert {(i.dataset.name, i.dataset.digest) for i in inputs} >= {
        ("catalogue", manifest["inputs"]["titles"]["sha256"][:32])
    }
    eval_contexts = {t.value for i in inputs for t in i.tags if t.key == "mlflow.data.context"}
    assert eval_contexts == {"evaluation", "catalogue"}  # the judged set it was evaluated on, and the catalogue

    # the manifest holds every served file's sha256 (Retriever.load checks them) and the model version
    served = set(manifest["file_sha256"])
    assert {"titles.faiss", "model/model.pt", "model.json"} <= served
    assert any(f.startswith("embeddings/part-") for f in served) and manifest["model"]["version"] == "1"
    # a rebuild for the same model version over the same titles (--force, or a lost directory) writes
    # the same files: it reuses the registered retriever version rather than registering a copy
    champion = "models:/dssm-tiny@champion"
    rebuilt = index(spark, champion, tmp_path / "titles.parquet", out, registered["uri"], force=True)
    assert not rebuilt["skipped"] and rebuilt["content_sha256"] == manifest["content_sha256"]
    assert rebuilt["retriever"] == manifest["retriever"]
    assert [str(v.version) for v in client.search_model_versions("name='dssm-tiny-retriever'")] == ["1"]
    train_run = client_for(registered).get_run(read_checkpoint(registered["checkpoint"])["mlflow_run_id"])
    contexts = {t.value for i in train_run.inputs.dataset_inputs for t in i.tags if t.key == "mlflow.data.context"}
    assert contexts == {"training", "validation", "vocabulary"}

    # the pyfunc retriever, loaded by URI in a fresh process, answers the same
    script = (
        "import json, mlflow, pandas as pd\n"
        f"mlflow.set_tracking_uri({registered['uri']!r})\n"
        "m = mlflow.pyfunc.load_model('models:/dssm-tiny-retriever@champion')\n"
        "out = m.predict(pd.DataFrame({'query': ['cordless drill', 'white lamp']}), params={'k': 5})\n"
        "print(json.dumps(out.to_dict('list')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    answered = json.loads(done.stdout.strip().splitlines()[-1])
    assert answered["title"][:5] == [h.title for h in hits[0]] and answered["rank"] == [1, 2, 3, 4, 5] * 2
    assert answered["query"] == ["cordless drill"] * 5 + ["white lamp"] * 5

    # `dssm search --model` finds the retriever through the registered model's tag
    args = ["search", "white lamp", "-k", "2", "--model", "models:/dssm-tiny@champion", "--mlflow-uri"]
    assert dssm_main([*args, registered["uri"]]) == 0
    assert hits[1][0].title in capsys.readouterr().out


def client_for(registered: dict) -> mlflow.MlflowClient:
    """The store the tiny model's training run went to (conftest.tiny_model)."""
    return mlflow.MlflowClient(f"sqlite:///{registered['checkpoint'].parent.parent}/train.db")


def post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.integration
def test_mlflow_models_serve_answers_scores_and_embeddings_and_rejects_bad_input(registered, tmp_path):
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": registered["uri"]}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # uvicorn of this env
    cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", "models:/dssm-tiny@champion",
           "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with http_service(cmd, tmp_path / "serve.log", f"{base}/ping", env=env, cwd=tmp_path):
        queries, titles = ["cordless drill", "white lamp"], ["steel drill kit", "brass rug pro"]
        frame = {
            "dataframe_split": {
                "columns": ["query", "title"],
                "data": [list(p) for p in zip(queries, titles, strict=True)],
            }
        }
        status, body = post(f"{base}/invocations", json.dumps(frame).encode())
        assert status == 200
        expected = TwoTowerEmbedder(registered["checkpoint"]).score(queries, titles)
        np.testing.assert_allclose([p["score"] for p in body["predictions"]], expected, atol=1e-5)

        only_queries = {"dataframe_split": {"columns": ["query"], "data": [["cordless drill"]]}}
        status, body = post(
            f"{base}/invocations", json.dumps(only_queries | {"params": {"output": "query_embedding"}}).encode()
        )
        assert status == 200 and len(body["predictions"][0]["embedding"]) == 8  # model.ncell=8

        # bad input: a 4xx that says what is wrong, never a 500
        status, body = post(f"{base}/invocations", json.dumps(only_queries).encode())
        assert status == 400 and "needs column(s) title" in body["message"]
        status, body = post(f"{base}/invocations", json.dumps(only_queries | {"params": {"output": "x"}}).encode())
        assert status == 400 and "output must be one of" in body["message"]
        status, body = post(f"{base}/invocations", b"not json")
        assert status == 400 and "valid JSON" in body["message"]
        nulls = {"dataframe_split": {"columns": ["query", "title"], "data": [[None, None]]}}  # scored 1.0 before
        status, body = post(f"{base}/invocations", json.dumps(nulls).encode())
        assert status == 400 and "query 1 of 1 is null" in body["message"]
        for nested in ([{"a": [1, {"b": 2}]}, "steel drill kit"], [["cordless", ["drill"]], "steel drill kit"]):
            status, body = post(f"{base}/invocations", json.dumps({"dataframe_split": frame["dataframe_split"]
                                | {"data": [nested]}}).encode())  # fmt: skip
            assert status == 400, body


def test_a_hybrid_saved_without_a_retrieval_fusion_rescores_the_union_as_before(registered):
    from scoring.bm25 import CatalogueBM25
    from scoring.fusion import RetrievalFusion
    from scoring.hybrid import HybridScorer
    from scoring.lexical import BM25, Collection
    from scoring.retriever import Retriever
    from stages.index.config import IndexConfig
    from stages.index.job import build_faiss

    RERANK = RetrievalFusion.from_dict(None).depth  # the depth a hybrid saved before retrieval fusion keeps

    sizes = ("a", "b", "c")
    titles = [f"{a} {p} {s} {n}" for p in TINY_PRODUCTS for a in TINY_ATTRIBUTES for s in ("kit", "pro") for n in sizes]
    embedder = TwoTowerEmbedder(registered["checkpoint"])
    bm25 = BM25.fit(Collection(titles))
    fusion = {"bm25": bm25.to_dict(), "weight": 0.3}
    vectors = embedder.embed(titles, "doc")
    query = "cordless drill"
    # expected: every title of the union of the exact cosine top RERANK and BM25's (score > 0) top RERANK,
    # ranked by the hybrid scorer of `dssm evaluate`
    cos = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)) @ embedder.embed([query], "query")[0]
    lexical = bm25.score([query] * len(titles), titles)
    union = set(np.argsort(-cos, kind="stable")[:RERANK]) | {i for i in np.argsort(-lexical)[:RERANK] if lexical[i] > 0}
    assert len(union) > RERANK  # BM25 adds candidates the vectors did not rank in their top RERANK
    fused = HybridScorer(embedder, [bm25], [0.3]).score([query] * len(titles), titles)
    ranked = sorted(union, key=lambda i: -fused[i])
    k = next(k for k in range(10, len(ranked)) if fused[ranked[k - 1]] > fused[ranked[k]] + 1e-6)  # no tie at the edge
    expected = ranked[:k]
    for kind in ("flat", "hnsw"):
        index, _ = build_faiss(vectors, IndexConfig(kind=kind, flat_max=10**6 if kind == "flat" else 1))
        hits = Retriever(index, titles, embedder, fusion, lexical=CatalogueBM25(titles)).search([query], k)[0]
        assert [h.rank for h in hits] == list(range(1, k + 1))
        np.testing.assert_allclose([h.score for h in hits], [fused[i] for i in expected], atol=1e-5)
        if kind == "flat":
            assert sorted(h.title for h in hits) == sorted(titles[i] for i in expected)


@pytest.mark.parametrize("method", ["zscore", "rrf"])
def test_a_hybrid_fuses_the_union_as_its_retrieval_fusion_says(registered, method):
    from scoring.bm25 import CatalogueBM25
    from scoring.lexical import BM25, Collection
    from scoring.retriever import Retriever
    from stages.index.config import IndexConfig
    from stages.index.job import build_faiss

    titles = [f"{a} {p} {s} {n}" for p in TINY_PRODUCTS for a in TINY_ATTRIBUTES for s in ("kit", "pro") for n in "abc"]
    embedder = TwoTowerEmbedder(registered["checkpoint"])
    depth, alpha = 40, 0.7
    fusion = {"bm25": BM25.fit(Collection(titles)).to_dict(), "weight": 0.3}
    fusion["retrieval"] = {"method": method, "depth": depth, "alpha": alpha}
    vectors = embedder.embed(titles, "doc")
    query = "cordless drill"
    # by hand: the union of both top `depth` (BM25's with a matching word), each candidate's cosine and
    # bm25s score standardised over the union (zscore) or turned into reciprocal ranks (rrf), mixed by alpha
    cos = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)) @ embedder.embed([query], "query")[0]
    lexical = CatalogueBM25(titles).scores(query)
    union = list(
        dict.fromkeys(
            [
                *np.argsort(-cos, kind="stable")[:depth],
                *[i for i in np.argsort(-lexical, kind="stable")[:depth] if lexical[i] > 0],
            ]
        )
    )
    assert len(union) > depth
    c, b = cos[union].astype(np.float64), lexical[union].astype(np.float64)
    if method == "zscore":
        fused = alpha * (c - c.mean()) / c.std() + (1 - alpha) * (b - b.mean()) / b.std()
    else:
        rank = lambda x: np.argsort(np.argsort(-x, kind="stable"), kind="stable") + 1  # noqa: E731
        fused = alpha / (60 + rank(c)) + (1 - alpha) / (60 + rank(b))
    order = np.argsort(-fused, kind="stable")
    index, _ = build_faiss(vectors, IndexConfig(kind="flat"))
    retriever = Retriever(index, titles, embedder, fusion, lexical=CatalogueBM25(titles))
    hits = retriever.search([query], 10)[0]
    np.testing.assert_allclose([h.score for h in hits], fused[order[:10]], atol=1e-5)
    # the candidates do not depend on k: asking for more (past `depth` too) keeps the top 10, and ends at the union
    for k in (11, depth + 5, 10_000):
        more = retriever.search([query], k)[0]
        assert more[:10] == hits and len(more) == min(k, len(union))
    if method == "zscore":  # (rrf's ranks break the ties of titles that differ in one letter either way)
        at_least = fused[order[9]] - 1e-6  # tied titles: any of them may come first
        assert {h.title for h in hits} <= {titles[union[i]] for i in order if fused[i] >= at_least}


def test_a_three_scorer_hybrid_ranks_alike_in_evaluation_the_mlflow_model_and_the_retriever(
    registered, tiny_data, tmp_path
):
    """model + BM25 + a second trained model: the union of the three top `depth`, each candidate's three
    scores standardised over the union and mixed by the fusion's weights; the evaluation's ranking, the
    logged pyfunc's pair scores and `Retriever.search` all follow fusion.json (the partner's checkpoint
    travelling as a file of its own)."""
    from conftest import tiny_model

    from scoring.bm25 import CatalogueBM25
    from scoring.catalogue import Catalogue, fused
    from scoring.fusion import RetrievalFusion
    from scoring.hybrid import HybridScorer
    from scoring.lexical import BM25, Collection
    from scoring.retriever import Retriever
    from scoring.systems import System
    from stages.evaluate.job import component_kind
    from stages.index.config import IndexConfig
    from stages.index.job import build_faiss

    partner_path = tiny_model(tiny_data, tmp_path / "partner", "epochs=2", "seed=7") / "last.pt"
    model, partner = TwoTowerEmbedder(registered["checkpoint"]), TwoTowerEmbedder(partner_path)
    titles = [f"{a} {p} {s} {n}" for p in TINY_PRODUCTS for a in TINY_ATTRIBUTES for s in ("kit", "pro") for n in "abc"]
    bm25 = BM25.fit(Collection(titles))
    members = [System("lstm", "trained", model, checkpoint=registered["checkpoint"]), System("bm25", "baseline", bm25),
               System("lstm-7", "trained", partner, checkpoint=partner_path)]  # fmt: skip
    weights, retrieval = [0.4, 0.7], RetrievalFusion("zscore", 30, (0.5, 0.2, 0.3))
    fusion = {
        "components": [{"name": m.name, "kind": component_kind(m, i)} for i, m in enumerate(members)],
        "weights": weights,
        "bm25": bm25.to_dict(),
        "retrieval": retrieval.to_dict(),
    }
    query = "cordless drill"
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    cos_m = unit(model.embed(titles, "doc")) @ unit(model.embed([query], "query")[0])
    cos_p = unit(partner.embed(titles, "doc")) @ unit(partner.embed([query], "query")[0])
    lexical = CatalogueBM25(titles).scores(query)
    from scoring.bm25 import best

    tops = [np.argsort(-cos_m, kind="stable")[:30], best(lexical, 30), np.argsort(-cos_p, kind="stable")[:30]]
    tops[1] = tops[1][lexical[tops[1]] > 0]
    union = list(dict.fromkeys(int(i) for t in tops for i in t))
    assert len(union) > 40  # the partner and BM25 add candidates the model did not rank in its top 30
    z = lambda x: (x - x.mean()) / x.std()  # noqa: E731
    by_hand = 0.5 * z(cos_m[union]) + 0.2 * z(lexical[union].astype(np.float64)) + 0.3 * z(cos_p[union])
    score_of = dict(zip(union, by_hand, strict=True))
    top10 = np.sort(by_hand)[::-1][:10]

    def ranked_as_by_hand(ids) -> bool:  # titles that differ in their last letter tie: either may come first
        return np.allclose([score_of.get(int(i), -np.inf) for i in ids], top10, atol=1e-5)

    # the evaluation's ranking of the catalogue
    scorers = {m.name: m.scorer for m in members}
    assert ranked_as_by_hand(fused(Catalogue(titles), scorers, [query], retrieval, 10)[0])
    # the retriever, over flat indexes of the model's and the partner's title vectors
    index, _ = build_faiss(model.embed(titles, "doc"), IndexConfig(kind="flat"))
    partner_index, _ = build_faiss(partner.embed(titles, "doc"), IndexConfig(kind="flat"))
    files = {"component-2.pt": partner_path}
    fusion["components"][2]["file"] = "component-2.pt"
    lexical_index = CatalogueBM25(titles)
    retriever = Retriever(index, titles, model, fusion, None, lexical_index, {2: partner_index}, files)
    hits = retriever.search([query], 10)[0]
    assert ranked_as_by_hand([titles.index(h.title) for h in hits])
    np.testing.assert_allclose([h.score for h in hits], top10, atol=1e-5)

    # the MLflow model: s_0 + Σ w_i·s_i per pair, its partner loaded from the checkpoint it logged
    from core.tracking import experiment_id
    from scoring.serving import log_model

    del fusion["components"][2]["file"]  # log_model names the partners' files
    with mlflow.start_run(experiment_id=experiment_id(f"sqlite:///{tmp_path}/mlflow.db", "three")):
        uri, _ = log_model(registered["checkpoint"], None, fusion, {"lstm-7": partner_path})
    loaded = mlflow.pyfunc.load_model(uri)
    pairs = pd_frame([query] * 4, titles[:4])
    expected = HybridScorer(model, [bm25, partner], weights).score([query] * 4, titles[:4])
    np.testing.assert_allclose(loaded.predict(pairs)["score"], expected, atol=1e-5)
    inner = loaded.unwrap_python_model()
    assert inner.name == "lstm+bm25+lstm-7" and list(inner.components) == ["lstm", "bm25", "lstm-7"]
    import pandas as pd

    only_titles = pd.DataFrame({"title": titles[:2]})
    embedded = loaded.predict(only_titles, params={"output": "title_embedding", "component": "lstm-7"})
    np.testing.assert_allclose(np.array(embedded["embedding"].tolist()), partner.embed(titles[:2], "doc"), atol=1e-5)

    # the dev grid scores every weighting at once (standardised scores as matrices); each grid point's
    # NDCG@10 is what ranking with that fusion (the served path above) gets
    from core.judgments import JudgedSetSpec, read_judgments
    from scoring.catalogue import fit_fusion
    from scoring.protocol import build_eval_set
    from scoring.quality import catalogue_metrics

    pairs = read_judgments(write_judged(tmp_path / "judged.csv"), JudgedSetSpec(encoding="utf-8"))
    dev = build_eval_set(pairs, "tiny", "sha")
    judged_catalogue = Catalogue.of_judged(pairs)
    chosen, grid = fit_fusion(dev, judged_catalogue, scorers)
    for fusion in (chosen, RetrievalFusion("rrf", 100, (0.5, 0.25, 0.25))):
        ids = fused(judged_catalogue, scorers, [q.query for q in dev.queries], fusion, 10)
        retrieved = {q.qid: [judged_catalogue.titles[i] for i in row] for q, row in zip(dev.queries, ids, strict=True)}
        assert catalogue_metrics(dev, retrieved, 2.5)["ndcg@10"] == pytest.approx(grid[fusion.label], abs=1e-3)


def test_an_index_whose_files_do_not_belong_together_is_refused_naming_the_file(registered, tmp_path):
    """A file copied from another index or another model, or damaged at the same size, used to be
    served (a mix of two models, or scores around 6.7e37) with rc 0."""
    import re
    import shutil

    from core.artifacts import damage, read_manifest
    from core.errors import DssmError
    from core.tracking import experiment_id
    from scoring.retriever import Retriever
    from scoring.serving import log_retriever

    titles = catalogue(tmp_path / "titles.parquet")
    good = hand_built_index(tmp_path / "good", registered["checkpoint"], titles, tiny_fusion(titles))
    other = hand_built_index(tmp_path / "other", registered["checkpoint"], [f"{t} x" for t in titles])
    assert (good / "titles.faiss").stat().st_size == (other / "titles.faiss").stat().st_size
    hits = Retriever.load(good).search(["cordless drill"], 3)[0]  # the hybrid with its retrieval fusion serves
    assert len(hits) == 3 and "drill" in hits[0].title

    def another_model(path: Path) -> None:  # the same architecture and vocabulary, other weights: same size
        import torch

        state = read_checkpoint(path)
        for tensor in state["model"].values():
            if tensor.is_floating_point():
                tensor.add_(0.01)  # in place: tensors that share storage keep sharing it
        torch.save(state, path)

    def flip(path: Path) -> None:  # same size, other bytes: the middle of the vectors
        data = bytearray(path.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 64] = b"\x7f" * 64
        path.write_bytes(data)

    tampered = {
        "another index's titles.faiss": ("titles.faiss", lambda p: shutil.copyfile(other / "titles.faiss", p)),
        "another model's model.pt": ("model/model.pt", another_model),
        "a same-size corrupted titles.faiss": ("titles.faiss", flip),
        "an edited fusion.json": ("model/fusion.json", lambda p: p.write_text(p.read_text().replace("0.3", "3.0"))),
        "another index's embeddings": (
            "embeddings/part-00000.parquet",
            lambda p: shutil.copyfile(other / "embeddings" / "part-00000.parquet", p),
        ),
    }
    for i, (case, (name, tamper)) in enumerate(tampered.items()):
        broken = tmp_path / f"broken-{i}"
        shutil.copytree(good, broken)
        tamper(broken / name)
        differs = r" (is not the file this output was built with|has \d+ bytes, the manifest says \d+)"
        with pytest.raises(DssmError, match=re.escape(str(broken / name)) + differs + ".*dssm index --force"):
            Retriever.load(broken)
        if case in ("another index's titles.faiss", "another model's model.pt", "a same-size corrupted titles.faiss"):
            assert damage(broken, read_manifest(broken)) is None  # what the size check alone let through
    # an index written before manifests held hashes still serves (sizes checked): `dssm run` rebuilds it
    legacy = tmp_path / "legacy"
    shutil.copytree(good, legacy)
    written = json.loads((legacy / "manifest.json").read_text())
    del written["file_sha256"]
    (legacy / "manifest.json").write_text(json.dumps(written))
    assert Retriever.load(legacy).search(["cordless drill"], 1)[0]
    # a file the manifest does not list: a plain index turned into a hybrid
    shutil.copyfile(good / "model" / "fusion.json", other / "model" / "fusion.json")
    with pytest.raises(DssmError, match=re.escape(str(other / "model" / "fusion.json")) + " is not part of"):
        Retriever.load(other)

    # the pyfunc retriever checks its own copy at load
    store = f"sqlite:///{tmp_path}/mlflow.db"
    with mlflow.start_run(experiment_id=experiment_id(store, "retriever")):
        uri, _ = log_retriever(good, None)
    assert len(mlflow.pyfunc.load_model(uri).predict(pd_frame(["cordless drill"]), params={"k": 2})) == 2
    (logged,) = (tmp_path / "mlartifacts").rglob("titles.faiss")
    flip(logged)
    with pytest.raises(DssmError, match=re.escape(str(logged)) + " is not the file"):
        mlflow.pyfunc.load_model(uri)


def pd_frame(queries: list, titles: list | None = None):
    import pandas as pd

    return pd.DataFrame({"query": queries} | ({"title": titles} if titles is not None else {}))


def test_null_empty_and_non_text_inputs_are_refused_and_unknown_queries_are_flagged(registered, tmp_path, capsys):
    """They used to be scored: two nulls as 1.0, an empty search returned titles, numbers and lists
    were turned into strings."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, ErrorCode

    from core.tracking import experiment_id
    from scoring.serving import log_retriever

    mlflow.set_tracking_uri(registered["uri"])
    scorer = mlflow.pyfunc.load_model("models:/dssm-tiny@champion")  # the served two-tower model, in process
    titles = catalogue(tmp_path / "titles.parquet")
    index = hand_built_index(tmp_path / "index", registered["checkpoint"], titles)
    with mlflow.start_run(experiment_id=experiment_id(f"sqlite:///{tmp_path}/mlflow.db", "retriever")):
        uri, _ = log_retriever(index, None)
    retriever = mlflow.pyfunc.load_model(uri)

    def refused(model, frame, reason: str, **params) -> None:
        with pytest.raises(MlflowException, match=reason) as e:
            model.predict(frame, params=params or None)
        assert e.value.error_code == ErrorCode.Name(INVALID_PARAMETER_VALUE)  # a 400 from `mlflow models serve`

    refused(scorer, pd_frame([None], [None]), "query 1 of 1 is null")
    refused(scorer, pd_frame(["cordless drill", "lamp"], ["drill kit", None]), "title 2 of 2 is null")
    refused(scorer, pd_frame([""], ["drill kit"]), "query 1 of 1 is empty")
    refused(scorer, pd_frame(["drill"], [" \t "]), "title 1 of 1 is whitespace only")
    # (a column of numbers only MLflow's schema check refuses itself; a JSON request mixes them with text)
    refused(scorer, pd_frame(["drill", 3], ["drill kit"] * 2), r"query 2 of 2 is a number \(3\), not text")
    refused(scorer, pd_frame(["drill"], [["drill", "kit"]]), "title 1 of 1 is a list")
    refused(scorer, pd_frame([None]), "query 1 of 1 is null", output="query_embedding")
    refused(retriever, pd_frame(["cordless drill", None]), "query 2 of 2 is null")
    refused(retriever, pd_frame(["  "]), "query 1 of 1 is whitespace only")
    assert len(scorer.predict(pd_frame(["cordless drill"], ["drill kit"]))) == 1

    # the CLI: an empty query is refused before the index loads; an unknown one is answered with a warning
    assert dssm_main(["search", "cordless drill", "", "--index", str(tmp_path / "absent")]) == 2
    assert "dssm search: error: query 2 of 2 is empty" in capsys.readouterr().err
    embedder = TwoTowerEmbedder(registered["checkpoint"])
    assert embedder.knows("cordless drill") and not embedder.knows("zzqx qqj")
    assert dssm_main(["search", "cordless drill", "zzqx qqj", "-k", "2", "--index", str(index)]) == 0
    shown = capsys.readouterr()
    warned = [line for line in shown.err.splitlines() if line.startswith("dssm search: warning:")]
    assert warned == ["dssm search: warning: no letter trigram of 'zzqx qqj' is in the model's vocabulary; "
                      "the model ranks it as an unknown text"]  # fmt: skip
    assert "'zzqx qqj': top 2 of 160 titles" in shown.out


def test_a_query_is_read_to_its_first_64_words_so_the_hybrid_score_stays_bounded(registered, tmp_path):
    """16,667 copies of one word scored 5407.9: BM25 adds a term's weight once per repeat in the query."""
    from core.text import MAX_QUERY_WORDS
    from core.tracking import experiment_id
    from scoring.hybrid import HybridScorer
    from scoring.lexical import BM25
    from scoring.retriever import Retriever
    from scoring.serving import log_model
    from stages.index.config import IndexConfig
    from stages.index.job import build_faiss

    titles = catalogue(tmp_path / "titles.parquet")
    fusion = tiny_fusion(titles)
    long, capped = " ".join(["drill"] * 10_000), " ".join(["drill"] * MAX_QUERY_WORDS)
    bm25 = BM25.from_dict(fusion["bm25"])
    bound = 1 + fusion["weight"] * MAX_QUERY_WORDS * max(bm25.idf.values()) * (bm25.k1 + 1)

    # the served hybrid (scoring/serving.py's HybridModel), in process
    with mlflow.start_run(experiment_id=experiment_id(f"sqlite:///{tmp_path}/mlflow.db", "hybrid")):
        uri, _ = log_model(registered["checkpoint"], None, {k: fusion[k] for k in ("bm25", "weight")})
    served = mlflow.pyfunc.load_model(uri).predict(pd_frame([long, capped], ["steel drill kit"] * 2))["score"]
    assert served[0] == pytest.approx(served[1]) and 1 < served[0] <= bound
    embedder = TwoTowerEmbedder(registered["checkpoint"])
    uncapped = HybridScorer(embedder, [bm25], [fusion["weight"]]).score([long], ["steel drill kit"])[0]
    assert uncapped > 100 * served[0]  # what the served hybrid answered before the cap

    # the retriever (`dssm search`, the pyfunc retriever), with the re-ranking fusion that adds w·BM25
    index, _ = build_faiss(embedder.embed(titles, "doc"), IndexConfig(kind="flat"))
    rescoring = Retriever(index, titles, embedder, {k: fusion[k] for k in ("bm25", "weight")})
    hits = rescoring.search([long, capped], 5)
    assert [(h.title, h.score) for h in hits[0]] == [(h.title, h.score) for h in hits[1]]
    assert 1 < hits[0][0].score <= bound


def test_catalogue_metrics_count_unjudged_titles_as_not_relevant():
    from core.judgments import JudgedPair
    from scoring.protocol import build_eval_set
    from scoring.quality import catalogue_metrics

    labels = {"a": 3.0, "b": 2.0, "c": 1.0, "d": 1.0, "e": 2.6}
    pairs = [JudgedPair(i, "q", t, label) for i, (t, label) in enumerate(labels.items())]
    eval_set = build_eval_set(pairs, "toy", "sha", all_queries=True)
    qid = eval_set.queries[0].qid
    # ideal: a (gain 3), e (2^1.6 - 1), b (1); retrieved: an unjudged title first, then a, then b
    result = catalogue_metrics(eval_set, {qid: ["unjudged", "a", "b"]}, threshold=2.5)
    gain_e = 2**1.6 - 1
    idcg = 3 + gain_e / np.log2(3) + 1 / np.log2(4)
    assert result["ndcg@10"] == pytest.approx(100 * (3 / np.log2(3) + 1 / np.log2(4)) / idcg)
    assert result["recall@10"] == pytest.approx(50)  # a of {a, e}
    assert result["judged@10"] == pytest.approx(20)  # a and b of the 10 places
    # condensed: the unjudged title is dropped, so a and b move up one place each
    assert result["condensed_ndcg@10"] == pytest.approx(100 * (3 + 1 / np.log2(3)) / idcg)
    assert result["recall_queries"] == 1 and len(result["per_query"]["ndcg@10"]) == 1


def test_bm25s_ranks_the_catalogue_as_the_reference_bm25_scores_it():
    from scoring.bm25 import CatalogueBM25
    from scoring.lexical import BM25, Collection

    titles = [f"{a} {p} {s}" for p in TINY_PRODUCTS for a in TINY_ATTRIBUTES for s in ("kit", "pro", "pro max")]
    reference = BM25.fit(Collection(titles))
    fast = CatalogueBM25(titles)
    for query in ("cordless drill", "pro pro lamp", "unknown words", "white"):
        np.testing.assert_allclose(fast.scores(query), reference.score([query] * len(titles), titles), atol=1e-4)
    ids, scores = fast.search("brass faucet", 3)
    assert [titles[i].split()[:2] for i in ids] == [["brass", "faucet"]] * 3 and scores[0] >= scores[-1]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_a_damaged_faiss_file_is_named_with_the_command_that_rebuilds_it(tmp_path, capsys, damage):
    from core.artifacts import write_manifest
    from core.errors import DssmError
    from scoring.retriever import INDEX_FILE, Retriever

    index = write_index(tmp_path / "index", [f"title {i}" for i in range(50)])
    data = (index / INDEX_FILE).read_bytes()
    (index / INDEX_FILE).write_bytes(
        {"truncated": data[: len(data) // 2], "garbage": b"garbage!" * 64, "empty": b""}[damage]
    )
    with pytest.raises(DssmError, match=rf"{re.escape(str(index / INDEX_FILE))} has \d+ bytes.*dssm index --force"):
        Retriever.load(index)  # the manifest's sizes and hashes: faiss never reads the damaged file
    # a manifest that agrees with the damaged file (written over it, or before manifests held hashes):
    # faiss's reader is the last check
    write_manifest(index, {"stage": "index"})
    with pytest.raises(
        DssmError,
        match=rf"^{re.escape(str(index / INDEX_FILE))}: not a readable faiss index \(.+\); .*dssm index --force",
    ):
        Retriever.load(index)
    assert dssm_main(["search", "drill", "--index", str(index)]) == 2
    error = capsys.readouterr().err
    assert (
        error.startswith(f"dssm search: error: {index / INDEX_FILE}: not a readable faiss index")
        and "Error in" not in error
    )


def test_faiss_hnsw_finds_the_exact_neighbours_and_auto_picks_by_size():
    from scoring.retriever import unit_rows
    from stages.index.config import IndexConfig
    from stages.index.job import build_faiss

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(3000, 16)).astype(np.float32)
    queries = unit_rows(rng.normal(size=(50, 16)))
    flat, kind = build_faiss(vectors, IndexConfig(kind="auto"))
    assert kind == "flat"
    hnsw, kind = build_faiss(vectors, IndexConfig(kind="auto", flat_max=1000))
    assert kind == "hnsw"
    _, exact = flat.search(queries, 10)
    _, approx = hnsw.search(queries, 10)
    brute = np.argsort(-(unit_rows(vectors) @ queries.T).T, axis=1)[:, :10]
    assert (exact == brute).all()
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(exact, approx, strict=True)]) >= 0.95
    # what the index stage reports of an HNSW index (its own vectors as queries); a flat one is exact
    from stages.index.job import hnsw_recall

    assert hnsw_recall(vectors, hnsw) >= 0.95
    assert hnsw_recall(vectors, flat) == 1.0
    worse, _ = build_faiss(vectors, IndexConfig(kind="hnsw", hnsw_m=2, ef_construction=4, ef_search=4))
    assert hnsw_recall(vectors, worse) < hnsw_recall(vectors, hnsw)


@pytest.mark.integration
def test_bm25s_reproduces_protocols_bm25_row_on_home_depot(home_depot):
    from core.judgments import JudgedSetSpec, resolve_judged_set
    from core.text import norm
    from scoring.bm25 import CatalogueBM25
    from scoring.protocol import evaluate_scores, load_eval_set

    judged = resolve_judged_set(home_depot, JudgedSetSpec(encoding="latin-1"))
    titles = list(dict.fromkeys(norm(p.title) for p in judged.pairs()))
    fast, row = CatalogueBM25(titles), {t: i for i, t in enumerate(titles)}
    eval_set = load_eval_set(judged)
    queries, pair_titles = eval_set.pairs()
    by_query = {q: fast.scores(q) for q in dict.fromkeys(queries)}
    scores = np.array([by_query[q][row[norm(t)]] for q, t in zip(queries, pair_titles, strict=True)])
    result = evaluate_scores(eval_set, "bm25s", scores)
    for k, reference in ((1, 70.1), (3, 73.9), (10, 88.4)):  # PROTOCOL.md §7
        assert abs(result.mean(f"ndcg@{k}") - reference) <= 0.2


@pytest.mark.integration
def test_bm25_retrieval_from_the_whole_home_depot_catalogue_reproduces_protocols_row(home_depot):
    """PROTOCOL.md §8's reference row, through `dssm evaluate --retrieval`'s code path."""
    from core.judgments import JudgedSetSpec, resolve_judged_set
    from scoring.catalogue import Catalogue, evaluate_retrieval
    from scoring.protocol import load_eval_set, relevant_threshold
    from scoring.systems import build_baseline

    judged = resolve_judged_set(home_depot, JudgedSetSpec(encoding="latin-1"))
    pairs = judged.pairs()
    eval_set = load_eval_set(judged)
    catalogue = Catalogue.of_judged(pairs)
    row = evaluate_retrieval(eval_set, catalogue, [build_baseline("bm25", pairs)], relevant_threshold(eval_set))
    assert row["catalogue_titles"] == 53_474 and row["queries"] == 1_580
    reference = {"ndcg@10": 27.7, "recall@10": 32.7, "recall@100": 62.9, "recall@1000": 82.1}
    reference |= {"judged@10": 23.3, "condensed_ndcg@10": 75.0}
    for metric, value in reference.items():
        assert abs(row["systems"]["bm25"][metric] - value) <= 0.1, metric


def test_an_index_task_embeds_on_the_gpu_spark_assigned_it_else_where_torch_sees_one(monkeypatch):
    """A cluster with task GPU resources (infra/README.md) hands each task a GPU address; without one, "auto"
    is torch's choice. No GPU exists here: the task context that would name one is the part stood in for."""
    from types import SimpleNamespace

    import pyspark
    import torch

    from stages.index.job import executor_device

    assigned = SimpleNamespace(resources=lambda: {"gpu": SimpleNamespace(addresses=["3"])}, cpus=lambda: 1)
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: assigned))
    assert executor_device("auto") == "cuda:3" and executor_device("cuda") == "cuda:3"
    assert executor_device("cpu") == "cpu"  # index.device=cpu keeps the CPU even on a GPU executor
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: None))  # local mode: no resources
    assert executor_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert executor_device("cpu") == "cpu"


def test_the_pyfunc_retriever_bounds_k_query_length_and_rows_and_never_echoes_a_long_query(registered, tmp_path):
    """What `mlflow models serve` of a retriever calls: a 1 MB query, k=1000 on it, or a nested value is a
    400 (MlflowException's invalid parameter), never an answer that repeats the query in every row."""
    import pandas as pd
    from mlflow.exceptions import MlflowException

    from core.tracking import experiment_id
    from scoring.serving import log_retriever

    titles = catalogue(tmp_path / "titles.parquet")
    index = hand_built_index(tmp_path / "index", registered["checkpoint"], titles)
    with mlflow.start_run(experiment_id=experiment_id(f"sqlite:///{tmp_path}/mlflow.db", "retriever")):
        uri, _ = log_retriever(index, None)
    loaded = mlflow.pyfunc.load_model(uri)
    long_query = "cordless   DRILL " + "x" * 900  # under the length bound, read as its words
    answer = loaded.predict(pd.DataFrame({"query": [long_query]}), params={"k": 3})
    assert list(answer["rank"]) == [1, 2, 3] and set(answer["query"]) == {"cordless drill " + "x" * 900}
    bad = [
        (pd.DataFrame({"query": ["d" * 1001]}), {}, "at most 1000"),
        (pd.DataFrame({"query": ["drill"]}), {"k": 1001}, "between 1 and 1000"),
        (pd.DataFrame({"query": ["drill"] * 101}), {"k": 1000}, "rows; at most 100,000"),
        (pd.DataFrame({"query": [{"nested": ["drill"]}]}), {}, ""),
    ]
    for frame, params, says in bad:
        with pytest.raises(MlflowException, match=says) as raised:
            loaded.predict(frame, params=params)
        assert raised.value.error_code == "INVALID_PARAMETER_VALUE"
