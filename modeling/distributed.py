"""The ranks of a training run: the process group (NCCL on GPUs, gloo on CPU), each rank's device,
the collectives the loop calls between ranks, and how a torchrun rank exits.

One process (WORLD_SIZE unset or 1) is a world of one: every helper here is then a no-op.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from core.errors import DssmError

if TYPE_CHECKING:
    from modeling.config import TrainJob


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def default_nproc() -> int:
    """Training processes when none are asked for: one rank per GPU when there are GPUs, else one CPU process."""
    return torch.cuda.device_count() or 1


def device_kind(cfg: TrainJob) -> str:
    """ "cuda" or "cpu": what `pick_device` will choose, known before the process group exists."""
    return "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"


def init_distributed(device_kind: str) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    backend = "nccl" if device_kind == "cuda" else "gloo"
    dist.init_process_group(backend)
    return Dist(dist.get_rank(), world, int(os.environ.get("LOCAL_RANK", "0")))


def close_distributed(d: Dist) -> None:
    if d.world > 1 and dist.is_initialized():
        dist.destroy_process_group()


def pick_device(cfg: TrainJob, local_rank: int) -> torch.device:
    if device_kind(cfg) == "cuda":
        if not torch.cuda.is_available():
            raise DssmError("device=cuda but no CUDA device is visible")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def describe(device: torch.device, precision: str) -> str:
    """What a run trains on, for its log: the GPU's name and the precision, or the CPU threads."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)}, {precision})"
    return f"cpu ({torch.get_num_threads()} threads)"


def barrier(d: Dist) -> None:
    """Wait for every rank (nothing to wait for in a world of one)."""
    if d.world > 1:
        dist.barrier()


def summed_over_ranks(value: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.world > 1:
        value = value.clone()
        dist.all_reduce(value)
    return value


def fixed_bytes_sent(model: torch.nn.Module, cfg: TrainJob, d: Dist) -> int:
    """Bytes a rank sends per step in collectives of fixed size: DDP's ring all-reduce of the
    gradients it manages (2(W−1)/W of their size) and, with in-batch negatives, the all-gather of
    the clicked titles' vectors and its backward all-reduce, and with `mask_in_batch` the all-gather
    of the rows' keys. (Row-wise tables count their own.)"""
    if d.world == 1:
        return 0
    ring = 2 * (d.world - 1) / d.world
    dense = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    gathered = 0
    if cfg.loss.objective == "click" and cfg.loss.in_batch_negatives:
        rows = cfg.data.batch_size * model.dim * 4  # float32 vectors of the global batch
        gathered = rows // d.world * (d.world - 1) + ring * rows
        if cfg.loss.mask_in_batch:
            gathered += cfg.data.batch_size * 2 * 8 // d.world * (d.world - 1)  # (B, 2) int64 keys
    return int(ring * dense + gathered)


def exit_rank(code: int) -> None:
    """Leave a torchrun rank without interpreter finalisation. The process group is destroyed by then
    (train's finally), but gloo's C++ threads can outlive it in objects freed only at finalisation,
    where a still-joinable std::thread aborts the rank ("terminate called without an active
    exception", SIGABRT) after a finished run, and torchrun reports the run failed. Everything a rank
    writes (checkpoint, summary, MLflow run) is closed before train returns."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
