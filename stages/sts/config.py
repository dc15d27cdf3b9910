"""`dssm sts`'s settings, in a module that imports no pyspark, mlflow or torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import DssmError


@dataclass
class StsConfig:
    baselines: list[str] = field(default_factory=list)  # off-the-shelf encoders scored beside the models: minilm


def check_config(settings: StsConfig) -> None:
    unknown = [b for b in settings.baselines if b != "minilm"]
    if unknown:
        raise DssmError(f"unknown STS baseline(s) {', '.join(unknown)}; choose minilm")
