"""Training throughput: examples per second (1 query + 1 clicked title + n negatives each; for the
transformer's GPU recipe, `minilm-all`, a query and its clicked title: pairs per second).

Each configuration runs `dssm train` as a user would (with `--nproc N` for DDP), for `--steps`
updates on a pipeline work dir's negatives, at each `--batch-size`; the rate is the run's steady
rate (its summary.json: the steps after the first logged window, which holds start-up and warm-up).
`--vocab-size` pads the trigram vocabulary with unused ids so the embedding tables (and their
dense gradients) have that size. `--device cuda` trains on the GPU (bf16), `--mlflow-uri none`
where MLflow is not installed (no bytes-sent column then).

    python benchmarks/train_bench.py --workdir bench-work/hd --vocab-size 30000
    python benchmarks/train_bench.py --configs lstm minilm-all --nproc 1 --batch-size 256 1024 4096 --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: scripts_common (see its docstring)

import pyarrow as pa
import pyarrow.parquet as pq

from core.layout import Layout
from scripts_common import ROOT

# (label, encoder, overrides)
CONFIGS = {
    "lstm": ("lstm", []),
    "lstm-dense": ("lstm", ["optim.table_updates=dense"]),  # whole tables every step (before issue 19)
    "lstm-process": ("lstm", ["data.encode_in=process"]),  # batches encoded ahead in a DataLoader worker
    "lstm-1thread": ("lstm", ["threads=1"]),  # 1 process on 1 core: what each of 2 DDP ranks has
    "lstm-script": ("lstm", ["model.impl=script"]),
    "lstm-fg-loop": ("lstm", ["model.forget_gate=true", "model.impl=loop"]),
    "lstm-fg-native": ("lstm", ["model.forget_gate=true", "model.impl=native"]),
    "rnn": ("rnn", []),
    "rnn-native": ("rnn", ["model.impl=native"]),
    "dssm": ("dssm", []),
    "dssm-dense": ("dssm", ["optim.table_updates=dense"]),
    "dssm-process": ("dssm", ["data.encode_in=process"]),
    "clsm": ("clsm", []),
    "clsm-dense": ("clsm", ["optim.table_updates=dense"]),
    "bilstm": ("bilstm", []),
    "lstm_avg": ("lstm_avg", []),
    "gran": ("gran", []),
    "avg": ("avg", []),
    "rnn-dense": ("rnn", ["optim.table_updates=dense"]),
    # the transformer: the bounded CPU fine-tune of configs/homedepot_search.yaml, and every layer trained as its
    # GPU recipe does (in-batch negatives alone: each example is a (query, clicked title) pair)
    "minilm": ("minilm", ["model.train_layers=2", "model.max_tokens=24", "loss.gamma=20"]),
    "minilm-all": (
        "minilm",
        ["model.train_layers=6", "model.max_tokens=48", "data.negatives_per_row=0", "loss.mask_in_batch=true"],
    ),
}


def padded_vocab(workdir: Path, size: int, dest: Path) -> Path:
    """A copy of WORKDIR/vocab whose trigram table has `size` ids (extra tokens never occur)."""
    from core.artifacts import read_manifest, write_manifest

    if dest.exists():
        shutil.rmtree(dest)
    (dest / "trigrams").mkdir(parents=True)
    table = pq.read_table(Layout(workdir).vocab / "trigrams").sort_by("id")
    extra = max(0, size - table.num_rows)
    pad = pa.table(
        {
            "id": pa.array(range(table.num_rows, table.num_rows + extra), pa.int32()),
            "token": pa.array([f"<pad{i}>" for i in range(extra)]),
            "count": pa.array([0] * extra, pa.int64()),
        },
        schema=table.schema,
    )
    pq.write_table(pa.concat_tables([table, pad]), dest / "trigrams" / "part-00000.parquet")
    manifest = read_manifest(Layout(workdir).vocab)
    write_manifest(dest, {k: manifest[k] for k in ("stage", "inputs", "params")})
    return dest


def run(label: str, nproc: int, batch_size: int, args: argparse.Namespace, vocab: Path, scratch: Path) -> dict:
    encoder, overrides = CONFIGS[label]
    name = f"{label}-{nproc}-b{batch_size}"
    out = scratch / name
    shutil.rmtree(out, ignore_errors=True)
    uri = args.mlflow_uri or f"sqlite:///{scratch / 'mlflow.db'}"
    cmd = [
        sys.executable,
        "-m",
        "dssm.cli",
        "train",
        "--workdir",
        str(args.workdir),
        "--nproc",
        str(nproc),
        f"model.encoder={encoder}",
        f"out={out}",
        f"data.vocab={vocab}",
        f"mlflow_uri={uri}",
        f"max_steps={args.steps}",
        f"log_every={args.window}",
        "eval_every=1000000",
        "checkpoint_every=1000000",
        "checkpoint_seconds=0",
        "data.max_valid_rows=1024",  # the final validation is outside the rate; kept short (a transformer's on a CPU)
        f"data.batch_size={batch_size}",
        f"device={args.device}",
        "experiment=train-bench",
        f"run_name={name}",
        *overrides,
    ]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {
        "config": label,
        "encoder": encoder,
        "overrides": overrides,
        "nproc": nproc,
        "batch_size": batch_size,
        "device": summary["device"],
        "examples_per_s": summary["steady_examples_per_s"] or summary["examples_per_s"],
        "sent_bytes_per_example": sent_bytes(uri, name) if nproc > 1 and uri != "none" else 0.0,
        "wall_s": time.perf_counter() - started,
    }


def sent_bytes(uri: str, name: str) -> float:
    """What each DDP rank sent per example, from the run's MLflow metrics."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs(
        [client.get_experiment_by_name("train-bench").experiment_id],
        f"attributes.run_name = '{name}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    sent = [m.value for m in client.get_metric_history(runs[0].info.run_id, "sent_bytes_per_example")]
    return sum(sent) / len(sent) if sent else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--workdir",
        type=Path,
        default=ROOT / "bench-work" / "hd",
        help="a pipeline work dir with negatives/ and vocab/ (default: %(default)s)",
    )
    parser.add_argument("--configs", nargs="+", default=["lstm", "rnn", "dssm", "clsm"], choices=sorted(CONFIGS))
    parser.add_argument("--nproc", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--vocab-size", type=int, default=30_000)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--window", type=int, default=20, help="steps per throughput window")
    parser.add_argument("--batch-size", type=int, nargs="+", default=[256], help="global batch sizes swept")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--mlflow-uri", default="", help="none: no MLflow (default: a store in the scratch dir)")
    parser.add_argument("--scratch", type=Path, default=ROOT / "bench-work" / "train-bench")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-work" / "train_bench.json")
    args = parser.parse_args()
    scratch = args.scratch
    scratch.mkdir(parents=True, exist_ok=True)
    vocab = padded_vocab(args.workdir, args.vocab_size, Layout(scratch).vocab)
    results = []
    for label in args.configs:
        for nproc in args.nproc:
            for batch_size in args.batch_size:
                r = run(label, nproc, batch_size, args, vocab, scratch)
                sent = r["sent_bytes_per_example"]
                print(
                    f"{label:<16} nproc {nproc} batch {batch_size:>5} on {r['device']}: "
                    f"{r['examples_per_s']:9,.0f} examples/s, {sent:9,.0f} B/example sent",
                    flush=True,
                )
                results.append(r)
    report = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "workdir": str(args.workdir),
        "vocab_size": args.vocab_size,
        "steps": args.steps,
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2))
    print("\n| config | processes | batch | device | examples/s | bytes sent per example |\n|---|---|---|---|---|---|")
    for r in results:
        cells = [r["config"], r["nproc"], r["batch_size"], r["device"], f"{r['examples_per_s']:,.0f}"]
        print("| " + " | ".join(map(str, cells)) + f" | {r['sent_bytes_per_example']:,.0f} |")


if __name__ == "__main__":
    main()
