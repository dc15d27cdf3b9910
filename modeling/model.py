"""The two-tower retrieval model, the paper's objective, eq. (5), and Wieting & Gimpel's paraphrase
objective (`loss.objective`).

P(D+|Q) = exp(γ·cos(Q, D+)) / Σ_{D ∈ {D+} ∪ negatives} exp(γ·cos(Q, D)); the loss is −log of it,
averaged over the batch. Query and document towers are separate by default (Λ_Q, Λ_D, as in
Algorithm 1); `shared_towers` ties them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from modeling.config import LossConfig, ModelConfig
from modeling.data import ListTargets
from modeling.encoder import Encoder
from modeling.encoders import build_encoder
from modeling.hashing import TextBatch


class TwoTower(nn.Module):
    def __init__(self, vocab_size: int, cfg: ModelConfig):
        super().__init__()
        self.query_encoder = build_encoder(vocab_size, cfg)
        self.doc_encoder = self.query_encoder if cfg.shared_towers else build_encoder(vocab_size, cfg)
        self.dim = self.query_encoder.dim

    def encode_queries(self, batch: TextBatch) -> Tensor:
        return self.query_encoder(batch)

    def encode_docs(self, batch: TextBatch) -> Tensor:
        return self.doc_encoder(batch)

    def forward(
        self, queries: TextBatch, docs: TextBatch, listed: TextBatch | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Query vectors (B, dim), document vectors (B, 1 + n, dim) (clicked title first) and the
        vectors of `listed` (the shown titles of listwise targets; None without them). One forward
        encodes all, so DDP sees every use of the document tower. A shared word-hashing tower reads
        all the texts in one call: one recurrent loop per step, not two (on a GPU, half the launches)."""
        batches = [queries, docs] + ([listed] if listed is not None else [])
        if self.doc_encoder is self.query_encoder and all(isinstance(b, TextBatch) for b in batches):
            vectors = self.query_encoder(TextBatch.cat(batches)).split([len(b) for b in batches])
            q, d, listed_vectors = vectors[0], vectors[1], (vectors[2] if listed is not None else None)
        else:
            q = self.encode_queries(queries)
            d = self.encode_docs(docs)
            listed_vectors = self.encode_docs(listed) if listed is not None else None
        return q, d.view(q.shape[0], -1, d.shape[1]), listed_vectors


class _GatherRows(torch.autograd.Function):
    """Every rank's rows, concatenated in rank order. The backward hands each rank the sum over ranks
    of the gradient for its own rows (a reduce-scatter, done as an all_reduce because gloo has no
    reduce_scatter), so DDP's averaged gradient is the gradient of the global batch's mean loss."""

    @staticmethod
    def forward(ctx, rows: Tensor) -> Tensor:
        parts = [torch.empty_like(rows) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, rows.contiguous())
        ctx.span = (dist.get_rank() * rows.shape[0], rows.shape[0])
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        start, rows = ctx.span
        return grad[start : start + rows]


def _gather_keys(keys: Tensor) -> Tensor:
    """Every rank's row keys, concatenated in rank order like `_GatherRows` (no gradient)."""
    parts = [torch.empty_like(keys) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, keys.contiguous())
    return torch.cat(parts)


def click_loss(
    q: Tensor,
    d: Tensor,
    cfg: LossConfig,
    weights: Tensor | None = None,
    across_ranks: bool = False,
    keys: Tensor | None = None,
) -> Tensor:
    """Eq. (5): softmax over γ·cos of the clicked title (index 0) and its negatives; mean −log P
    (a `weights`-weighted mean when given).

    With `in_batch_negatives`, every other example's clicked title is a negative too: those of the
    whole global batch when `across_ranks` (training under DDP), so the objective does not depend on
    the number of processes. With `mask_in_batch` too, `keys` ((B, 2) [query, clicked title] keys,
    `modeling.data.row_keys`) drop the other rows that share the row's query or its clicked title."""
    if q.dtype in (torch.float16, torch.bfloat16):  # autocast outputs: score in fp32
        q, d = q.float(), d.float()
    q = F.normalize(q, dim=-1, eps=1e-8)
    d = F.normalize(d, dim=-1, eps=1e-8)
    scores = torch.einsum("bh,bkh->bk", q, d)  # (B, 1 + n)
    if cfg.in_batch_negatives:
        clicked, offset = (_GatherRows.apply(d[:, 0]), dist.get_rank() * q.shape[0]) if across_ranks else (d[:, 0], 0)
        others = q @ clicked.t()  # (B, global B): each row's own clicked title at column offset + row
        own = torch.arange(q.shape[0], device=q.device)
        others = others.index_put((own, own + offset), others.new_tensor(float("-inf")))
        if cfg.mask_in_batch:
            # another click of the same query is relevant to this row, and the same clicked title
            # is this row's positive again: as negatives both would push relevant titles away
            if keys is None:
                raise ValueError("loss.mask_in_batch needs the rows' keys")
            keys = keys.to(q.device)
            every = _gather_keys(keys) if across_ranks else keys
            shared = (keys.unsqueeze(1) == every.unsqueeze(0)).any(2)  # (B, global B)
            others = others.masked_fill(shared, float("-inf"))
        scores = torch.cat([scores, others], 1)
    target = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
    if weights is None:
        return F.cross_entropy(cfg.gamma * scores, target)
    losses = F.cross_entropy(cfg.gamma * scores, target, reduction="none")
    return (losses * weights).sum() / weights.sum().clamp_min(1e-12)


def listwise_loss(q: Tensor, listed: Tensor, mask: Tensor, targets: Tensor, gamma: float) -> Tensor:
    """Cross-entropy of each list's targets (L, K) against the softmax over γ·cos of its query `q`
    (L, dim) and its shown titles (`listed`: the vectors of `mask`'s slots, list after list); mean
    over the lists."""
    if q.dtype in (torch.float16, torch.bfloat16):
        q, listed = q.float(), listed.float()
    q = F.normalize(q, dim=-1, eps=1e-8)
    slots = listed.new_zeros(*mask.shape, listed.shape[1])
    slots[mask] = F.normalize(listed, dim=-1, eps=1e-8)
    scores = (gamma * torch.einsum("lh,lkh->lk", q, slots)).masked_fill(~mask, float("-inf"))
    log_p = torch.log_softmax(scores, 1).masked_fill(~mask, 0.0)
    return -(targets * log_p).sum(1).mean()


def paraphrase_loss(s1: Tensor, s2: Tensor, groups: Tensor, margin: float) -> Tensor:
    """Wieting & Gimpel 2017, eq. (2), averaged over the batch:
    max(0, δ − cos(s1, s2) + cos(s1, t1)) + max(0, δ − cos(s1, s2) + cos(s2, t2)), where t1 (t2) is
    the sentence of the mini-batch most similar to s1 (s2) that is not of its own pair; rows with
    the same `groups` id (the same first sentence) never serve as each other's negatives."""
    if s1.dtype in (torch.float16, torch.bfloat16):
        s1, s2 = s1.float(), s2.float()
    s1 = F.normalize(s1, dim=-1, eps=1e-8)
    s2 = F.normalize(s2, dim=-1, eps=1e-8)
    positive = (s1 * s2).sum(1)
    candidates = torch.cat([s1, s2])  # (2B, h)
    same = groups.to(s1.device).unsqueeze(1) == groups.to(s1.device).repeat(2).unsqueeze(0)  # (B, 2B)
    losses = torch.zeros_like(positive)
    for anchor in (s1, s2):
        sims = (anchor @ candidates.t()).masked_fill(same, float("-inf"))
        hardest = sims.max(1).values
        usable = torch.isfinite(hardest)  # a batch of one pair has no negative
        losses = losses + torch.where(usable, F.relu(margin - positive + hardest), torch.zeros_like(positive))
    return losses.mean()


def training_loss(
    q: Tensor,
    d: Tensor,
    cfg: LossConfig,
    weights: Tensor | None,
    keys: Tensor,
    across_ranks: bool = False,
    lists: ListTargets | None = None,
    listed: Tensor | None = None,
) -> Tensor:
    """The configured objective on a batch: `q` the queries (first sentences), `d` (B, 1 + n, dim)
    the clicked titles (second sentences) and their negatives, `keys` the rows' (B, 2) [query,
    clicked title] keys (`modeling.data.row_keys`); with `loss.listwise` = λ > 0 and
    `lists` (the rows' listwise targets, `listed` their titles' vectors), (1 − λ)·eq. (5) +
    λ·`listwise_loss`. Under DDP each rank averages its own lists."""
    if cfg.objective == "paraphrase":
        return paraphrase_loss(q, d[:, 0], keys[:, 0], cfg.margin)
    loss = click_loss(q, d, cfg, weights, across_ranks, keys)
    if cfg.listwise and lists is not None and listed is not None:
        ranked = listwise_loss(q[lists.rows], listed, lists.mask, lists.targets, cfg.gamma)
        loss = (1 - cfg.listwise) * loss + cfg.listwise * ranked
    return loss


def embedding_tables(model: nn.Module) -> dict[str, Tensor]:
    """The token embedding tables its encoders name (`Encoder.token_tables`), by parameter name: W of
    Wieting & Gimpel's λ_w term. A table shared by both towers appears once."""
    tables = {id(t.weight) for m in model.modules() if isinstance(m, Encoder) for t in m.token_tables()}
    return {name: p for name, p in model.named_parameters() if id(p) in tables}


def regulariser(model: nn.Module, initial: dict[str, Tensor], cfg: LossConfig) -> Tensor | None:
    """λ_c/2·‖θ_composition‖² + λ_w/2·‖W − W_initial‖² (None when both are off). `initial` holds
    the embedding tables at step 0; shared towers count their parameters once."""
    terms = []
    if cfg.l2_composition > 0:
        tables = embedding_tables(model)
        squares = [p.pow(2).sum() for name, p in model.named_parameters() if name not in tables]
        terms.append(0.5 * cfg.l2_composition * torch.stack(squares).sum())
    if cfg.l2_embeddings > 0:
        tables = embedding_tables(model)
        squares = [(tables[name] - start).pow(2).sum() for name, start in initial.items()]
        terms.append(0.5 * cfg.l2_embeddings * torch.stack(squares).sum())
    return torch.stack(terms).sum() if terms else None
