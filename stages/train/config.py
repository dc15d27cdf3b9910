"""The train stage's settings, the flow's `train` section, in a module that imports no pyspark, mlflow or
torch: the training recipe (modeling/config.py's TrainRecipe, every `dssm train` key but where a run reads
and writes) plus how the flow runs it, one model per encoder."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from core.config import apply, field_values, parse_overrides
from core.errors import DssmError
from modeling.config import TrainRecipe

DEVICES = ("cpu", "cuda")  # what a train.per_encoder entry ENCODER@DEVICE may name


@dataclass
class TrainConfig(TrainRecipe):
    """The training recipe (`train.optim.lr`, `train.epochs`, ...) plus how the flow runs it. The flow
    fills in the rest for each model: its data paths, run directory and store."""

    models: list[str] = field(default_factory=list)  # encoders trained side by side; empty: model.encoder alone
    # training KEY=VALUEs for one encoder only, over the rest of this section, e.g. {minilm: [data.batch_size=64]};
    # an entry ENCODER@cuda (or @cpu) applies over ENCODER's when the model trains on that device (docs/flows.md)
    per_encoder: dict[str, list[str]] = field(default_factory=dict)
    nproc: int = 0  # processes under torchrun; 0: one per GPU, else 1
    warm_start: bool = True  # windowed runs: start from the champion when compatible (docs/flows.md)
    warm_min_overlap: float = 0.5  # ... when its vocabulary holds at least this share of the new one's tokens

    def encoders(self) -> list[str]:
        return list(dict.fromkeys(self.models)) or [self.model.encoder]

    def for_encoder(self, encoder: str, device: str = "cpu") -> TrainRecipe:
        """The recipe of one model on `device` (cpu or cuda): this section without the flow's own keys,
        with the encoder's `per_encoder` KEY=VALUEs applied, then those of ENCODER@DEVICE."""
        recipe = TrainRecipe(**field_values(self, TrainRecipe))
        recipe = replace(recipe, model=replace(recipe.model, encoder=encoder))
        for entry in (encoder, f"{encoder}@{device}"):
            recipe = apply(recipe, parse_overrides(self.per_encoder.get(entry, [])), f"train.per_encoder.{entry}.")
        return recipe


def flat_keys(nested: dict, prefix: str = "") -> list[str]:
    """The dotted keys of a nested dict (parsed KEY=VALUEs)."""
    keys = []
    for key, value in nested.items():
        keys += flat_keys(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]
    return keys


def check_config(cfg: TrainConfig) -> None:
    """Every model's recipe on either device, before any stage runs, whatever the machine."""
    from modeling.config import check_config as check_recipe
    from modeling.config import check_device
    from modeling.encoders import ENCODERS

    for encoder, pairs in cfg.per_encoder.items():
        if "model.encoder" in flat_keys(parse_overrides(pairs)):
            raise DssmError(f"train.per_encoder.{encoder}: model.encoder is the entry's own name; leave it out")
    entries = [m.partition("@") for m in cfg.per_encoder]
    unknown = [m for m in cfg.models if m not in ENCODERS] + [e for e, _, _ in entries if e not in ENCODERS]
    if unknown:
        raise DssmError(f"train.models: unknown encoder(s) {', '.join(unknown)}; choose from {', '.join(ENCODERS)}")
    devices = [f"{e}@{d}" for e, at, d in entries if at and d not in DEVICES]
    if devices:
        raise DssmError(f"train.per_encoder: {', '.join(devices)}: the device after @ is one of {', '.join(DEVICES)}")
    if cfg.nproc < 0:
        raise DssmError(f"train.nproc must be >= 0, got {cfg.nproc}")
    if cfg.epochs < 1:  # before the training config was the train section, 0 meant "its default"
        raise DssmError(f"train.epochs must be >= 1 (the default is {TrainRecipe().epochs}), got {cfg.epochs}")
    for encoder in dict.fromkeys([*cfg.encoders(), *(e for e, _, _ in entries)]):
        for device in DEVICES:
            recipe = cfg.for_encoder(encoder, device)
            check_recipe(recipe)  # an explicit `device` checked there; auto may meet either
            if recipe.device == "auto":
                check_device(recipe, device)
