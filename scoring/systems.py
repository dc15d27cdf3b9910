"""The systems `dssm evaluate` compares: baselines by name, trained models by checkpoint or MLflow URI.

A system is anything with `score(queries, titles) -> np.ndarray` over aligned pairs, plus the
name, kind and parameters it is reported and logged under.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.artifacts import sha256_file
from core.errors import DssmError
from core.judgments import JudgedPair
from scoring import lexical, neural
from scoring.baselines import BASELINES, BaselineParams
from scoring.hybrid import Scorer

log = logging.getLogger(__name__)


@dataclass
class System:
    name: str
    kind: str  # "baseline", "trained" or "hybrid" (a model fused with other scorers: BM25, MiniLM, models)
    scorer: Scorer
    params: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    checkpoint: Path | None = None  # a trained model's checkpoint file, for the MLflow model
    # a hybrid's fusion.json (components, weights, BM25 statistics, retrieval fusion), saved with its MLflow model
    fusion: dict[str, Any] | None = None
    # a hybrid's scorers by component name, its model first (scoring/catalogue.py ranks a catalogue with them)
    components: dict[str, Scorer] = field(default_factory=dict)
    partner_checkpoints: dict[str, Path] = field(default_factory=dict)  # trained partners of a hybrid, by name

    def scorers(self) -> dict[str, Scorer]:
        """The scorers a catalogue is ranked with: a hybrid's components, else the system itself."""
        return self.components or {self.name: self.scorer}


def build_baseline(name: str, judged: list[JudgedPair], params: BaselineParams | None = None) -> System:
    """A baseline fitted on the judged set's text (titles; doc2vec also queries), never its labels."""
    params = params or BaselineParams()
    titles = [p.title for p in judged]
    if name in ("bm25", "ulm", "plsa"):
        collection = lexical.Collection(titles)
    if name == "bm25":
        bm25 = lexical.BM25.fit(collection, params.k1, params.b)
        return System(name, "baseline", bm25, {"k1": params.k1, "b": params.b})
    if name == "ulm":
        return System(name, "baseline", lexical.UnigramLM(collection, params.mu), {"mu": params.mu})
    if name == "plsa":
        scorer = lexical.PLSA(collection, params.topics, params.plsa_iterations, params.seed)
        return System(name, "baseline", scorer, {"topics": params.topics, "iterations": params.plsa_iterations})
    if name == "doc2vec":
        scorer = neural.Doc2VecEmbedder(titles + [p.query for p in judged], seed=params.seed)
        return System(name, "baseline", scorer, {"vector_size": 100, "window": 5, "epochs": 30, "seed": params.seed})
    if name == "minilm":
        return System(name, "baseline", neural.MiniLMEmbedder(), {"model": "all-MiniLM-L6-v2"})
    raise DssmError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")


def is_mlflow_model(spec: str) -> bool:
    """Whether a --model names an MLflow model (models:/…, runs:/…, a URI), not a checkpoint file or run dir."""
    return "://" in spec or spec.startswith(("models:/", "runs:/"))


def load_trained(spec: str) -> System:
    """A trained model from a checkpoint file or run directory, or an MLflow model URI (models:/…, runs:/…),
    resolved in the tracking store set (`core.tracking.use_store`)."""
    if is_mlflow_model(spec):
        return _from_mlflow(spec)
    path = Path(spec)
    checkpoint = path / "last.pt" if path.is_dir() else path
    if not checkpoint.exists():
        raise DssmError(f"--model {spec}: no checkpoint there (expected a .pt file or a `dssm train` out dir)")
    embedder = neural.TwoTowerEmbedder(checkpoint)
    from modeling.checkpoint import read_checkpoint

    state = read_checkpoint(checkpoint)
    tags = {
        "checkpoint_sha256": sha256_file(checkpoint),
        "train_dataset_sha256": str(state.get("dataset_sha256", "")),
        "train_run_id": str(state.get("mlflow_run_id") or ""),
        "train_step": str(state.get("step", "")),
    }
    return System(embedder.system_name, "trained", embedder, embedder.cfg.flat(), tags, checkpoint.resolve())


def _from_mlflow(uri: str) -> System:
    from scoring.serving import load_logged_model

    try:
        inner, run_id = load_logged_model(uri)
    except DssmError as e:
        raise type(e)(f"--model {e}") from None  # NotADssmModel stays one: the gate replaces such a champion
    tags = {"model_uri": uri, "train_run_id": run_id}
    fusion = getattr(inner, "fusion", None)
    components, partners = getattr(inner, "components", {}), getattr(inner, "partner_paths", {})
    cfg = inner.embedder.cfg.flat()
    return System(inner.name, inner.kind, inner.scorer, cfg, tags, inner.checkpoint_path, fusion, components, partners)


def unique_names(systems: list[System]) -> None:
    """Models of one encoder stay apart, and none of them passes for the others: where several share a
    name, each takes its run directory's name (a `dssm train` out dir such as train/lstm-para), else
    that name with a short hash suffix. A lone model keeps its encoder's name."""
    shared = {name for name, n in Counter(s.name for s in systems).items() if n > 1}
    seen: set[str] = {s.name for s in systems if s.name not in shared}
    for s in systems:
        if s.name not in shared:
            continue
        run_dir = s.checkpoint.parent.name if s.checkpoint is not None else ""
        if run_dir and run_dir not in seen and not s.tags.get("model_uri"):
            s.name = run_dir
        else:
            key = s.tags.get("checkpoint_sha256") or s.tags.get("model_uri") or str(len(seen))
            s.name = f"{s.name}-{hashlib.sha256(key.encode()).hexdigest()[:6]}"
        seen.add(s.name)
