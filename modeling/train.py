"""`dssm train`: the training loop (Algorithm 1 of Palangi et al. 2016) under torch DDP.

Run in-process (`--nproc 1`), through `dssm train --nproc N` (which launches torchrun), or by
torchrun directly: `torchrun --nproc-per-node N -m modeling.train --workdir work`. NCCL on GPUs,
gloo on CPU. Every rank streams its own shards; rank 0 alone logs to MLflow and checkpoints.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from core.artifacts import code_fingerprint, lineage, require_manifest
from core.errors import DssmError
from core.layout import Layout
from core.tracking import default_tracking_uri, experiment_id, log_datasets
from modeling.checkpoint import LAST, newest_checkpoint, save_checkpoint, warm_start
from modeling.config import TrainConfig, config_changes, load_config
from modeling.data import ClickBatches, train_files, validation_rows
from modeling.hashing import Tokenizer, Vocab
from modeling.model import TwoTower, embedding_tables, regulariser, training_loss
from modeling.optim import build_optimizer, set_momentum, table_rows

log = logging.getLogger("dssm.train")


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_kind: str) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    backend = "nccl" if device_kind == "cuda" else "gloo"
    dist.init_process_group(backend)
    return Dist(dist.get_rank(), world, int(os.environ.get("LOCAL_RANK", "0")))


def pick_device(cfg: TrainConfig, local_rank: int) -> torch.device:
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise DssmError("device=cuda but no CUDA device is visible")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def resolve_paths(cfg: TrainConfig, workdir: Path | None) -> None:
    """Fill the data, output and MLflow locations left empty from the work dir."""
    layout = Layout(workdir or "work")
    cfg.data.negatives = cfg.data.negatives or str(layout.negatives)
    cfg.data.vocab = cfg.data.vocab or str(layout.vocab)
    cfg.out = cfg.out or str(layout.train(cfg.model.encoder))
    cfg.mlflow_uri = cfg.mlflow_uri or default_tracking_uri(layout.workdir)


class Tracker:
    """MLflow on rank 0; one run per training run (resumed runs continue it). No-op elsewhere."""

    def __init__(
        self, cfg: TrainConfig, enabled: bool, run_id: str | None, tags: dict[str, str], datasets: list[tuple]
    ):
        self.enabled = enabled
        self.run_id = run_id
        if not enabled:
            return
        import mlflow

        self.mlflow = mlflow
        run = mlflow.start_run(
            run_id=run_id, experiment_id=experiment_id(cfg.mlflow_uri, cfg.experiment), run_name=cfg.run_name or None
        )
        self.run_id = run.info.run_id
        if run_id is None:
            mlflow.log_params({k: str(v)[:500] for k, v in cfg.flat().items()})
            mlflow.set_tags(tags)
            log_datasets(cfg.mlflow_uri, self.run_id, datasets)

    def metrics(self, values: dict[str, float], step: int) -> None:
        if self.enabled:
            self.mlflow.log_metrics(values, step=step)

    def close(self, status: str = "FINISHED") -> None:
        if self.enabled:
            self.mlflow.end_run(status)


def clip_gradients(model: torch.nn.Module, threshold: float, row_grads: list[torch.Tensor] = ()) -> float:
    """Algorithm 1's re-normalisation: scale all gradients (the parameters' and the tables' row
    gradients) to global L2 norm `threshold` when larger. (clip_grad_norm_ rescales every step even
    by 1.0: a full pass over dense table gradients.)"""
    grads = [p.grad for p in model.parameters() if p.grad is not None] + list(row_grads)
    norm = float(torch.nn.utils.get_total_norm(grads))
    if norm > threshold:
        torch._foreach_mul_(grads, threshold / (norm + 1e-6))
    return norm


def fixed_bytes_sent(model: torch.nn.Module, cfg: TrainConfig, d: Dist) -> int:
    """Bytes a rank sends per step in collectives of fixed size: DDP's ring all-reduce of the
    gradients it manages (2(W−1)/W of their size) and, with in-batch negatives, the all-gather of
    the clicked titles' vectors and its backward all-reduce. (Row-wise tables count their own.)"""
    if d.world == 1:
        return 0
    ring = 2 * (d.world - 1) / d.world
    dense = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    gathered = 0
    if cfg.loss.objective == "click" and cfg.loss.in_batch_negatives:
        rows = cfg.data.batch_size * model.dim * 4  # float32 vectors of the global batch
        gathered = rows // d.world * (d.world - 1) + ring * rows
    return int(ring * dense + gathered)


def mean_over_ranks(value: torch.Tensor, d: Dist) -> float:
    if d.world > 1:
        value = value.clone()
        dist.all_reduce(value)
        value /= d.world
    return float(value)


@torch.no_grad()
def validation_loss(model: TwoTower, rows: list, batches: ClickBatches, cfg: TrainConfig, device) -> float:
    model.eval()
    # eq. (5) over each row's own negatives only: comparable across batch sizes and
    # `loss.in_batch_negatives` settings (chance level ln(1 + n))
    loss_cfg = replace(cfg.loss, in_batch_negatives=False)
    total, count = 0.0, 0
    size = max(1, cfg.data.batch_size)
    for start in range(0, len(rows), size):
        chunk = rows[start : start + size]
        # unweighted and without lists: comparable across pair_weight and listwise settings
        queries, docs, _, groups, _ = batches.encode(chunk, lists=False)
        q, d, _ = model(queries.to(device), docs.to(device))
        total += float(training_loss(q, d, loss_cfg, None, groups)) * len(chunk)
        count += len(chunk)
    model.train()
    return total / max(count, 1)


def train(cfg: TrainConfig, resume: bool = False, on_change: str | None = None) -> dict[str, Any]:
    """Train one model; returns a summary (steps, losses, throughput, checkpoint, MLflow run id).

    resume: continue the checkpoint in cfg.out (else a checkpoint there is an error); on_change:
    what a checkpoint of other data, code or config means (see `decide`): "restart" trains afresh
    (the pipeline), default "resume" (`dssm train --resume`) or "error".
    """
    on_change = on_change or ("resume" if resume else "error")
    device_kind = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()) else "cpu"
    d = init_distributed(device_kind)
    try:
        summary = _train(cfg, on_change, d)
        if d.world > 1:
            # No rank tears gloo down while another may still be in a collective or logging: CI saw a
            # rank abort at exit ("terminate called without an active exception") after a finished run.
            dist.barrier()
        return summary
    finally:
        if d.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


@dataclass
class Inputs:
    """What a training run reads, checked: the negatives, the vocabulary, and the code behind them."""

    negatives: Path
    negatives_manifest: dict[str, Any]
    vocab: Vocab
    code: str  # lineage of modeling/train.py's fingerprint with the negatives' and vocabulary's code


def load_inputs(cfg: TrainConfig) -> Inputs:
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


def build_model(cfg: TrainConfig, vocab: Vocab, state: dict[str, Any] | None, device, d: Dist):
    """Model, optimiser, the step-0 embedding tables (for loss.l2_embeddings) and the step to start at."""
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = TwoTower(vocab.size, cfg.model).to(device)
    optimizer = build_optimizer(model, cfg.optim)
    # A resumed run rebuilds its step-0 weights too when loss.l2_embeddings pulls toward them.
    if cfg.init_from and (state is None or cfg.loss.l2_embeddings > 0):
        copied = warm_start(model, vocab, cfg.init_from)
        if d.main and state is None:
            log.info("init_from %s: %d tensors and %d embedding rows copied", cfg.init_from, *copied.values())
    initial = {n: p.detach().clone() for n, p in embedding_tables(model).items()} if cfg.loss.l2_embeddings else {}
    if state is None:
        return model, optimizer, initial, 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return model, optimizer, initial, state["step"]


def checkpoint_state(cfg: TrainConfig, inputs: Inputs, model, optimizer, step: int, total: int, val, run_id) -> dict:
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


def _train(cfg: TrainConfig, on_change: str, d: Dist) -> dict[str, Any]:
    device = pick_device(cfg, d.local_rank)
    torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // d.world))
    out = Path(cfg.out)
    inputs = load_inputs(cfg)
    tokenizer = Tokenizer(inputs.vocab, cfg.model.max_words)
    n = int(inputs.negatives_manifest["params"]["n"])
    batches = ClickBatches(
        *(train_files(inputs.negatives), d.rank, d.world, cfg.data, tokenizer, n, cfg.seed),
        pair_weight=cfg.loss.pair_weight,
        listwise=cfg.loss.listwise > 0,
    )
    steps_per_epoch = batches.steps_per_epoch
    total = min(cfg.epochs * steps_per_epoch, cfg.max_steps or cfg.epochs * steps_per_epoch)

    start = decide(cfg, inputs.negatives_manifest, inputs.vocab, inputs.code, total, on_change, d.main)
    if d.world > 1:
        dist.barrier()  # every rank has read the run directory before rank 0 may delete it
    if start.restart and d.main:
        shutil.rmtree(out)
    if d.world > 1:
        dist.barrier()
    state = start.state
    if start.kind == "finished":
        if d.main:
            log.info("%s: already trained (%d steps with this config and data); nothing to do", out, state["step"])
        return {
            "steps": state["step"],
            "valid_loss": state["valid_loss"],
            "examples_per_s": None,
            "checkpoint": str(start.path),
            "mlflow_run_id": state["mlflow_run_id"],
            "skipped": True,
        }

    model, optimizer, initial, step = build_model(cfg, inputs.vocab, state, device, d)
    rows = table_rows(model, optimizer, cfg, step, total, d.world > 1)  # before DDP, which then skips the tables
    # DDP refuses a model whose only parameters are row-wise tables (avg): TableRows syncs those
    synced = d.world > 1 and any(p.requires_grad for p in model.parameters())
    ddp = DistributedDataParallel(model) if synced else model
    bytes_per_step = fixed_bytes_sent(model, cfg, d)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    tags = {
        "dataset_sha256": inputs.negatives_manifest["content_sha256"],
        "vocab_sha256": inputs.vocab.sha256,
        "system": cfg.model.encoder,
        "world_size": str(d.world),
        "device": device.type,
        "code_version": inputs.code[:16],
    } | ({"dataset": cfg.dataset} if cfg.dataset else {})
    negatives_sha = inputs.negatives_manifest["content_sha256"]
    datasets = [
        ("negatives/train", str(inputs.negatives / "train"), negatives_sha, "training"),
        ("negatives/valid", str(inputs.negatives / "valid"), negatives_sha, "validation"),
        ("vocab", cfg.data.vocab, inputs.vocab.sha256, "vocabulary"),
    ]
    tracker = Tracker(cfg, d.main, state.get("mlflow_run_id") if state else None, tags, datasets)
    valid = validation_rows(inputs.negatives, cfg.data.max_valid_rows) if d.main else []

    def catch_up() -> None:  # on every rank, at the same steps: replicas stay identical
        if rows is not None:
            rows.catch_up()

    def checkpoint(val: float | None) -> None:  # rank 0 writes, every rank waits for it
        catch_up()
        if d.main:
            state = checkpoint_state(cfg, inputs, model, optimizer, step, total, val, tracker.run_id)
            save_checkpoint(out, state, step, cfg.keep_checkpoints)
        if d.world > 1:
            dist.barrier()

    def validate() -> float | None:
        catch_up()
        val = validation_loss(model, valid, batches, cfg, device) if d.main and valid else None
        if val is not None:
            tracker.metrics({"valid_loss": val}, step)
        return val

    if d.main:
        out.mkdir(parents=True, exist_ok=True)
        log.info(
            "training %s: %d steps (%d per epoch), global batch %d over %d process(es) on %s; out %s",
            *(cfg.model.encoder, total, steps_per_epoch, cfg.data.batch_size, d.world, device, out),
        )
        if step:
            log.info("resuming from step %d (checkpoint %s)", step, start.path)
    from tqdm import tqdm

    bar = tqdm(
        total=total, initial=step, unit="step", desc=f"train {cfg.model.encoder}", disable=None if d.main else True
    )
    val = None
    window_loss = torch.zeros((), device=device)
    window_steps, window_start, started, first_step = 0, time.perf_counter(), time.perf_counter(), step
    window_sent = 0  # rows.sent_bytes at the window's start
    status = "FAILED"
    try:
        for queries, docs, weights, groups, lists in batches.steps(step, total):
            step += 1
            mu = set_momentum(optimizer, step, total, cfg.optim)
            lists = lists.to(device) if lists is not None else None
            with autocast:
                q, dv, listed = ddp(queries.to(device), docs.to(device), lists.docs if lists is not None else None)
            weighted = None if cfg.loss.pair_weight == "none" else weights.to(device)
            loss = training_loss(q, dv, cfg.loss, weighted, groups, d.world > 1, lists, listed)
            penalty = regulariser(model, initial, cfg.loss)
            optimizer.zero_grad(set_to_none=True)
            (loss if penalty is None else loss + penalty).backward()
            norm = clip_gradients(model, cfg.optim.clip_norm, rows.gradients() if rows is not None else [])
            if not math.isfinite(norm):  # the norm is reduced over ranks: every rank stops here
                raise DssmError(
                    f"non-finite loss/gradient at step {step} (loss {float(loss):.4g}); nothing written after "
                    f"the last checkpoint in {out}; try a smaller optim.lr or optim.clip_norm"
                )
            optimizer.step()
            if rows is not None:
                rows.update()
            window_loss += loss.detach()
            window_steps += 1
            bar.update(1)
            if step % cfg.log_every == 0 or step == total:
                train_loss = mean_over_ranks(window_loss / window_steps, d)
                rate = window_steps * cfg.data.batch_size / (time.perf_counter() - window_start)
                values = {"train_loss": train_loss, "examples_per_s": rate, "momentum": mu, "grad_norm": norm}
                if penalty is not None:  # train_loss is the objective alone, comparable with valid_loss
                    values["regulariser"] = float(penalty.detach())
                if d.world > 1:  # what this rank sent per example it trained on
                    sent = bytes_per_step * window_steps + (rows.sent_bytes - window_sent if rows is not None else 0)
                    values["sent_bytes_per_example"] = sent / (window_steps * cfg.data.batch_size / d.world)
                    window_sent = rows.sent_bytes if rows is not None else 0
                tracker.metrics(values, step)
                bar.set_postfix(loss=f"{train_loss:.4f}", ex_s=f"{rate:,.0f}")
                window_loss.zero_()
                window_steps, window_start = 0, time.perf_counter()
            if step % cfg.eval_every == 0 and step != total:
                val = validate()
            if step % cfg.checkpoint_every == 0 and step != total:
                checkpoint(val)
        val = validate()
        checkpoint(val)
        status = "FINISHED"
    finally:
        bar.close()
        tracker.close(status)
        if rows is not None:
            rows.release()
    seconds = time.perf_counter() - started
    if d.main:
        shown = "n/a" if val is None else f"{val:.4f}"
        log.info("finished %d steps; validation loss %s; checkpoint %s", step, shown, out / LAST)
    return {
        "steps": step,
        "valid_loss": val,
        "examples_per_s": (step - first_step) * cfg.data.batch_size / seconds if step > first_step else None,
        "checkpoint": str(out / LAST),
        "mlflow_run_id": tracker.run_id,
        "skipped": False,
    }


@dataclass
class Start:
    """How a training call begins: "fresh", "resume" (from `state`) or "finished" (nothing to do)."""

    kind: str
    state: dict[str, Any] | None = None
    restart: bool = False  # the run directory holds a stale run: delete it first
    path: Path | None = None  # the checkpoint resumed or found finished


def decide(
    cfg: TrainConfig,
    negatives: dict[str, Any],
    vocab: Vocab,
    code: str,
    total: int,
    on_change: str,
    is_main: bool = True,
) -> Start:
    """The one place that decides fresh / resume / finished / stale for the run directory cfg.out.

    A checkpoint of other negatives, another vocabulary or another model config can never be
    continued; one made by other code or with other (non-model) settings can. on_change says what
    any such difference means: "restart" deletes the run and trains afresh (the retrain flow: a
    scheduled run must not serve a model of old code or data), "resume" continues where allowed,
    "error" refuses (a checkpoint exists and --resume was not given).
    """
    out = Path(cfg.out)
    found = newest_checkpoint(out)
    if found is None:
        return Start("fresh")
    path, state = found
    hard = []
    if state["dataset_sha256"] != negatives["content_sha256"]:
        hard.append(f"other negatives than {cfg.data.negatives}")
    if state["vocab"]["sha256"] != vocab.sha256:
        hard.append(f"another vocabulary than {cfg.data.vocab}")
    changes = config_changes(state["config"], cfg)
    hard += [f"model config {c}" for c in changes if c.startswith("model.")]
    settings = [c for c in changes if not c.startswith("model.")]  # e.g. more epochs: continued
    soft = settings + (["other code"] if state.get("code_sha256") != code else [])
    if on_change == "restart" and (hard or soft):
        log.info("train: %s was trained with %s; training %s afresh", path, ", ".join(hard + soft), out)
        return Start("fresh", restart=True)
    if on_change == "error":
        raise DssmError(f"{out} already holds a checkpoint; pass --resume to continue it or choose another out=")
    if hard:
        raise DssmError(f"{path} was trained with {', '.join(hard)}; cannot resume (train into another out=)")
    if soft and is_main:
        log.info("resuming %s despite: %s", path, ", ".join(soft))
    if state["step"] >= total and not settings:
        return Start("finished", state, path=path)
    return Start("resume", state, path=path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="config overrides, e.g. model.encoder=rnn optim.lr=0.05 epochs=3 (see docs/training.md)",
    )
    p.add_argument("--config", type=Path, help="YAML config file (defaults < file < KEY=VALUE overrides)")
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path("work"),
        help="where `dssm negatives`/`dssm vocab` wrote (default: %(default)s); also the default "
        "home of the run (WORKDIR/train/ENCODER) and of the MLflow store (WORKDIR/mlflow.db)",
    )
    p.add_argument(
        "--objective",
        choices=["click", "paraphrase"],
        help="click: the paper's softmax over clicked and negative titles; paraphrase: Wieting & Gimpel's margin "
        "loss with in-batch negatives and one shared encoder (= loss.objective=paraphrase model.shared_towers=true)",
    )
    p.add_argument("--resume", action="store_true", help="continue the checkpoint in the run directory")
    p.add_argument(
        "--on-change",
        choices=["resume", "restart", "error"],
        help="when the run directory holds a run of other data, code or settings: resume it where possible, "
        "restart (delete it, train afresh: what `dssm run` does) or error (default: resume with --resume, "
        "else error)",
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="processes (DDP ranks) to launch with torchrun: GPUs, or gloo CPU processes (default: 1)",
    )


def override_list(args: argparse.Namespace) -> list[str]:
    """`dssm train`'s KEY=VALUE overrides with its shorthand options expanded in front of them."""
    return objective_overrides(getattr(args, "objective", None)) + list(args.overrides)


def objective_overrides(objective: str | None) -> list[str]:
    """What `--objective` stands for; the user's KEY=VALUE overrides come after and win."""
    if objective == "paraphrase":
        return ["loss.objective=paraphrase", "model.shared_towers=true"]
    return [f"loss.objective={objective}"] if objective else []


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Defaults < --config < overrides; with --resume, the checkpoint's config replaces the defaults."""
    overrides = override_list(args)
    cfg = load_config(args.config, overrides)
    resolve_paths(cfg, args.workdir)
    found = newest_checkpoint(Path(cfg.out)) if args.resume else None
    if found is not None:
        cfg = load_config(args.config, overrides, base=found[1]["config"])
        resolve_paths(cfg, args.workdir)
    if not math.isfinite(cfg.optim.lr) or cfg.optim.lr <= 0:
        raise DssmError("optim.lr must be a positive number")
    return cfg


def launch(
    nproc: int,
    workdir: Path,
    overrides: list[str],
    config: Path | None = None,
    resume: bool = False,
    on_change: str | None = None,
) -> int:
    """Run this module under torchrun with `nproc` processes; returns torchrun's exit status.
    overrides: KEY=VALUE config overrides (objective shorthands already expanded)."""
    import subprocess

    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "modeling.train",
        "--workdir",
        str(workdir),
    ]
    if config:
        argv += ["--config", str(config)]
    if resume:
        argv.append("--resume")
    if on_change:
        argv += ["--on-change", on_change]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return subprocess.run([*argv, *overrides], env=env).returncode


def command(args: argparse.Namespace) -> None:
    """`dssm train`: in this process, or under torchrun with --nproc N."""
    if args.nproc < 1:
        raise DssmError("--nproc must be at least 1")
    if args.nproc > 1:
        from modeling.data import plan

        cfg = config_from_args(args)  # a bad config or data layout fails here, before N processes start
        plan(train_files(Path(cfg.data.negatives)), cfg.data.batch_size, args.nproc)
        if launch(args.nproc, args.workdir, override_list(args), args.config, args.resume, args.on_change) != 0:
            raise DssmError(f"training failed in one of the {args.nproc} processes (their messages are above)")
        return
    s = train(config_from_args(args), resume=args.resume, on_change=args.on_change)
    val = "n/a" if s["valid_loss"] is None else f"{s['valid_loss']:.4f}"
    rate = "" if s["examples_per_s"] is None else f", {s['examples_per_s']:,.0f} examples/s"
    print(
        f"trained {s['steps']:,} steps{rate}; validation loss {val}; checkpoint {s['checkpoint']}; "
        f"MLflow run {s['mlflow_run_id']}"
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of each torchrun process."""
    parser = argparse.ArgumentParser(prog="python -m modeling.train", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{rank} %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    try:
        train(config_from_args(args), resume=args.resume, on_change=args.on_change)
    except DssmError as e:
        print(f"dssm train (rank {rank}): error: {e}", file=sys.stderr)
        return 2
    return 0


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


if __name__ == "__main__":
    code = main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        exit_rank(code)
    sys.exit(code)
