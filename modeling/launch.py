"""`dssm train`'s command line, and the entry point of the torchrun ranks it launches.

`dssm train` resolves the config once (defaults < --config YAML < KEY=VALUE overrides; with --resume
the checkpoint's config replaces the defaults) and trains in this process, or with --nproc N writes
the resolved config to a JSON file and starts N ranks, `torchrun -m modeling.launch --resolved-config
FILE`, which read it back and never see the overrides. torchrun can also start the ranks itself with
the command line's options and overrides (each rank then resolves them):
`torchrun --nproc-per-node N -m modeling.launch --workdir work model.encoder=rnn`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from core.errors import DssmError
from core.machine import cpus_per_process
from modeling.checkpoint import newest_checkpoint
from modeling.config import TrainJob, load_config
from modeling.data import plan, train_files
from modeling.distributed import exit_rank
from modeling.train import resolve_paths, train


def add_arguments(p: argparse.ArgumentParser) -> None:
    from core.options import HelpFormatter, keys_text
    from modeling.config import OBJECTIVES, TrainJob

    p.formatter_class = HelpFormatter
    p.epilog = keys_text(TrainJob, "keys (KEY=VALUE, or in a --config YAML; docs/training.md#every-key):")
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
        choices=OBJECTIVES,
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


def objective_overrides(objective: str | None) -> list[str]:
    """What `--objective` stands for; the user's KEY=VALUE overrides come after and win."""
    if objective == "paraphrase":
        return ["loss.objective=paraphrase", "model.shared_towers=true"]
    return [f"loss.objective={objective}"] if objective else []


def config_from_args(args: argparse.Namespace) -> TrainJob:
    """Defaults < --config < overrides; with --resume, the checkpoint's config replaces the defaults."""
    overrides = objective_overrides(args.objective) + list(args.overrides)
    cfg = resolve_paths(load_config(args.config, overrides), args.workdir)
    found = newest_checkpoint(Path(cfg.out)) if args.resume else None
    if found is not None:
        cfg = resolve_paths(load_config(args.config, overrides, base=found[1]["config"]), args.workdir)
    return cfg


def command(args: argparse.Namespace) -> None:
    """`dssm train`: in this process, or under torchrun with --nproc N."""
    if args.nproc < 1:
        raise DssmError("--nproc must be at least 1")
    cfg = config_from_args(args)  # a bad config or data layout fails here, before N processes start
    if args.nproc > 1:
        if launch(args.nproc, cfg, args.resume, args.on_change) != 0:
            raise DssmError(f"training failed in one of the {args.nproc} processes (their messages are above)")
        return
    s = train(cfg, resume=args.resume, on_change=args.on_change)
    val = "n/a" if s["valid_loss"] is None else f"{s['valid_loss']:.4f}"
    rate = "" if s["examples_per_s"] is None else f", {s['examples_per_s']:,.0f} examples/s"
    tracked = f"MLflow run {s['mlflow_run_id']}" if s["mlflow_run_id"] else "no MLflow run"
    print(
        f"trained {s['steps']:,} steps on {s['device']}{rate}; validation loss {val}; "
        f"checkpoint {s['checkpoint']}; {tracked}"
    )


def launch(nproc: int, cfg: TrainJob, resume: bool = False, on_change: str | None = None) -> int:
    """Train the resolved `cfg` (paths filled: `resolve_paths`) under torchrun with `nproc` ranks;
    returns torchrun's exit status. resume, on_change: as `train`'s. The config reaches the ranks as
    a JSON file next to the run directory, removed when torchrun returns."""
    import subprocess

    path = write_resolved(cfg)  # refuses an unresolved config
    try:
        plan(train_files(Path(cfg.data.negatives)), cfg.data.batch_size, nproc)  # a bad layout fails before N ranks
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        argv += ["-m", "modeling.launch", "--resolved-config", str(path)]
        if resume:
            argv.append("--resume")
        if on_change:
            argv += ["--on-change", on_change]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(cpus_per_process(nproc)))
        proc = subprocess.Popen(argv, env=env)
        try:
            return proc.wait()
        except BaseException:  # SIGTERM or ^C here (or any error): the ranks must not outlive this process
            stop_group(proc)
            raise
    finally:
        path.unlink(missing_ok=True)


def stop_group(proc, grace: float = 7.0) -> None:
    """SIGTERM to torchrun, which forwards it to each rank once (a second signal would cut short a rank's
    own stop): each rank marks its run KILLED and leaves its last checkpoint. torchrun starts every rank
    in a session of its own, so what is left of torchrun or its ranks after `grace` seconds is killed
    here, by pid."""
    import psutil

    from core.stopping import end_processes

    try:
        torchrun = psutil.Process(proc.pid)
        family = [torchrun, *torchrun.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    end_processes(family, wait=grace, signalled=[torchrun])


def write_resolved(cfg: TrainJob) -> Path:
    """`cfg` as JSON in `.OUT.config-PID.json` beside the run directory OUT, written atomically."""
    unresolved = [k for k in ("out", "mlflow_uri", "data.negatives", "data.vocab") if not cfg.flat().get(k)]
    if unresolved:
        raise DssmError(f"launch needs a resolved config (resolve_paths); empty: {', '.join(unresolved)}")
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.parent / f".{out.name}.config-{os.getpid()}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def read_resolved(path: Path) -> TrainJob:
    """The config `write_resolved` wrote, validated as any other."""
    return load_config(Path(path))  # JSON is YAML: core.config.read_yaml's checks and errors


def main(argv: list[str] | None = None) -> int:
    """Entry point of each torchrun process."""
    parser = argparse.ArgumentParser(prog="python -m modeling.launch", description=__doc__)
    add_arguments(parser)
    parser.add_argument(
        "--resolved-config",
        type=Path,
        help="a config resolved by `dssm train --nproc N` (JSON), instead of --config, --objective and overrides",
    )
    args = parser.parse_args(argv)
    if args.resolved_config and (args.config or args.objective or args.overrides):
        parser.error("--resolved-config is the whole config: no --config, --objective or KEY=VALUE with it")
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{rank} %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    from core.stopping import is_stop, signal_of, signals_stop

    try:
        with signals_stop():  # SIGTERM from `dssm train`/`dssm run` (stop_group): the run ends KILLED, resumable
            cfg = read_resolved(args.resolved_config) if args.resolved_config else config_from_args(args)
            train(cfg, resume=args.resume, on_change=args.on_change)
    except DssmError as e:
        print(f"dssm train (rank {rank}): error: {e}", file=sys.stderr)
        return 2
    except BaseException as e:
        if not is_stop(e):
            raise
        print(f"dssm train (rank {rank}): stopped by signal {signal_of(e)}", file=sys.stderr)
        return 128 + signal_of(e)
    return 0


def run_rank() -> None:
    """`main`, then leave the process (a rank of several without interpreter finalisation: `exit_rank`)."""
    code = main()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        exit_rank(code)
    sys.exit(code)


if __name__ == "__main__":
    run_rank()
