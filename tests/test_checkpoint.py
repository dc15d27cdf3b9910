"""Checkpoints are read as tensors and plain data only: a planted `.pt` whose pickle would run code is
refused, by name, at every way a checkpoint comes in (issue 41, item 1), and a champion that is no
readable checkpoint sends the nightly warm start to a model from scratch (item 7)."""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_model, write_index, write_judged

from core.errors import DssmError
from modeling.checkpoint import read_checkpoint


class Payload:
    """Unpickling this writes `marker`: what an attacker's checkpoint would do with a full torch.load."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('code from a checkpoint ran')",))


def planted(path: Path, marker: Path) -> Path:
    """A checkpoint-shaped file whose config, once unpickled, writes `marker`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": {"model": Payload(marker)}, "vocab": {"tokens": ["<unk>"]}, "model": {}}, path)
    return path


@pytest.fixture
def evil(tmp_path) -> tuple[Path, Path]:
    marker = tmp_path / "marker"
    path = planted(tmp_path / "evil" / "last.pt", marker)
    # The payload works: a full unpickle writes the marker (the old weights_only=False load did this).
    torch.load(path, weights_only=False)
    assert marker.read_text() == "code from a checkpoint ran"
    marker.unlink()
    return path, marker


def refused(call, path: Path, marker: Path) -> None:
    refusal = rf"{re.escape(str(path))}: refused to load \(it refers to (builtins\.)?exec, .*\); .*retrain"
    with pytest.raises(DssmError, match=refusal):
        call()
    assert not marker.exists()


def test_a_checkpoint_whose_pickle_runs_code_is_refused_at_every_loader(evil, tiny_data, tmp_path):
    from dssm.cli import main
    from modeling.checkpoint import load_model, newest_checkpoint
    from modeling.config import load_config
    from modeling.train import resolve_paths, train
    from scoring.neural import TwoTowerEmbedder
    from scoring.systems import load_trained
    from stages.analyze.job import load as analyze_load

    path, marker = evil
    refused(lambda: read_checkpoint(path), path, marker)
    refused(lambda: read_checkpoint(path.parent), path, marker)  # a run directory: its last.pt
    refused(lambda: load_model(path), path, marker)
    refused(lambda: TwoTowerEmbedder(path), path, marker)  # the pyfunc models and `dssm search`
    refused(lambda: load_trained(str(path.parent)), path, marker)  # dssm evaluate/analyze --model
    refused(lambda: analyze_load(str(path), None), path, marker)
    # `dssm train --resume` over a run directory that holds only the planted file
    with pytest.raises(DssmError, match="no readable checkpoint"):
        newest_checkpoint(path.parent)
    assert not marker.exists()
    # `dssm train init_from=…`
    cfg = load_config(None, ["model.ncell=8", "data.batch_size=16", "threads=1", f"init_from={path}"])
    cfg = resolve_paths(dataclasses.replace(cfg, out=str(tmp_path / "run")), tiny_data)
    cfg.mlflow_uri = f"sqlite:///{tmp_path}/train.db"
    refused(lambda: train(cfg), path, marker)
    # the CLI prints the refusal as its one-line error
    judged = write_judged(tmp_path / "judged.csv")
    args = ["evaluate", "--model", str(path), "--judgments", str(judged), "--out", str(tmp_path / "eval")]
    assert main([*args, "--mlflow-uri", f"sqlite:///{tmp_path}/eval.db", "--encoding", "utf-8"]) == 2
    assert not marker.exists()


def test_an_index_directory_with_a_planted_model_is_refused(evil, tmp_path):
    from core.artifacts import write_manifest
    from scoring.retriever import Retriever

    path, marker = evil
    index = write_index(tmp_path / "index", ["cordless drill", "white lamp"])
    os.replace(path, index / "model" / "model.pt")
    # whoever can plant the file can rewrite the manifest over it: the manifest's hashes catch a file
    # that does not belong, and the checkpoint loader's own refusal is what holds against a planted one
    write_manifest(index, {"stage": "index"})
    refused(lambda: Retriever.load(index), index / "model" / "model.pt", marker)


def test_checkpoint_metadata_is_saved_as_plain_data_a_safe_load_reads(tmp_path):
    from modeling.checkpoint import plain, plain_state

    @dataclasses.dataclass
    class Where:
        path: Path
        shards: tuple[int, ...]

    state = {
        "config": {"out": Path("/runs/a"), "where": Where(Path("b"), (1, 2)), "model": {"ncell": np.int32(8)}},
        "vocab": {"tokens": ["<unk>", "#a#"], "sha256": "s"},
        "model": {"w": torch.ones(2)},
        "valid_loss": np.float32(0.5),
        "step": np.int64(3),
        "rng": np.array([1, 2], np.uint32),
    }
    torch.save(plain_state(state), tmp_path / "c.pt")
    loaded = read_checkpoint(tmp_path / "c.pt")
    assert loaded["config"] == {"out": "/runs/a", "where": {"path": "b", "shards": (1, 2)}, "model": {"ncell": 8}}
    assert type(loaded["valid_loss"]) is float and type(loaded["step"]) is int and loaded["rng"] == [1, 2]
    with pytest.raises(TypeError, match=r"checkpoint\['config'\]\['x'\]: a object is not plain data"):
        plain({"x": object()}, "checkpoint['config']")


@pytest.mark.parametrize(
    "content, problem",
    [(5, "it holds a int, not a dict"), ({"config": {}, "vocab": {"tokens": []}}, "no model dict")],
)
def test_a_file_that_is_not_a_dssm_checkpoint_is_named(tmp_path, content, problem):
    torch.save(content, tmp_path / "model.pt")
    with pytest.raises(
        DssmError, match=rf"{re.escape(str(tmp_path / 'model.pt'))}: not a dssm checkpoint \({problem}\)"
    ):
        read_checkpoint(tmp_path / "model.pt")


def register_champion(uri: str, name: str, source: Path) -> str:
    import mlflow

    client = mlflow.MlflowClient(uri)
    if not client.search_registered_models(f"name = '{name}'"):
        client.create_registered_model(name)
    version = client.create_model_version(name, str(source)).version
    client.set_registered_model_alias(name, "champion", version)
    return version


def test_a_champion_that_is_no_readable_checkpoint_means_training_from_scratch(tmp_path, caplog):
    """The issue's night: a champion whose model.pt is `torch.save(5)` stopped every windowed run
    with "TypeError: 'int' object is not subscriptable"; a planted pickle ran its code."""
    from core.layout import Layout
    from modeling.config import load_config
    from stages.train.warm_start import warm_start_source

    uri, name = f"sqlite:///{tmp_path}/mlflow.db", "dssm-tiny"
    layout = Layout(tmp_path / "work")
    layout.warm_start.mkdir(parents=True)  # as the night before left it
    cfg = load_config(None, ["model.ncell=8"])
    marker = tmp_path / "marker"
    (tmp_path / "int").mkdir()
    torch.save(5, tmp_path / "int" / "model.pt")
    planted(tmp_path / "evil" / "model.pt", marker)
    (tmp_path / "empty").mkdir()
    caplog.set_level(logging.WARNING)
    for night, (source, problem) in enumerate(
        [
            ("int", r"not a dssm checkpoint \(it holds a int, not a dict\)"),
            ("evil", r"refused to load \(it refers to (builtins\.)?exec"),
            ("empty", "no model.pt among its artifacts"),
        ]
    ):
        version = register_champion(uri, name, tmp_path / source)
        init_from, why = warm_start_source(layout, uri, name, cfg, f"negatives-{night}", 0.5)
        assert init_from is None
        assert why.startswith(f"champion v{version} of {name} is not a readable dssm checkpoint: ")
        assert re.search(problem, why), why
        warning = caplog.records[-1]
        assert warning.levelno == logging.WARNING and f"champion v{version}" in warning.getMessage()
        assert "training from scratch" in warning.getMessage()
        # pinned for the night: a rerun starts the same way without reading the champion again
        assert warm_start_source(layout, uri, name, cfg, f"negatives-{night}", 0.5) == (None, why)
    assert not marker.exists()


def test_the_first_windowed_night_warm_starts_from_a_champion_already_there(tiny_data, tmp_path):
    """A store whose champion came from a run without a window: the first windowed night has no
    warm-start directory yet, and starts from that champion."""
    from core.layout import Layout
    from modeling.config import load_config
    from stages.train.warm_start import warm_start_source

    model = tiny_model(tiny_data, tmp_path / "model")
    (tmp_path / "registered").mkdir()
    os.link(model / "last.pt", tmp_path / "registered" / "model.pt")
    uri, name = f"sqlite:///{tmp_path}/mlflow.db", "dssm-tiny"
    version = register_champion(uri, name, tmp_path / "registered")
    layout = Layout(tmp_path / "work")
    cfg = load_config(None, ["model.ncell=8", f"data.vocab={tiny_data / 'vocab'}"])
    init_from, why = warm_start_source(layout, uri, name, cfg, "negatives", 0.5, "2026-01-03")
    assert init_from == str(layout.warm_start / f"v{version}" / "model.pt") and Path(init_from).is_file()
    assert why == f"champion v{version} (vocabulary overlap 100%)"
    # its rerun starts the same way; a later night on the same rows too, and says whose decision it keeps (the
    # eleventh probe of issue 63: it named v1 while the alias had moved to the model v1 started)
    assert warm_start_source(layout, uri, name, cfg, "negatives", 0.5, "2026-01-03") == (init_from, why)
    assert warm_start_source(layout, uri, name, cfg, "negatives", 0.5, "2026-01-04") == (
        init_from, f"{why}, as decided on 2026-01-03 for the same training rows")  # fmt: skip


def test_a_half_precision_slim_checkpoint_keeps_a_shared_towers_tensors_once(tiny_data, tmp_path):
    from modeling.checkpoint import load_model, slim_checkpoint

    run = tiny_model(tiny_data, tmp_path / "run")
    full = slim_checkpoint(run / "last.pt", tmp_path / "full.pt")
    half = slim_checkpoint(run / "last.pt", tmp_path / "half.pt", half=True)
    state = torch.load(half, weights_only=True)["model"]
    query, doc = state["query_encoder.forward_rnn.bag.weight"], state["doc_encoder.forward_rnn.bag.weight"]
    # the shared tower's tensors under both names stay one tensor (issue 61: twice the bytes otherwise)
    assert query.dtype == torch.float16 and query.untyped_storage().data_ptr() == doc.untyped_storage().data_ptr()

    def stored(tensors) -> int:  # the bytes a file holds: each storage once
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())

    assert stored(state.values()) * 2 == stored(torch.load(full, weights_only=True)["model"].values())
    model, _, _ = load_model(half)
    reference, _, _ = load_model(full)
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3, msg=name)


def test_checkpoints_come_by_time_when_steps_would_not(tiny_data, tmp_path):
    """`checkpoint_seconds`: a checkpoint once that much training time passed since the last, whatever
    `checkpoint_every` says; 0 turns the clock off (only the final checkpoint here)."""
    from conftest import tiny_model

    from modeling.checkpoint import read_checkpoint

    by_steps = "checkpoint_every=1000000"
    timed = tiny_model(tiny_data, tmp_path / "timed", "epochs=3", by_steps, "checkpoint_seconds=1e-9")
    steps = sorted(read_checkpoint(p)["step"] for p in timed.glob("step-*.pt"))
    final = read_checkpoint(timed / "last.pt")["step"]
    assert len(steps) >= 2 and steps[-1] == final and steps[-2] == final - 1  # every step was due by the clock
    untimed = tiny_model(tiny_data, tmp_path / "untimed", "epochs=3", by_steps, "checkpoint_seconds=0")
    assert [read_checkpoint(p)["step"] for p in untimed.glob("step-*.pt")] == [final]


def test_a_stop_mid_write_leaves_no_partial_checkpoint_and_a_killed_ones_is_removed(tmp_path, monkeypatch):
    """Issue 63's fourth probe (medium): a SIGTERM while torch.save wrote a checkpoint left
    `.step-N.pt.tmp`, half-written, beside the finished ones. A stop now removes it; one that a SIGKILL
    left is removed by the next save."""
    import torch

    from core.stopping import Stopped
    from modeling import checkpoint

    state = {"step": 1, "model": {"w": torch.zeros(2)}}
    (tmp_path / ".step-0000001.pt.tmp").write_bytes(b"half")  # a SIGKILLed writer's
    checkpoint.save_checkpoint(tmp_path, state, 2, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step-0000002.pt"]

    class StoppedMidWrite(io.FileIO):
        def write(self, data):
            super().write(bytes(data)[:4])
            raise Stopped(15)

    monkeypatch.setattr(checkpoint, "open", StoppedMidWrite, raising=False)  # the checkpoint file's writer
    with pytest.raises(Stopped):
        checkpoint.save_checkpoint(tmp_path, state, 3, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step-0000002.pt"]
