"""The retrain flow as `dssm run` starts it: real Prefect flow runs (ephemeral API), real Spark,
real training and MLflow; a run killed mid-training resumes; a failing stage fails the flow run."""

import contextlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dssm.cli import main
from flows.retrain import retrain  # noqa: F401  (Prefect configures logging on import: before caplog, not after)

TINY_RUN = ["--impressions", "5_000", "--workers", "1"]
TINY_TRAIN = ["data.batch_size=64", "model.ncell=16"]


def flow_run(flow_run_id: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def latest_flow_run(flow_name: str = "retrain"):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])), sort=FlowRunSort.START_TIME_DESC, limit=1
        )
    return runs[0]


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"dssm run exited ({proc.returncode}) before {path} appeared")
        if time.monotonic() > deadline:
            pytest.fail(f"{path} did not appear within {timeout}s")
        time.sleep(0.2)


class Recorded(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def resumed(spark, tmp_path_factory) -> dict:
    """A default `dssm run` SIGKILLed mid-training, then run again to the end in this process: its work
    dir, its arguments, what it printed and logged, and its report. The tests below read it; those that
    run the flow again on it say what they change, each on top of the last."""
    work = tmp_path_factory.mktemp("resumed") / "w"
    # Enough steps that the kill lands mid-training; a checkpoint every 10 steps.
    train = [*TINY_TRAIN, "epochs=20", "checkpoint_every=10", "eval_every=1000"]
    args = ["run", "--workdir", str(work), *TINY_RUN, "--train", *train]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dssm.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own group: the kill takes Spark and the ephemeral Prefect server with it
    )
    try:
        wait_for(work / "train" / "lstm" / "last.pt", proc)
        helpers = psutil.Process(proc.pid).children(recursive=True)  # the ephemeral Prefect server among them
        os.kill(proc.pid, signal.SIGKILL)  # the main pid only: its guardian ends the helpers
        proc.wait()
        _, orphans = psutil.wait_procs(helpers, timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed = {"helpers": len(helpers), "orphans": [" ".join(p.cmdline()[:4]) for p in orphans]}
    killed["left"] = [p.name for p in (work / "eval", work / "report.json") if p.exists()]

    recorded, root = Recorded(), logging.getLogger()
    level, printed = root.level, io.StringIO()
    root.addHandler(recorded)
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(printed):
            code = main(args)
    finally:
        root.removeHandler(recorded)
        root.setLevel(level)
    assert code == 0
    summary = json.loads((work / "report.json").read_text())
    return {"work": work, "args": args, "killed": killed, "out": printed.getvalue(), "logged": recorded.messages,
            "summary": summary, "stages": {s["stage"]: s for s in summary["pipeline"]["stages"]}}  # fmt: skip


def skipped_stages(work: Path) -> dict[str, bool]:
    return {s["stage"]: s["skipped"] for s in json.loads((work / "report.json").read_text())["pipeline"]["stages"]}


@pytest.mark.integration
def test_a_killed_run_leaves_no_process_behind_and_resumes_from_its_checkpoint(resumed):
    killed, summary, stages = resumed["killed"], resumed["summary"], resumed["stages"]
    assert killed["helpers"] and killed["orphans"] == [] and killed["left"] == []
    logged = resumed["logged"]
    resumed_at = [m for m in logged if m.startswith("resuming from step")]
    assert len(resumed_at) == 1 and int(resumed_at[0].split()[3]) >= 10
    default_systems = {"bm25", "minilm", "lstm", "lstm+bm25", "lstm+bm25+minilm"}  # the default fusions' systems
    assert set(summary["systems"]) == default_systems and summary["eval_queries"] > 0  # PROTOCOL.md §6
    # retrieval from the whole catalogue (PROTOCOL.md §8) beside re-ranking, in the report and the printed table
    retrieval = summary["retrieval"]
    assert set(retrieval["systems"]) == default_systems
    assert retrieval["queries"] == summary["eval_queries"]
    measured = {"ndcg@10", "recall@1000", "judged@10", "condensed_ndcg@10", "p_vs_bm25"}
    assert set(retrieval["systems"]["lstm"]) >= measured
    assert list(stages) == [
        "simulate",
        "clean",
        "propensity",
        "vocab",
        "negatives",
        "train",
        "evaluate",
        "register",
        "gate",
        "index",
        "analyze",
    ]
    assert all(stages[s]["skipped"] for s in ["simulate", "clean", "propensity", "vocab", "negatives"])
    planned = [m for m in logged if m.startswith("training lstm: ")]
    assert not stages["train"]["skipped"] and stages["train"]["counts"]["steps"] == int(planned[0].split()[2])
    out, work = resumed["out"], resumed["work"]
    assert "| lstm |" in out and f"report: {work / 'report.json'}" in out
    assert "Retrieval from the whole catalogue" in out
    assert flow_run(summary["pipeline"]["flow_run_id"]).state.is_completed()


@pytest.mark.integration
def test_the_resumed_run_logs_one_parent_run_registers_gates_indexes_and_analyzes(resumed, tmp_path, capsys):
    import mlflow

    work, summary, stages = resumed["work"], resumed["summary"], resumed["stages"]
    retrieval = summary["retrieval"]
    mlflow.set_tracking_uri(f"sqlite:///{work / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["default-catalogue"], output_format="list")
    # one parent run for the flow: the resumed flow run continued the killed one's, every run under it
    parents = [r for r in runs if r.data.tags.get("kind") == "flow"]
    assert len(parents) == 1, [r.info.run_name for r in parents]
    parent = parents[0]
    assert summary["pipeline"]["mlflow_parent_run_id"] == parent.info.run_id and parent.info.status == "FINISHED"
    assert parent.info.run_name.startswith("flow-") and parent.data.tags["workdir"] == str(work.resolve())
    assert parent.data.tags["prefect.flow_run_id"] == summary["pipeline"]["flow_run_id"]
    killed_and_resumed = parent.data.tags["prefect.flow_run_ids"].split(",")
    assert len(killed_and_resumed) == 2 and killed_and_resumed[-1] == summary["pipeline"]["flow_run_id"]
    assert parent.data.tags["data_version"] == stages["negatives"]["sha256"]
    runs = [r for r in runs if r is not parent]
    assert all(r.data.tags.get("mlflow.parentRunId") == parent.info.run_id for r in runs)
    assert all(r.info.status == "FINISHED" for r in runs)  # the killed training run was resumed, not left behind
    by_system = {}
    for run in runs:
        by_system.setdefault(run.data.tags["system"], []).append(run)
    # one training run (the resumed run continues it) and one evaluation run per system
    expected = [("bm25", 1), ("lstm", 2), ("lstm+bm25", 1), ("lstm+bm25+minilm", 1), ("minilm", 1)]
    assert sorted((k, len(v)) for k, v in by_system.items()) == expected
    assert all(r.data.tags["dataset"] == "default-catalogue" for r in runs)
    train_run = stages["train"]["counts"]["mlflow_run_id"]
    assert train_run in {r.info.run_id for r in by_system["lstm"]}
    # the model (v1), its hybrid with BM25 (v2) and with BM25 and MiniLM (v3) went through the gate in turn, which
    # compares retrieval NDCG@10 (what the index serves): the champion is the best of the three
    gates = {g["system"]: g for g in summary["gate"]}
    assert [gates[s]["version"] for s in ("lstm", "lstm+bm25", "lstm+bm25+minilm")] == ["1", "2", "3"]
    assert all(g["reason"].startswith(("no champion", "retrieval NDCG@10")) for g in gates.values())
    retrieved = {s: retrieval["systems"][s]["ndcg@10"] for s in gates}
    champion = gates[max(retrieved, key=lambda s: (retrieved[s], -int(gates[s]["version"])))]["version"]
    alias = mlflow.MlflowClient().get_model_version_by_alias("dssm-default-catalogue", "champion")
    assert str(alias.version) == champion
    hybrid_run = next(r for r in by_system["lstm+bm25"])
    assert hybrid_run.data.params["retrieval_method"] in ("zscore", "rrf")  # fit on the dev queries
    assert {"retrieval_ndcg_at_10", "retrieval_recall_at_100"} <= set(hybrid_run.data.metrics)
    # the index stage embedded the title pool with the champion; `dssm search` answers from it
    index_model = json.loads((work / "index" / "model.json").read_text())
    assert (
        index_model["version"] == champion
        and stages["index"]["counts"]["titles"] == stages["clean"]["counts"]["titles"]
    )
    assert mlflow.MlflowClient().get_model_version_by_alias("dssm-default-catalogue-retriever", "champion")
    assert (work / "index" / "bm25").is_dir() == (champion != "1")  # a hybrid champion also retrieves with BM25
    assert (work / "index" / "component-2.faiss").is_file() == (champion == "3")  # and MiniLM's own vectors
    capsys.readouterr()
    assert main(["search", "cordless drill", "-k", "3", "--workdir", str(work)]) == 0
    assert f"dssm-default-catalogue v{champion}" in capsys.readouterr().out
    # the analyze stage's report is an artifact of the training run
    assert (work / "analysis" / "analysis.md").is_file() and stages["analyze"]["path"] == str(work / "analysis")
    assert "analysis/analysis.md" in {a.path for a in mlflow.MlflowClient().list_artifacts(train_run, "analysis")}
    # the resolved run config: in report.json and with the training run
    assert summary["config"]["negatives"]["seed"] == 13 and summary["config"]["train"]["checkpoint_every"] == 10
    logged = Path(mlflow.MlflowClient().download_artifacts(train_run, "run_config.json", str(tmp_path)))
    logged = json.loads(logged.read_text())
    assert logged == summary["config"]
    # the position bias the logs showed: a curve in the training run, falling from rank 1
    metrics = mlflow.MlflowClient().get_run(train_run).data.metrics
    assert metrics["examination_rank_1"] == 1.0 and metrics["examination_rank_5"] < metrics["examination_rank_2"] < 1
    logged_bias = {a.path for a in mlflow.MlflowClient().list_artifacts(train_run, "propensity")}
    assert "propensity/propensity.png" in logged_bias


@pytest.mark.integration
def test_a_damaged_manifest_recomputes_its_stage_and_a_code_edit_everything_after(resumed, monkeypatch):
    import mlflow

    work, args = resumed["work"], resumed["args"]
    mlflow.set_tracking_uri(f"sqlite:///{work / 'mlflow.db'}")
    before = len(mlflow.search_runs(experiment_names=["default-catalogue"], output_format="list"))
    champion = mlflow.MlflowClient().get_model_version_by_alias("dssm-default-catalogue", "champion").version

    # An unreadable manifest means "not up to date": that stage is recomputed (same bytes: the rest is skipped).
    (work / "simulate" / "manifest.json").write_text("{ garbage")
    assert main(args) == 0
    assert [stage for stage, skipped in skipped_stages(work).items() if not skipped] == ["simulate"]
    # it made no MLflow run, so it left no parent run either
    assert json.loads((work / "report.json").read_text())["pipeline"]["mlflow_parent_run_id"] is None
    assert len(mlflow.search_runs(experiment_names=["default-catalogue"], output_format="list")) == before

    # An edit to the negatives stage's code: it and everything downstream recompute, upstream is skipped.
    import core.artifacts

    real = core.artifacts.module_sha256
    monkeypatch.setattr(core.artifacts, "module_sha256", lambda m: "edited" if m == "stages.negatives.job" else real(m))
    assert main(args) == 0
    skipped = skipped_stages(work)
    now = mlflow.MlflowClient().get_model_version_by_alias("dssm-default-catalogue", "champion").version
    assert skipped.pop("index") == (str(now) == str(champion))  # the index is rebuilt only for a new champion
    assert skipped == {
        "simulate": True,
        "clean": True,
        "propensity": True,
        "vocab": True,
        "negatives": False,
        "train": False,
        "evaluate": False,
        "register": False,
        "gate": False,
        "analyze": False,
    }
    # a new flow run, finished: its own parent with its new training and evaluation runs under it
    second = json.loads((work / "report.json").read_text())["pipeline"]["mlflow_parent_run_id"]
    assert second and second != resumed["summary"]["pipeline"]["mlflow_parent_run_id"]
    nested = mlflow.search_runs(
        experiment_names=["default-catalogue"],
        filter_string=f"tags.`mlflow.parentRunId` = '{second}'",
        output_format="list",
    )
    assert sorted(r.data.tags["system"] for r in nested) == ["bm25", "lstm", "lstm", "lstm+bm25", "lstm+bm25+minilm",
                                                             "minilm"]  # fmt: skip
    lstm_eval = next(r for r in nested if r.data.tags["system"] == "lstm" and "eval_key" in r.data.tags)
    lstm_train = next(r for r in nested if r.data.tags["system"] == "lstm" and "eval_key" not in r.data.tags)
    # the metrics compared across runs have one name in each run that has them
    assert {"train_loss", "valid_loss", "train_examples_per_s"} <= set(lstm_train.data.metrics)
    assert {
        "ndcg_at_1",
        "ndcg_at_3",
        "ndcg_at_10",
        "retrieval_ndcg_at_10",
        "train_examples_per_s",
        "valid_loss",
    } <= set(lstm_eval.data.metrics)
    assert lstm_eval.data.metrics["valid_loss"] == lstm_train.data.metrics["valid_loss"]


def short_runs(resumed: dict) -> tuple[list[str], list[str]]:
    """What reaches training, checked on runs that train 3 epochs and evaluate the model against BM25 alone
    (no hybrid, no catalogue retrieval, no index or analysis, which the resumed run checked)."""
    base = [*resumed["args"][: 3 + len(TINY_RUN)], "--no-index", "--no-analyze"]
    base += ["evaluate.hybrid=false", "evaluate.retrieval=false", "gate.metric=ndcg@10"]
    return base, [*TINY_TRAIN, "epochs=3", "checkpoint_every=10", "eval_every=1000"]


@pytest.mark.integration
def test_debiased_mined_and_distilled_rows_reach_training(resumed):
    from modeling.checkpoint import read_checkpoint

    work, stages = resumed["work"], resumed["stages"]
    base, short = short_runs(resumed)
    # Debiased training: the propensity stage's curve reaches the negatives, which the training run weighs by
    debiased = [*base, "negatives.debias=true", "negatives.list_size=10"]
    debiased += ["--train", *short, "loss.pair_weight=log_ipw", "loss.listwise=0.5"]
    assert main(debiased) == 0
    built = json.loads((work / "negatives" / "manifest.json").read_text())
    assert built["inputs"]["propensity"]["path"] == str(work / "propensity") and built["counts"]["listwise_queries"]
    assert {s: k for s, k in skipped_stages(work).items() if s in ("propensity", "negatives", "train")} == {
        "propensity": True,
        "negatives": False,
        "train": False,
    }

    # Mining and distillation in one run (tests/test_pipeline.py: train reads the last of them that ran). The mine
    # stage reads the index the runs before left; the teacher stage lists each train query's hard candidates
    # (BM25's and that index's) with the titles clicked for it, among the mined rows, scored by a teacher (BM25
    # and that index's model, z-scores fused); the model trains on them with the listwise loss beside eq. (5)
    taught = [*base, "mine.hard=0.5", "teacher.scorers=[bm25,index]", "--train", *short, "loss.listwise=0.5"]
    assert main(taught) == 0
    mined = json.loads((work / "mined" / "manifest.json").read_text())
    assert mined["source_used"] == "index" and mined["inputs"]["index"]["path"] == str(work / "index")
    assert mined["counts"]["mined_negatives"] > 0 and not skipped_stages(work)["mine"]
    teacher = json.loads((work / "teacher" / "manifest.json").read_text())
    assert teacher["inputs"]["index"]["path"] == str(work / "index") and teacher["params"]["list_size"] == 20
    assert Path(teacher["inputs"]["negatives"]["path"]) == work / "mined"
    assert teacher["counts"]["lists"] == stages["negatives"]["counts"]["train_queries"]
    assert teacher["counts"]["clicked_in_lists"] >= teacher["counts"]["lists"]  # every query's clicks in its list
    assert not skipped_stages(work)["teacher"]
    state = read_checkpoint(work / "train" / "lstm" / "last.pt")
    assert Path(state["config"]["data"]["negatives"]) == work / "teacher" and state["config"]["loss"]["listwise"] == 0.5


@pytest.mark.integration
def test_the_transformer_trains_beside_the_lstm_rnn_and_any_version_indexes(resumed, tmp_path, capsys):
    """A tiny random BERT (CI's stand-in for all-MiniLM-L6-v2) trained beside the LSTM-RNN, fused with BM25 and
    the bundled MiniLM, every model and hybrid registered and gated; any version indexes (its dense partners
    embedded on Spark too) and `dssm search` serves it."""
    from modeling.checkpoint import read_checkpoint

    work, stages = resumed["work"], resumed["stages"]
    _, short = short_runs(resumed)
    tiny_bert = "train.per_encoder.minilm=[model.pretrained=false,model.max_tokens=16,model.train_layers=1,epochs=2,"
    tiny_bert += "data.batch_size=32]"
    fusions = "evaluate.fusions=[MODEL+bm25,MODEL+bm25+minilm]"
    full = [*resumed["args"][: 3 + len(TINY_RUN)], "--no-index", "--no-analyze"]  # every hybrid and retrieval
    assert main([*full, "train.models=[lstm,minilm]", tiny_bert, fusions, "--train", *short]) == 0
    report = json.loads((work / "report.json").read_text())
    wanted = {"minilm", "minilm-ft", "minilm-ft+bm25", "minilm-ft+bm25+minilm", "lstm+bm25", "lstm+bm25+minilm"}
    assert wanted <= set(report["systems"]) and wanted <= set(report["retrieval"]["systems"])
    gated = {g["system"]: g["version"] for g in report["gate"]}
    assert {"minilm-ft", "minilm-ft+bm25+minilm", "lstm+bm25+minilm"} <= set(gated)
    bert = read_checkpoint(work / "train" / "minilm" / "last.pt")["config"]
    assert bert["model"]["encoder"] == "minilm" and not bert["model"]["pretrained"] and bert["epochs"] == 2
    assert bert["data"]["batch_size"] == 32 and Path(bert["data"]["negatives"]) == work / "negatives"
    trains = [t for t in report["pipeline"]["stages"] if t["stage"] == "train"]
    assert [Path(t["path"]).parent.name for t in trains] == ["lstm", "minilm"]
    lstm = read_checkpoint(work / "train" / "lstm" / "last.pt")["config"]  # the per-encoder keys stay out of it
    assert lstm["model"]["encoder"] == "lstm" and lstm["epochs"] == 3 and lstm["data"]["batch_size"] == 64
    for system in ("minilm-ft", "lstm+bm25+minilm"):
        out = tmp_path / f"index-{system}"
        model = f"models:/dssm-default-catalogue/{gated[system]}"
        assert main(["index", "--model", model, "--titles", str(work / "clean"), "--out", str(out), "--no-register",
                     "--mlflow-uri", f"sqlite:///{work / 'mlflow.db'}", "--master", "local[1]"]) == 0  # fmt: skip
        assert (out / "component-2.faiss").is_file() == (system == "lstm+bm25+minilm")  # MiniLM's own vectors
        capsys.readouterr()
        assert main(["search", "white cordless drill", "-k", "3", "--index", str(out)]) == 0
        shown = capsys.readouterr().out
        assert f"top 3 of {stages['clean']['counts']['titles']:,} titles" in shown and shown.count("\n  ") == 3


def test_a_failing_stage_names_itself_and_fails_the_flow_run(tmp_path):
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("this is not a log\n" * 5)
    work = tmp_path / "w"
    # a process of its own: Prefect's console handler writes to the stderr it found at import, which
    # no capture fixture of this process sees
    done = subprocess.run(
        [sys.executable, "-m", "dssm.cli", "run", "--workdir", str(work), "--logs", str(garbage)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    errors = done.stderr.strip().splitlines()
    failed = [line for line in errors if "stage clean failed" in line]
    assert len(failed) == 1 and failed[0].startswith(f"dssm run: error: stage clean failed on {garbage}: ")
    assert "no usable impression" in failed[0]
    # the one line only: Prefect's traceback and its state lines repeating the error are left to -v
    assert not [line for line in errors if "Traceback" in line or "Finished in state Failed" in line], done.stderr
    run = latest_flow_run()
    assert run.state.is_failed() and "stage clean failed" in run.state.message
    assert not (work / "clean").exists() and not (work / "report.json").exists()


@pytest.mark.integration  # more than one process
def test_train_model_skips_a_finished_run_retrains_a_changed_one_and_launches_torchrun(tiny_data, tmp_path, caplog):
    import shutil
    from dataclasses import replace

    import torch

    from core.layout import Layout
    from modeling.checkpoint import read_checkpoint
    from modeling.config import load_config
    from stages.train.stage import train_model

    work = tmp_path / "w"
    shutil.copytree(tiny_data, work)
    layout = Layout(work)
    tiny = load_config(None, ["data.batch_size=16", "epochs=1", "model.ncell=8"])
    first = train_model(layout, tiny, nproc=1, force=False)
    assert not first.skipped and first.counts["steps"] == 6 and Path(first.path).exists()
    assert first.counts["device"] == "cpu"  # the flow's table says where each model trained
    again = train_model(layout, tiny, nproc=1, force=False)
    assert again.skipped and again.sha256 == first.sha256
    # a run made before a config key existed is still this config: the key's default keeps its behaviour
    state = read_checkpoint(Path(first.path))
    del state["config"]["model"]["gran_type"], state["config"]["loss"]["l2_embeddings"]
    torch.save(state, first.path)
    assert train_model(layout, tiny, nproc=1, force=False).skipped
    caplog.set_level(logging.INFO)
    smaller = replace(tiny, model=replace(tiny.model, ncell=4))
    changed = train_model(layout, smaller, nproc=1, force=False)
    assert any("model config model.ncell 8 -> 4; training" in r.getMessage() for r in caplog.records)
    # another config: trained afresh, here by 2 gloo processes under torchrun, which get the resolved config
    changed = train_model(layout, replace(smaller, epochs=2), nproc=2, force=False)
    assert not changed.skipped and changed.counts["nproc"] == 2 and changed.sha256 != first.sha256
    assert changed.counts["device"] == "cpu"
    state = read_checkpoint(Path(changed.path))
    assert state["config"]["model"]["ncell"] == 4 and state["step"] == 12


@pytest.mark.integration
def test_three_nights_of_windowed_retraining_clean_each_day_once_and_warm_start(spark, tmp_path):
    """docs/flows.md's nightly setup: each night a day of logs lands under a log root given as a URI
    (`file://`: listed and fingerprinted through the Hadoop FileSystem, as `hdfs://` or `s3a://` would
    be), the model trains on the last two days, starting from the champion; a rerun does nothing; a
    lost day cache is rebuilt alone. The logs come without a judged set: the nights are evaluated on one
    graded from their clicks on the time split (issue 63): from the test day alone, the window's last
    day when the set is graded, which no stage that training reads sees while the set is kept
    (judge.keep_nights=2 nights); then a new set is graded from the new last day."""
    import mlflow

    from modeling.checkpoint import read_checkpoint

    work, root = tmp_path / "w", tmp_path / "logs"
    nightly = ["--window-days", "2", "--logs", root.as_uri(), "--no-index", "--no-analyze", "evaluate.hybrid=false"]
    nightly += ["judge.keep_nights=2", "judge.min_impressions=2", "judge.min_shown=2"]

    def lands(day: str) -> None:
        """The day's logs arrive, as a log shipper writes them (`dssm simulate --day`), the test queries'
        traffic included, as a team's log has it."""
        simulated = ["simulate", "--out", str(root), "--day", day, "--impressions", "3_000", "--workers", "1"]
        assert main([*simulated, "--test-traffic"]) == 0

    def night(day: str) -> tuple[dict[str, dict], dict]:
        assert main(["run", "--workdir", str(work), "--run-date", day, *nightly]) == 0
        summary = json.loads((work / "report.json").read_text())
        return {s["stage"]: s for s in summary["pipeline"]["stages"]}, summary

    def day_cache(day: str) -> Path:
        return work / "clean-days" / f"dt={day}" / "manifest.json"

    def decisions() -> list[dict]:
        return list(json.loads((work / "warm-start" / "decisions.json").read_text()).values())

    def held_out() -> dict:
        return json.loads((work / "clean" / "manifest.json").read_text()).get("held_out", {})

    # night 1: two days' logs, a model from scratch trained on the first, the first champion; the set is
    # graded from the second, the test day
    lands("2025-12-31")
    lands("2026-01-01")
    stages, summary = night("2026-01-01")
    night1 = summary
    assert not stages["judge"]["skipped"] and summary["judged_set"]["graded_from"] == "clicks"
    assert (summary["judged_set"]["split"], summary["judged_set"]["test_day"]) == ("time", "2026-01-01")
    assert held_out()["date"] == "2026-01-01" and held_out()["path"] == str(day_cache("2026-01-01").parent)
    assert json.loads((work / "judge" / "manifest.json").read_text())["inputs"]["clean"]["path"] == held_out()["path"]
    assert "simulate" not in stages and stages["clean"]["path"] == str(work / "clean")
    assert (stages["clean"]["counts"]["days"], stages["clean"]["counts"]["days_cleaned"]) == (1, 2)
    assert decisions() == [{"init_from": None, "why": "no champion yet", "night": "2026-01-01"}]
    assert summary["gate"][0]["promoted"] and summary["gate"][0]["version"] == "1"
    day1 = day_cache("2026-01-01").stat().st_mtime_ns

    # night 2: day 2 lands and is the only day parsed; the model trains on it, from champion v1: day 1 is
    # the kept set's test day, still held out
    lands("2026-01-02")
    stages, summary = night("2026-01-02")
    assert (stages["clean"]["counts"]["days"], stages["clean"]["counts"]["days_cleaned"]) == (1, 1)
    assert day_cache("2026-01-01").stat().st_mtime_ns == day1
    window = json.loads((work / "clean" / "manifest.json").read_text())
    days = [json.loads(day_cache(d).read_text())["counts"] for d in ("2026-01-02",)]
    assert window["counts"]["lines_read"] == sum(d["lines_read"] for d in days)
    assert window["counts"]["lines_read"] == window["counts"]["kept"] + window["counts"]["rejected"]
    assert list(window["window"]["days"]) == ["2026-01-02"] and held_out()["date"] == "2026-01-01"
    assert decisions()[1]["init_from"] and decisions()[1]["why"].startswith("champion v1")
    assert read_checkpoint(Path(stages["train"]["path"]))["config"]["init_from"] == decisions()[1]["init_from"]
    client = mlflow.MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    run = client.get_run(stages["train"]["counts"]["mlflow_run_id"])
    inputs = {d.dataset.name for d in run.inputs.dataset_inputs}
    assert "logs/dt=2026-01-02" in inputs and "logs/dt=2026-01-01" not in inputs  # the test day: not trained on
    assert run.data.tags["window"] == "2026-01-01..2026-01-02"
    gate = summary["gate"][0]
    assert gate["version"] == "2" and client.get_model_version(gate["model"], "2").tags["run_date"] == "2026-01-02"
    assert (work / "gate" / "gate-history.png").is_file()
    # night 2 kept night 1's judged set: one evaluation set (one eval key) for both nights' models
    assert stages["judge"]["skipped"] and summary["judged_set"]["split"] == "time"
    assert summary["judged_set"]["test_day"] == "2026-01-01"
    first_set = summary["judged_set"]["dataset_sha256"]
    assert first_set == night1["judged_set"]["dataset_sha256"]
    experiments = [e.experiment_id for e in client.search_experiments()]
    nights = client.search_runs(experiments, "tags.test_day = '2026-01-01' and tags.kind = 'flow'")  # parents
    assert len(nights) == 2 and {r.data.tags["dataset_sha256"] for r in nights} == {first_set}
    assert run.data.tags["test_day"] == "2026-01-01"  # the training run: the day it did not read
    series = [v for v in client.search_model_versions(f"name='{gate['model']}'") if any(
        k.startswith("retrieval_ndcg_at_10.") for k in v.tags)]  # fmt: skip
    assert len({k for v in series for k in v.tags if k.startswith("retrieval_ndcg_at_10.")}) == 1
    assert summary["gate_trend"]["night"] == "2026-01-02" and summary["gate_trend"]["nights"] == 1

    # night 2 again: nothing to do
    stages, _ = night("2026-01-02")
    assert all(s["skipped"] for s in stages.values()), {k: s["skipped"] for k, s in stages.items()}

    # day 1's cache lost: only day 1 is cleaned again; its sums are the same, so nothing downstream runs
    shutil.rmtree(work / "clean-days" / "dt=2026-01-01")
    day2 = day_cache("2026-01-02").stat().st_mtime_ns
    stages, _ = night("2026-01-02")
    assert stages["clean"]["counts"]["days_cleaned"] == 1 and day_cache("2026-01-01").exists()
    assert day_cache("2026-01-02").stat().st_mtime_ns == day2
    assert [stage for stage, s in stages.items() if not s["skipped"]] == ["clean"]

    # night 3: the window slides: day 3 parsed, day 1 left behind
    lands("2026-01-03")
    stages, summary = night("2026-01-03")
    window = json.loads((work / "clean" / "manifest.json").read_text())
    assert list(window["window"]["days"]) == ["2026-01-02"] and window["counts"]["days"] == 1
    assert held_out()["date"] == "2026-01-03" and summary["judged_set"]["test_day"] == "2026-01-03"
    assert json.loads((work / "judge" / "manifest.json").read_text())["inputs"]["clean"]["path"] == held_out()["path"]
    assert stages["clean"]["counts"]["days_cleaned"] == 1
    # its third night: keep_nights=2 are over, so night 3 graded a new set (a new series from here)
    assert not stages["judge"]["skipped"] and summary["judged_set"]["dataset_sha256"] != first_set
    # its training days less the new test day are night 2's: nothing new was trained, and night 2's model keeps
    # its version and its night (issue 63's eighth probe), measured on the new set
    assert stages["train"]["skipped"] and summary["gate"][0]["version"] == "2"
    versions = client.search_model_versions(f"name='{gate['model']}'")
    assert sorted((int(v.version), v.tags["run_date"]) for v in versions) == [(1, "2026-01-01"), (2, "2026-01-02")]
    measured_on = [k for k in client.get_model_version(gate["model"], "2").tags if k.startswith("retrieval_ndcg")]
    assert len(measured_on) == 2  # the first set and the new one
    trained = client.get_run(run.info.run_id).data.tags  # night 2's training run: night 3 did not re-tag it
    assert (trained["window"], trained["run_date"], trained["test_day"]) == ("2026-01-01..2026-01-02", "2026-01-02",
                                                                           "2026-01-01")  # fmt: skip
