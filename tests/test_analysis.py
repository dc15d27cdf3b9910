"""The numbers behind the analysis pictures: most active cells, keyword counts, and a trace that is
true to the model (its last output is the query vector)."""

import numpy as np
import torch

from analysis.lstm import Trace, keyword_counts, plot_internals, plot_top_cells, top_cells, trace_text
from modeling.config import ModelConfig
from modeling.hashing import Tokenizer, Vocab
from modeling.model import TwoTower


def test_top_cells_and_keyword_counts_on_set_values():
    y = np.array([[0.5, 0.0, 0.0, 0.1], [0.5, 0.3, 0.0, 0.1], [0.45, 0.3, 0.9, -0.2]])
    trace = Trace("a b c", "query", ["a", "b", "c"], {"y": y})
    assert top_cells(trace, k=3).tolist() == [2, 0, 1]
    cells = top_cells(trace, k=3)
    # word a: cell 0 jumps 0 -> 0.5; word b: cell 1 0 -> 0.3; word c: cell 2 0 -> 0.9 (cell 0 moves 0.05)
    assert keyword_counts(trace, cells, threshold=0.2).tolist() == [1, 1, 1]
    assert keyword_counts(trace, cells, threshold=0.04).tolist() == [1, 1, 2]
    assert keyword_counts(trace, cells, threshold=0.4).tolist() == [1, 0, 1]


def test_trace_is_true_to_the_model_and_plots(tiny_data, tmp_path):
    vocab = Vocab.load(tiny_data / "vocab")
    torch.manual_seed(0)
    model = TwoTower(vocab.size, ModelConfig(ncell=6)).eval()
    tokenizer = Tokenizer(vocab, max_words=40)
    trace = trace_text(model, tokenizer, "Cordless DRILL kit", "query")
    assert trace.words == ["cordless", "drill", "kit"]
    assert {"i", "c", "o", "y"} <= set(trace.series) and trace.series["y"].shape == (3, 6)
    with torch.no_grad():
        vector = model.encode_queries(tokenizer.batch(["cordless drill kit"]))[0].numpy()
    np.testing.assert_allclose(trace.series["y"][-1], vector, atol=1e-6)
    cells = top_cells(trace, k=4)
    assert plot_internals(trace, tmp_path / "gates.png").stat().st_size > 1000
    assert plot_top_cells(trace, cells, tmp_path / "top.png").stat().st_size > 1000
