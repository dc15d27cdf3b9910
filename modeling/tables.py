"""Row-wise updates of the word-hashing tables (`optim.table_updates`): the same Nesterov momentum,
computed only for the rows a batch touches.

A Home Depot batch of 256 examples reads 5,443 of a 30,000-row table, but a dense update touches
every row each step: a zero-filled full-size gradient, its norm, the optimiser pass over weights
and momentum, and under DDP a 35 MB all-reduce. Here:

- `HashingTable` is an `nn.EmbeddingBag(mode="sum")` with the same parameter and state_dict. While
  training under `TableRows`, it gathers the batch's distinct rows into a small leaf tensor, so
  backward yields one gradient row per touched row and never a full-size gradient.
- `TableRows` sums those rows (over ranks under DDP by gathering them, not all-reducing a dense
  table) and applies SGD with Nesterov momentum to them, with the optimiser's own momentum buffers.
- A row a batch does not touch still moves in the dense algorithm: its buffer decays (b ← μb) and
  the weight follows (p ← p − ε·μ·b) every step. That drift is applied in closed form when the row
  is next read: μ is constant over long runs of steps (the paper's schedule has three), and over k
  steps of one run p moves by ε·b·μ²(1 − μ^k)/(1 − μ) while b becomes μ^k·b.
- `catch_up` brings every row up to date before the weights are read outside training (validation,
  checkpoints), so a checkpoint equals the dense algorithm's up to float rounding (tested) and
  resumes in either mode.

Exact only for SGD with momentum, a constant step size and no weight decay or λ_w term, whose
gradient is zero for untouched rows; `optim.table_updates=auto` uses rows exactly then.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn


class HashingTable(nn.EmbeddingBag):
    """A word-hashing table: per word, the sum of its trigram rows (W·l(t) for all gates at once)."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__(num_embeddings, embedding_dim, mode="sum")
        self.rows: TableRows | None = None  # set while a training run updates this table row-wise

    def forward(self, ids: Tensor, offsets: Tensor) -> Tensor:
        if self.rows is not None and self.training and torch.is_grad_enabled():
            return self.rows.embed(self, ids, offsets)
        return super().forward(ids, offsets)


def momentum_runs(momentum: Iterable[float]) -> list[tuple[int, int, float]]:
    """(first step, last step, μ) for each run of equal μ, steps counted from 1."""
    runs: list[tuple[int, int, float]] = []
    for step, mu in enumerate(momentum, 1):
        if runs and runs[-1][2] == mu:
            runs[-1] = (runs[-1][0], step, mu)
        else:
            runs.append((step, step, mu))
    return runs


class TableRows:
    """Row-wise Nesterov updates of `tables`, whose momentum buffers live in `optimizer.state` (an
    SGD that updates every other parameter). `runs`: the momentum schedule (`momentum_runs`);
    `step`: updates already applied (a resumed run's step; every row is up to date there)."""

    def __init__(
        self,
        tables: list[HashingTable],
        optimizer: torch.optim.Optimizer,
        runs: list[tuple[int, int, float]],
        step: int,
        across_ranks: bool,
    ):
        self.tables = tables
        self.optimizer = optimizer
        self.runs = runs
        self.step = step
        self.across_ranks = across_ranks
        self.group = {id(p): g for g in optimizer.param_groups for p in g["params"]}
        self.last = {t: torch.full((t.num_embeddings,), step, dtype=torch.long, device=t.weight.device) for t in tables}
        self.pending: dict[HashingTable, list[tuple[Tensor, Tensor]]] = {t: [] for t in tables}
        self.ready: dict[HashingTable, tuple[Tensor, Tensor]] = {}
        self.sent_bytes = 0  # row gradients this rank has sent to the others
        for t in tables:
            t.rows = self
            t.weight.requires_grad_(False)  # updated here, from row gradients: DDP leaves it alone

    def release(self) -> None:
        """The tables back to plain autograd parameters."""
        for t in self.tables:
            t.rows = None
            t.weight.requires_grad_(True)

    def embed(self, table: HashingTable, ids: Tensor, offsets: Tensor) -> Tensor:
        rows, local = torch.unique(ids, return_inverse=True)
        self._advance(table, rows)
        part = table.weight.index_select(0, rows).requires_grad_()
        self.pending[table].append((rows, part))
        return F.embedding_bag(local, part, offsets, mode="sum")

    def gradients(self) -> list[Tensor]:
        """This step's row gradients, one block per table, summed over the batch's reads and (mean)
        over ranks, as DDP averages the other parameters': what gradient clipping sees and scales."""
        for table, parts in self.pending.items():
            if not parts:
                continue
            rows = torch.cat([r for r, _ in parts])
            grad = torch.cat([p.grad if p.grad is not None else torch.zeros_like(p) for _, p in parts])
            parts.clear()
            if self.across_ranks:
                rows, grad = self._from_all_ranks(rows, grad)
            rows, where = torch.unique(rows, return_inverse=True)
            summed = grad.new_zeros(len(rows), grad.shape[1]).index_add_(0, where, grad)
            if self.across_ranks:
                summed /= dist.get_world_size()
            self.ready[table] = (rows, summed)
        return [g for _, g in self.ready.values()]

    def _from_all_ranks(self, rows: Tensor, grad: Tensor) -> tuple[Tensor, Tensor]:
        """Every rank's (rows, gradient rows), concatenated: padded to the longest, all-gathered."""
        world = dist.get_world_size()
        count = torch.tensor([len(rows)], device=rows.device)
        counts = [torch.empty_like(count) for _ in range(world)]
        dist.all_gather(counts, count)
        longest = int(max(counts))
        rows = F.pad(rows, (0, longest - len(rows)))
        grad = F.pad(grad, (0, 0, 0, longest - len(grad)))
        all_rows = [torch.empty_like(rows) for _ in range(world)]
        all_grads = [torch.empty_like(grad) for _ in range(world)]
        dist.all_gather(all_rows, rows)
        dist.all_gather(all_grads, grad)
        self.sent_bytes += (world - 1) * (count.nbytes + rows.nbytes + grad.nbytes)
        keep = [int(c) for c in counts]
        return (
            torch.cat([r[:n] for r, n in zip(all_rows, keep, strict=True)]),
            torch.cat([g[:n] for g, n in zip(all_grads, keep, strict=True)]),
        )

    @torch.no_grad()
    def update(self) -> None:
        """Update `step + 1` on the rows of `gradients()` (each already brought to `step` by `embed`):
        torch's SGD with Nesterov momentum, b ← μb + g, p ← p − ε(g + μb)."""
        self.step += 1
        for table, (rows, grad) in self.ready.items():
            group = self.group[id(table.weight)]
            lr, mu = group["lr"], group["momentum"]
            buffer = self._buffer(table, create=True)
            b = buffer.index_select(0, rows).mul_(mu).add_(grad)
            p = table.weight.index_select(0, rows).sub_(grad.add(b, alpha=mu), alpha=lr)
            buffer.index_copy_(0, rows, b)
            table.weight.index_copy_(0, rows, p)
            self.last[table].index_fill_(0, rows, self.step)
        self.ready = {}

    @torch.no_grad()
    def catch_up(self) -> None:
        """Every row of every table up to date: the weights and buffers the dense algorithm has."""
        for table in self.tables:
            self._advance(table, None)

    def _buffer(self, table: HashingTable, create: bool = False) -> Tensor | None:
        state = self.optimizer.state[table.weight]
        if "momentum_buffer" not in state and create:  # torch's SGD starts it at the first gradient
            state["momentum_buffer"] = torch.zeros_like(table.weight)
        return state.get("momentum_buffer")

    @torch.no_grad()
    def _advance(self, table: HashingTable, rows: Tensor | None) -> None:
        """Apply to `rows` (None: all) the momentum-only updates they missed since they were last
        touched, up to `self.step`."""
        last = self.last[table] if rows is None else self.last[table].index_select(0, rows)
        behind = last < self.step
        rows = behind.nonzero().squeeze(1) if rows is None else rows[behind]
        if len(rows) == 0:
            return
        last = last[behind]
        buffer = self._buffer(table)
        if buffer is not None:
            lr = self.group[id(table.weight)]["lr"]
            b = buffer.index_select(0, rows)
            moved = torch.zeros_like(b)
            first = int(last.min()) + 1
            for lo, hi, mu in self.runs:
                if hi < first or lo > self.step:
                    continue
                k = (min(hi, self.step) - torch.clamp(last + 1, min=lo) + 1).clamp_min(0).to(b.dtype).unsqueeze(1)
                decay = torch.pow(mu, k)
                drift = k if mu == 1 else mu * mu * (1 - decay) / (1 - mu)  # Σ_{j=1..k} μ^(j+1)
                moved.addcmul_(b, drift)
                b.mul_(decay)
            table.weight.index_copy_(0, rows, table.weight.index_select(0, rows).sub_(moved, alpha=lr))
            buffer.index_copy_(0, rows, b)
        self.last[table].index_fill_(0, rows, self.step)
