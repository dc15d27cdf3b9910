"""The gate stage: the champion alias moved to a better registered version (stages/gate/job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.stage import RunContext, StageOutput, run_data_stage
from stages.gate.config import GateConfig


def run(ctx: RunContext, settings: GateConfig, register: StageOutput) -> StageOutput:
    """`dssm gate` of the registered versions: the champion alias moves to a better one."""
    from stages.gate.job import gate as champion_gate

    out = ctx.layout.output("gate")
    job = lambda: champion_gate(Path(register.path), out, settings, ctx.force)  # noqa: E731
    return run_data_stage("gate", register.path, out, job)


def printed(summary: dict[str, Any]) -> list[str]:
    """The flow's hook for `dssm run`'s console: each gate decision, one line."""
    return [
        f"  {g['model']} v{g['version']} ({g['system']}): {'promoted' if g['promoted'] else 'kept'} ({g['reason']})"
        for g in summary.get("gate", [])
    ]


def report(output: StageOutput) -> dict[str, Any]:
    """The flow's hook after the walk: each gate decision, and the nightly trend when there is one."""
    from core.artifacts import read_manifest
    from scoring.serving import read_gate

    trend = (read_manifest(Path(output.path)) or {}).get("trend")
    return {"gate": read_gate(Path(output.path))} | ({"gate_trend": trend} if trend else {})
