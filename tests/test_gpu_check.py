"""benchmarks/gpu_check.py without a GPU: its phases on the CPU, the dev choice, and the exported model's
parts joined back into a checkpoint (CI never has a GPU; the check itself runs on one: docs/training.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny_model, write_judged

from benchmarks.gpu_check import assemble, choose, split
from core.errors import DssmError
from modeling.checkpoint import load_model, slim_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def test_the_check_runs_its_phases_on_the_cpu(tiny_data, tmp_path):
    out = tmp_path / "out"
    tiny = ["data.batch_size=16", "model.pretrained=false", "model.ncell=16", "model.transformer_layers=1"]
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "run", "--device", "cpu"]
    judged = write_judged(tmp_path / "judged.csv")
    cmd += ["--workdir", str(tiny_data), "--out", str(out), "--phases", "env", "smoke", "throughput", "index"]
    cmd += ["--judgments", str(judged)]
    cmd += ["--encoders", "lstm", "minilm", "--lstm-batches", "16", "--minilm-batches", "16", "--steps", "6"]
    done = subprocess.run([*cmd, "--extra", *tiny], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu-check.json").read_text())
    assert report["env"]["torch"] and all(r["ok"] for r in report["smoke"].values())
    assert report["smoke"]["lstm"]["steps"] == [3, 5]  # trained 3 steps, resumed to 5
    assert [(r["config"], r["batch"]) for r in report["throughput"]] == [("lstm", 16), ("minilm-all", 16)]
    assert all(r["examples_per_s"] > 0 for r in report["throughput"])
    assert "## throughput" in done.stdout
    # index: a 3-step fine-tune embeds the judged set's catalogue as the index stage does (here on the CPU)
    assert report["index"]["titles"] == 55 and report["index"]["titles_per_s"] > 0  # write_judged's distinct titles
    assert report["index"]["cosine_to_float32"]["min"] > 0.999


def test_the_dev_choice_keeps_the_earlier_variant_within_the_tie():
    assert choose({"recipe": 34.64, "unweighted": 34.45, "batch1024": 34.80}) == "recipe"  # issue 61's dev
    assert choose({"recipe": 34.0, "bigger": 34.5}) == "bigger"


def test_the_exported_parts_join_into_the_checkpoint_they_were_cut_from(tiny_data, tmp_path):
    run = tiny_model(tiny_data, tmp_path / "run")
    exported = slim_checkpoint(run / "last.pt", tmp_path / "parts" / "minilm-ft.pt", half=True)
    import benchmarks.gpu_check as check

    check.PART_BYTES = 4096  # several parts of a tiny model
    parts = split(exported)
    assert len(parts) > 1 and not exported.exists()
    joined = assemble(tmp_path / "parts", tmp_path / "joined")
    model, _, cfg = load_model(joined.parent)
    assert cfg.model.encoder == "lstm" and model.dim == 8
    (tmp_path / "parts" / parts[-1]).write_bytes(b"truncated")
    with pytest.raises(DssmError, match="sha256"):
        assemble(tmp_path / "parts", tmp_path / "joined-again")
