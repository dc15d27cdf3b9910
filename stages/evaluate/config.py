"""The evaluate stage's settings, in a module that imports no pyspark, mlflow or torch (the run config is
built from them): what an evaluation scores (`EvaluateConfig`: `dssm evaluate`'s flags; `EvaluateStageConfig`:
the flow's `evaluate` section, with the flow's defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import DssmError
from scoring.baselines import BASELINES, BaselineParams


@dataclass
class EvaluateConfig:
    # beside the models, from bm25,doc2vec,ulm,plsa,minilm (bm25 is always evaluated: the significance reference)
    baselines: list[str] = field(default_factory=lambda: ["bm25"])
    # each hybrid (with a dev set to fit it on): scorers joined by +, from bm25, minilm (the bundled
    # all-MiniLM-L6-v2), MODEL (each trained model in turn) or a trained model's name (minilm-ft)
    fusions: list[str] = field(default_factory=lambda: ["MODEL+bm25"])
    # also rank the judged set's whole catalogue (PROTOCOL.md §8) and fit each hybrid's retrieval fusion
    retrieval: bool = False
    bm25_k1: float = 1.2  # BM25's term-frequency saturation
    bm25_b: float = 0.75  # BM25's length normalisation
    ulm_mu: float = 100.0  # ULM's Dirichlet prior
    plsa_topics: int = 50  # PLSA's topics
    seed: int = 0  # doc2vec's and PLSA's seed

    def baseline_params(self) -> BaselineParams:
        return BaselineParams(self.bm25_k1, self.bm25_b, self.ulm_mu, self.plsa_topics, seed=self.seed)


@dataclass
class EvaluateStageConfig(EvaluateConfig):
    """The flow's `evaluate` section: what `dssm evaluate` scores, with the flow's defaults (what the search
    service serves: the 3-way fusion, the whole catalogue), and whether to fit hybrids."""

    # each hybrid: scorers joined by +, from bm25, minilm (the bundled all-MiniLM-L6-v2), MODEL (each trained model)
    # or a trained model's name (minilm-ft); the default's 3-way fusion: docs/studies/pretrained-fusion-distillation.md
    fusions: list[str] = field(default_factory=lambda: ["MODEL+bm25", "MODEL+bm25+minilm"])
    # also rank the judged set's whole catalogue (PROTOCOL.md §8) and fit each hybrid's retrieval fusion
    retrieval: bool = True
    hybrid: bool = True  # also the `fusions` (hybrids), their weights fit on the negatives' validation queries


def check_config(settings: EvaluateConfig) -> None:
    parse_baselines(settings.baselines)
    check_fusions(settings.fusions)


def parse_baselines(names: list[str]) -> list[str]:
    """Known baseline names, each once, in order."""
    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise DssmError(f"unknown baseline(s) {', '.join(unknown)}; choose from {', '.join(BASELINES)}")
    return list(dict.fromkeys(names))


def check_fusions(specs: list[str]) -> list[str]:
    """Fusion specs: two or more components joined by +, each bm25, minilm, MODEL or a trained model's name."""
    for spec in specs:
        names = [n.strip() for n in spec.split("+")]
        if len(names) < 2 or not all(names) or len(set(names)) != len(names):
            raise DssmError(f"fusion {spec!r}: two or more distinct scorers joined by +, e.g. MODEL+bm25+minilm")
    return list(dict.fromkeys(specs))
