"""Algorithm 1's optimiser: Nesterov momentum SGD with a fixed step size, the paper's momentum
schedule, and gradient re-normalisation at th_G (global L2 norm). Adam is an option, and AdamW the
transformer encoder's optimiser (`optim.name=auto`).

PyTorch's `SGD(nesterov=True)` is the common reformulation of Nesterov momentum
(Sutskever et al. 2013) that evaluates the gradient at the current parameters.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from modeling.config import OptimConfig, TrainJob, optimizer_name, rows_are_exact
from modeling.tables import HashingTable, TableRows, momentum_runs


def build_optimizer(model: nn.Module, train: TrainJob) -> torch.optim.Optimizer:
    cfg = train.optim
    params = [p for p in model.parameters() if p.requires_grad]
    name = optimizer_name(train)
    fused = bool(params) and params[0].is_cuda  # on a GPU: a few kernels per step for all tensors, not several each
    if name == "adamw":
        return torch.optim.AdamW(params, lr=cfg.adamw_lr, weight_decay=cfg.weight_decay, fused=fused or None)
    if name == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=fused or None)
    # fused: one pass over each tensor per step (the embedding tables dominate memory traffic)
    return torch.optim.SGD(
        params, lr=cfg.lr, momentum=cfg.momentum_edge_value, nesterov=True, weight_decay=cfg.weight_decay, fused=True
    )


def momentum_at(step: int, total: int, cfg: OptimConfig) -> float:
    """μ for update `step` (1-based) of `total`: the edge value in the first and last 2%, else 0.995."""
    edge = cfg.momentum_edge * total
    if step <= edge or step > total - edge:
        return cfg.momentum_edge_value
    return cfg.momentum


def step_size_factor(step: int, total: int, cfg: OptimConfig) -> float:
    """The step size of update `step` (1-based) of `total`, relative to the configured one: rising
    linearly over the first `warmup` share of updates, then constant or (`decay=linear`) falling
    linearly to 0 after the last update (sentence-transformers' WarmupLinear)."""
    warm = math.ceil(cfg.warmup * total)
    if step <= warm:
        return step / warm
    if cfg.decay == "linear":
        return (total - step + 1) / (total - warm)
    return 1.0


def set_schedule(optimizer: torch.optim.Optimizer, step: int, total: int, train: TrainJob) -> float:
    """The momentum (Nesterov) and step size of update `step` set on every parameter group; returns μ."""
    cfg = train.optim
    mu = momentum_at(step, total, cfg)
    name = optimizer_name(train)
    if name == "nesterov":
        for group in optimizer.param_groups:
            group["momentum"] = mu
    if cfg.warmup or cfg.decay != "none":
        lr = (cfg.adamw_lr if name == "adamw" else cfg.lr) * step_size_factor(step, total, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
    return mu


def table_rows(
    model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainJob, step: int, total: int, across_ranks: bool
) -> TableRows | None:
    """Row-wise updates of the model's word-hashing tables from update `step` on (None: dense)."""
    if cfg.optim.table_updates == "dense" or not rows_are_exact(cfg):
        return None
    tables = [m for m in model.modules() if isinstance(m, HashingTable)]  # a shared table once
    runs = momentum_runs(momentum_at(s, total, cfg.optim) for s in range(1, total + 1))
    return TableRows(tables, optimizer, runs, step, across_ranks)
