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

from dssm.errors import DssmError
from dssm.text import norm
from modeling.hashing import Tokenizer
from modeling.model import TwoTower

RECURRENT = ("lstm", "bilstm", "lstm_avg")


@dataclass
class Trace:
    """One text through one tower: `words`, and per quantity (i, f, c, o, y; bw_* for the backward
    direction) an array of shape (len(words), cells)."""

    text: str
    tower: str
    words: list[str]
    series: dict[str, np.ndarray]


def trace_text(model: TwoTower, tokenizer: Tokenizer, text: str, tower: str = "query") -> Trace:
    """Run `text` through the query or document tower and record its per-word internals."""
    encoder = {"query": model.query_encoder, "doc": model.doc_encoder}.get(tower)
    if encoder is None:
        raise DssmError(f"tower must be query or doc, not {tower!r}")
    if not hasattr(encoder, "forward_rnn"):
        raise DssmError(f"internals are recorded for {', '.join(RECURRENT)} encoders, not {type(encoder).__name__}")
    normalised = norm(text)
    words = normalised.split()[: tokenizer.max_words] or [""]
    with torch.no_grad():
        _, found = encoder(tokenizer.batch([normalised]), internals=True)
    series = {name: value[0, : len(words)].float().numpy() for name, value in found.items()}
    return Trace(text, tower, words, series)


def top_cells(trace: Trace, k: int = 10, name: str = "y") -> np.ndarray:
    """The k cells with the largest output at the last word (Fig. 6: the most active cells), largest first."""
    last = trace.series[name][-1]
    order = np.argsort(-last, kind="stable")
    return order[:k]


def keyword_counts(trace: Trace, cells: np.ndarray, threshold: float, name: str = "y") -> np.ndarray:
    """For each word, how many of `cells` change by more than `threshold` when the word is read
    (Table I); the state before the first word is zero."""
    values = trace.series[name][:, cells]
    before = np.vstack([np.zeros((1, values.shape[1]), values.dtype), values[:-1]])
    return (np.abs(values - before) > threshold).sum(axis=1)


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


def analyze(
    checkpoint: Path | str, texts: list[str], out: Path, tower: str = "query", top: int = 10, threshold: float = 0.1
) -> Path:
    """For each text: the gate/cell heatmaps, the most active cells, and the keyword counts, in
    OUT/analysis.md with the PNGs beside it. Written atomically."""
    from dssm.artifacts import atomic_dir
    from modeling.checkpoint import load_model

    model, tokenizer, _ = load_model(checkpoint)
    if not texts:
        raise DssmError("give at least one --text to analyse")
    lines = [f"# What the model reads ({tower} tower of {checkpoint})", ""]
    lines += [f"Keyword counts: how many of the {top} most active cells change by more than {threshold}", ""]
    with atomic_dir(Path(out)) as tmp:
        for n, text in enumerate(texts):
            trace = trace_text(model, tokenizer, text, tower)
            cells = top_cells(trace, top)
            counts = keyword_counts(trace, cells, threshold)
            plot_internals(trace, tmp / f"internals-{n}.png")
            plot_top_cells(trace, cells, tmp / f"top-cells-{n}.png")
            lines += [f"## {text}", "", "| word | " + " | ".join(trace.words) + " |"]
            lines += ["|---" * (len(trace.words) + 1) + "|", "| cells moved | " + " | ".join(map(str, counts)) + " |"]
            lines += ["", f"![internals](internals-{n}.png)", f"![top cells](top-cells-{n}.png)", ""]
        (tmp / "analysis.md").write_text("\n".join(lines))
    return Path(out) / "analysis.md"
