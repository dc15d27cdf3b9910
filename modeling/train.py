"""The training loop (Algorithm 1 of Palangi et al. 2016) under torch DDP.

`train(cfg)` trains one model in this process, or as one rank of a torchrun job (`dssm train --nproc N`,
modeling/launch.py). NCCL on GPUs, gloo on CPU. Every rank streams its own shards; rank 0 alone logs to
MLflow and checkpoints. Read top down: `train` → `_train` (inputs, how the run begins) → `setup` (model,
DDP, optimiser, tracker) → `loop` → `train_step`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from core.artifacts import code_fingerprint, lineage, require_manifest
from core.errors import DssmError
from core.layout import Layout
from core.locks import output_lock
from core.machine import cpus_per_process
from core.stopping import is_stop
from core.tracking import default_tracking_uri
from modeling.checkpoint import LAST, save_checkpoint, warm_start
from modeling.config import TrainJob, check_device
from modeling.data import ClickBatches, plan, train_files
from modeling.distributed import (
    Dist,
    barrier,
    close_distributed,
    describe,
    device_kind,
    fixed_bytes_sent,
    init_distributed,
    pick_device,
    summed_over_ranks,
)
from modeling.encoders import ENCODERS, tokenizer_for
from modeling.hashing import Vocab
from modeling.model import TwoTower, embedding_tables, regulariser, training_loss
from modeling.optim import build_optimizer, set_schedule, table_rows
from modeling.resume import Start, decide
from modeling.tables import TableRows
from modeling.tokens import load_or_build
from modeling.tracker import Tracker

log = logging.getLogger("dssm.train")
# worker processes building a GPU run's batches (one's rate: BENCHMARKS.md, the training input pipeline)
LOADERS_ON_GPU = 2


def train(cfg: TrainJob, resume: bool = False, on_change: str | None = None) -> dict[str, Any]:
    """Train one model; returns a summary (steps, losses, throughput, checkpoint, MLflow run id).

    resume: continue the checkpoint in cfg.out (else a checkpoint there is an error); on_change:
    what a checkpoint of other data, code or config means (see `modeling.resume.decide`): "restart"
    trains afresh (the pipeline), default "resume" (`dssm train --resume`) or "error".
    """
    on_change = on_change or ("resume" if resume else "error")
    d = init_distributed(device_kind(cfg))
    try:
        # rank 0 writes the run directory: a second `dssm train` into it fails here, naming this one
        with output_lock(cfg.out) if d.main else nullcontext():
            summary = _train(cfg, on_change, d)
        # No rank tears gloo down while another may still be in a collective or logging: CI saw a
        # rank abort at exit ("terminate called without an active exception") after a finished run.
        barrier(d)
        return summary
    finally:
        close_distributed(d)


def _train(cfg: TrainJob, on_change: str, d: Dist) -> dict[str, Any]:
    device = pick_device(cfg, d.local_rank)
    check_device(cfg, device.type)  # auto resolved: what cannot run there fails before anything is read
    torch.set_num_threads(cfg.threads or cpus_per_process(d.world))
    inputs = load_inputs(cfg)
    files = train_files(inputs.negatives)
    _, steps_per_epoch = plan(files, cfg.data.batch_size, d.world)
    total = min(cfg.epochs * steps_per_epoch, cfg.max_steps or cfg.epochs * steps_per_epoch)
    start = begin(cfg, inputs, total, on_change, d)
    if start.kind == "finished":
        state = start.state
        if d.main:
            log.info("%s: already trained (%d steps with this config and data); nothing to do", cfg.out, state["step"])
        return {
            "steps": state["step"],
            "valid_loss": state["valid_loss"],
            "examples_per_s": None,
            "checkpoint": str(start.path),
            "mlflow_run_id": state["mlflow_run_id"],
            "steady_examples_per_s": None,
            "device": device.type,
            "skipped": True,
        }
    n = int(inputs.negatives_manifest["params"]["n"])
    if cfg.data.negatives_per_row > n:  # before tokenising, which a large log takes a while for
        raise DssmError(f"data.negatives_per_row={cfg.data.negatives_per_row}, but {inputs.negatives} has {n} a row")
    tokenizer = tokenizer_for(cfg.model, inputs.vocab)  # a finished run above reads no text
    tokenised = load_or_build(inputs.negatives, inputs.negatives_manifest["content_sha256"], tokenizer, n)
    batches = ClickBatches(
        *(tokenised, files, d.rank, d.world, cfg.data, n, cfg.seed),
        pair_weight=cfg.loss.pair_weight,
        listwise=cfg.loss.listwise > 0,
    )
    return loop(setup(cfg, inputs, batches, total, start, device, d))


def begin(cfg: TrainJob, inputs: Inputs, total: int, on_change: str, d: Dist) -> Start:
    """Decide how the run begins (`decide`) and, for a stale run, delete its directory on rank 0."""
    start = decide(cfg, inputs.negatives_manifest, inputs.vocab, inputs.code, total, on_change, d.main)
    barrier(d)  # every rank has read the run directory before rank 0 may delete it
    if start.restart and d.main:
        shutil.rmtree(cfg.out)
    barrier(d)
    return start


@dataclass
class Run:
    """What the loop needs, built by `setup`."""

    cfg: TrainJob
    d: Dist
    device: torch.device
    inputs: Inputs
    batches: ClickBatches
    total: int  # the step to stop at
    step: int  # the step to start from (a resumed run's checkpoint)
    model: TwoTower
    ddp: torch.nn.Module  # the model, wrapped in DDP when ranks sync its gradients
    optimizer: torch.optim.Optimizer
    initial: dict[str, torch.Tensor]  # step-0 embedding tables, for loss.l2_embeddings
    rows: TableRows | None  # row-wise table updates
    precision: Callable[[], AbstractContextManager]  # what each forward runs under (`precision`)
    bytes_per_step: int  # fixed_bytes_sent
    tracker: Tracker

    @property
    def out(self) -> Path:
        return Path(self.cfg.out)


def setup(
    cfg: TrainJob, inputs: Inputs, batches: ClickBatches, total: int, start: Start, device: torch.device, d: Dist
) -> Run:
    """Model, optimiser (a resumed run's state loaded), DDP, MLflow run and validation rows."""
    model, optimizer, initial, step = build_model(cfg, inputs.vocab, start.state, device, d)
    rows = table_rows(model, optimizer, cfg, step, total, d.world > 1)  # before DDP, which then skips the tables
    # DDP refuses a model whose only parameters are row-wise tables (avg): TableRows syncs those
    synced = d.world > 1 and any(p.requires_grad for p in model.parameters())
    ddp = DistributedDataParallel(model) if synced else model
    bytes_per_step = fixed_bytes_sent(model, cfg, d)
    forward, precise = precision(device, ENCODERS[cfg.model.encoder].transformer)
    tracker = open_tracker(cfg, inputs, start.state, device, d)
    run = Run(
        cfg=cfg,
        d=d,
        device=device,
        inputs=inputs,
        batches=batches,
        total=total,
        step=step,
        model=model,
        ddp=ddp,
        optimizer=optimizer,
        initial=initial,
        rows=rows,
        precision=forward,
        bytes_per_step=bytes_per_step,
        tracker=tracker,
    )
    if d.main:
        run.out.mkdir(parents=True, exist_ok=True)
        log.info(
            "training %s: %d steps (%d per epoch), global batch %d over %d process(es) on %s; out %s",
            *(cfg.model.encoder, total, batches.steps_per_epoch, cfg.data.batch_size, d.world),
            describe(device, precise),
            run.out,
        )
        if step:
            log.info("resuming from step %d (checkpoint %s)", step, start.path)
    return run


def loop(run: Run) -> dict[str, Any]:
    """Steps `run.step`+1 … `run.total`: log every `log_every`, validate every `eval_every`, checkpoint
    every `checkpoint_every` steps or `checkpoint_seconds` of training and at the end; returns `train`'s
    summary."""
    from tqdm import tqdm

    cfg, step = run.cfg, run.step
    bar = tqdm(
        total=run.total,
        initial=step,
        unit="step",
        desc=f"train {cfg.model.encoder}",
        disable=None if run.d.main else True,
    )
    val = None
    window = Window(torch.zeros((), device=run.device))
    started, first_step = time.perf_counter(), step
    logged: list[tuple[float, int]] = []  # (time, step) of the first and the last logged window
    status = "FAILED"
    on_gpu = run.device.type == "cuda"
    ahead = cfg.data.encode_in == "process" or (cfg.data.encode_in == "auto" and on_gpu)
    workers = (LOADERS_ON_GPU if on_gpu else 1) if ahead else 0
    saved_at = time.monotonic()
    try:
        for batch in run.batches.steps(step, run.total, workers=workers, pin=on_gpu):
            step += 1
            loss, penalty, norm, mu = train_step(run, batch, step)
            window.add(loss)
            bar.update(1)
            clock_due = run.d.world == 1 and overdue(cfg, saved_at)  # alone, the clock is asked every step
            if step % cfg.log_every == 0 or step == run.total:
                values = {"momentum": mu, "grad_norm": norm}
                train_loss, rate, agreed = window.log(run, step, values, penalty, overdue(cfg, saved_at))
                clock_due = clock_due or agreed
                bar.set_postfix(loss=f"{train_loss:.4f}", ex_s=f"{rate:,.0f}")
                logged[1:] = [(time.perf_counter(), step)]
            if step % cfg.eval_every == 0 and step != run.total:
                val = validate(run, step)
            if step != run.total and (step % cfg.checkpoint_every == 0 or clock_due):
                checkpoint(run, step, val)
                saved_at = time.monotonic()
        val = validate(run, step)
        checkpoint(run, step, val)
        status = "FINISHED"
    except BaseException as e:
        status = "KILLED" if is_stop(e) else "FAILED"  # SIGTERM, ^C: the run resumes from its last checkpoint
        raise
    finally:
        bar.close()
        run.tracker.close(status)
        if run.rows is not None:
            run.rows.release()
    ended = time.perf_counter()
    if run.d.main:
        shown = "n/a" if val is None else f"{val:.4f}"
        log.info("finished %d steps; validation loss %s; checkpoint %s", step, shown, run.out / LAST)

    def per_second(since: tuple[float, int], until: tuple[float, int]) -> float | None:
        return (until[1] - since[1]) * cfg.data.batch_size / (until[0] - since[0]) if until[1] > since[1] else None

    summary = {
        "steps": step,
        "valid_loss": val,
        "examples_per_s": per_second((started, first_step), (ended, step)),
        # from the first logged window's end (start-up and warm-up behind) to the last's (before the final
        # validation and checkpoint)
        "steady_examples_per_s": per_second(logged[0], logged[-1]) if len(logged) > 1 else None,
        "checkpoint": str(run.out / LAST),
        "mlflow_run_id": run.tracker.run_id,
        "device": run.device.type,
        "skipped": False,
    }
    if run.d.main:
        write_summary(run.out, summary)
    return summary


def write_summary(out: Path, summary: dict[str, Any]) -> None:
    """OUT/summary.json: what the run's last call did (steps, losses, throughput, device), for scripts."""
    tmp = out / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, out / "summary.json")


def train_step(run: Run, batch: tuple, step: int) -> tuple[torch.Tensor, torch.Tensor | None, float, float]:
    """One update: forward (all ranks' clicked titles as in-batch negatives), eq. (5) plus the
    regulariser, backward, Algorithm 1's gradient re-normalisation, the Nesterov step. Returns the
    loss, the regulariser (None without one), the gradient norm and the momentum μ of this step."""
    cfg, device, rows = run.cfg, run.device, run.rows
    queries, docs, weights, keys, lists = batch
    mu = set_schedule(run.optimizer, step, run.total, cfg)
    # non_blocking: a pinned batch (from a GPU run's workers) is queued for copying without the host waiting
    queries, docs = queries.to(device, non_blocking=True), docs.to(device, non_blocking=True)
    lists = lists.to(device, non_blocking=True) if lists is not None else None
    with run.precision():
        q, dv, listed = run.ddp(queries, docs, lists.docs if lists is not None else None)
    weighted = None if cfg.loss.pair_weight == "none" else weights.to(device, non_blocking=True)
    loss = training_loss(q, dv, cfg.loss, weighted, keys, run.d.world > 1, lists, listed)
    penalty = regulariser(run.model, run.initial, cfg.loss)
    run.optimizer.zero_grad(set_to_none=True)
    (loss if penalty is None else loss + penalty).backward()
    norm = clip_gradients(run.model, cfg.optim.clip_norm, rows.gradients() if rows is not None else [])
    if not math.isfinite(norm):  # the norm is reduced over ranks: every rank stops here
        raise DssmError(
            f"non-finite loss/gradient at step {step} (loss {float(loss):.4g}); nothing written after "
            f"the last checkpoint in {run.out}; try a smaller optim.lr or optim.clip_norm"
        )
    run.optimizer.step()
    if rows is not None:
        rows.update()
    return loss, penalty, norm, mu


def precision(device: torch.device, transformer: bool) -> tuple[Callable[[], AbstractContextManager], str]:
    """What a training step's forward (and validation) runs under, and its name for the log. On a GPU,
    a transformer in bf16 autocast, without scaled-dot-product attention's cuDNN kernels (they plan
    anew for every padded length: 2.5-3.3 ms of CPU a call, 70 ms a step, in issue 61's profile);
    word-hashing encoders in float32 (matrices ~100 wide: bf16 would add casts at every word and save
    nothing; cuDNN's LSTM kernels multiply in TF32, torch's default for cuDNN)."""
    if device.type != "cuda" or not transformer:
        return nullcontext, "float32"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

    def context() -> AbstractContextManager:
        stack = ExitStack()
        stack.enter_context(torch.autocast("cuda", dtype=torch.bfloat16))
        stack.enter_context(sdpa_kernel(kernels))
        return stack

    return context, "bf16 autocast"


@dataclass
class Window:
    """The steps since the last logged metrics: their summed loss (on the device), count, start time
    and what row-wise tables had sent by then."""

    loss: torch.Tensor
    steps: int = 0
    start: float = field(default_factory=time.perf_counter)
    sent: int = 0  # rows.sent_bytes at the window's start

    def add(self, loss: torch.Tensor) -> None:
        self.loss += loss.detach()
        self.steps += 1

    def log(
        self, run: Run, step: int, values: dict[str, float], penalty: torch.Tensor | None, overdue: bool = False
    ) -> tuple[float, float, bool]:
        """Log the window's mean training loss (over ranks), throughput and `values`; start a new
        window. Returns the loss, the examples per second and whether rank 0 finds a checkpoint overdue:
        its vote rides in the loss's all-reduce, so every rank checkpoints at the same step with no
        collective of its own (a stop between two collectives could leave a rank waiting in one)."""
        cfg, d, rows = run.cfg, run.d, run.rows
        vote = torch.tensor(float(overdue and d.main), device=self.loss.device)
        summed = summed_over_ranks(torch.stack([self.loss / self.steps, vote.to(self.loss.dtype)]), d)
        train_loss, agreed = float(summed[0]) / d.world, bool(summed[1] > 0)
        rate = self.steps * cfg.data.batch_size / (time.perf_counter() - self.start)
        values = {"train_loss": train_loss, "train_examples_per_s": rate, **values}
        if penalty is not None:  # train_loss is the objective alone, comparable with valid_loss
            values["regulariser"] = float(penalty.detach())
        if d.world > 1:  # what this rank sent per example it trained on
            sent = run.bytes_per_step * self.steps + (rows.sent_bytes - self.sent if rows is not None else 0)
            values["sent_bytes_per_example"] = sent / (self.steps * cfg.data.batch_size / d.world)
            self.sent = rows.sent_bytes if rows is not None else 0
        run.tracker.metrics(values, step)
        self.loss.zero_()
        self.steps, self.start = 0, time.perf_counter()
        return train_loss, rate, agreed


def catch_up(run: Run) -> None:
    """Apply the row-wise tables' pending updates, on every rank at the same steps: replicas stay identical."""
    if run.rows is not None:
        run.rows.catch_up()


def validate(run: Run, step: int) -> float | None:
    """The validation loss (rank 0, when it has validation rows), logged at `step`."""
    catch_up(run)
    with run.precision():
        val = validation_loss(run.model, run.batches, run.cfg, run.device) if run.d.main else None
    if val is not None:
        run.tracker.metrics({"valid_loss": val}, step)
    return val


def overdue(cfg: TrainJob, saved_at: float) -> bool:
    """Whether `checkpoint_seconds` of training passed since the last checkpoint (this rank's clock)."""
    return cfg.checkpoint_seconds > 0 and time.monotonic() - saved_at >= cfg.checkpoint_seconds


def checkpoint(run: Run, step: int, val: float | None) -> None:
    """Rank 0 writes a checkpoint of `step`; every rank waits for it."""
    catch_up(run)
    if run.d.main:
        state = checkpoint_state(
            run.cfg, run.inputs, run.model, run.optimizer, step, run.total, val, run.tracker.run_id
        )
        save_checkpoint(run.out, state, step, run.cfg.keep_checkpoints)
    barrier(run.d)


def resolve_paths(cfg: TrainJob, workdir: Path | None) -> TrainJob:
    """`cfg` with the data, output and MLflow locations left empty filled from the work dir."""
    layout = Layout(workdir or "work")
    negatives, vocab = cfg.data.negatives or str(layout.negatives), cfg.data.vocab or str(layout.vocab)
    data = replace(cfg.data, negatives=negatives, vocab=vocab)
    out = cfg.out or str(layout.train(cfg.model.encoder))
    return replace(cfg, data=data, out=out, mlflow_uri=cfg.mlflow_uri or default_tracking_uri(layout.workdir))


@dataclass
class Inputs:
    """What a training run reads, checked: the negatives, the vocabulary, and the code behind them."""

    negatives: Path
    negatives_manifest: dict[str, Any]
    vocab: Vocab
    code: str  # lineage of modeling/train.py's fingerprint with the negatives' and vocabulary's code


def load_inputs(cfg: TrainJob) -> Inputs:
    negatives = Path(cfg.data.negatives)
    neg_manifest = require_manifest(negatives, "negatives")
    vocab_manifest = require_manifest(Path(cfg.data.vocab), "vocab")
    vocab = Vocab.load(cfg.data.vocab, cfg.model.tokens)
    neg_clean = neg_manifest.get("inputs", {}).get("clean", {}).get("sha256")
    if vocab.clean_sha256 and neg_clean and vocab.clean_sha256 != neg_clean:
        raise DssmError(
            f"{cfg.data.vocab} and {negatives} were built from different `dssm clean` outputs; rebuild one of them"
        )
    params = neg_manifest.get("params", {})
    if cfg.loss.pair_weight in ("ipw", "log_ipw") and not params.get("debias"):
        raise DssmError(
            f"loss.pair_weight={cfg.loss.pair_weight} needs negatives built with debias "
            f"(`dssm negatives --debias --propensity DIR`, or negatives.debias=true in `dssm run`); "
            f"{negatives} has none"
        )
    if cfg.loss.listwise and not params.get("list_size"):
        raise DssmError(
            f"loss.listwise needs negatives built with list_size > 0 (`dssm negatives --list-size K`); "
            f"{negatives} has none"
        )
    code = lineage(code_fingerprint("modeling.train"), [neg_manifest, vocab_manifest])
    return Inputs(negatives, neg_manifest, vocab, code)


def build_model(cfg: TrainJob, vocab: Vocab, state: dict[str, Any] | None, device, d: Dist):
    """Model, optimiser, the step-0 embedding tables (for loss.l2_embeddings) and the step to start at."""
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = TwoTower(vocab.size, cfg.model).to(device)
    optimizer = build_optimizer(model, cfg)
    # A resumed run rebuilds its step-0 weights too when loss.l2_embeddings pulls toward them.
    if cfg.init_from and (state is None or cfg.loss.l2_embeddings > 0):
        copied = warm_start(model, vocab, cfg.init_from)
        if d.main and state is None:
            log.info("init_from %s: %d tensors and %d embedding rows copied", cfg.init_from, *copied.values())
    initial = {n: p.detach().clone() for n, p in embedding_tables(model).items()} if cfg.loss.l2_embeddings else {}
    if state is None:
        return model, optimizer, initial, 0
    model.load_state_dict(state["model"])
    fused = [group.get("fused") for group in optimizer.param_groups]  # this device's choice, not the saved run's
    optimizer.load_state_dict(state["optimizer"])
    for group, kept in zip(optimizer.param_groups, fused, strict=True):
        group["fused"] = kept
    return model, optimizer, initial, state["step"]


def open_tracker(cfg: TrainJob, inputs: Inputs, state: dict[str, Any] | None, device: torch.device, d: Dist):
    """The run's MLflow tracker (rank 0), continuing a resumed checkpoint's MLflow run."""
    negatives_sha = inputs.negatives_manifest["content_sha256"]
    tags = {
        "dataset_sha256": negatives_sha,
        "vocab_sha256": inputs.vocab.sha256,
        "system": cfg.model.encoder,
        "world_size": str(d.world),
        "device": device.type,
        "code_version": inputs.code[:16],
    } | ({"dataset": cfg.dataset} if cfg.dataset else {})
    datasets = [
        ("negatives/train", str(inputs.negatives / "train"), negatives_sha, "training"),
        ("negatives/valid", str(inputs.negatives / "valid"), negatives_sha, "validation"),
        ("vocab", cfg.data.vocab, inputs.vocab.sha256, "vocabulary"),
    ]
    return Tracker(cfg, d.main, state.get("mlflow_run_id") if state else None, tags, datasets)


def checkpoint_state(cfg: TrainJob, inputs: Inputs, model, optimizer, step: int, total: int, val, run_id) -> dict:
    """Everything a checkpoint holds: self-contained, loadable without the work dir."""
    vocab = inputs.vocab
    return {
        "config": cfg.to_dict(),
        "vocab": {
            "tokens": vocab.tokens,
            "sha256": vocab.sha256,
            "clean_sha256": vocab.clean_sha256,
            "kind": vocab.kind,
        },
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "total_steps": total,
        "valid_loss": val,
        "dataset_sha256": inputs.negatives_manifest["content_sha256"],
        "code_sha256": inputs.code,
        "mlflow_run_id": run_id,
    }


def clip_gradients(model: torch.nn.Module, threshold: float, row_grads: list[torch.Tensor] = ()) -> float:
    """Algorithm 1's re-normalisation: scale all gradients (the parameters' and the tables' row
    gradients) to global L2 norm `threshold` when larger. (clip_grad_norm_ rescales every step even
    by 1.0: a full pass over dense table gradients.)"""
    grads = [p.grad for p in model.parameters() if p.grad is not None] + list(row_grads)
    norm = float(torch.nn.utils.get_total_norm(grads))
    if norm > threshold:
        torch._foreach_mul_(grads, threshold / (norm + 1e-6))
    return norm


@torch.no_grad()
def validation_loss(model: TwoTower, batches: ClickBatches, cfg: TrainJob, device) -> float | None:
    """Eq. (5) over the first `data.max_valid_rows` validation rows, each against its own sampled
    negatives only: comparable across batch sizes, `loss.in_batch_negatives`, `pair_weight` and
    `listwise` settings (chance level ln(1 + n)); None without validation rows."""
    model.eval()
    loss_cfg = replace(cfg.loss, in_batch_negatives=False)
    total, count = torch.zeros((), device=device), 0
    for rows, (queries, docs, _, keys, _) in batches.valid(cfg.data.max_valid_rows):
        q, d, _ = model(queries.to(device), docs.to(device))
        total += training_loss(q, d, loss_cfg, None, keys) * rows
        count += rows
    model.train()
    return float(total) / count if count else None


if __name__ == "__main__":  # `torchrun -m modeling.train` as documented before modeling/launch.py held the entry
    import runpy

    runpy.run_module("modeling.launch", run_name="__main__", alter_sys=True)
