"""Checkpoints: written atomically by rank 0, self-contained (resolved config, vocabulary tokens,
model and optimiser state, position in the data, MLflow run id), loadable without the work dir.

A checkpoint is tensors and plain data only (dicts, lists, str, int, float, bool, None) and is read
with `torch.load(weights_only=True)`: a `.pt` file can come from anyone who reaches the MLflow
server or an index directory, and a full unpickle would run whatever code it names."""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import pickle
import re
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import torch

from core.errors import DssmError, naming_full_disk
from modeling.config import TrainJob, load_config
from modeling.encoders import tokenizer_for
from modeling.hashing import Tokenizer, Vocab
from modeling.model import TwoTower, embedding_tables

LAST = "last.pt"
log = logging.getLogger(__name__)


def save_checkpoint(out: Path, state: dict[str, Any], step: int, keep: int) -> Path:
    """Write `step-NNNNNNN.pt` then point `last.pt` at the same bytes; keep the newest `keep` steps."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"step-{step:07d}.pt"
    tmp = out / f".{path.name}.tmp"
    for stale in out.glob(".step-*.pt.tmp"):  # a process killed mid-write (SIGKILL) left it
        stale.unlink(missing_ok=True)
    # serialised in memory, then written by plain file I/O: a full disk is then an OSError (ENOSPC) that
    # names nothing, made one line naming the run directory and its free space, not torch's
    # "[enforce fail at inline_container.cc] unexpected pos"
    buffer = io.BytesIO()
    torch.save(plain_state(state), buffer)
    try:
        with naming_full_disk(out):
            with open(tmp, "wb") as f:
                f.write(buffer.getbuffer())
            os.replace(tmp, path)  # a reader never sees a half-written checkpoint
    except BaseException:  # a stop (SIGTERM, ^C) or a full disk mid-write: no half-written file left behind
        tmp.unlink(missing_ok=True)
        raise
    last_tmp = out / f".{LAST}.tmp"
    if last_tmp.exists():
        last_tmp.unlink()
    os.link(path, last_tmp)
    os.replace(last_tmp, out / LAST)
    for old in sorted(out.glob("step-*.pt"))[:-keep] if keep > 0 else []:
        old.unlink()
    return path


# The model and optimiser state dicts are torch's own, which its safe loader reads as they are.
TORCH_STATE = ("model", "optimizer")
SAFE_LOAD_HELP = (
    "a dssm checkpoint holds only tensors and plain data and is never unpickled as code; retrain the "
    "model, or re-save a checkpoint you trust with plain data (docs/training.md, Checkpoints)"
)


def plain(value: Any, where: str = "checkpoint") -> Any:
    """`value` as data `torch.load(weights_only=True)` accepts: paths become str, numpy scalars and
    arrays Python numbers and lists, dataclasses dicts. Anything else is a bug in what is saved."""
    if value is None or type(value) in (str, bool, int, float) or isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.generic):
        return value.item()
    for kind in (str, int, float):  # a subclass (an enum) pickles as its own class, which is refused
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value), where)
    if isinstance(value, dict):
        return {plain(k, where): plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if type(value) is tuple else items
    raise TypeError(f"{where}: a {type(value).__name__} is not plain data a safe torch.load reads")


def plain_state(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's state with its metadata as plain data (`plain`), the torch state dicts as they are."""
    return {k: v if k in TORCH_STATE else plain(v, f"checkpoint[{k!r}]") for k, v in state.items()}


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's state (a file, or a run directory's last.pt), loaded as tensors and plain data
    only; a file that is anything else raises DssmError naming it, without running any of it."""
    path = Path(path)
    if path.is_dir():
        path = path / LAST
    if not path.exists():
        raise DssmError(f"{path}: no checkpoint here")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # the safe loader met something other than tensors and data
        raise DssmError(f"{path}: refused to load ({_refusal(e)}); {SAFE_LOAD_HELP}") from None
    except Exception as e:  # truncated or foreign file
        raise DssmError(f"{path}: not a readable dssm checkpoint ({type(e).__name__}: {e})") from e
    problem = _shape_problem(state)
    if problem:
        raise DssmError(f"{path}: not a dssm checkpoint ({problem})")
    return state


def _refusal(error: pickle.UnpicklingError) -> str:
    """What torch's several-paragraph weights_only error says was refused, in a few words."""
    text = " ".join(str(error).split())
    found = re.search(r"GLOBAL ([\w.]+)", text)
    if found:
        return f"it refers to {found.group(1)}, not only to tensors and plain data"
    found = re.search(r"WeightsUnpickler error: (.+?)(?: Check the documentation|$)", text)
    return found.group(1) if found else "not tensors and plain data"


def _shape_problem(state: Any) -> str | None:
    """What keeps `state` from being a dssm checkpoint (the keys every reader indexes), or None."""
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not a dict"
    missing = [k for k in ("config", "vocab", "model") if not isinstance(state.get(k), dict)]
    if missing:
        return f"no {', '.join(missing)} dict"
    if not isinstance(state["vocab"].get("tokens"), list):
        return "no vocab tokens list"
    if not isinstance(state["config"].get("model"), dict):
        return "no model config"
    return None


def slim_checkpoint(checkpoint: Path, dest: Path, half: bool = False) -> Path:
    """The checkpoint without optimiser state: what serving needs, a third of the bytes (`half`: its
    floating-point tensors in float16, a sixth, e.g. to carry a model trained on another machine;
    `load_model` reads them back into float32)."""
    state = read_checkpoint(checkpoint)
    keep = {k: state[k] for k in ("config", "vocab", "model", "step", "dataset_sha256", "mlflow_run_id") if k in state}
    if half:  # a tensor under two names (a shared tower's) stays one tensor
        halves: dict[tuple, torch.Tensor] = {}
        model = {}
        for name, value in keep["model"].items():
            key = (value.data_ptr(), value.dtype, tuple(value.shape), tuple(value.stride()))
            if key not in halves:
                halves[key] = value.half() if value.is_floating_point() else value
            model[name] = halves[key]
        keep["model"] = model
    dest.parent.mkdir(parents=True, exist_ok=True)
    torch.save(keep, dest)  # under its own name: torch names the archive's records after the file
    return dest


def newest_checkpoint(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest readable checkpoint of a run directory: last.pt, else the newest step-*.pt that
    loads (a truncated last.pt need not block a run whose older step file is intact); None when the
    directory holds no checkpoint. Raises when checkpoints exist but none can be read."""
    run_dir = Path(run_dir)
    candidates = [run_dir / LAST, *sorted(run_dir.glob("step-*.pt"), reverse=True)]
    present = [p for p in candidates if p.is_file()]
    for path in present:
        try:
            return path, read_checkpoint(path)
        except DssmError as e:
            log.warning("%s; trying an older checkpoint", e)
    if present:
        raise DssmError(
            f"{run_dir}: no readable checkpoint ({', '.join(p.name for p in present)} are damaged); "
            f"delete {run_dir} to train afresh"
        )
    return None


def load_model(path: Path | str) -> tuple[TwoTower, Tokenizer, TrainJob]:
    """A trained model in eval mode, its tokenizer and its config, from a checkpoint or run dir."""
    state = read_checkpoint(Path(path))
    cfg = load_config(base=state["config"])
    saved = state["vocab"]
    vocab = Vocab(saved["tokens"], saved["sha256"], saved.get("clean_sha256"), saved.get("kind", "trigrams"))
    model = TwoTower(vocab.size, cfg.model)
    model.load_state_dict(state["model"])
    model.eval()
    return model, tokenizer_for(cfg.model, vocab), cfg


def warm_start(model: torch.nn.Module, vocab: Vocab, path: Path | str) -> dict[str, int]:
    """Start `model` from another run's weights (e.g. paraphrase pre-training before click training):
    every tensor with the same name and shape is copied; token embedding tables (`Encoder.token_tables`) are
    copied row by row for the tokens both vocabularies have. A shared-encoder source fills both
    towers. Returns how many tensors and embedding rows were copied."""
    source = read_checkpoint(Path(path))
    source_rows = {tok: i for i, tok in enumerate(source["vocab"]["tokens"])}
    pairs = [(i, source_rows[tok]) for i, tok in enumerate(vocab.tokens) if tok in source_rows]
    target_rows, from_rows = (
        (torch.tensor(x, dtype=torch.long) for x in zip(*pairs, strict=True)) if pairs else (None, None)
    )
    copied = {"tensors": 0, "embedding_rows": 0}
    own = model.state_dict(keep_vars=True)
    table_ids = {id(p) for p in embedding_tables(model).values()}
    tables = {name for name, p in own.items() if id(p) in table_ids}  # a shared table under both names
    own = model.state_dict()
    with torch.no_grad():
        for name, value in source["model"].items():
            if name not in own:
                continue
            target = own[name]
            if name in tables and target_rows is not None and value.shape[1] == target.shape[1]:
                target[target_rows] = value[from_rows].to(target.dtype)
                copied["embedding_rows"] += len(pairs)
            elif value.shape == target.shape:
                target.copy_(value)
                copied["tensors"] += 1
    if not copied["tensors"] and not copied["embedding_rows"]:
        raise DssmError(f"init_from={path}: no tensor of that model fits this one (another encoder or size?)")
    return copied
