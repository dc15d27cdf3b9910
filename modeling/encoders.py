"""Text encoders: a `TextBatch` in, one vector per text out (`forward(batch, internals=False)`).

- `lstm`: Palangi et al. 2016, eq. (2); the embedding is y(T) at each text's last real word.
- `rnn`: eq. (1), tanh.  `bilstm`: a forward and a backward LSTM-RNN, final states concatenated.
- `dssm`: bag of all the text's trigrams through a tanh MLP (Huang et al. 2013).
- `clsm`: convolution over a window of words' trigram bags, max-pooling over positions, a tanh
  semantic layer (Shen et al. 2014).
- `lstm_avg`: the mean of the LSTM outputs over the words (`bilstm_avg`: both directions, concatenated);
  `gran`: Wieting & Gimpel 2017, eq. (1): mean over t of x_t ⊙ σ(W_x x_t + W_h h_t + b), with h_t
  the LSTM output and x_t a word vector (`model.gran_type` 2-5: their variants; `bigran`: both
  directions, summed); `avg`: the mean of the word vectors.
- `model.dropout`: dropout on every word's input vector (all gates' W·l(t), x_t) while training.

Every input projection is a `HashingTable` (an `nn.EmbeddingBag(mode="sum")`) over trigram ids:
`W·l(t)` for all gates at once. Recurrent encoders can also return their per-step internals (gates, cells,
outputs), each (texts, words, ncell) in word order, for the analysis stage.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from modeling.encoder import Encoder
from modeling.hashing import TextBatch, Tokenizer, Vocab
from modeling.recurrence import batch_sizes_of, last_states, lstm_loop, padded, rnn_loop, scripted
from modeling.tables import HashingTable

if TYPE_CHECKING:  # annotations only: modeling.config checks model.encoder against ENCODERS
    from modeling.model_config import ModelConfig
    from modeling.transformer import WordPieceTokenizer


def hashed_words(bag: HashingTable, batch: TextBatch) -> Tensor:
    """(word occurrences, dim): W·l(t) for every word of every text, each distinct word hashed once."""
    return bag(batch.ids, batch.offsets).index_select(0, batch.words)


def dropped(x: Tensor, p: float, training: bool) -> Tensor:
    """`model.dropout` on per-word input vectors; p=0 costs nothing."""
    return nn.functional.dropout(x, p, training) if p > 0 and training else x


def word_places(lengths: Tensor) -> tuple[Tensor, Tensor]:
    """For each word occurrence (texts in order, words in order; `lengths` on the CPU): its text and
    its position within that text."""
    text = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    return text, torch.arange(len(text)) - (torch.cumsum(lengths, 0) - lengths)[text]


def padded_positions(lengths: Tensor) -> tuple[int, int, Tensor]:
    """(texts, max words, each word occurrence's row in a (texts × max words) padded grid)."""
    lengths = lengths.cpu()
    n, t = len(lengths), int(lengths.max())
    text, within = word_places(lengths)
    return n, t, text * t + within


@dataclass
class Packed:
    """Word vectors in packed layout (PackedSequence order): step 0 of every text, then step 1 of
    every text still going, ...; texts sorted by length, longest first, so at step t the running
    texts are the first `sizes[t]`. A packed layout has no padding to compute on or leak."""

    x: Tensor  # (words, dim)
    sizes: list[int]  # texts still running at each step
    rank: Tensor  # (texts,) each text's position in the sorted order
    row_text: Tensor  # (words,) the sorted text each packed row belongs to

    def steps(self, x: Tensor | None = None) -> list[Tensor]:
        return list(torch.split(self.x if x is None else x, self.sizes))

    def sum_per_text(self, rows: Tensor) -> Tensor:
        """Per-text sums of packed rows, in sorted order."""
        return rows.new_zeros(len(self.rank), rows.shape[1]).index_add(0, self.row_text, rows)


def pack_words(flat: Tensor, lengths: Tensor, reverse: bool = False, word_rows: Tensor | None = None) -> Packed:
    """Packed layout of per-word vectors: `flat`, words in text order, or `flat[word_rows]` (one
    gather from distinct words' rows straight into packed order, which halves the copying and its
    backward); reversed within each text if `reverse`, for the backward direction."""
    lengths = lengths.cpu()
    n = len(lengths)
    order = torch.sort(lengths, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank[order] = torch.arange(n)
    sizes = batch_sizes_of(lengths[order])
    step_start = torch.tensor([0, *sizes[:-1]]).cumsum(0)
    text, within = word_places(lengths)
    if reverse:
        within = lengths[text] - 1 - within
    position = step_start[within] + rank[text]
    source = torch.empty_like(position)
    source[position] = torch.arange(len(position))
    row_text = torch.empty_like(position)
    row_text[position] = rank[text]
    device = flat.device
    source = source.to(device) if word_rows is None else word_rows.to(device).index_select(0, source.to(device))
    return Packed(flat.index_select(0, source), sizes, rank.to(device), row_text.to(device))


def text_sums(rows: Tensor, lengths: Tensor) -> Tensor:
    """Per-text sums of per-word rows (words in text order)."""
    text = torch.repeat_interleave(torch.arange(len(lengths), device=rows.device), lengths, output_size=rows.shape[0])
    return rows.new_zeros(len(lengths), rows.shape[1]).index_add(0, text, rows)


def reverse_within(x: Tensor, lengths: Tensor) -> Tensor:
    """(N, T, D) with each text's first `length` positions reversed, padding left in place."""
    t = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
    index = torch.where(t < lengths.unsqueeze(1), lengths.unsqueeze(1) - 1 - t, t)
    return x.gather(1, index.unsqueeze(2).expand_as(x))


class Recurrent(nn.Module):
    """One direction of an LSTM-RNN or RNN over word-hashed inputs (shared by lstm/rnn/bilstm/
    lstm_avg/gran). `run` returns sorted-order outputs so callers pool them as they need."""

    def __init__(self, vocab_size: int, cfg: ModelConfig, cell: str, extra: int = 0):
        super().__init__()
        self.cell = cell
        self.hidden = cfg.ncell
        self.forget_gate = cfg.forget_gate and cell == "lstm"
        self.peepholes = cfg.peepholes and cell == "lstm"
        gates = 1 if cell == "rnn" else (4 if self.forget_gate else 3)
        self.gates = gates
        self.extra = extra  # extra input columns (GRAN's word vector x_t) computed by the same bag
        self.bag = HashingTable(vocab_size, gates * cfg.ncell + extra)
        self.bias = nn.Parameter(torch.zeros(gates * cfg.ncell))
        self.w_rec = nn.Parameter(torch.empty(gates * cfg.ncell, cfg.ncell))
        self.peep = nn.Parameter(torch.zeros(3, cfg.ncell)) if self.peepholes else None
        self.impl = self._choose_impl(cfg.impl)
        self.dropout = cfg.dropout
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.hidden)
        nn.init.uniform_(self.bag.weight, -bound, bound)
        nn.init.uniform_(self.w_rec, -bound, bound)
        nn.init.zeros_(self.bias)
        if self.forget_gate:  # a common choice: start by remembering (gates are [i, f, o, g])
            nn.init.ones_(self.bias[self.hidden : 2 * self.hidden])

    def _choose_impl(self, impl: str) -> str:
        if impl == "native" and not self.native_ok:
            raise ValueError("model.impl=native needs a tanh RNN or an LSTM without peepholes")
        return impl

    @property
    def native_ok(self) -> bool:
        """Whether torch's RNN kernels compute this cell: a tanh RNN, an LSTM without peepholes."""
        return self.cell == "rnn" or not self.peepholes

    def loop_for(self, x: Tensor) -> str:
        """The implementation a batch on x's device runs: `model.impl`, with auto resolved: torch's
        kernels (cuDNN) on a GPU where they compute the cell, one launch per direction instead of about
        ten per word; else the Python loop, fastest on the CPU (docs/studies/training-throughput.md)."""
        if self.impl != "auto":
            return self.impl
        return "native" if x.is_cuda and self.native_ok else "loop"

    def run(self, batch: TextBatch, reverse: bool = False, record: bool = False):
        """(outputs per step, internals per step, packed inputs): steps in the packed, sorted order."""
        packed = pack_words(self.bag(batch.ids, batch.offsets), batch.host_lengths(), reverse, batch.words)
        packed.x = dropped(packed.x, self.dropout, self.training)
        gate_x = (packed.x[:, : self.gates * self.hidden] if self.extra else packed.x) + self.bias
        internals: list[list[Tensor]] = []
        impl = self.loop_for(gate_x)
        if impl == "native" and not record:
            outputs = self._native(gate_x, packed)
        elif self.cell == "rnn":
            outputs = (scripted("rnn") if impl == "script" else rnn_loop)(packed.steps(gate_x), self.w_rec)
        else:
            loop = scripted("lstm") if impl == "script" else lstm_loop
            outputs, internals = loop(packed.steps(gate_x), self.w_rec, self.peep, self.forget_gate, record)
        return outputs, internals, packed

    def _native(self, gate_x: Tensor, packed: Packed) -> list[Tensor]:
        """nn.LSTM / nn.RNN kernels on the same parameters: identity input weights, our recurrent ones.
        torch's LSTM always has a forget gate; the paper's cell (c(t) = c(t-1) + i ⊙ g) is that cell with
        the gate held open: no weights and a pre-activation of FORGET_OPEN, whose sigmoid is 1.0 exactly
        in float32, so c(t-1) passes unscaled forward and its gradient unscaled back."""
        h = self.hidden
        sizes = torch.tensor(packed.sizes)
        zeros = gate_x.new_zeros(1, packed.sizes[0], h)
        if self.cell == "rnn":
            eye = torch.eye(h, device=gate_x.device, dtype=gate_x.dtype)
            out, _ = torch._VF.rnn_tanh(gate_x, sizes, zeros, [eye, self.w_rec], False, 1, 0.0, self.training, False)
            return packed.steps(out)
        # our gate order [i, f?, o, g] -> torch's [i, f, g, o]
        if self.forget_gate:
            (i, f, o, g), (wi, wf, wo, wg) = gate_x.split(h, 1), self.w_rec.split(h, 0)
        else:
            (i, o, g), (wi, wo, wg) = gate_x.split(h, 1), self.w_rec.split(h, 0)
            f, wf = gate_x.new_full((len(gate_x), h), FORGET_OPEN), self.w_rec.new_zeros(h, h)
        eye = torch.eye(4 * h, device=gate_x.device, dtype=gate_x.dtype)
        weights = [eye, torch.cat([wi, wf, wg, wo])]
        out, _, _ = torch._VF.lstm(
            torch.cat([i, f, g, o], 1), sizes, (zeros, zeros), weights, False, 1, 0.0, self.training, False
        )
        return packed.steps(out)


FORGET_OPEN = 40.0  # sigmoid(40) = 1 - 4e-18: 1.0 in float32 and float64


def _unsort(sorted_rows: Tensor, rank: Tensor) -> Tensor:
    """Rows back in the texts' original order (index_select: its backward is a cheap index_add)."""
    return sorted_rows.index_select(0, rank)


def _per_word(series: list[Tensor], rank: Tensor, batch: TextBatch, reverse: bool) -> Tensor:
    """One per-step quantity as (texts, words, H) in the texts' original order and word order."""
    x = _unsort(padded(series, len(batch)).transpose(0, 1), rank)
    return reverse_within(x, batch.lengths) if reverse else x


def _internals(
    steps: list[list[Tensor]], outputs: list[Tensor], rank: Tensor, batch: TextBatch, reverse: bool
) -> dict[str, Tensor]:
    """The cell's recorded [i, f, c, o] (f only with a forget gate) and its outputs y, per word."""
    series = dict(zip(["i", "f", "c", "o"], steps, strict=False)) | {"y": outputs}
    return {name: _per_word(s, rank, batch, reverse) for name, s in series.items() if s}


class LSTMEncoder(Encoder):
    """lstm (y at the last word), bilstm (forward and backward final states), lstm_avg (mean of y)."""

    def __init__(
        self, vocab_size: int, cfg: ModelConfig, cell: str = "lstm", pooling: str = "last", bidirectional: bool = False
    ):
        super().__init__()
        self.pooling = pooling
        self.forward_rnn = Recurrent(vocab_size, cfg, cell)
        self.backward_rnn = Recurrent(vocab_size, cfg, cell) if bidirectional else None
        self.dim = cfg.ncell * (2 if bidirectional else 1)

    def _direction(self, rnn: Recurrent, batch: TextBatch, reverse: bool, internals: bool):
        outputs, steps, packed = rnn.run(batch, reverse=reverse, record=internals)
        if self.pooling == "last":
            vec = _unsort(last_states(outputs, packed.sizes), packed.rank)
        else:
            total = packed.sum_per_text(torch.cat(outputs))
            vec = _unsort(total, packed.rank) / batch.lengths.unsqueeze(1).to(total.dtype)
        found = _internals(steps, outputs, packed.rank, batch, reverse) if internals else {}
        return vec, found

    def forward(self, batch: TextBatch, internals: bool = False):
        vec, found = self._direction(self.forward_rnn, batch, False, internals)
        if self.backward_rnn is not None:
            back, back_found = self._direction(self.backward_rnn, batch, True, internals)
            vec = torch.cat([vec, back], 1)
            found.update({f"bw_{k}": v for k, v in back_found.items()})
        return (vec, found) if internals else vec


class GRANEncoder(Encoder):
    """Wieting & Gimpel 2017's gated recurrent averaging network, eq. (1), and its variants
    (`model.gran_type`, as numbered in the authors' code, jwieting/acl2017), with x_t the word
    vector, h_t the LSTM output and σ(·) a gate over [x_t, h_t] (σ' a second one):

    1. GRAN: a_t = x_t ⊙ σ(W_x x_t + W_h h_t + b), g = mean_t a_t
    2. a_t = h_t ⊙ σ(...), g = mean_t a_t
    3. a_t = a_{t-1} ⊙ σ(...) + x_t ⊙ σ'(...), g = a_T
    4. as 3, with a_{t-1} also an input of both gates
    5. a_t = x_t ⊙ σ(...) + h_t ⊙ σ'(...), g = a_T

    `bidirectional` (encoder `bigran`) adds a second GRAN that reads the text backwards; the two
    vectors are summed (the authors' "sum layer"), so g stays ncell wide."""

    def __init__(self, vocab_size: int, cfg: ModelConfig, bidirectional: bool = False, reverse: bool = False):
        super().__init__()
        self.kind = cfg.gran_type
        self.reverse = reverse
        self.dim = cfg.ncell
        self.rnn = Recurrent(vocab_size, cfg, "lstm", extra=cfg.ncell)
        self.w_x = nn.Linear(cfg.ncell, cfg.ncell)
        self.w_h = nn.Linear(cfg.ncell, cfg.ncell, bias=False)
        if self.kind >= 3:
            self.w_x2 = nn.Linear(cfg.ncell, cfg.ncell)
            self.w_h2 = nn.Linear(cfg.ncell, cfg.ncell, bias=False)
        if self.kind == 4:
            self.w_a = nn.Linear(cfg.ncell, 2 * cfg.ncell, bias=False)  # a_{t-1} into both gates
        self.backward_gran = GRANEncoder(vocab_size, cfg, reverse=True) if bidirectional else None

    def _accumulate(self, packed: Packed, x: Tensor, h: Tensor) -> list[Tensor]:
        """Types 3 and 4: a_t = a_{t-1} ⊙ σ(...) + x_t ⊙ σ'(...), step by step in packed order."""
        pre1 = packed.steps(self.w_x(x) + self.w_h(h))
        pre2 = packed.steps(self.w_x2(x) + self.w_h2(h))
        words = packed.steps(x)
        steps: list[Tensor] = []
        a = x.new_zeros(packed.sizes[0], self.dim)
        for t, n in enumerate(packed.sizes):
            a = a[:n]
            g1, g2 = pre1[t], pre2[t]
            if self.kind == 4:
                extra = self.w_a(a)
                g1, g2 = g1 + extra[:, : self.dim], g2 + extra[:, self.dim :]
            a = a * torch.sigmoid(g1) + words[t] * torch.sigmoid(g2)
            steps.append(a)
        return steps

    def forward(self, batch: TextBatch, internals: bool = False):
        outputs, steps, packed = self.rnn.run(batch, reverse=self.reverse, record=internals)
        h = torch.cat(outputs)  # packed, aligned with packed.x
        x = packed.x[:, -self.dim :]  # x_t
        gate = torch.sigmoid(self.w_x(x) + self.w_h(h))
        if self.kind in (1, 2):
            a = (x if self.kind == 1 else h) * gate
            vec = _unsort(packed.sum_per_text(a), packed.rank) / batch.lengths.unsqueeze(1).to(h.dtype)
        else:
            if self.kind == 5:
                second = torch.sigmoid(self.w_x2(x) + self.w_h2(h))
                a_steps = packed.steps(x * gate + h * second)
            else:
                a_steps = self._accumulate(packed, x, h)
            vec = _unsort(last_states(a_steps, packed.sizes), packed.rank)
        found: dict[str, Tensor] = {}
        if internals:
            found = _internals(steps, outputs, packed.rank, batch, self.reverse)
            found["gran_gate"] = _per_word(packed.steps(gate), packed.rank, batch, self.reverse)
        if self.backward_gran is not None:
            back, back_found = self.backward_gran(batch, True) if internals else (self.backward_gran(batch), {})
            vec = vec + back
            found.update({f"bw_{k}": v for k, v in back_found.items()})
        return (vec, found) if internals else vec


class AvgEncoder(Encoder):
    """Wieting & Gimpel's word averaging: the mean of the text's word vectors (each word's summed
    trigram embeddings, or its own vector with model.tokens=words), ncell wide."""

    def __init__(self, vocab_size: int, cfg: ModelConfig):
        super().__init__()
        self.bag = HashingTable(vocab_size, cfg.ncell)
        self.dim = cfg.ncell
        self.dropout = cfg.dropout
        nn.init.uniform_(self.bag.weight, -1 / math.sqrt(cfg.ncell), 1 / math.sqrt(cfg.ncell))

    def forward(self, batch: TextBatch, internals: bool = False):
        lengths = batch.lengths.to(self.bag.weight.device)
        words = dropped(hashed_words(self.bag, batch), self.dropout, self.training)
        vec = text_sums(words, lengths) / lengths.unsqueeze(1).to(self.bag.weight.dtype)
        return (vec, {}) if internals else vec


class DSSMEncoder(Encoder):
    """Huang et al. 2013: the text's summed trigram vector through tanh layers (default 300-300-128)."""

    def __init__(self, vocab_size: int, cfg: ModelConfig):
        super().__init__()
        sizes = [*cfg.hidden, cfg.out_dim]
        self.bag = HashingTable(vocab_size, sizes[0])
        self.bias = nn.Parameter(torch.zeros(sizes[0]))
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=False))
        self.dim = sizes[-1]
        nn.init.uniform_(self.bag.weight, -1 / math.sqrt(sizes[0]), 1 / math.sqrt(sizes[0]))

    def forward(self, batch: TextBatch, internals: bool = False):
        h = torch.tanh(text_sums(hashed_words(self.bag, batch), batch.lengths) + self.bias)
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return (h, {}) if internals else h


class CLSMEncoder(Encoder):
    """Shen et al. 2014: conv over `window` words' trigram bags, max over positions, tanh semantic layer."""

    def __init__(self, vocab_size: int, cfg: ModelConfig):
        super().__init__()
        self.window = cfg.window
        self.channels = cfg.hidden[0]
        # One bag computes, per word, its contribution at every window offset: W_c split by offset.
        self.bag = HashingTable(vocab_size, cfg.window * self.channels)
        self.bias = nn.Parameter(torch.zeros(self.channels))
        self.semantic = nn.Linear(self.channels, cfg.out_dim)
        self.dim = cfg.out_dim
        bound = 1 / math.sqrt(self.channels)
        nn.init.uniform_(self.bag.weight, -bound, bound)

    def forward(self, batch: TextBatch, internals: bool = False):
        distinct = self.bag(batch.ids, batch.offsets)  # (distinct words, window*K)
        # Row w*window + k of `blocks` is distinct word w's contribution at window offset k; the
        # last row is zeros for positions past a text's ends. Gathering those rows per offset costs
        # one (N·T, K) read each, where slicing padded (N, T, window, K) word vectors cost a
        # full-size zero gradient per slice (10x slower, issue 19).
        blocks = torch.cat([distinct.view(-1, self.channels), distinct.new_zeros(1, self.channels)])
        n, t, positions = padded_positions(batch.host_lengths())
        half = self.window // 2
        grid = torch.full((n * t,), -1, dtype=torch.long).index_copy(0, positions, batch.words.cpu())
        grid = nn.functional.pad(grid.view(n, t), (half, half), value=-1).to(blocks.device)
        conv = self.bias
        for k in range(self.window):  # the word at position p + k − half, its offset-k block
            word = grid[:, k : k + t]
            rows = torch.where(word >= 0, word * self.window + k, len(blocks) - 1)
            conv = conv + blocks.index_select(0, rows.reshape(-1)).view(n, t, self.channels)
        conv = torch.tanh(conv)  # (N, T, K)
        mask = torch.arange(t, device=conv.device).unsqueeze(0) < batch.lengths.unsqueeze(1)
        pooled = conv.masked_fill(~mask.unsqueeze(2), float("-inf")).max(1).values
        out = torch.tanh(self.semantic(pooled))
        return (out, {"conv": conv}) if internals else out


@dataclass(frozen=True)
class EncoderSpec:
    build: Callable[[int, ModelConfig], Encoder]
    recurrent: bool  # records per-step gates and cells for `dssm analyze`
    what: str  # one line for --help and docs/training.md
    transformer: bool = False  # reads word pieces with its own tokenizer; AdamW (optim.name=auto)


def _minilm(vocab_size: int, cfg: ModelConfig) -> Encoder:
    from modeling.transformer import MiniLMEncoder  # imports transformers: only when asked for

    return MiniLMEncoder(vocab_size, cfg)


# The single list of encoders: config validation, CLI help, the analysis stage and the docs read it.
ENCODERS: dict[str, EncoderSpec] = {
    "lstm": EncoderSpec(LSTMEncoder, True, "LSTM-RNN, eq. (2); y(T) at the last word"),
    "rnn": EncoderSpec(lambda v, c: LSTMEncoder(v, c, cell="rnn"), True, "eq. (1), tanh"),
    "bilstm": EncoderSpec(
        lambda v, c: LSTMEncoder(v, c, bidirectional=True), True, "forward and backward LSTM-RNN, concatenated"
    ),
    "dssm": EncoderSpec(DSSMEncoder, False, "Huang et al. 2013: trigram bag through tanh layers"),
    "clsm": EncoderSpec(CLSMEncoder, False, "Shen et al. 2014: convolution over word windows, max-pool"),
    "lstm_avg": EncoderSpec(
        lambda v, c: LSTMEncoder(v, c, pooling="mean"), True, "Wieting & Gimpel: mean of the LSTM outputs"
    ),
    "bilstm_avg": EncoderSpec(
        lambda v, c: LSTMEncoder(v, c, pooling="mean", bidirectional=True), False, "lstm_avg in both directions"
    ),
    "gran": EncoderSpec(GRANEncoder, False, "Wieting & Gimpel: gated recurrent averaging network"),
    "bigran": EncoderSpec(lambda v, c: GRANEncoder(v, c, bidirectional=True), False, "gran in both directions"),
    "avg": EncoderSpec(AvgEncoder, False, "Wieting & Gimpel: mean of the word vectors"),
    "minilm": EncoderSpec(
        _minilm, False, "all-MiniLM-L6-v2 (bundled), fine-tuned: its top model.train_layers layers", transformer=True
    ),
}


def build_encoder(vocab_size: int, cfg: ModelConfig) -> Encoder:
    if cfg.encoder not in ENCODERS:
        raise ValueError(f"unknown encoder {cfg.encoder!r}")
    return ENCODERS[cfg.encoder].build(vocab_size, cfg)


def tokenizer_for(cfg: ModelConfig, vocab: Vocab, cache_size: int = 100_000) -> Tokenizer | WordPieceTokenizer:
    """What turns texts into the encoder's batches: letter-trigram (or word) ids of the `dssm vocab`
    vocabulary, or a transformer's own word pieces."""
    if ENCODERS[cfg.encoder].transformer:
        from modeling.transformer import WordPieceTokenizer

        return WordPieceTokenizer(cfg.max_tokens)
    return Tokenizer(vocab, cfg.max_words, cache_size=cache_size)
