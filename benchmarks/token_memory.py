"""How much memory the token arrays take in a DDP training: one copy for all ranks, or one per rank.

For a pipeline work dir's negatives and vocabulary, `dssm train` runs with `--nproc N` (torchrun, gloo on
the CPU) for a few steps while this script samples, every half second, each process that maps a file of
the work dir's `tokens/` cache (the ranks, and loader workers where there are any): the resident memory
of those mappings (Rss) and each process's share of it (Pss, a page shared by k processes counting 1/k
in each), and each process's whole Pss. The token cache is emptied first, so rank 0 tokenises and the
other ranks map what it wrote (modeling/tokens.py, core/array_cache.py). It prints, at the sample where
the ranks' token mappings were largest:

    tokens: S MB on disk; rank r: token mappings Rss X MB (Pss Y MB), whole Pss Z MB; ...
    the ranks' token Pss together: T MB = T/S of one copy

    python benchmarks/token_memory.py --workdir bench-work/hd --nproc 2 [--steps 40] [KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root (scripts_common's docstring)

from core.layout import Layout
from modeling.tokens import tokens_dir


def mappings(process: psutil.Process, folder: str) -> tuple[int, int, int] | None:
    """(Rss, Pss of the mappings of files under `folder`, whole Pss), in kB; None when it maps none."""
    try:
        tokens = [m for m in process.memory_maps(grouped=True) if m.path.startswith(folder)]
        if not tokens:
            return None
        return (
            sum(m.rss for m in tokens) // 1024,
            sum(m.pss for m in tokens) // 1024,
            process.memory_full_info().pss // 1024,
        )
    except psutil.Error:
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, required=True, help="a pipeline work dir with negatives/ and vocab/")
    p.add_argument("--nproc", type=int, default=2, help="training processes (torchrun)")
    p.add_argument("--steps", type=int, default=40, help="training steps (max_steps)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="training config keys (dssm train's)")
    args = p.parse_args()
    layout = Layout(args.workdir)
    folder = tokens_dir(layout.negatives)
    shutil.rmtree(folder, ignore_errors=True)
    out = args.workdir / "train-memory"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "dssm.cli", "train", "--workdir", str(args.workdir), "--nproc", str(args.nproc)]
    command += [f"out={out}", f"max_steps={args.steps}", "eval_every=100000", "mlflow_uri=none", *args.overrides]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    best: dict[int, tuple[int, int, int]] = {}
    while proc.poll() is None:
        seen = {}
        for process in psutil.process_iter():
            found = mappings(process, str(folder)) if process.pid != os.getpid() else None
            if found is not None:
                seen[process.pid] = found
        if sum(v[0] for v in seen.values()) > sum(v[0] for v in best.values()):
            best = seen
        time.sleep(0.5)
    if proc.returncode != 0:
        sys.exit(f"dssm train failed ({proc.returncode}): {proc.stderr.read()[-2000:]}")
    size = sum(f.stat().st_size for f in folder.rglob("*.npy")) / 1e6
    rows = [
        f"pid {pid}: token mappings Rss {rss / 1e3:.1f} MB (Pss {pss / 1e3:.1f} MB), whole Pss {total / 1e3:.0f} MB"
        for pid, (rss, pss, total) in sorted(best.items())
    ]
    print(f"tokens: {size:.1f} MB on disk; " + "; ".join(rows))
    together = sum(v[1] for v in best.values()) / 1e3
    print(f"the processes' token Pss together: {together:.1f} MB = {together / size:.2f} of one copy" if size else "")


if __name__ == "__main__":
    main()
