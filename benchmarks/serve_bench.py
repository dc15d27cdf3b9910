"""`dssm serve` under open-loop load: offered rates, latency percentiles, errors and the server's memory.

    python benchmarks/serve_bench.py --workdir work --rate 100 --seconds 30
    python benchmarks/serve_bench.py --workdir bench-work/hd --rate 50 100 200 400 --seconds 60 --out serve.json

It starts `dssm serve` on WORKDIR's champion (or --index DIR) on a free port, waits for /ready, then for each
rate offers R requests a second for S seconds, open loop: arrivals are a Poisson process fixed in advance
(seeded), each request sent at its time whether or not earlier ones were answered, and its latency counted
from that time (a server that falls behind is charged for the wait, coordinated omission avoided). One query
a request, `{"query": Q, "k": 10}`, the queries drawn in turn from the work dir's test queries (its
evaluation's eval_set.json: realistic lengths). A request that is not answered 200 within --timeout is an
error. It prints, per rate:

    rate R/s: p50 X ms, p95 Y ms, p99 Z ms, errors E (answered A/s; server peak RSS M MB)

then stops the server with SIGTERM. The client runs in this process (asyncio, aiohttp) on the same machine:
on 2 cores it takes part of one core from the server; run nothing else beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repo root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_queries(workdir: Path) -> list[str]:
    """The test queries the work dir's evaluation scored (eval_set.json), in its order."""
    from core.layout import Layout

    path = Layout(workdir).evaluate / "eval_set.json"
    if not path.is_file():
        sys.exit(f"{path}: not found; run `dssm run --workdir {workdir}` first (its evaluate stage writes it)")
    return [q["query"] for q in json.loads(path.read_text())["queries"]]


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM) and its current one, in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(fields["VmHWM"].split()[0]) / 1024


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"dssm serve exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=2) as answer:
                return json.loads(answer.read())
        except OSError:
            time.sleep(0.25)
    sys.exit(f"dssm serve was not ready within {timeout:.0f}s")


async def offer(url: str, queries: list[str], rate: float, seconds: float, timeout: float, seed: int = 0) -> dict:
    """Offer `rate` requests/s for `seconds`, open loop: the latencies (ms) of the answered requests, the errors
    by kind, the answers by model, and each answer's (time.perf_counter(), model)."""
    import aiohttp

    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, int(rate * seconds * 1.2) + 10))
    arrivals = arrivals[arrivals < seconds]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    models: dict[str, int] = {}
    answers: list[tuple[float, str]] = []

    async def one(session, at: float, query: str, start: float) -> None:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        try:
            async with session.post(f"{url}/search", json={"query": query, "k": 10}) as answer:
                body = await answer.read()
                if answer.status != 200:
                    errors[str(answer.status)] = errors.get(str(answer.status), 0) + 1
                    return
        except (TimeoutError, aiohttp.ClientError) as e:
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            return
        done = time.perf_counter()
        latencies.append((done - start - at) * 1000)
        model = json.loads(body)["model"]
        models[model] = models.get(model, 0) + 1
        answers.append((done, model))

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        start = time.perf_counter() + 0.1
        await asyncio.gather(*(one(session, at, queries[i % len(queries)], start) for i, at in enumerate(arrivals)))
        took = time.perf_counter() - start
    return {
        "sent": len(arrivals),
        "latencies_ms": latencies,
        "errors": errors,
        "seconds": took,
        "models": models,
        "answers": answers,
    }


def summary(rate: float, result: dict, rss_mb: float) -> dict:
    ms = np.array(result["latencies_ms"]) if result["latencies_ms"] else np.array([np.nan])
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return {
        "rate": rate,
        "sent": result["sent"],
        "answered_per_s": round(len(result["latencies_ms"]) / result["seconds"], 1),
        "p50_ms": round(float(p50), 2),
        "p95_ms": round(float(p95), 2),
        "p99_ms": round(float(p99), 2),
        "max_ms": round(float(ms.max()), 2),
        "errors": sum(result["errors"].values()),
        "error_kinds": result["errors"],
        "models": result["models"],
        "server_peak_rss_mb": round(rss_mb),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("work"), help="a `dssm run` work dir (default: %(default)s)")
    p.add_argument("--index", type=Path, help="serve this `dssm index` output instead of WORKDIR's champion")
    p.add_argument("--rate", type=float, nargs="+", default=[100.0], help="offered requests/s (default: 100)")
    p.add_argument("--seconds", type=float, default=30.0, help="seconds per rate (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=10.0, help="a request not answered in this many s is an error")
    p.add_argument("--warm", type=float, default=3.0, help="seconds of load before the measured ones (default: 3)")
    p.add_argument("--serve-args", default="", help="more `dssm serve` flags, e.g. '--max-batch 32'")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args()
    queries = test_queries(args.workdir)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(ROOT / ".venv" / "bin" / "dssm"), "serve", "--workdir", str(args.workdir), "--port", str(port)]
    cmd += ["--log-every", "0"] + (["--index", str(args.index)] if args.index else []) + args.serve_args.split()
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"serve-bench-{port}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    results = []
    try:
        ready = wait_ready(url, proc, 300)
        print(f"serving {ready['model']} ({ready['titles']:,} titles); {len(queries)} test queries; log {log.name}")
        if args.warm:
            asyncio.run(offer(url, queries, min(args.rate), args.warm, args.timeout, seed=99))
        for rate in args.rate:
            result = summary(
                rate, asyncio.run(offer(url, queries, rate, args.seconds, args.timeout)), peak_rss_mb(proc.pid)
            )
            results.append(result)
            print(
                f"rate {rate:g}/s: p50 {result['p50_ms']:.1f} ms, p95 {result['p95_ms']:.1f} ms, "
                f"p99 {result['p99_ms']:.1f} ms, errors {result['errors']} (answered {result['answered_per_s']:.1f}/s; "
                f"server peak RSS {result['server_peak_rss_mb']} MB)",
                flush=True,
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    if args.out:
        args.out.write_text(
            json.dumps({"model": ready["model"], "titles": ready["titles"], "rates": results}, indent=2)
        )


if __name__ == "__main__":
    main()
