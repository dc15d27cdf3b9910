"""The simulate stage: click logs of the judged set's train queries (stages/simulate/job.py)."""

from __future__ import annotations

from typing import Any

from core.stage import RunContext, StageOutput, run_data_stage
from stages.simulate.config import SimulationConfig


def run(ctx: RunContext, settings: SimulationConfig) -> StageOutput:
    """Simulated logs of the judged set's train queries; in a windowed run, the run date's logs as the
    partition `WORKDIR/logs/dt=DAY` (kept when already there): new logs landing each night."""
    from dataclasses import replace

    from stages.simulate.config import partition_name
    from stages.simulate.job import simulate

    cfg, judged = settings, ctx.judged
    day = ctx.window[-1] if ctx.window else ""
    out = ctx.layout.logs / partition_name(day) if day else ctx.layout.simulate

    def job() -> dict[str, Any]:
        from tqdm import tqdm

        desc = f"simulate {day}".strip()
        with tqdm(total=cfg.impressions, unit="imp", unit_scale=True, desc=desc, disable=None) as bar:
            return simulate(
                judged.pairs(),
                out,
                replace(cfg, day=day) if day else cfg,
                judged.describe(),
                progress=bar.update,
                force=ctx.force,
            )

    return run_data_stage("simulate", judged.path, out, job)
