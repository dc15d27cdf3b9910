"""How a training call begins in its run directory: fresh, resumed, already finished, or stale
(another run's checkpoint, deleted first). `decide` is the one place that says which."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import DssmError
from modeling.checkpoint import newest_checkpoint
from modeling.config import TrainJob, config_changes

if TYPE_CHECKING:
    from modeling.hashing import Vocab

log = logging.getLogger("dssm.train")


@dataclass
class Start:
    """How a training call begins: "fresh", "resume" (from `state`) or "finished" (nothing to do)."""

    kind: str
    state: dict[str, Any] | None = None
    restart: bool = False  # the run directory holds a stale run: delete it first
    path: Path | None = None  # the checkpoint resumed or found finished


def decide(
    cfg: TrainJob,
    negatives: dict[str, Any],
    vocab: Vocab,
    code: str,
    total: int,
    on_change: str,
    is_main: bool = True,
) -> Start:
    """The one place that decides fresh / resume / finished / stale for the run directory cfg.out.

    A checkpoint of other negatives, another vocabulary or another model config can never be
    continued; one made by other code or with other (non-model) settings can. on_change says what
    any such difference means: "restart" deletes the run and trains afresh (the retrain flow: a
    scheduled run must not serve a model of old code or data), "resume" continues where allowed,
    "error" refuses (a checkpoint exists and --resume was not given).
    """
    out = Path(cfg.out)
    found = newest_checkpoint(out)
    if found is None:
        return Start("fresh")
    path, state = found
    hard = []
    if state["dataset_sha256"] != negatives["content_sha256"]:
        hard.append(f"other negatives than {cfg.data.negatives}")
    if state["vocab"]["sha256"] != vocab.sha256:
        hard.append(f"another vocabulary than {cfg.data.vocab}")
    changes = config_changes(state["config"], cfg)
    hard += [f"model config {c}" for c in changes if c.startswith("model.")]
    settings = [c for c in changes if not c.startswith("model.")]  # e.g. more epochs: continued
    soft = settings + (["other code"] if state.get("code_sha256") != code else [])
    if on_change == "restart" and (hard or soft):
        log.info("train: %s was trained with %s; training %s afresh", path, ", ".join(hard + soft), out)
        return Start("fresh", restart=True)
    if on_change == "error":
        raise DssmError(f"{out} already holds a checkpoint; pass --resume to continue it or choose another out=")
    if hard:
        raise DssmError(f"{path} was trained with {', '.join(hard)}; cannot resume (train into another out=)")
    if soft and is_main:
        log.info("resuming %s despite: %s", path, ", ".join(soft))
    if state["step"] >= total and not settings:
        return Start("finished", state, path=path)
    return Start("resume", state, path=path)
