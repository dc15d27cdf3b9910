"""What evaluate hands to register and gate, as files in its output: the eval set it scored on (so the
gate can score a champion never measured there) and the models it may register.

eval_set.json: the EvalSet (queries, titles, labels, file rows), its relevance threshold, its key and,
when retrieval was measured, the catalogue's titles. models.json: per trained model or hybrid with a
checkpoint, its evaluation run, its files and the two metrics a gate may compare.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import DssmError
from scoring.protocol import EvalQuery, EvalSet

EVAL_SET_FILE = "eval_set.json"
MODELS_FILE = "models.json"


def eval_key(eval_set: EvalSet) -> str:
    """Names an evaluation set: same judged file, split and queries give the same key."""
    qids = ",".join(q.qid for q in eval_set.queries)
    return hashlib.sha256(f"{eval_set.sha256}:{eval_set.min_label}:{qids}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ScoredOn:
    """The eval set an evaluation scored on, with what a gate needs to score another model there."""

    eval_set: EvalSet
    threshold: float  # label at which a pair counts as relevant (recall, MRR, MAP)
    catalogue: list[str] | None  # the titles retrieval ranked; None: retrieval was not measured

    @property
    def key(self) -> str:
        return eval_key(self.eval_set)


def write_eval_set(out: Path, scored: ScoredOn) -> None:
    s = scored.eval_set
    queries = [
        {"qid": q.qid, "query": q.query, "rows": q.rows.tolist(), "titles": q.titles, "labels": q.labels.tolist()}
        for q in s.queries
    ]
    doc = {
        "name": s.name,
        "sha256": s.sha256,
        "min_label": s.min_label,
        "split": s.split,
        "eval_key": scored.key,
        "threshold": scored.threshold,
        "queries": queries,
        "catalogue": scored.catalogue,
    }
    (out / EVAL_SET_FILE).write_text(json.dumps(doc))


def read_eval_set(evaluation: Path) -> ScoredOn:
    doc = json.loads((Path(evaluation) / EVAL_SET_FILE).read_text(encoding="utf-8"))
    queries = [
        EvalQuery(q["qid"], q["query"], np.array(q["rows"]), q["titles"], np.array(q["labels"], dtype=np.float64))
        for q in doc["queries"]
    ]
    split = doc["split"]
    eval_set = EvalSet(doc["name"], doc["sha256"], doc["min_label"], queries, split == "all", restricted=split == "dev")
    return ScoredOn(eval_set, doc["threshold"], doc["catalogue"])


@dataclass
class Registrable:
    """A model evaluate scored that register may log and register (it has a checkpoint)."""

    system: str
    kind: str  # "trained" or "hybrid"
    run_id: str  # its evaluation run: the MLflow model is logged there
    checkpoint: str
    metrics: dict[str, float]  # what a gate may compare: ndcg@10, retrieval_ndcg@10 when measured
    fusion: dict[str, Any] | None = None  # a hybrid's components and weights
    partners: dict[str, str] = field(default_factory=dict)  # a hybrid's trained partners' checkpoints, by name


def write_models(out: Path, dataset: str, key: str, models: list[Registrable]) -> None:
    doc = {"dataset": dataset, "eval_key": key, "models": [m.__dict__ for m in models]}
    (out / MODELS_FILE).write_text(json.dumps(doc, indent=2) + "\n")


def read_models(evaluation: Path) -> tuple[str, str, list[Registrable]]:
    """(the dataset, the eval key, the models) of an evaluation."""
    doc = json.loads((Path(evaluation) / MODELS_FILE).read_text(encoding="utf-8"))
    return doc["dataset"], doc["eval_key"], [Registrable(**m) for m in doc["models"]]


REGISTERED_FILE = "registered.json"  # what the register stage hands the gate: the versions it registered


def read_registered(registered: Path) -> dict[str, Any]:
    path = Path(registered) / REGISTERED_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise DssmError(f"{path} is not a `dssm register` output's JSON ({e}): register again") from None
