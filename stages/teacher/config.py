"""The teacher stage's settings: the teacher's scorers and weights, the candidates' sources and depth."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import DssmError

RANKERS = ("bm25", "minilm", "index")
CHECKPOINT = "checkpoint:"


@dataclass(frozen=True)
class TeacherConfig:
    # the teacher: bm25, minilm, index (an earlier run's index model), checkpoint:PATH; empty: no teacher stage
    scorers: list[str] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)  # one per scorer, for their z-scores; empty: equal
    sources: list[str] = field(default_factory=lambda: ["bm25", "index"])  # whose top `depth` are the candidates
    depth: int = 10  # candidates from each source per query
    temperature: float = 1.0  # softmax(fused z-score / temperature) over each list


def check_config(cfg: TeacherConfig) -> None:
    unknown = [s for s in [*cfg.sources, *cfg.scorers] if s not in RANKERS and not s.startswith(CHECKPOINT)]
    if unknown:
        raise DssmError(f"teacher: unknown ranker(s) {', '.join(unknown)}; choose from {', '.join(RANKERS)} or "
                        "checkpoint:PATH")  # fmt: skip
    if cfg.weights and len(cfg.weights) != len(cfg.scorers):
        raise DssmError(f"teacher.weights: {len(cfg.weights)} weights for {len(cfg.scorers)} scorers")
    if cfg.depth < 1 or not cfg.temperature > 0 or not cfg.sources:
        raise DssmError("teacher: depth >= 1, temperature > 0 and at least one source")
