"""Checkpoints: written atomically by rank 0, self-contained (resolved config, vocabulary tokens,
model and optimiser state, position in the data, MLflow run id), loadable without the work dir."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from dssm.errors import DssmError
from modeling.config import TrainConfig, load_config
from modeling.hashing import Tokenizer, Vocab
from modeling.model import TwoTower

LAST = "last.pt"


def save_checkpoint(out: Path, state: dict[str, Any], step: int, keep: int) -> Path:
    """Write `step-NNNNNNN.pt` then point `last.pt` at the same bytes; keep the newest `keep` steps."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"step-{step:07d}.pt"
    tmp = out / f".{path.name}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # a reader never sees a half-written checkpoint
    last_tmp = out / f".{LAST}.tmp"
    if last_tmp.exists():
        last_tmp.unlink()
    os.link(path, last_tmp)
    os.replace(last_tmp, out / LAST)
    for old in sorted(out.glob("step-*.pt"))[:-keep] if keep > 0 else []:
        old.unlink()
    return path


def read_checkpoint(path: Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / LAST
    if not path.exists():
        raise DssmError(f"{path}: no checkpoint here")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # truncated or foreign file
        raise DssmError(f"{path}: not a readable dssm checkpoint ({type(e).__name__}: {e})") from e


def load_model(path: Path | str) -> tuple[TwoTower, Tokenizer, TrainConfig]:
    """A trained model in eval mode, its tokenizer and its config, from a checkpoint or run dir."""
    state = read_checkpoint(Path(path))
    cfg = load_config(base=state["config"])
    saved = state["vocab"]
    vocab = Vocab(saved["tokens"], saved["sha256"], saved.get("clean_sha256"), saved.get("kind", "trigrams"))
    model = TwoTower(vocab.size, cfg.model)
    model.load_state_dict(state["model"])
    model.eval()
    return model, Tokenizer(vocab, cfg.model.max_words), cfg
