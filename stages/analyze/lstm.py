"""What a trained LSTM-RNN does word by word (Palangi et al. 2016, section V-A): its gates and cells
over a text, its most active cells, and the words that move them (keyword detection, Table I).

A Trace holds one text's per-word internals as (words, cells) arrays; everything else here is a
function of a Trace, so the numbers behind each picture can be checked on arrays a test sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from core.errors import DssmError
from core.text import norm
from modeling.encoders import ENCODERS
from modeling.hashing import Tokenizer
from modeling.model import TwoTower
from stages.analyze.config import KeywordRule

RECURRENT = tuple(name for name, spec in ENCODERS.items() if spec.recurrent)
TRACE_BATCH = 256


@dataclass
class Trace:
    """One text through one tower: `words`, and per quantity (i, f, c, o, y; bw_* for the backward
    direction; y only for the RNN) an array of shape (len(words), cells), in word order."""

    text: str
    tower: str
    words: list[str]
    series: dict[str, np.ndarray]

    @property
    def bidirectional(self) -> bool:
        return "bw_y" in self.series


def trace_texts(model: TwoTower, tokenizer: Tokenizer, texts: list[str], tower: str = "query") -> list[Trace]:
    """Run `texts` through the query or document tower and record each one's per-word internals."""
    encoder = {"query": model.query_encoder, "doc": model.doc_encoder}.get(tower)
    if encoder is None:
        raise DssmError(f"tower must be query or doc, not {tower!r}")
    if not hasattr(encoder, "forward_rnn"):
        raise DssmError(f"internals are recorded for {', '.join(RECURRENT)} encoders, not {type(encoder).__name__}")
    traces = []
    for start in range(0, len(texts), TRACE_BATCH):
        chunk = texts[start : start + TRACE_BATCH]
        normalised = [norm(t) for t in chunk]
        with torch.no_grad():
            _, found = encoder(tokenizer.batch(normalised), internals=True)
        for row, (text, clean) in enumerate(zip(chunk, normalised, strict=True)):
            words = tokenizer.words(clean)
            series = {name: value[row, : len(words)].float().numpy() for name, value in found.items()}
            traces.append(Trace(text, tower, words, series))
    return traces


def trace_text(model: TwoTower, tokenizer: Tokenizer, text: str, tower: str = "query") -> Trace:
    return trace_texts(model, tokenizer, [text], tower)[0]


def _final(name: str) -> int:
    # The backward direction reads right to left: its final state is at the first word.
    return 0 if name.startswith("bw_") else -1


def top_cells(trace: Trace, k: int = 10, name: str = "y") -> np.ndarray:
    """The k cells with the largest output at the end of reading (Fig. 6: the most active cells),
    largest first; for bw_* the end is the first word."""
    last = trace.series[name][_final(name)]
    return np.argsort(-last, kind="stable")[:k]


def moved_cells(trace: Trace, cells: np.ndarray, threshold: float, name: str = "y") -> np.ndarray:
    """(words, len(cells)) booleans: does reading the word change the cell by more than `threshold`
    times the largest |value| of these cells over the text? The state before reading the first word
    (the last, for bw_*) is zero. Relative, because the scale of y differs between towers and
    models (a cosine ignores it): a title tower's outputs can be a third of its query tower's."""
    values = trace.series[name][:, cells]
    zero = np.zeros((1, values.shape[1]), values.dtype)
    before = np.vstack([values[1:], zero]) if name.startswith("bw_") else np.vstack([zero, values[:-1]])
    scale = float(np.abs(values).max()) or 1.0
    return np.abs(values - before) > threshold * scale


def keyword_counts(trace: Trace, cells: np.ndarray, threshold: float, name: str = "y") -> np.ndarray:
    """For each word, how many of `cells` it moves (`moved_cells`) when read (Table I)."""
    return moved_cells(trace, cells, threshold, name).sum(axis=1)


def keywords(trace: Trace, rule: KeywordRule = KeywordRule()) -> list[str]:
    """Table II: the words that move more than `rule.share` of the `rule.top` most active cells; for
    a bidirectional model, in both directions."""
    limit = rule.share * rule.top
    moved = keyword_counts(trace, top_cells(trace, rule.top), rule.threshold) > limit
    if trace.bidirectional:
        moved &= keyword_counts(trace, top_cells(trace, rule.top, "bw_y"), rule.threshold, "bw_y") > limit
    return [w for w, m in zip(trace.words, moved, strict=True) if m]


def plot_internals(trace: Trace, path: Path, names: tuple[str, ...] = ("i", "c", "o", "y")) -> Path:
    """Figs. 4-5: one heatmap per quantity, cells on the vertical axis, words on the horizontal, one
    shared colour range so the panels compare."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [n for n in names if n in trace.series]
    limit = max(float(np.abs(trace.series[n]).max()) for n in shown) or 1.0
    fig, axes = plt.subplots(1, len(shown), figsize=(2.2 + 1.2 * len(trace.words) * len(shown) / 2, 5), squeeze=False)
    for ax, name in zip(axes[0], shown, strict=True):
        image = ax.imshow(trace.series[name].T, aspect="auto", cmap="coolwarm", vmin=-limit, vmax=limit)
        ax.set_title(f"{name}(t)")
        ax.set_xticks(range(len(trace.words)), trace.words, rotation=60, ha="right", fontsize=8)
    axes[0][0].set_ylabel("cell")
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8)
    fig.suptitle(f"{trace.tower}: {trace.text}", fontsize=10)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_top_cells(trace: Trace, cells: np.ndarray, path: Path, name: str = "y") -> Path:
    """Fig. 6: the output of the most active cells over the words."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.5 + 0.8 * len(trace.words), 4))
    for cell in cells:
        ax.plot(trace.series[name][:, cell], marker="o", label=f"cell {cell}")
    ax.set_xticks(range(len(trace.words)), trace.words, rotation=60, ha="right")
    ax.set_ylabel(f"{name}(t)")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"{len(cells)} most active cells: {trace.text}", fontsize=10)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
