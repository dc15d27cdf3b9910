"""Training throughput: examples per second (1 query + 1 clicked title + n negatives each).

Each configuration runs `dssm train` as a user would (with `--nproc N` for DDP), for `--steps`
updates on a pipeline work dir's negatives; the rate is the mean of the MLflow `train_examples_per_s`
windows after the first (which holds start-up and warm-up). `--vocab-size` pads the trigram
vocabulary with unused ids so the embedding tables (and their dense gradients) have that size.

    python benchmarks/train_bench.py --workdir bench-work/hd --vocab-size 30000
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


def run(label: str, nproc: int, args: argparse.Namespace, vocab: Path, scratch: Path) -> dict:
    encoder, overrides = CONFIGS[label]
    out = scratch / f"{label}-{nproc}"
    shutil.rmtree(out, ignore_errors=True)
    uri = f"sqlite:///{scratch / 'mlflow.db'}"
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
        f"data.batch_size={args.batch_size}",
        "experiment=train-bench",
        f"run_name={label}-{nproc}",
        *overrides,
    ]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TQDM_DISABLE": "1"})
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    import mlflow

    client = mlflow.MlflowClient(uri)
    run_id = proc.stdout.strip().rsplit("MLflow run ", 1)[-1].split()[0] if nproc == 1 else None
    if run_id is None:
        runs = client.search_runs(
            [client.get_experiment_by_name("train-bench").experiment_id],
            f"attributes.run_name = '{label}-{nproc}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        run_id = runs[0].info.run_id
    rates = [m.value for m in sorted(client.get_metric_history(run_id, "train_examples_per_s"), key=lambda m: m.step)]
    steady = rates[1:] or rates
    sent = [m.value for m in client.get_metric_history(run_id, "sent_bytes_per_example")]
    return {
        "config": label,
        "encoder": encoder,
        "overrides": overrides,
        "nproc": nproc,
        "examples_per_s": sum(steady) / len(steady),
        "sent_bytes_per_example": sum(sent) / len(sent) if sent else 0.0,
        "windows": rates,
        "wall_s": time.perf_counter() - started,
    }


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
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-work" / "train_bench.json")
    args = parser.parse_args()
    scratch = ROOT / "bench-work" / "train-bench"
    scratch.mkdir(parents=True, exist_ok=True)
    vocab = padded_vocab(args.workdir, args.vocab_size, Layout(scratch).vocab)
    results = []
    for label in args.configs:
        for nproc in args.nproc:
            r = run(label, nproc, args, vocab, scratch)
            sent = r["sent_bytes_per_example"]
            print(
                f"{label:<16} nproc {nproc}: {r['examples_per_s']:8,.0f} examples/s, {sent:9,.0f} B/example sent",
                flush=True,
            )
            results.append(r)
    report = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "workdir": str(args.workdir),
        "vocab_size": args.vocab_size,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2))
    print("\n| config | processes | examples/s | bytes sent per example |\n|---|---|---|---|")
    for r in results:
        print(f"| {r['config']} | {r['nproc']} | {r['examples_per_s']:,.0f} | {r['sent_bytes_per_example']:,.0f} |")


if __name__ == "__main__":
    main()
