"""The recurrent loops of eq. (1) (RNN) and eq. (2) (LSTM-RNN), over length-sorted packed batches.

Texts are sorted by length, longest first, so at step t only the first n_t texts still have a
word: the loop shrinks the batch instead of computing on padding, and padding can never leak into
a state. Inputs already hold `W·l(t) + b` for every gate (the word-hashing EmbeddingBag computes
them for all words at once); the loop adds the recurrent part.

Three implementations of the same loop (`model.impl`): `loop` (plain Python), `script`
(TorchScript, CPU only) and `native` (torch's LSTM/RNN kernels, cuDNN on a GPU: the tanh RNN and the
LSTM without peepholes, the paper's cell as an LSTM with its forget gate held open;
`modeling/encoders.Recurrent._native`). `auto` is native on a GPU, the loop on the CPU.
benchmarks/train_bench.py compares them.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def lstm_loop(
    x: list[Tensor],
    w_rec: Tensor,
    peep: Optional[Tensor],  # noqa: UP045 (TorchScript reads typing.Optional)
    forget_gate: bool,
    record: bool,
) -> tuple[list[Tensor], list[list[Tensor]]]:
    """x: per step, (n_t, G*H) gate inputs of the texts still running, gates ordered [i, f?, o, g]
    (the sigmoid gates first, so one sigmoid call covers them). Returns y(t) per step ((n_t, H)
    each) and, with `record`, [i, f, c, o] per step (f empty without a forget gate)."""
    n0 = x[0].shape[0]
    hidden = w_rec.shape[1]
    sig = (3 if forget_gate else 2) * hidden
    y = x[0].new_zeros(n0, hidden)
    c = x[0].new_zeros(n0, hidden)
    outputs: list[Tensor] = []
    internals: list[list[Tensor]] = [[], [], [], []]
    for t in range(len(x)):
        n = x[t].shape[0]
        y = y[:n]
        c = c[:n]
        # split/chunk, not slicing: their backward is one cat, a slice's a zero-filled full copy
        sig_part, g = torch.addmm(x[t], y, w_rec.t()).split([sig, hidden], 1)
        g = torch.tanh(g)
        if peep is None:
            parts = torch.sigmoid(sig_part).chunk(sig // hidden, 1)
            i, o = parts[0], parts[-1]
            f = parts[1] if forget_gate else i
        else:  # peepholes: i and f see c(t-1), o sees c(t)
            parts = sig_part.chunk(sig // hidden, 1)
            i = torch.sigmoid(parts[0] + peep[0] * c)
            f = torch.sigmoid(parts[1] + peep[1] * c) if forget_gate else i
            o = parts[-1]
        c = torch.addcmul(f * c, i, g) if forget_gate else torch.addcmul(c, i, g)
        if peep is not None:
            o = torch.sigmoid(o + peep[2] * c)
        y = o * torch.tanh(c)
        outputs.append(y)
        if record:
            internals[0].append(i)
            if forget_gate:
                internals[1].append(f)
            internals[2].append(c)
            internals[3].append(o)
    return outputs, internals


def rnn_loop(x: list[Tensor], w_rec: Tensor) -> list[Tensor]:
    """Eq. (1): y(t) = tanh(W·l(t) + b + W_rec·y(t-1)); x[t] holds W·l(t) + b of the running texts."""
    y = x[0].new_zeros(x[0].shape[0], w_rec.shape[1])
    outputs: list[Tensor] = []
    for t in range(len(x)):
        n = x[t].shape[0]
        y = torch.tanh(torch.addmm(x[t], y[:n], w_rec.t()))
        outputs.append(y)
    return outputs


_scripted: dict[str, object] = {}


def scripted(name: str):
    """The TorchScript version of `lstm_loop` or `rnn_loop`, compiled once per process."""
    if name not in _scripted:
        _scripted[name] = torch.jit.script({"lstm": lstm_loop, "rnn": rnn_loop}[name])
    return _scripted[name]


def last_states(outputs: list[Tensor], batch_sizes: list[int]) -> Tensor:
    """Each sorted text's output at its last real word: texts [n_{t+1}, n_t) end at step t."""
    pieces = []
    for t in range(len(batch_sizes) - 1, -1, -1):
        start = batch_sizes[t + 1] if t + 1 < len(batch_sizes) else 0
        if batch_sizes[t] > start:
            pieces.append(outputs[t][start : batch_sizes[t]])
    return torch.cat(pieces, 0)


def padded(steps: list[Tensor], n: int) -> Tensor:
    """(T, n, H) from per-step (n_t, H) tensors, zeros past each text's end."""
    return torch.stack([torch.nn.functional.pad(s, (0, 0, 0, n - s.shape[0])) for s in steps])


def batch_sizes_of(sorted_lengths: Tensor) -> list[int]:
    """For lengths sorted descending (on the CPU, each >= 1): how many texts have a word at step t,
    for t < max length."""
    longest = int(sorted_lengths[0])
    texts_of_length = torch.bincount(sorted_lengths, minlength=longest + 1)
    return (len(sorted_lengths) - torch.cumsum(texts_of_length, 0)[:longest]).tolist()
