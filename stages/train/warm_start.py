"""Where a windowed (nightly) run's model starts: the champion, when its config and vocabulary fit."""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import DssmError
from core.layout import Layout

if TYPE_CHECKING:
    from modeling.config import TrainJob
    from modeling.hashing import Vocab

log = logging.getLogger(__name__)


def warm_start_source(
    layout: Layout,
    mlflow_uri: str,
    name: str,
    cfg: TrainJob,
    negatives_sha: str,
    min_overlap: float,
    night: str = "",
) -> tuple[str | None, str]:
    """(checkpoint, why) a windowed run's model starts from: the champion of registered model `name`
    when it has this model's config and its vocabulary covers at least `min_overlap` of this run's
    tokens, else (None, why not): from scratch, also when the champion is no readable dssm checkpoint
    (logged as a warning). Decided once per training data version (the negatives' hash), so a rerun
    of the same night trains with the same start, and is skipped; a later `night` with the same rows (a
    window whose new day was held out as the test day) keeps that start too, and its `why` says so: the
    champion may have moved since."""
    import json

    from mlflow.exceptions import MlflowException

    from core.tracking import client as mlflow_client
    from modeling.hashing import Vocab
    from scoring.serving import CHAMPION

    decisions_path = layout.warm_start / "decisions.json"
    decisions = json.loads(decisions_path.read_text()) if decisions_path.exists() else {}
    key = f"{negatives_sha}:{cfg.model.encoder}"
    pinned = decisions.get(key)
    # a pinned decision holds while its checkpoint does; a deleted one is decided again
    if pinned and (pinned["init_from"] is None or Path(pinned["init_from"]).is_file()):
        decided = pinned.get("night", "")
        if night and decided not in ("", night):
            return pinned["init_from"], f"{pinned['why']}, as decided on {decided} for the same training rows"
        return pinned["init_from"], pinned["why"]
    client = mlflow_client(mlflow_uri)
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        champion = None
    init_from, why = None, "no champion yet"
    if champion is not None:
        checkpoint = layout.warm_start / f"v{champion.version}" / "model.pt"
        state, problem = _champion_state(name, champion.version, mlflow_uri, checkpoint)
        theirs = _model_config(state) if state else {}
        if state is None:
            why = f"champion v{champion.version} of {name} is not a readable dssm checkpoint: {problem}"
            log.warning("warm start: %s; training from scratch", why)
        elif changed := sorted(k for k, v in asdict(cfg.model).items() if theirs.get(k) != v):
            why = f"champion v{champion.version} has another model config ({', '.join(f'model.{k}' for k in changed)})"
        elif (overlap := _overlap(state, Vocab.load(cfg.data.vocab or layout.vocab, cfg.model.tokens))) < min_overlap:
            why = f"champion v{champion.version}'s vocabulary covers {overlap:.0%} of this one's (< {min_overlap:.0%})"
        else:
            init_from, why = str(checkpoint), f"champion v{champion.version} (vocabulary overlap {overlap:.0%})"
    decisions[key] = {"init_from": init_from, "why": why, "night": night}
    layout.warm_start.mkdir(parents=True, exist_ok=True)
    tmp = decisions_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(decisions, indent=2) + "\n")
    os.replace(tmp, decisions_path)
    return init_from, why


def _model_config(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's model config with the keys added since it was written at their defaults (which
    keep the behaviour it had), or as saved when it no longer loads."""
    from modeling.config import load_config

    try:
        return asdict(load_config(base=state["config"]).model)
    except DssmError:
        return state["config"].get("model", {})


def _champion_state(name: str, version: str, mlflow_uri: str, checkpoint: Path) -> tuple[dict[str, Any] | None, str]:
    """(the champion's checkpoint state, "") downloaded into `checkpoint`'s directory, or (None, what
    is wrong) when the registered version is no dssm checkpoint: anyone who reaches the MLflow server
    can register one, and it must not stop every night's training."""
    from core.tracking import resolve_model
    from modeling.checkpoint import read_checkpoint
    from scoring.serving import copy_logged_model

    try:
        if not checkpoint.is_file():
            shutil.rmtree(checkpoint.parent, ignore_errors=True)  # a download cut short
            # the first windowed night may already find a champion (of a run without a window)
            checkpoint.parent.parent.mkdir(parents=True, exist_ok=True)
            copy_logged_model(resolve_model(f"models:/{name}/{version}", mlflow_uri).uri, checkpoint.parent)
        return read_checkpoint(checkpoint), ""
    except DssmError as e:  # no model.pt among its artifacts, refused by the safe loader, not a checkpoint
        return None, str(e)


def _overlap(state: dict[str, Any], vocab: Vocab) -> float:
    """The share of `vocab`'s tokens the checkpoint's vocabulary holds."""
    tokens = set(state["vocab"]["tokens"])
    return sum(t in tokens for t in vocab.tokens) / max(vocab.size, 1)
