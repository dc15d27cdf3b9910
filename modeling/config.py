"""One config object per training run: nested dataclasses, a YAML file, `key=value` overrides.

`dssm train --config run.yaml model.encoder=rnn optim.lr=0.05` resolves defaults < YAML < overrides,
and the resolved config is saved with every checkpoint and logged to MLflow as parameters.
Defaults follow Palangi et al. 2016 where the paper is specific; every departure is an option.
"""

from __future__ import annotations

import math
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from core.config import Between, check_choices, field_values, flat, load
from core.errors import DssmError
from modeling.model_config import ModelConfig


@dataclass
class OptimConfig:
    # auto: the encoder's own (nesterov: SGD with Nesterov momentum, Algorithm 1; adamw for the transformer)
    name: Literal["auto", "nesterov", "adam", "adamw"] = "auto"
    lr: float = 0.1  # fixed step size ε of nesterov and adam (tuned on the validation split; see docs/training.md)
    adamw_lr: float = 5e-5  # adamw's step size (pretrained transformer weights move in small steps)
    momentum: float = 0.995  # μ between the first and the last `momentum_edge` of updates
    momentum_edge_value: float = 0.9  # μ in the first and last momentum_edge of updates (the paper's schedule)
    momentum_edge: float = 0.02  # share of updates at each end that use momentum_edge_value
    clip_norm: float = 100.0  # th_G: gradients re-normalised to this global L2 norm when larger
    weight_decay: float = 0.0  # L2 weight decay of the optimiser
    # word-hashing tables: rows (only the rows a batch touches, the same updates computed lazily),
    # dense (whole tables every step), auto (rows where exact: Nesterov, no weight decay or loss.l2_embeddings)
    table_updates: Literal["auto", "rows", "dense"] = "auto"
    warmup: float = 0.0  # share of the updates over which the step size rises linearly to its value (0: none)
    decay: Literal["none", "linear"] = "none"  # linear: after the warm-up, the step size falls linearly to 0


@dataclass
class LossConfig:
    objective: Literal["click", "paraphrase"] = "click"  # click: eq. (5); paraphrase: Wieting & Gimpel's margin loss
    margin: float = 0.4  # paraphrase: δ of max(0, δ − cos(s1, s2) + cos(s1, t1))
    gamma: float = 10.0  # smoothing factor of the softmax over cosines, eq. (5)
    in_batch_negatives: bool = True  # also score every other clicked title of the global batch (all ranks)
    mask_in_batch: bool = False  # in-batch negatives skip the rows with the same query or the same clicked title
    # weight of a (query, clicked title) row; ipw: its clicks each weighted by 1/examination of their
    # rank (negatives built with `debias`)
    pair_weight: Literal["none", "clicks", "log_clicks", "ctr", "ipw", "log_ipw"] = "none"
    # λ of (1 − λ)·eq. (5) + λ·listwise: a softmax over the titles shown for a query against its
    # clicks / expected examinations (needs negatives built with `list_size` > 0; docs/training.md)
    listwise: float = 0.0
    l2_composition: float = 0.0  # Wieting & Gimpel's λ_c/2·‖θ‖² over every parameter but the embedding tables
    l2_embeddings: float = 0.0  # Wieting & Gimpel's λ_w/2·‖W − W_step0‖² pulling the tables to their start


OBJECTIVES = typing.get_args(typing.get_type_hints(LossConfig)["objective"])


@dataclass
class DataConfig:
    # global examples per step, split evenly over ranks and shards
    batch_size: Annotated[int, Between(1, 10_000_000)] = 256
    # rows per shard shuffled together (shards are written sorted by query)
    shuffle_buffer: Annotated[int, Between(1, 100_000_000)] = 16_384
    word_dropout: float = 0.0  # Wieting & Gimpel: drop each word with this probability (train only)
    scramble: float = 0.0  # Wieting & Gimpel: with this probability, shuffle the word order of a row's texts
    max_valid_rows: int = 20_000  # validation rows scored (the first rows of valid/)
    # where batches are built from the tokenised negatives: in the step, ahead in a worker process (into
    # page-locked memory on a GPU), or auto: process when training on a GPU, else step
    encode_in: Literal["auto", "step", "process"] = "auto"
    # of each row's n sampled negatives, how many the loss scores (-1: all; 0: in-batch negatives alone, as
    # sentence-transformers' MultipleNegativesRankingLoss); validation always scores all n
    negatives_per_row: int = -1


@dataclass
class DataInputs(DataConfig):
    negatives: str = ""  # a `dssm negatives` output (train/, valid/); empty: WORKDIR/negatives
    vocab: str = ""  # a `dssm vocab` output (trigrams/); empty: WORKDIR/vocab


@dataclass
class TrainRecipe:
    """The recipe: what a run learns and how. The retrain flow's `train` section embeds exactly this;
    TrainJob adds where one run reads and writes, which the flow fills in for each model."""

    epochs: Annotated[int, Between(1, 100_000)] = 5  # passes over the training rows
    max_steps: int = 0  # stop after this many updates (0: run all epochs)
    seed: int = 1  # initial weights, batch order, dropout
    log_every: int = 20  # training loss and throughput to MLflow every K steps
    eval_every: int = 200  # validation loss every K steps and at the end
    checkpoint_every: int = 200  # a checkpoint every K steps (a killed run resumes from the last)
    # ... and when this many seconds of training passed since the last one (0: by steps only), so that a stop
    # never loses more; with several ranks rank 0's clock decides at each log_every step (in the loss's all-reduce)
    checkpoint_seconds: float = 60.0
    keep_checkpoints: int = 2  # step-* checkpoints kept besides last.pt
    threads: int = 0  # torch threads per rank (0: CPUs / ranks)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when a GPU is visible
    run_name: str = ""  # MLflow run name; empty: ENCODER-seedSEED (e.g. lstm-seed1)
    init_from: str = ""  # a checkpoint whose weights start this run (same-shaped tensors; embeddings by token)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def flat(self) -> dict[str, Any]:
        """Dotted keys, as MLflow parameters."""
        return flat(self)


@dataclass
class TrainJob(TrainRecipe):
    """One training run: the recipe plus its plumbing (the data paths, the run directory, the store)."""

    data: DataInputs = field(default_factory=DataInputs)  # the recipe's data settings and the paths read
    out: str = ""  # run directory: checkpoints and the resolved config; empty: WORKDIR/train/ENCODER
    # tracking URI; empty: sqlite under the run directory's parent (the work dir); none: no MLflow run (benchmarks)
    mlflow_uri: str = ""
    experiment: str = "dssm-train"  # MLflow experiment (the retrain flow: the dataset's name)
    dataset: str = ""  # the judged set's name, tagged on the MLflow run (the retrain flow sets it)

    @classmethod
    def of(
        cls, settings: TrainRecipe, negatives: str, vocab: str, *, mlflow_uri: str, experiment: str, dataset: str
    ) -> TrainJob:
        """A run of `settings` on the `negatives` and `vocab` outputs, filed in `experiment` of the
        store at `mlflow_uri` under `dataset`; `out` is left to the work dir's default."""
        data = DataInputs(**field_values(settings.data, DataConfig), negatives=negatives, vocab=vocab)
        filed = {"mlflow_uri": mlflow_uri, "experiment": experiment, "dataset": dataset}
        return cls(**field_values(settings, TrainRecipe) | {"data": data} | filed)


def load_config(path: Path | None = None, overrides: list[str] | None = None, base: dict | None = None) -> TrainJob:
    """Defaults, then `base` (e.g. a checkpoint's config), then the YAML file, then overrides."""
    cfg = load(TrainJob(), path, overrides, base)
    check_config(cfg)
    return cfg


def config_changes(stored: dict[str, Any], cfg: TrainJob) -> list[str]:
    """How `cfg` differs from a checkpoint's saved config, as "key old -> new". Keys added to the
    config since the checkpoint was written read as their defaults, which keep the behaviour it had,
    so a code update alone does not make a finished run stale."""
    try:
        stored_cfg = load_config(base=stored)
    except DssmError as e:  # a key since removed, or a value no longer valid
        return [str(e)]
    before, now = stored_cfg.flat(), cfg.flat()
    if optimizer_name(stored_cfg) == optimizer_name(cfg):  # `auto` (the default since issue 48) is its resolution
        before["optim.name"] = now["optim.name"]
    return [f"{k} {before.get(k)!r} -> {v!r}" for k, v in now.items() if before.get(k) != v]


def optimizer_name(cfg: TrainRecipe) -> str:
    """`optim.name`, with auto resolved: adamw for a transformer encoder, else nesterov (Algorithm 1)."""
    from modeling.encoders import ENCODERS

    if cfg.optim.name != "auto":
        return cfg.optim.name
    spec = ENCODERS.get(cfg.model.encoder)
    return "adamw" if spec is not None and spec.transformer else "nesterov"


def rows_are_exact(cfg: TrainRecipe) -> bool:
    """Whether row-wise table updates equal the dense ones: untouched rows have a zero gradient, and the
    step size is constant (their drift is applied in closed form)."""
    o = cfg.optim
    constant = o.warmup == 0 and o.decay == "none"
    return optimizer_name(cfg) == "nesterov" and o.weight_decay == 0 and cfg.loss.l2_embeddings == 0 and constant


def check_config(cfg: TrainRecipe) -> None:
    from modeling.encoders import ENCODERS  # lazily: importing this module imports no torch

    check_choices(cfg)
    m, o = cfg.model, cfg.optim
    if not math.isfinite(cfg.checkpoint_seconds) or cfg.checkpoint_seconds < 0:
        raise DssmError("checkpoint_seconds must be a number >= 0 (0: checkpoints by steps only)")
    if not math.isfinite(o.lr) or o.lr <= 0 or not math.isfinite(o.adamw_lr) or o.adamw_lr <= 0:
        raise DssmError("optim.lr and optim.adamw_lr must be positive numbers")
    if m.encoder not in ENCODERS:
        raise DssmError(f"model.encoder {m.encoder!r}: choose one of {', '.join(ENCODERS)}")
    if o.table_updates == "rows" and not rows_are_exact(cfg):
        raise DssmError(
            "optim.table_updates=rows needs optim.name=nesterov, optim.weight_decay=0, loss.l2_embeddings=0 "
            "(they give untouched rows a gradient) and a constant step size (optim.warmup=0, optim.decay=none); "
            "use optim.table_updates=dense or auto"
        )
    if cfg.data.batch_size < 1 or m.ncell < 1 or m.max_words < 1 or m.max_tokens < 2:
        raise DssmError("data.batch_size, model.ncell and model.max_words must be positive, model.max_tokens >= 2")
    if ENCODERS[m.encoder].transformer:
        if m.train_layers < 1 or m.transformer_layers < 1 or m.ncell < 2:
            raise DssmError("model.train_layers and model.transformer_layers must be >= 1, model.ncell >= 2")
        if cfg.data.word_dropout or cfg.data.scramble:
            raise DssmError(
                f"model.encoder={m.encoder} reads word pieces: set data.word_dropout and data.scramble to 0"
            )
        if optimizer_name(cfg) == "nesterov" and o.name == "nesterov" and o.lr >= 0.01:
            raise DssmError(
                f"model.encoder={m.encoder} with optim.name=nesterov at optim.lr={o.lr} would wreck the pretrained "
                "weights; use optim.name=auto (adamw, optim.adamw_lr) or a much smaller optim.lr"
            )
    if cfg.loss.objective == "paraphrase" and not m.shared_towers:
        raise DssmError("loss.objective=paraphrase trains one shared encoder: add model.shared_towers=true")
    if not 0 <= cfg.loss.listwise <= 1:
        raise DssmError("loss.listwise must be in [0, 1]")
    if cfg.loss.listwise and cfg.loss.objective != "click":
        raise DssmError("loss.listwise needs loss.objective=click")
    if not 0 <= m.dropout < 1:
        raise DssmError("model.dropout must be in [0, 1)")
    if cfg.loss.l2_composition < 0 or cfg.loss.l2_embeddings < 0:
        raise DssmError("loss.l2_composition and loss.l2_embeddings must be >= 0")
    if not 0 <= cfg.data.word_dropout < 1 or not 0 <= cfg.data.scramble <= 1:
        raise DssmError("data.word_dropout must be in [0, 1) and data.scramble in [0, 1]")
    if not 0 <= o.warmup < 1:
        raise DssmError("optim.warmup must be in [0, 1)")
    if cfg.data.shuffle_buffer < 1:
        raise DssmError("data.shuffle_buffer must be at least 1")
    if cfg.data.negatives_per_row < -1:
        raise DssmError("data.negatives_per_row must be >= 0, or -1 for all the rows carry")
    if cfg.data.negatives_per_row == 0 and cfg.loss.objective == "click" and not cfg.loss.in_batch_negatives:
        raise DssmError(
            "data.negatives_per_row=0 with loss.in_batch_negatives=false leaves the clicked title nothing to "
            "compete with; score some sampled negatives or the batch's other titles"
        )
    check_device(cfg)


def check_device(cfg: TrainRecipe, device: str | None = None) -> None:
    """What cannot run on the device (cfg.device, or `device` once resolved): TorchScript's loop on CUDA."""
    if (device or cfg.device) == "cuda" and cfg.model.impl == "script":
        raise DssmError(
            "model.impl=script runs on the CPU only (its TorchScript loop failed in the interpreter on CUDA); "
            "on a GPU use model.impl=auto (the Python loop) or native (nn.LSTM's kernels, with a forget gate)"
        )
