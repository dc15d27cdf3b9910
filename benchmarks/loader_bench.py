"""What the training input pipeline alone delivers, without a model, on one core.

For a pipeline work dir's negatives, each encoder's batches are built as `dssm train` builds them in
the step (modeling/data.py over the tokenised negatives, modeling/tokens.py), pinned to one CPU core:

- lstm: letter-trigram batches of the work dir's vocabulary, 1 query + 1 clicked title + all n
  sampled negatives per example (the LSTM-RNN's inputs);
- minilm: word-piece batches of the bundled all-MiniLM-L6-v2 tokenizer (48 pieces a text), a query
  and its clicked title per pair (the transformer's GPU recipe: data.negatives_per_row=0).

It prints one line per encoder, `lstm: N examples/s` and `minilm: N pairs/s`, after the time the
tokenisation took (or the cache it was read from):

    python benchmarks/loader_bench.py --workdir bench-work/hd
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root (scripts_common's docstring)

from core.artifacts import require_manifest
from core.layout import Layout
from modeling.config import DataConfig, ModelConfig
from modeling.data import ClickBatches, train_files
from modeling.encoders import tokenizer_for
from modeling.hashing import Vocab
from modeling.tokens import load_or_build, tokens_dir

ENCODERS = {
    "lstm": ("examples", ModelConfig(encoder="lstm"), -1),
    "minilm": ("pairs", ModelConfig(encoder="minilm", max_tokens=48), 0),
}


def measure(workdir: Path, encoder: str, batch_size: int, steps: int, rebuild: bool) -> tuple[float, float, str]:
    """(items per second, seconds to tokenise or read the cache, where the cache is)."""
    unit, model, per_row = ENCODERS[encoder]
    layout = Layout(workdir)
    manifest = require_manifest(layout.negatives, "negatives")
    n = int(manifest["params"]["n"])
    tokenizer = tokenizer_for(model, Vocab.load(layout.vocab, model.tokens))
    if rebuild:
        shutil.rmtree(tokens_dir(layout.negatives), ignore_errors=True)
    started = time.perf_counter()
    tokenised = load_or_build(layout.negatives, manifest["content_sha256"], tokenizer, n)
    loaded = time.perf_counter() - started
    files = train_files(layout.negatives)
    cfg = DataConfig(batch_size=batch_size, negatives_per_row=per_row)
    batches = ClickBatches(tokenised, files, 0, 1, cfg, n, seed=1)
    stream = batches.steps(0, steps + 5)
    for _ in range(5):  # the first epoch's order and numpy's first calls
        next(stream)
    started = time.perf_counter()
    built = sum(1 for _ in stream)
    seconds = time.perf_counter() - started
    return built * batch_size / seconds, loaded, str(tokenised.path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, required=True, help="a pipeline work dir with negatives/ and vocab/")
    p.add_argument("--encoders", nargs="+", default=list(ENCODERS), choices=list(ENCODERS))
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--steps", type=int, default=200, help="batches timed, after 5 untimed")
    p.add_argument("--rebuild", action="store_true", help="tokenise afresh (time the cache's build)")
    p.add_argument("--core", type=int, default=0, help="the CPU core to run on (default: %(default)s)")
    args = p.parse_args()
    os.sched_setaffinity(0, {args.core})
    import torch

    torch.set_num_threads(1)
    for encoder in args.encoders:
        rate, loaded, path = measure(args.workdir, encoder, args.batch_size, args.steps, args.rebuild)
        unit = ENCODERS[encoder][0]
        print(f"{encoder}: {rate:,.0f} {unit}/s (batch {args.batch_size}; tokens {loaded:.1f} s, {path})", flush=True)


if __name__ == "__main__":
    main()
