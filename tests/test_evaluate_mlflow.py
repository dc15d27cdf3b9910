"""`dssm evaluate`, `dssm register` and `dssm gate` against a real `mlflow server` process: runs, the
pyfunc model loaded in a fresh process, the registry and the champion gate; and against the default
local store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import numpy as np
import pytest
from conftest import evaluate_register_gate, free_port, http_service, tiny_model, write_judged

from core.errors import DssmError
from core.text import is_test_query
from dssm.cli import main as dssm_main
from infra.stack import MLFLOW_SERVER_ENV
from modeling.checkpoint import read_checkpoint
from scoring.neural import TwoTowerEmbedder
from stages.gate.job import champion_gate


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real tracking server on 127.0.0.1: sqlite backend, artifacts served from a local root."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
        "--artifacts-destination", str(root / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    with http_service(cmd, root / "server.log", f"{uri}/health", timeout=90, env={**os.environ, **MLFLOW_SERVER_ENV}):
        yield uri


def evaluate(*args: str) -> dict:
    """The report of `dssm evaluate ARGS` with the decisions of its register and gate."""
    gate = evaluate_register_gate(*args)
    return json.loads((Path(args[args.index("--out") + 1]) / "report.json").read_text()) | {"gate": gate}


@pytest.mark.integration  # more than one process
def test_evaluate_logs_registers_and_gates_on_a_server(mlflow_server, tiny_data, tmp_path):
    good = tiny_model(tiny_data, tmp_path / "good", "epochs=3")
    judged = write_judged(tmp_path / "judged.csv")
    common = ["--judgments", str(judged), "--mlflow-uri", mlflow_server, "--dataset", "tiny", "--encoding", "utf-8"]
    report = evaluate("--model", str(good), "--out", str(tmp_path / "r1"), "--baselines", "bm25,ulm", *common)

    assert set(report["systems"]) == {"bm25", "ulm", "lstm"}
    assert report["dataset"] == "tiny" and len(report["dataset_sha256"]) == 64
    assert report["eval_pairs"] == 6 * report["eval_queries"]
    lstm = report["systems"]["lstm"]
    assert lstm["ndcg@10"] > 80  # the product word decides relevance here (random order: ~65)
    for name in ("report.json", "report.md", "ndcg.png", "qrels.txt", "runs/lstm.run", "eval_set.json", "models.json"):
        assert (tmp_path / "r1" / name).is_file()
    assert (tmp_path / "r1-gate" / "gate-history.png").is_file()

    client = mlflow.MlflowClient(mlflow_server)
    run = client.get_run(lstm["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["system"] == "lstm" and run.data.tags["dataset"] == "tiny"
    assert run.data.tags["dataset_sha256"] == report["dataset_sha256"] and run.data.tags["code_version"]
    assert run.data.metrics["ndcg_at_10"] == pytest.approx(lstm["ndcg@10"], abs=1e-3)
    assert client.get_experiment(run.info.experiment_id).name == "tiny"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"report.json", "report.md", "ndcg.png", "runs", "gate-history.png"} <= artifacts
    judged_input = [(i.dataset.name, i.dataset.digest) for i in run.inputs.dataset_inputs]
    assert judged_input == [("tiny", report["dataset_sha256"][:32])]  # mlflow.log_input: filter runs by data
    bm25_run = client.get_run(report["systems"]["bm25"]["mlflow_run_id"])
    assert bm25_run.data.tags["kind"] == "baseline" and bm25_run.data.params["k1"] == "1.2"
    assert report["gate"][0]["promoted"] and report["gate"][0]["reason"] == "no champion yet"
    assert client.get_model_version_by_alias("dssm-tiny", "champion").version == "1"
    assert client.get_run(lstm["mlflow_run_id"]).info.status == "FINISHED"  # the run the model was logged into
    # registering again (as after a crash before its output was published) registers nothing twice
    again = ["register", "--evaluation", str(tmp_path / "r1"), "--out", str(tmp_path / "r1-register"), "--force"]
    assert dssm_main(again) == 0
    assert [v.version for v in client.search_model_versions("name='dssm-tiny'")] == ["1"]

    # the registered model, loaded in a fresh process, scores like the checkpoint does
    queries, titles = ["cordless drill", "white lamp"], ["steel drill kit", "brass rug pro"]
    embedder = TwoTowerEmbedder(good / "last.pt")
    expected = embedder.score(queries, titles)
    script = (
        "import sys, json, mlflow, pandas as pd\n"
        f"mlflow.set_tracking_uri({mlflow_server!r})\n"
        "m = mlflow.pyfunc.load_model('models:/dssm-tiny@champion')\n"
        f"df = pd.DataFrame({{'query': {queries!r}, 'title': {titles!r}}})\n"
        "emb = m.predict(df[['query']], params={'output': 'query_embedding'})['embedding']\n"
        "print(json.dumps({'score': m.predict(df)['score'].tolist(), 'dim': len(emb[0]),\n"
        "                  'inputs': [c['name'] for c in m.metadata.get_input_schema().to_dict()]}))\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(loaded["score"], expected, atol=1e-5)
    assert loaded["dim"] == embedder.model.dim and loaded["inputs"] == ["query", "title"]

    # `dssm analyze` on the registered model reads as the checkpoint does, and logs its report to
    # the model's training run, in the store that run is in (here the training sqlite store)
    pair = ["--pair", "cordless drill", "steel drill kit", "--mlflow-uri", mlflow_server]
    uri_args = ["analyze", "--model", "models:/dssm-tiny@champion", "--out", str(tmp_path / "a1"), *pair]
    assert dssm_main(uri_args) == 0
    assert dssm_main(["analyze", "--model", str(good), "--out", str(tmp_path / "a2"), *pair, "--no-mlflow"]) == 0
    by_uri, by_checkpoint = (json.loads((tmp_path / a / "analysis.json").read_text()) for a in ("a1", "a2"))
    assert by_uri["pairs"] == by_checkpoint["pairs"] and by_uri["pairs"][0]["query"]["words"] == ["cordless", "drill"]
    train_store = mlflow.MlflowClient(f"sqlite:///{tmp_path}/train.db")
    train_run = train_store.get_run(read_checkpoint(good)["mlflow_run_id"])
    assert train_run.data.tags["analysis"] == "analysis/analysis.md"

    # a barely trained model, on another split: the champion is scored there too and keeps the alias
    weak = tiny_model(tiny_data, tmp_path / "weak", "max_steps=1")
    report2 = evaluate("--model", str(weak), "--out", str(tmp_path / "r2"), "--all-queries", *common)
    gate = report2["gate"][0]
    assert not gate["promoted"] and gate["version"] == "2" and gate["champion_version"] == "1"
    assert gate["champion_ndcg10"] > gate["ndcg10"]
    assert client.get_model_version_by_alias("dssm-tiny", "champion").version == "1"
    v1 = client.get_model_version("dssm-tiny", "1")
    assert any(k.startswith("ndcg_at_10.") for k in v1.tags)  # measured once, remembered per eval set

    # a version that beats the champion on the same eval set takes the alias
    key = client.get_run(report2["systems"]["lstm"]["mlflow_run_id"]).data.tags["eval_key"]
    decision = champion_gate(client, "dssm-tiny", "2", gate["champion_ndcg10"] + 1, key, lambda uri: 0.0)
    assert decision.promoted and client.get_model_version_by_alias("dssm-tiny", "champion").version == "2"

    # two first gates at once: neither saw a champion, v2 (better) wrote first, v1 writes last; v1's
    # gate reads again after its write and hands the alias to v2
    client.delete_registered_model_alias("dssm-tiny", "champion")
    decision = champion_gate(client, "dssm-tiny", "1", gate["champion_ndcg10"], key, lambda uri: 0.0)
    assert decision.promoted and "v2, gated at the same time, is better" in decision.reason
    assert client.get_model_version_by_alias("dssm-tiny", "champion").version == "2"


def test_evaluate_defaults_to_a_local_store_beside_the_report(tmp_path, capsys):
    judged = write_judged(tmp_path / "judged.csv")
    report = evaluate("--judgments", str(judged), "--encoding", "utf-8", "--out", str(tmp_path / "report"))
    assert list(report["systems"]) == ["bm25"] and report["gate"] == []
    assert "| bm25 |" in capsys.readouterr().out
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(report["systems"]["bm25"]["mlflow_run_id"])
    assert run.data.tags["dataset"] == f"{tmp_path.name}-judged"
    assert (tmp_path / "mlartifacts").is_dir()

    # the same call again finds its output up to date: the same report, no new run
    again = evaluate("--judgments", str(judged), "--encoding", "utf-8", "--out", str(tmp_path / "report"))
    assert again == report and "| bm25 |" in capsys.readouterr().out
    assert len(client.search_runs([run.info.experiment_id])) == 1


@pytest.mark.integration  # more than one process
def test_two_registers_of_one_evaluation_at_once_register_each_model_once(tiny_data, tmp_path):
    """The fresh probe of issue 63 (medium): two `dssm register` of one evaluation at once both found the model
    unregistered and each registered it, two versions of one run. They take turns on the store's registry lock
    now: while this test holds it, neither registers anything; after, the second finds the first's version."""
    import time

    from core.tracking import registry_lock

    model = tiny_model(tiny_data, tmp_path / "lstm", "epochs=1")
    judged = write_judged(tmp_path / "judged.csv")
    out, uri = tmp_path / "report", f"sqlite:///{tmp_path}/mlflow.db"
    args = ["--judgments", str(judged), "--encoding", "utf-8", "--dataset", "tiny", "--model", str(model)]
    assert dssm_main(["evaluate", *args, "--out", str(out)]) == 0
    cmd = [sys.executable, "-m", "dssm.cli", "register", "--evaluation", str(out), "--out"]
    client = mlflow.MlflowClient(uri)
    with registry_lock(uri):
        procs = [subprocess.Popen([*cmd, str(tmp_path / f"registered-{i}")], stderr=subprocess.PIPE) for i in (0, 1)]
        time.sleep(8)  # time enough for both to start and reach the lock
        assert [p.poll() for p in procs] == [None, None] and not client.search_model_versions("name='dssm-tiny'")
    assert [p.wait(300) for p in procs] == [0, 0], [p.stderr.read()[-2000:] for p in procs]
    docs = [json.loads((tmp_path / f"registered-{i}" / "registered.json").read_text()) for i in (0, 1)]
    assert docs[0]["versions"] == docs[1]["versions"] and len(docs[0]["versions"]) == 1
    assert [str(v.version) for v in client.search_model_versions("name='dssm-tiny'")] == ["1"]


@pytest.mark.integration  # more than one process
def test_the_gate_scores_the_champion_from_the_evaluations_store_wherever_it_runs(tiny_data, tmp_path, monkeypatch):
    """The re-probes of issue 63 (high): `dssm gate` run by hand loaded a champion never measured on the set from
    ./mlflow.db of its working directory, not from the store the evaluation logged to; a relative
    `--mlflow-uri` and a relative `--evaluation` were recorded as given, so a gate run elsewhere opened another
    store or read another directory's eval set. Both are recorded absolute now, and the gate refuses an eval
    set that is not the one the versions were measured on."""
    from stages.gate.job import _eval_set_of

    model = tiny_model(tiny_data, tmp_path / "lstm", "epochs=1")
    retrained = tiny_model(tiny_data, tmp_path / "lstm2", "epochs=1")  # another version (the same model keeps v1)
    monkeypatch.chdir(tmp_path)
    common = ["--encoding", "utf-8", "--dataset", "tiny", "--mlflow-uri=sqlite:///store/m.db"]
    first = write_judged(tmp_path / "judged.csv")
    assert evaluate_register_gate("--judgments", str(first), *common, "--model", str(model), "--out", "e1")[0][
        "promoted"
    ]
    rows = first.read_text().splitlines()  # six rows a query: half the queries, another set (another eval key)
    second = tmp_path / "half.csv"
    second.write_text("\n".join(rows[: 1 + 6 * (len(rows) // 12)]) + "\n")
    assert dssm_main(["evaluate", "--judgments", str(second), *common, "--model", str(retrained), "--out", "e2"]) == 0
    assert dssm_main(["register", "--evaluation", "e2", "--out", "r2"]) == 0
    registered = json.loads((tmp_path / "r2" / "registered.json").read_text())
    assert registered["evaluation"] == str(tmp_path / "e2")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    gate = ["gate", "--registered", str(tmp_path / "r2"), "--out", str(tmp_path / "g2")]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # a shell's, not this process's
    done = subprocess.run([sys.executable, "-m", "dssm.cli", *gate], cwd=elsewhere, env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    decision = json.loads((tmp_path / "g2" / "gate.json").read_text())[0]
    assert str(decision["champion_version"]) == "1" and "champion v1" in decision["reason"], decision
    assert not (elsewhere / "mlflow.db").exists() and not (elsewhere / "store").exists()
    with pytest.raises(DssmError, match=r"holds eval set \w+, not \w+ that the versions were measured on"):
        _eval_set_of(registered | {"evaluation": str(tmp_path / "e1")})
    # the fifth probe (low): an eval_set.json edited after register (its labels: not in the key) is refused too
    eval_set = tmp_path / "e2" / "eval_set.json"
    eval_set.write_text(eval_set.read_text() + " ")
    with pytest.raises(DssmError, match=r"eval_set.json"):
        _eval_set_of(registered)


def test_a_gate_by_hand_that_names_no_metric_gates_on_the_metric_of_the_models_last_gate(tiny_data, tmp_path, caplog):
    """The fifth probe of issue 63 (medium): the flow gates on retrieval NDCG@10, but `dssm gate` by hand (as
    register's hint prints it) compared NDCG@10 and moved the champion to a version worse at what the index
    serves. A gate that names no metric now compares the one the registered model's last gate compared."""
    import logging

    from stages.gate.config import GateConfig
    from stages.gate.job import gate

    model = tiny_model(tiny_data, tmp_path / "lstm", "epochs=1")
    store, out = f"sqlite:///{tmp_path}/m.db", tmp_path / "e"
    judged = write_judged(tmp_path / "judged.csv")
    args = ["--judgments", str(judged), "--encoding", "utf-8", "--dataset", "tiny", "--model", str(model)]
    assert dssm_main(["evaluate", *args, "--retrieval", "--mlflow-uri", store, "--out", str(out)]) == 0
    assert dssm_main(["register", "--evaluation", str(out), "--out", str(tmp_path / "r")]) == 0
    flows_gate = gate(tmp_path / "r", tmp_path / "g-flow", GateConfig(metric="retrieval_ndcg@10"))  # the flow's
    by_hand = gate(tmp_path / "r", tmp_path / "g-hand", GateConfig())  # `dssm gate --registered r --out g-hand`
    assert flows_gate["params"]["metric"] == by_hand["params"]["metric"] == "retrieval_ndcg@10"
    assert mlflow.MlflowClient(store).get_registered_model("dssm-tiny").tags["gate_metric"] == "retrieval_ndcg@10"
    caplog.set_level(logging.WARNING)
    assert gate(tmp_path / "r", tmp_path / "g-named", GateConfig(metric="ndcg@10"))["params"]["metric"] == "ndcg@10"
    assert "dssm-tiny was gated on retrieval_ndcg@10 until now; this gate compares ndcg@10" in caplog.text
    assert mlflow.MlflowClient(store).get_registered_model("dssm-tiny").tags["gate_metric"] == "ndcg@10"


def test_a_register_stopped_after_mlflow_made_the_version_does_not_register_the_model_twice(tiny_data, tmp_path):
    """The sixth probe of issue 63 (medium): MLflow makes the version inside log_model, and register tagged the
    run with it only after; a stop in between left a version that the rerun did not see, so it registered the
    model again and the first version stayed behind, never gated. The rerun now keeps the version it finds."""
    from stages.register.job import register

    model = tiny_model(tiny_data, tmp_path / "lstm", "epochs=1")
    store, out = f"sqlite:///{tmp_path}/m.db", tmp_path / "e"
    judged = write_judged(tmp_path / "judged.csv")
    args = ["--judgments", str(judged), "--encoding", "utf-8", "--dataset", "tiny", "--model", str(model)]
    assert dssm_main(["evaluate", *args, "--mlflow-uri", store, "--out", str(out)]) == 0
    register(out, tmp_path / "r1")
    first = json.loads((tmp_path / "r1" / "registered.json").read_text())["versions"]
    client = mlflow.MlflowClient(store)
    for v in first:  # what the stop left: the versions, but no run tagged with one, and the run KILLED
        for tag in ("model_uri", "registered_model", "registered_version"):
            client.delete_tag(v["run_id"], tag)
        client.set_terminated(v["run_id"], "KILLED")
    register(out, tmp_path / "r2")
    again = json.loads((tmp_path / "r2" / "registered.json").read_text())["versions"]
    assert [(v["version"], v["model_uri"]) for v in again] == [(v["version"], v["model_uri"]) for v in first]
    assert len(client.search_model_versions("name='dssm-tiny'")) == len(first)
    kept = client.get_run(first[0]["run_id"])
    assert kept.data.tags["registered_version"] == first[0]["version"] and kept.info.status == "FINISHED"


def test_the_same_model_evaluated_again_keeps_its_version_and_the_night_that_trained_it(
    tiny_data, tmp_path, monkeypatch
):
    """The eighth probe of issue 63 (medium): a refresh night whose window, less its new test day, is the night
    before's trained nothing new, yet register made the unchanged checkpoint a new version under tonight's date.
    The same checkpoint (and fusion) evaluated again keeps its version and its run date; a retrained one does not."""
    from stages.register.job import register

    model = tiny_model(tiny_data, tmp_path / "lstm", "epochs=1")
    store, judged = f"sqlite:///{tmp_path}/m.db", write_judged(tmp_path / "judged.csv")
    args = ["--judgments", str(judged), "--encoding", "utf-8", "--dataset", "tiny", "--mlflow-uri", store]
    for night in ("e1", "e2"):
        assert dssm_main(["evaluate", *args, "--model", str(model), "--out", str(tmp_path / night)]) == 0
    register(tmp_path / "e1", tmp_path / "r1", run_date="2026-01-02")
    register(tmp_path / "e2", tmp_path / "r2", run_date="2026-01-03")
    first, again = (json.loads((tmp_path / r / "registered.json").read_text())["versions"] for r in ("r1", "r2"))
    assert [v["version"] for v in again] == [v["version"] for v in first] and again[0]["run_id"] != first[0]["run_id"]
    client = mlflow.MlflowClient(store)
    versions = client.search_model_versions("name='dssm-tiny'")
    assert len(versions) == len(first) and {v.tags["run_date"] for v in versions} == {"2026-01-02"}
    evaluated = client.get_run(again[0]["run_id"])
    assert evaluated.data.tags["registered_version"] == first[0]["version"] and evaluated.info.status == "FINISHED"
    # the ninth probe: the version evaluated by its models:/ URI (the slim copy it logged) from another directory:
    # resolved in --mlflow-uri's store, not the working directory's (high), and still the same model (medium)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    logged = f"models:/dssm-tiny/{first[0]['version']}"
    assert dssm_main(["evaluate", *args, "--model", logged, "--out", str(tmp_path / "e4")]) == 0
    assert not (elsewhere / "mlflow.db").exists()
    register(tmp_path / "e4", tmp_path / "r4", run_date="2026-01-05")
    by_uri = json.loads((tmp_path / "r4" / "registered.json").read_text())["versions"]
    assert [v["version"] for v in by_uri] == [v["version"] for v in first]
    assert {v.tags["run_date"] for v in client.search_model_versions("name='dssm-tiny'")} == {"2026-01-02"}
    # a retrained model is another model: a new version
    retrained = tiny_model(tiny_data, tmp_path / "lstm2", "epochs=1")
    assert dssm_main(["evaluate", *args, "--model", str(retrained), "--out", str(tmp_path / "e3")]) == 0
    register(tmp_path / "e3", tmp_path / "r3", run_date="2026-01-04")
    third = json.loads((tmp_path / "r3" / "registered.json").read_text())["versions"]
    assert int(third[0]["version"]) > int(first[0]["version"])


def test_the_gate_compares_both_sides_at_the_reports_precision(tmp_path):
    """The eighth probe of issue 63: a candidate's score comes from registered.json at 4 decimals, a champion
    scored by the gate came at full precision, so the same model "beat" itself by rounding (94.4674 against
    94.467382). Both sides are now compared at the report's precision, and a tie keeps the champion."""
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/m.db")
    name = "dssm-tiny"
    client.create_registered_model(name)
    for _ in range(2):
        client.create_model_version(name, source=str(tmp_path))
    client.set_registered_model_alias(name, "champion", "1")
    decision = champion_gate(client, name, "2", 94.4674, "key", lambda uri: 94.467382)
    assert not decision.promoted and "does not beat champion v1" in decision.reason
    assert str(client.get_model_version_by_alias(name, "champion").version) == "1"
    assert champion_gate(client, name, "2", 94.4675, "key", lambda uri: 0.0).promoted  # a better one still wins
    # the champion gated again (a hand re-evaluation of models:/…@champion, a night whose model is unchanged) is
    # kept, not promoted a second time: the eleventh probe of issue 63, where it counted as a promotion
    again = champion_gate(client, name, "2", 94.4675, "key", lambda uri: 0.0)
    assert not again.promoted and again.reason == "already the champion" and again.champion_version == "2"


def test_a_champion_that_cannot_be_loaded_stops_the_gate_with_what_to_do(tiny_data, tmp_path, capsys):
    """The eighth probe of issue 63 (low): a champion whose model files are gone, never measured on a new set,
    failed the gate with "--model models:/…@champion: cannot download", an option `dssm gate` does not have."""
    from stages.gate.job import gate

    model = tiny_model(tiny_data, tmp_path / "lstm", "epochs=1")
    store, judged = f"sqlite:///{tmp_path}/m.db", write_judged(tmp_path / "judged.csv")
    args = ["--judgments", str(judged), "--encoding", "utf-8", "--dataset", "tiny", "--mlflow-uri", store]
    assert evaluate_register_gate(*args, "--model", str(model), "--out", str(tmp_path / "e1"))[0]["promoted"]
    client = mlflow.MlflowClient(store)
    lost = client.create_model_version("dssm-tiny", source=str(tmp_path / "gone"))  # its files are not there
    client.set_registered_model_alias("dssm-tiny", "champion", lost.version)
    rows = judged.read_text().splitlines()  # half the queries: another set, which the champion was never scored on
    (tmp_path / "half.csv").write_text("\n".join(rows[: 1 + 6 * (len(rows) // 12)]) + "\n")
    half = ["--judgments", str(tmp_path / "half.csv"), *args[2:]]
    assert dssm_main(["evaluate", *half, "--model", str(model), "--out", str(tmp_path / "e2")]) == 0
    assert dssm_main(["register", "--evaluation", str(tmp_path / "e2"), "--out", str(tmp_path / "r2")]) == 0
    with pytest.raises(DssmError) as refused:
        gate(tmp_path / "r2", tmp_path / "g2")
    said = str(refused.value)
    assert said.startswith("gate: the champion (models:/dssm-tiny@champion) was never measured on this eval set")
    assert "--model" not in said and "The alias is left as it was" in said
    assert str(client.get_model_version_by_alias("dssm-tiny", "champion").version) == str(lost.version)


def test_evaluate_bad_input_is_one_clear_error(tmp_path, capsys):
    judged = write_judged(tmp_path / "judged.csv")
    args = ["evaluate", "--judgments", str(judged), "--encoding", "utf-8", "--out", str(tmp_path / "r")]
    assert dssm_main([*args, "--model", str(tmp_path / "nowhere")]) == 2
    assert "no checkpoint there" in capsys.readouterr().err
    assert dssm_main([*args, "--baselines", "bm25,word2vec"]) == 2
    assert "unknown baseline(s) word2vec" in capsys.readouterr().err
    assert dssm_main([*args, "--query-col", "q"]) == 2
    assert "missing column(s) q" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.integration  # more than one process
def test_hybrid_is_fit_on_dev_queries_registered_and_scores_the_same_in_a_fresh_process(tiny_data, tmp_path):
    from core.judgments import resolve_judged_set
    from scoring.lexical import BM25, Collection
    from stages.evaluate.job import dev_queries

    model = tiny_model(tiny_data, tmp_path / "lstm", "epochs=3")
    judged = write_judged(tmp_path / "judged.csv")
    train_rows = write_judged(tmp_path / "train.csv", test=False).read_text().splitlines()[1:]
    with open(judged, "a") as f:  # test queries and train queries (the dev split's) in one judged set
        f.write("\n".join(train_rows) + "\n")
    args = ["--judgments", str(judged), "--encoding", "utf-8", "--dataset", "tiny", "--model", str(model)]
    negatives = tiny_data / "negatives"
    report = evaluate(*args, "--hybrid-dev", str(negatives), "--out", str(tmp_path / "r"))

    assert list(report["systems"]) == ["bm25", "lstm", "lstm+bm25"]
    assert dev_queries(negatives) and not any(is_test_query(q) for q in dev_queries(negatives))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    run = client.get_run(report["systems"]["lstm+bm25"]["mlflow_run_id"])
    assert run.data.tags["kind"] == "hybrid" and run.data.tags["fused_with"] == "bm25"
    assert int(run.data.params["fit_dev_queries"]) > 0
    weight = float(run.data.params["fusion_weights"])  # one partner, one weight
    gates = {g["system"]: g for g in report["gate"]}
    assert set(gates) == {"lstm", "lstm+bm25"} and gates["lstm+bm25"]["version"] == "2"

    # the registered hybrid carries its BM25 statistics: a fresh process scores as evaluation did
    queries, titles = ["cordless drill", "white lamp", "zzz"], ["steel drill kit", "white lamp pro", "brass rug"]
    bm25 = BM25.fit(Collection([p.title for p in resolve_judged_set(judged).pairs()]))
    expected = TwoTowerEmbedder(model / "last.pt").score(queries, titles) + weight * bm25.score(queries, titles)
    script = (
        "import json, mlflow, pandas as pd\n"
        f"mlflow.set_tracking_uri({uri!r})\n"
        "m = mlflow.pyfunc.load_model('models:/dssm-tiny/2')\n"
        f"print(json.dumps(m.predict(pd.DataFrame({{'query': {queries!r}, 'title': {titles!r}}}))['score'].tolist()))\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    np.testing.assert_allclose(json.loads(done.stdout.strip().splitlines()[-1]), expected, atol=1e-5)


def test_the_gate_warns_when_a_nights_best_falls_below_the_recent_nights_median(tmp_path, caplog):
    """stages/gate/job.py's night_trend, over a real registry: the best version of each earlier night on this
    eval set (its `run_date` and metric tags), their median, and a warning past gate.decline_tolerance."""
    import logging

    import mlflow

    from stages.gate.config import GateConfig
    from stages.gate.job import night_trend

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/m.db")
    name, key = "dssm-logs-clicks", "abc123"
    client.create_registered_model(name)
    nights = {"2026-01-01": [80.0, 82.0], "2026-01-02": [81.0], "2026-01-03": [83.0], "2026-01-04": [79.0]}
    for day, values in nights.items():
        for value in values:
            v = client.create_model_version(name, source=str(tmp_path))
            client.set_model_version_tag(name, v.version, "run_date", day)
            client.set_model_version_tag(name, v.version, f"ndcg_at_10.{key}", str(value))
            client.set_model_version_tag(name, v.version, "ndcg_at_10.another-set", "99.0")  # another series
    versions = client.search_model_versions(f"name='{name}'")
    last = [v for v in versions if v.tags["run_date"] == "2026-01-04"]
    tonight = [{"version": v.version, "metrics": {"ndcg@10": 79.0}} for v in last]
    with caplog.at_level(logging.WARNING, logger="stages.gate.job"):
        trend = night_trend(client, name, key, tonight, GateConfig(trend_nights=3, decline_tolerance=0.5))
    assert trend == {"night": "2026-01-04", "best": 79.0, "median": 82.0, "nights": 3, "declined": True}
    assert any("below the median of the last 3 nights" in r.getMessage() for r in caplog.records)
    calm = night_trend(client, name, key, tonight, GateConfig(trend_nights=3, decline_tolerance=5.0))
    assert calm["declined"] is False
    assert night_trend(client, name, key, [{"version": "1", "metrics": {"ndcg@10": 80.0}}], GateConfig()) is None
