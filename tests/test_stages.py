"""The one stage skeleton (core/artifacts.publish): code fingerprints, damaged outputs, and a kill
between write and rename for every stage kind (fault injection, in-process and with a real SIGKILL)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_model, write_judged

import core.artifacts as artifacts
from core.artifacts import code_fingerprint, code_modules, content_sha256, publish, read_manifest, up_to_date


class SimulatedKill(BaseException):
    """Raised at the fault point: nothing after it runs, as under SIGKILL."""


def kill_before_publish(monkeypatch, stage: str) -> None:
    def fault(name: str, tmp: Path) -> None:
        if name == stage:
            assert (tmp / "manifest.json").is_file()  # written: only the rename is left
            raise SimulatedKill(name)

    monkeypatch.setattr(artifacts, "before_publish", fault)


def test_a_stage_fingerprint_covers_the_project_modules_it_imports_and_nothing_else():
    modules = code_modules("stages.negatives.job")
    assert {"stages.negatives.job", "core.spark", "core.schemas", "core.artifacts", "core.errors"} <= set(modules)
    assert "stages.clean.job" not in modules and "modeling.train" not in modules
    assert not any(
        m.startswith(("tests", "benchmarks", "reproductions", "studies", "scripts_common", "docs")) for m in modules
    )
    # lazy imports inside functions count: evaluation reaches the model code through load_trained
    assert "modeling.encoders" in code_modules("stages.evaluate.job")
    assert "modeling.encoders" in code_modules("modeling.train")


def test_an_edit_to_an_imported_module_changes_the_fingerprint(monkeypatch):
    before = {m: code_fingerprint(m) for m in ("stages.negatives.job", "stages.vocab.job", "stages.simulate.job")}
    real = artifacts.module_sha256
    monkeypatch.setattr(artifacts, "module_sha256", lambda m: "edited" if m == "core.spark" else real(m))
    after = {m: code_fingerprint(m) for m in before}
    assert after["stages.negatives.job"] != before["stages.negatives.job"]
    assert after["stages.vocab.job"] != before["stages.vocab.job"]
    assert after["stages.simulate.job"] == before["stages.simulate.job"]  # the simulator does not use Spark


def write_files(tmp: Path) -> dict:
    (tmp / "part").mkdir()
    (tmp / "part" / "a.txt").write_text("a")
    (tmp / "b.txt").write_text("bb")
    return {"counts": {"files": 2}}


def test_publish_skips_an_intact_output_and_recomputes_a_damaged_or_unreadable_one(tmp_path, caplog):
    out = tmp_path / "out"
    args = (out, "demo", "code", {"x": {"sha256": "1"}}, {"p": 1}, write_files)
    first = publish(*args)
    assert not first["skipped"] and first["files"] == {"part/a.txt": 1, "b.txt": 2}
    assert publish(*args)["skipped"]
    (out / "part" / "a.txt").unlink()  # a deleted shard: not up to date, rebuilt
    assert up_to_date(out, first["input_key"]) is None and "a.txt is missing" in caplog.text
    assert not publish(*args)["skipped"] and (out / "part" / "a.txt").exists()
    (out / "b.txt").write_text("truncated to more")  # another size
    assert not publish(*args)["skipped"]
    (out / "manifest.json").write_text("{ garbage")  # an unreadable manifest means: not up to date
    assert read_manifest(out) is None and not publish(*args)["skipped"]
    assert publish(out, "demo", "other code", *args[3:])["skipped"] is False  # a code change recomputes


def test_upstream_code_is_chained_into_the_downstream_key(tmp_path):
    up = publish(tmp_path / "up", "up", "code-1", {}, {}, write_files)
    down = publish(tmp_path / "down", "down", "d", {}, {}, write_files, upstream=[up])
    assert publish(tmp_path / "down", "down", "d", {}, {}, write_files, upstream=[up])["skipped"]
    up2 = publish(tmp_path / "up", "up", "code-2", {}, {}, write_files)  # same bytes, other code
    assert up2["content_sha256"] == up["content_sha256"]
    again = publish(tmp_path / "down", "down", "d", {}, {}, write_files, upstream=[up2])
    assert not again["skipped"] and again["code_sha256"] != down["code_sha256"]


@pytest.fixture(scope="module")
def stage_work(spark, pipeline, tiny_data, tmp_path_factory) -> dict[str, Path]:
    """Copies of finished outputs of every stage kind, free to break."""
    work = tmp_path_factory.mktemp("faults")
    for stage in ("simulate", "clean", "vocab", "negatives"):
        shutil.copytree(pipeline[stage], work / stage)
    models = work / "models"
    models.mkdir()
    tiny_model(tiny_data, models / "lstm", "epochs=1")
    write_judged(work / "judged.csv")
    (work / "pairs.tsv").write_text("".join(f"a {w} lamp\tthe {w} lamp\n" for w in ("red", "blue", "green")))
    return work


def _runners(spark, work: Path):
    """Per stage kind: (output dir, run(variant) -> manifest). Variant 0 and 1 differ in one setting."""
    from core.judgments import DEFAULT_CATALOGUE, JudgedSetSpec, resolve_judged_set
    from stages.analyze.config import AnalyzeConfig
    from stages.analyze.job import AnalyzeJob, analyze
    from stages.clean.config import CleanConfig
    from stages.clean.job import clean
    from stages.evaluate.config import EvaluateConfig
    from stages.evaluate.job import EvaluateJob, evaluate
    from stages.negatives.config import NegativesConfig
    from stages.negatives.job import negatives
    from stages.paraphrase.config import ParaphraseConfig
    from stages.paraphrase.job import paraphrase
    from stages.simulate.config import SimulationConfig
    from stages.simulate.job import simulate
    from stages.vocab.config import VocabConfig
    from stages.vocab.job import vocab

    catalogue = resolve_judged_set(None, JudgedSetSpec(), DEFAULT_CATALOGUE)
    judged = resolve_judged_set(work / "judged.csv", JudgedSetSpec(encoding="utf-8"))
    model = str(work / "models" / "lstm")
    uri = f"sqlite:///{work}/faults.db"

    def simulate_run(v):
        cfg = SimulationConfig(impressions=2_000, seed=13 + v, shards=1, workers=1)
        return simulate(catalogue.pairs(), work / "simulate", cfg, catalogue.describe())

    def evaluate_run(v):
        settings = EvaluateConfig(baselines=["bm25", "ulm"][: 1 + v])
        cfg = EvaluateJob(judged, work / "eval", [model], settings, mlflow_uri=uri)
        evaluate(cfg)
        return read_manifest(work / "eval")

    def analyze_run(v):
        settings = AnalyzeConfig(pairs=1 + v)
        analyze(AnalyzeJob(model, work / "analysis", judgments=judged, settings=settings, log_mlflow=False))
        return read_manifest(work / "analysis")

    return {
        "simulate": (work / "simulate", simulate_run),
        "clean": (work / "clean", lambda v: clean(spark, str(work / "simulate"), work / "clean", CleanConfig(20 + v))),
        "vocab": (work / "vocab", lambda v: vocab(spark, work / "clean", work / "vocab", VocabConfig(2 + v))),
        "negatives": (
            work / "negatives",
            lambda v: negatives(spark, work / "clean", work / "negatives", NegativesConfig(seed=13 + v, shards=3)),
        ),
        "paraphrase": (
            work / "para",
            # one input, one setting: the second run is forced
            lambda v: paraphrase(spark, str(work / "pairs.tsv"), work / "para", ParaphraseConfig(), force=bool(v)),
        ),
        "evaluate": (work / "eval", evaluate_run),
        "analyze": (work / "analysis", analyze_run),
    }


STAGES = ["simulate", "clean", "vocab", "negatives", "paraphrase", "evaluate", "analyze"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_kill_between_write_and_rename_keeps_the_previous_output_and_the_next_run_recomputes(
    spark, stage_work, monkeypatch, stage
):
    out, run = _runners(spark, stage_work)[stage]
    run(0)  # a finished output
    before = read_manifest(out)
    files = content_sha256(out)
    kill_before_publish(monkeypatch, "clean" if stage == "paraphrase" else stage)
    with pytest.raises(SimulatedKill):
        run(1)
    assert read_manifest(out) == before and content_sha256(out) == files  # the previous output, intact
    assert not list(out.parent.glob(f".{out.name}.tmp-*"))
    monkeypatch.undo()
    after = run(1)
    published = read_manifest(out)
    assert not after.get("skipped") and published["input_key"] == after["input_key"]
    assert published["content_sha256"] == content_sha256(out) and published["created_at"] >= before["created_at"]
    if stage != "paraphrase":  # (paraphrase's second run is forced with the same key)
        assert after["input_key"] != before["input_key"]


@pytest.mark.integration  # more than one process
def test_a_real_sigkill_before_publication_leaves_the_old_output_and_a_temp_dir_the_next_run_removes(
    spark, pipeline, tmp_path
):
    from dssm.cli import main

    out = tmp_path / "negatives"
    shutil.copytree(pipeline["negatives"], out)
    before = read_manifest(out)
    args = ["negatives", "--clean", str(pipeline["clean"]), "--out", str(out), "--seed", "99", "--shards", "3"]
    env = {**os.environ, artifacts.FAULT_ENV: "negatives"}
    proc = subprocess.run([sys.executable, "-m", "dssm.cli", *args, "--master", "local[1]"], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert read_manifest(out) == before  # still the old, finished output
    assert list(tmp_path.glob(".negatives.tmp-*"))  # what the killed run left behind
    assert main(args) == 0  # the next run (here, in this process: its Spark session is started)
    after = read_manifest(out)
    assert after["params"]["seed"] == 99 and after["input_key"] != before["input_key"]
    assert not list(tmp_path.glob(".negatives.tmp-*"))
    assert json.loads((out / "manifest.json").read_text())["files"].keys() == after["files"].keys()
