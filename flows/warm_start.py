"""Where a windowed (nightly) run's model starts: the champion, when its config and vocabulary fit."""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from core.layout import Layout

if TYPE_CHECKING:
    from modeling.config import TrainConfig


def warm_start_source(
    layout: Layout, mlflow_uri: str, name: str, cfg: TrainConfig, negatives_sha: str, min_overlap: float
) -> tuple[str | None, str]:
    """(checkpoint, why) a windowed run's model starts from: the champion of registered model `name`
    when it has this model's config and its vocabulary covers at least `min_overlap` of this run's
    tokens, else (None, why not): from scratch. Decided once per training data version (the
    negatives' hash), so a rerun of the same night trains with the same start, and is skipped."""
    import json

    from mlflow.exceptions import MlflowException

    from core.tracking import client as mlflow_client
    from evaluation.registry import CHAMPION
    from modeling.checkpoint import read_checkpoint
    from modeling.hashing import Vocab
    from retrieval.index import copy_model_files, resolve_model

    decisions_path = layout.warm_start / "decisions.json"
    decisions = json.loads(decisions_path.read_text()) if decisions_path.exists() else {}
    key = f"{negatives_sha}:{cfg.model.encoder}"
    pinned = decisions.get(key)
    if pinned and (pinned["init_from"] is None or Path(pinned["init_from"]).is_file()):
        return pinned["init_from"], pinned["why"]  # else its checkpoint was deleted: decide again
    client = mlflow_client(mlflow_uri)
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        champion = None
    init_from, why = None, "no champion yet"
    if champion is not None:
        dest = layout.warm_start / f"v{champion.version}"
        checkpoint = dest / "model.pt"
        if not checkpoint.is_file():
            shutil.rmtree(dest, ignore_errors=True)  # a download cut short
            copy_model_files(resolve_model(f"models:/{name}/{champion.version}", mlflow_uri), dest)
        state = read_checkpoint(checkpoint)
        theirs = state["config"]["model"]
        ours = asdict(cfg.model)
        changed = sorted(k for k in ours if theirs.get(k) != ours[k])
        tokens = set(state["vocab"]["tokens"])
        vocab = Vocab.load(cfg.data.vocab or layout.vocab, cfg.model.tokens)
        overlap = sum(t in tokens for t in vocab.tokens) / max(vocab.size, 1)
        if changed:
            why = f"champion v{champion.version} has another model config ({', '.join(f'model.{k}' for k in changed)})"
        elif overlap < min_overlap:
            why = f"champion v{champion.version}'s vocabulary covers {overlap:.0%} of this one's (< {min_overlap:.0%})"
        else:
            init_from, why = str(checkpoint), f"champion v{champion.version} (vocabulary overlap {overlap:.0%})"
    decisions[key] = {"init_from": init_from, "why": why}
    layout.warm_start.mkdir(parents=True, exist_ok=True)
    tmp = decisions_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(decisions, indent=2) + "\n")
    os.replace(tmp, decisions_path)
    return init_from, why
