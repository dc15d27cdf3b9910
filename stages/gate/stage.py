"""The gate stage: the champion alias moved to a better registered version (stages/gate/job.py)."""

from __future__ import annotations

from pathlib import Path

from core.stage import RunContext, StageOutput, run_data_stage


def run(ctx: RunContext, register: StageOutput) -> StageOutput:
    """`dssm gate` of the registered versions: the champion alias moves to a better one."""
    from stages.gate.job import gate as champion_gate

    out = ctx.layout.output("gate")
    job = lambda: champion_gate(Path(register.path), out, ctx.cfg.gate, ctx.force)  # noqa: E731
    return run_data_stage("gate", register.path, out, job)
