"""Issue 51's fault-probe findings, each pinned. A registered model is loaded as data: its python_model.pkl
never runs (finding 1). The stack's
MLflow has no authentication, so anyone who reaches it can register a version whose pickle runs code
and point the champion alias at it; the nightly evaluate (the gate scores a champion it never
measured), the index stage and `dssm search --model` used to unpickle it. A champion that is no dssm
model is replaced by the gate, with a warning, instead of failing every night (finding 2). A same-size
corruption of the index is rebuilt by the index stage, and mining goes on without it (finding 4)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import mlflow
import pytest
from conftest import tiny_model

from core.errors import NotADssmModel


class PlantedModel(mlflow.pyfunc.PythonModel):
    """Unpickling this writes `marker`: what a planted python_model.pkl does under mlflow.pyfunc.load_model."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('code from python_model.pkl ran')",))

    def predict(self, context, model_input, params=None):
        return model_input


def plant(uri: str, name: str, marker: Path, artifacts: dict[str, str]) -> str:
    """Register a version of `name` whose pickle writes `marker` and make it the champion; its URI."""
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("planted")
    with mlflow.start_run():
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=PlantedModel(marker),
            artifacts=artifacts,
            registered_model_name=name,
            pip_requirements=["mlflow"],  # else MLflow loads the model to infer them, running the payload here
        )
    assert not marker.exists()
    version = str(info.registered_model_version)
    mlflow.MlflowClient(uri).set_registered_model_alias(name, "champion", version)
    return f"models:/{name}/{version}"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(None)


def test_a_planted_pickle_never_runs_in_evaluate_index_or_search(spark, tiny_data, tmp_path, store):
    from scoring.systems import load_trained
    from stages.index.job import index
    from stages.index.search import load

    model = tiny_model(tiny_data, tmp_path / "model")
    marker = tmp_path / "marker"
    uri = plant(store, "dssm-tiny", marker, {"checkpoint": str(model / "last.pt")})
    # the payload works: MLflow's own loader runs it
    with pytest.raises(Exception):  # noqa: B017 (the payload returns None where MLflow wants a model)
        mlflow.pyfunc.load_model(uri)
    assert marker.read_text() == "code from python_model.pkl ran"
    marker.unlink()

    # evaluate (and the gate, which scores the champion with the same loader)
    system = load_trained("models:/dssm-tiny@champion")
    assert system.name == "lstm" and system.tags["train_run_id"]
    assert len(system.scorer.score(["steel drill"], ["steel drill kit"])) == 1
    # the index stage: the titles embedded on Spark from the model's files
    titles = tmp_path / "titles.csv"
    titles.write_text("title\nsteel drill kit\nwhite lamp\ncordless drill\n")
    built = index(spark, "models:/dssm-tiny@champion", titles, tmp_path / "index", store, register=False)
    assert built["counts"]["titles"] == 3
    # finding 4: a same-size corruption is not up to date (a size check passed it; dssm search refused it)
    # and an earlier run's damaged index is no input of this run's mining (it failed every night there)
    from core.stage import StageOutput
    from scoring.retriever import INDEX_FILE, Retriever

    faiss_file = tmp_path / "index" / INDEX_FILE
    damaged = bytearray(faiss_file.read_bytes())
    damaged[-1] ^= 0xFF
    faiss_file.write_bytes(bytes(damaged))
    assert StageOutput.left_by_earlier_run("index", tmp_path / "index") is None
    rebuilt = index(spark, "models:/dssm-tiny@champion", titles, tmp_path / "index", store, register=False)
    assert not rebuilt["skipped"] and Retriever.load(tmp_path / "index").index.ntotal == 3
    assert StageOutput.left_by_earlier_run("index", tmp_path / "index") is not None
    # `dssm search --model` of a planted retriever over that index
    retriever = plant(store, "dssm-tiny-retriever", marker, {"index": str(tmp_path / "index")})
    args = argparse.Namespace(model=retriever, mlflow_uri=store, workdir=str(tmp_path), index=None)
    hits = load(args).search(["steel drill"], 2)[0]
    assert len(hits) == 2 and hits[0].title in {"steel drill kit", "cordless drill"}
    assert not marker.exists()


def test_a_champion_that_is_no_dssm_model_is_replaced_by_the_gate_with_a_warning(tmp_path, store, caplog):
    from scoring.systems import load_trained
    from stages.gate.job import champion_gate

    marker = tmp_path / "marker"
    (tmp_path / "notes.txt").write_text("not a model")
    planted = plant(store, "dssm-tiny", marker, {"notes": str(tmp_path / "notes.txt")})
    with pytest.raises(NotADssmModel, match="not a dssm two-tower model"):
        load_trained(planted)
    # a new version goes through the gate: the champion cannot be scored, so it is replaced
    client = mlflow.MlflowClient(store)
    new = client.create_model_version("dssm-tiny", str(tmp_path)).version
    caplog.set_level(logging.WARNING)
    decision = champion_gate(client, "dssm-tiny", new, 0.5, "key", lambda u: load_trained(u) and 1.0, "lstm")
    assert decision.promoted and decision.reason.startswith("champion v1 cannot be scored (")
    assert client.get_model_version_by_alias("dssm-tiny", "champion").version == new
    assert any("v1 cannot be scored" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert not marker.exists()


def edited_in_place(output: Path, stage: str, name: str, text: str, old: str, new: str) -> Path:
    """A published `stage` output holding `name` (`text`), whose `old` is then replaced by `new` of the same
    size: what a check by file size alone lets through."""
    from core.artifacts import write_manifest

    output.mkdir()
    (output / name).write_text(text)
    write_manifest(output, {"stage": stage, "params": {"mlflow_uri": f"sqlite:///{output.parent}/m.db"}})
    (output / name).write_text(text.replace(old, new))
    return output


def test_register_refuses_an_evaluation_damaged_without_changing_a_files_size(tmp_path):
    """Issue 63's probe: `dssm register` checked the evaluation's files by size only, so a same-size edit of
    its report.json passed. What is registered is read from those files: they are hashed now."""
    from core.errors import DssmError
    from stages.register.job import register

    evaluation = edited_in_place(tmp_path / "eval", "evaluate", "report.json",
                                 '{"systems": {"lstm": {"ndcg@10": 0.5}}}\n', "0.5", "0.9")  # fmt: skip
    with pytest.raises(DssmError, match=r"report.json is not the file this output was built with"):
        register(evaluation, tmp_path / "registered")
    assert not (tmp_path / "registered").exists()


def test_the_gate_refuses_a_registration_damaged_without_changing_a_files_size(tmp_path):
    """The fresh probe of issue 63 (high): the gate checked registered.json by size only, so raising a
    version's score in place, digit for digit, moved the champion alias to it. It is hashed now."""
    from core.errors import DssmError
    from stages.gate.job import gate

    registered = edited_in_place(tmp_path / "registered", "register", "registered.json",
                                 '{"versions": [{"metrics": {"ndcg@10": 18.07}}]}\n', "18.07", "98.07")  # fmt: skip
    with pytest.raises(DssmError, match=r"registered.json is not the file this output was built with"):
        gate(registered, tmp_path / "gate")
    assert not (tmp_path / "gate").exists()


def test_register_gate_and_index_refuse_a_store_that_is_not_there_and_create_none(tmp_path, capsys):
    """The fresh probe of issue 63 (medium): with the evaluation's sqlite store moved away, register and gate
    created an empty one in its place and failed on a run or model they could not find."""
    from core.artifacts import write_manifest
    from core.errors import DssmError
    from stages.gate.job import gate
    from stages.register.job import register

    store = tmp_path / "mlflow.db"
    for stage, name in (("evaluate", "report.json"), ("register", "registered.json")):
        (tmp_path / stage).mkdir()
        (tmp_path / stage / name).write_text("{}\n")
        write_manifest(tmp_path / stage, {"stage": stage, "params": {"mlflow_uri": f"sqlite:///{store}"}})
    missing = r"mlflow.db, and it does not exist \(moved or deleted\?\)"
    with pytest.raises(DssmError, match=missing):
        register(tmp_path / "evaluate", tmp_path / "r")
    with pytest.raises(DssmError, match=missing):
        gate(tmp_path / "register", tmp_path / "g")
    assert not store.exists() and not (tmp_path / "r").exists() and not (tmp_path / "g").exists()
    # the fifth probe (low): `dssm index --model models:/…` with its default store, beside --out, did the same
    from dssm.cli import main

    index = ["index", "--model", "models:/dssm-tiny@champion", "--titles", str(tmp_path), "--out", str(tmp_path / "i")]
    assert main(index) == 2 and f"{store}, and it does not exist (moved or deleted?)" in capsys.readouterr().err
    assert not store.exists() and not (tmp_path / "i").exists()


def test_the_training_docs_say_which_loaders_unpickle_a_registered_model():
    """Issue 63's probe: docs/training.md said `--model models:/…` unpickles a pyfunc model; dssm's loaders
    read its files (scoring.serving.logged_files), and only MLflow's own loaders unpickle it."""
    import inspect

    from scoring import serving

    docs = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    paragraph = docs[docs.index("A registered\npyfunc model") :].split("\n\n")[0]
    assert "never from its `python_model.pkl`" in paragraph and "`scoring.serving.logged_files`" in paragraph
    assert "`mlflow models serve`, `mlflow.pyfunc.load_model`) do unpickle" in paragraph
    assert "never loaded" in inspect.getdoc(serving.logged_files)


FAILING_TASK = """
from core.spark import get_spark

spark = get_spark("local[1]")
try:
    spark.sparkContext.parallelize([1, 2], 1).map(lambda x: 1 // (x - x)).collect()
except Exception as e:
    print("one line:", type(e).__name__)
"""


@pytest.mark.integration  # a Spark driver of its own
def test_a_failed_task_prints_no_executor_traceback_above_the_commands_line():
    """Issue 74's probe (low): a task that failed printed the executor's traceback (23 of 39 lines) above
    the command's one-line error. The exception still carries it (the command prints it with -v)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FAILING_TASK], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "one line: Py4JJavaError", done.stderr[-2000:]
    spark_lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert not [line for line in spark_lines if "Traceback" in line or "ZeroDivisionError" in line], spark_lines
    assert len(spark_lines) <= 2, spark_lines  # the scheduler's "aborting job", Spark's own start-up notes
