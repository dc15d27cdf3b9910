"""Two trained models side by side (Palangi et al. 2016, appendix Tables V-VIII and Fig. 7): their
scores on the same query/title pairs, the cells each word moves in each, and their training cost
curves read back from MLflow."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scoring.neural import TwoTowerEmbedder
from stages.analyze.config import KeywordRule
from stages.analyze.lstm import keyword_counts, top_cells, trace_text


@dataclass
class PairReading:
    """One model on one (query, title) pair: its cosine score, and per word of each side how many
    of that side's `top` most active cells the word moves."""

    model: str
    score: float
    query_words: list[str]
    query_counts: list[int]
    title_words: list[str]
    title_counts: list[int]


def read_pair(embedder: TwoTowerEmbedder, query: str, title: str, rule: KeywordRule) -> PairReading:
    sides = []
    for text, tower in ((query, "query"), (title, "doc")):
        trace = trace_text(embedder.model, embedder.tokenizer, text, tower)
        sides.append((trace.words, keyword_counts(trace, top_cells(trace, rule.top), rule.threshold).tolist()))
    score = float(embedder.score([query], [title])[0])
    return PairReading(embedder.encoder_name, score, sides[0][0], sides[0][1], sides[1][0], sides[1][1])


def training_curve(tracking_uri: str, run_id: str, metric: str = "train_loss") -> list[tuple[int, float]]:
    """(step, value) of one metric of one MLflow run, by step."""
    from core.tracking import client

    history = client(tracking_uri).get_metric_history(run_id, metric)
    return sorted((m.step, m.value) for m in history)


def plot_cost_curves(curves: dict[str, list[tuple[int, float]]], path: Path, metric: str = "train_loss") -> Path:
    """Fig. 7: each model's training cost per step on one log-scale axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, points in curves.items():
        steps, values = np.array(points).T
        ax.plot(steps, values, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("training step (mini-batch updates)")
    ax.set_ylabel(f"{metric} (log scale)")
    ax.set_title("Training cost")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
