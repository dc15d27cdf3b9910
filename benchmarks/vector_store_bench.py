"""A warm read of MiniLM's vector store against how its vectors reached the disk: one writer, or many small ones.

The fault probe of issue 73 found 2,000 small shards (a search service's odd batches) made a read 80x
slower, since every read scanned every shard's keys. The store (scoring/vector_store.py) now merges past
MAX_SHARDS and keeps each process's index of the keys. For `--titles` synthetic titles of 384-d vectors it
writes them once as one shard, and again in `--writers` shards, then reads every title back `--reads` times
in a new process's store (the first read indexes the keys; the rest are warm) and prints per layout:

    one writer: S shards on disk, first read X ms, warm read Y ms (median)

    python benchmarks/vector_store_bench.py [--titles 44839] [--writers 2000] [--reads 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root (scripts_common's docstring)

import numpy as np

from scoring.vector_store import VectorStore


def measure(folder: Path, titles: list[str], reads: int) -> tuple[int, float, list[float]]:
    store = VectorStore(folder)  # a new process's: an empty index
    shards = sum(1 for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    times = []
    for _ in range(reads + 1):
        started = time.perf_counter()
        found = store.read(titles, 384)
        times.append((time.perf_counter() - started) * 1e3)
        assert len(found) == len(titles)
    return shards, times[0], times[1:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--titles", type=int, default=44_839, help="titles (Home Depot's catalogue: 44,839)")
    p.add_argument("--writers", type=int, default=2_000, help="small writers of the second layout")
    p.add_argument("--reads", type=int, default=5, help="warm reads timed")
    args = p.parse_args()
    titles = [f"synthetic title {i}" for i in range(args.titles)]
    vectors = np.random.default_rng(0).standard_normal((args.titles, 384)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        every = np.arange(args.titles)
        layouts = {"one writer": [every], f"{args.writers} writers": np.array_split(every, args.writers)}
        for name, parts in layouts.items():
            folder = Path(tmp) / name.replace(" ", "-")
            store = VectorStore(folder)
            started = time.perf_counter()
            for index in parts:
                store.write([titles[i] for i in index], vectors[index])
            wrote = time.perf_counter() - started
            shards, first, warm = measure(folder, titles, args.reads)
            print(
                f"{name}: {shards} shards on disk (written in {wrote:.1f} s), first read {first:.0f} ms, "
                f"warm read {statistics.median(warm):.0f} ms (median of {len(warm)})"
            )


if __name__ == "__main__":
    main()
