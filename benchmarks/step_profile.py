"""Where a training step's time goes: torch.profiler over steps of `dssm train`'s own loop.

Builds a run as `dssm train` does (modeling.train.setup: model, optimiser, row-wise tables, batches
from the tokenised negatives, built in the step), trains `--warmup` steps, then profiles `--steps`
more and prints the wall time a step spends building its batch and in `train_step` (the copy to the
device, forward, loss, backward, clipping, the optimiser, the row-wise tables), then torch's top
operators by their own time (on a GPU: by GPU time).

    python benchmarks/step_profile.py --workdir bench-work/hd model.encoder=lstm data.batch_size=256
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root (scripts_common's docstring)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, required=True, help="a pipeline work dir with negatives/ and vocab/")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--top", type=int, default=15, help="operators listed")
    p.add_argument("--trace", type=Path, help="also write a Chrome trace here")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="`dssm train` keys")
    args = p.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    import modeling.train as T
    from modeling.config import load_config
    from modeling.data import plan, train_files
    from modeling.distributed import Dist, pick_device
    from modeling.encoders import tokenizer_for
    from modeling.resume import Start
    from modeling.tokens import load_or_build

    scratch = args.workdir / "step-profile"
    cfg = load_config(None, [f"out={scratch}", "mlflow_uri=none", *args.overrides])
    cfg = T.resolve_paths(cfg, args.workdir)
    d = Dist()
    device = pick_device(cfg, 0)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    inputs = T.load_inputs(cfg)
    files = train_files(inputs.negatives)
    total = args.warmup + args.steps
    n = int(inputs.negatives_manifest["params"]["n"])
    tokenizer = tokenizer_for(cfg.model, inputs.vocab)
    tokenised = load_or_build(inputs.negatives, inputs.negatives_manifest["content_sha256"], tokenizer, n)
    plan(files, cfg.data.batch_size, 1)
    batches = T.ClickBatches(tokenised, files, 0, 1, cfg.data, n, cfg.seed, cfg.loss.pair_weight, cfg.loss.listwise > 0)
    run = T.setup(cfg, inputs, batches, total, Start("fresh"), device, d)
    parts: dict[str, float] = defaultdict(float)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(name: str, fn):
        started = time.perf_counter()
        with record_function(name):
            out = fn()
        sync()
        parts[name] += time.perf_counter() - started
        return out

    stream = batches.steps(0, total)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for step in range(1, total + 1):
            if step == args.warmup + 1:
                parts.clear()
                started = time.perf_counter()
            batch = timed("batch", lambda: next(stream))
            timed("step", lambda b=batch, s=step: T.train_step(run, b, s))
        seconds = time.perf_counter() - started
    run.tracker.close()
    rate = args.steps * cfg.data.batch_size / seconds
    print(f"{cfg.model.encoder} on {device}, batch {cfg.data.batch_size}: {rate:,.0f} examples/s, {args.steps} steps")
    for name, spent in parts.items():
        print(f"  {name:<6} {1000 * spent / args.steps:8.2f} ms/step  {100 * spent / seconds:5.1f}%")
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=args.top))
    if args.trace:
        prof.export_chrome_trace(str(args.trace))


if __name__ == "__main__":
    main()
