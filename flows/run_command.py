"""`dssm run`: its options (the run config) and what it prints; the flow itself is flows/retrain.py,
imported only when a run starts, so `dssm run --help` does not load Prefect."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from core.layout import Layout


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:.4f}" if isinstance(value, float) else str(value)


def add_arguments(p) -> None:
    """`dssm run`'s options: the run config (flows/config.py); the stage list as the epilog."""
    from core.options import HelpFormatter
    from flows.config import add_run_arguments
    from flows.pipeline import describe

    add_run_arguments(p)
    p.formatter_class = HelpFormatter
    p.epilog = describe()


class FailureReport(logging.Filter):
    """Prefect's console report of a failed run: the exception's traceback (about 100 lines) and the
    state lines that repeat the error `dssm run` then prints as its one line. Only the console's
    handler drops them: Prefect's API handler still sends them to the flow run's logs (the UI)."""

    REPEATS = ("Finished in state Failed", "Finished in state Crashed")

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(("prefect.flow_runs", "prefect.task_runs")):
            return True
        return not record.exc_info and not record.getMessage().startswith(self.REPEATS)


@contextmanager
def console_without_failure_report(verbose: bool) -> Iterator[None]:
    """Prefect's console handlers, for the block, without its failure report (kept with -v, as other
    commands show a trace only with -v)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    handlers = [] if verbose else [h for h in logging.getLogger().handlers if isinstance(h, PrefectConsoleHandler)]
    quiet = FailureReport()
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)


def command(args) -> None:
    """`dssm run`: the flow, ad hoc, then its table and each stage's time and counts."""
    import time

    from flows.config import config_from_args
    from flows.guardian import start_guardian
    from flows.pipeline import PIPELINE
    from flows.retrain import retrain

    cfg = config_from_args(args)
    start_guardian()  # a SIGKILL of this pid alone must not orphan the ephemeral Prefect server
    started = time.time()
    with console_without_failure_report(getattr(args, "verbose", False)):
        summary = retrain(cfg)
    layout = Layout(cfg.workdir)
    if (layout.evaluate / "report.md").exists() and "systems" in summary:
        print("\n" + (layout.evaluate / "report.md").read_text(), end="")
    print(f"\npipeline finished in {time.time() - started:.0f}s (flow run {summary['pipeline']['flow_run_id']}):")
    for out in summary["pipeline"]["stages"]:
        state = "skipped " if out["skipped"] else f"{out['seconds']:6.1f}s "
        shown = ", ".join(f"{k} {_number(v)}" for k, v in out["counts"].items())
        print(f"  {out['stage']:<10} {state} {out['path']}  ({shown})")
    ran = [stage for stage in PIPELINE if stage.name in {out["stage"] for out in summary["pipeline"]["stages"]}]
    for stage in ran:
        if printed := stage.hook("printed"):
            print("\n".join(printed(summary)))
    print(f"report: {layout.report}")
    for stage in ran:  # what to do next with what a stage made
        if stage.then:
            print(stage.then.format(workdir=cfg.workdir))
