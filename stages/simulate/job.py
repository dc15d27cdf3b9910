"""Click-log simulator: raw impression logs (docs/raw-log-format.md) from a judged set.

Users arrive per query with a Zipf popularity; a production ranker shows the query's judged
titles plus random filler titles in a noisy order; clicks follow a position-based model
(examination decays with rank, attractiveness grows with the label). Realistic dirt is added at
the rates of `DirtRates`. Only train queries (PROTOCOL.md §3) are simulated, unless `test_traffic`
asks for the test queries' traffic too (as a team's own log has it; vocab, propensity and negatives
hold those queries out of training, the judge stage grades them); the test queries' graded pairs are
written apart as Parquet for evaluation. See docs/simulator.md.

Work is split into shards, each a file generated from its own seed in chunks, so memory stays
bounded at any `impressions` and shards run in parallel processes; output is deterministic for
a given seed and shard count.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import logging
import multiprocessing
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from core.artifacts import code_fingerprint, publish
from core.config import check_choices
from core.errors import DssmError
from core.judgments import JudgedPair
from core.machine import usable_cpus
from core.schemas import CATALOGUE, CATALOGUE_FILE, TEST_PAIRS
from core.text import is_test_query, norm
from stages.simulate.config import (
    PROMOTED_BRANDS,
    START_MS,
    ClickModel,
    DirtRates,
    SimulationConfig,
    partition_name,
)

log = logging.getLogger(__name__)
CHUNK = 8192


@dataclass
class JudgedQueries:
    """Train queries with their judged titles as padded arrays (the simulator's hot data)."""

    queries: list[str]
    title_json: list[str]  # per title: '"doc_id":"…","title":"…"' (escaped once, reused per line)
    title_json_dirty: list[str]
    doc_json: list[str]  # per title: '"doc_id":"…"' (format 2)
    titles: list[str]
    judged: np.ndarray  # (Q, L) title ids, -1 padded
    relevance: np.ndarray  # (Q, L) in [0, 1], -inf padded
    promoted: np.ndarray  # per title: whether its brand is promoted (`promoted_brand` or `weakest_brands`)


def promoted_brand(title: str) -> bool:
    """Whether the ranker's `promotion` applies to `title`: its first word (the brand, in most product
    titles) hashes into a quarter of all first words, independently of any label."""
    first = brand(title)
    return bool(first) and hashlib.md5(first.encode("utf-8")).digest()[0] % 4 == 0


def brand(title: str) -> str:
    """A title's first word (the brand, in most product titles), '' for an empty title."""
    words = norm(title).split()
    return words[0] if words else ""


def weakest_brands(train: dict[str, dict[str, float]], share: float = 0.25) -> set[str]:
    """The brands of lowest mean label over their judged (train query, title) pairs, weakest first
    (ties broken by the brand's md5), until their titles are `share` of all titles."""
    labels: dict[str, list[float]] = {}
    titles: dict[str, set[str]] = {}
    for judged in train.values():
        for title, label in judged.items():
            name = brand(title)
            labels.setdefault(name, []).append(label)
            titles.setdefault(name, set()).add(title)
    order = sorted(labels, key=lambda b: (float(np.mean(labels[b])), hashlib.md5(b.encode("utf-8")).hexdigest()))
    total, chosen, covered = sum(len(t) for t in titles.values()), set(), 0
    for name in order:
        if covered >= share * total:
            break
        chosen.add(name)
        covered += len(titles[name])
    return chosen


def check_promoted_brands(name: str) -> None:
    if name not in PROMOTED_BRANDS:
        raise DssmError(f"promoted brands must be one of {PROMOTED_BRANDS}, got {name!r}")


def promotion_rule(train: dict[str, dict[str, float]], promoted_brands: str = "hashed") -> Callable[[str], bool]:
    """Whether the ranker promotes a title: `promoted_brand`, or with "weakest" a brand among the
    train queries' `weakest_brands`."""
    if promoted_brands == "hashed":
        return promoted_brand
    check_promoted_brands(promoted_brands)
    weakest = weakest_brands(train)
    return lambda title: brand(title) in weakest


def _doc_id(title: str) -> str:
    return "d" + hashlib.md5(title.encode("utf-8")).hexdigest()[:12]


def _dirty_title(title: str) -> str:
    return title.upper() if len(title) % 2 else title.replace(" ", "  ")


def split_judgments(
    pairs: list[JudgedPair], test_traffic: bool = False
) -> tuple[dict[str, dict[str, float]], list[JudgedPair]]:
    """PROTOCOL.md §3: the simulated queries' titles with mean labels (first-seen query text kept: train
    queries, and with `test_traffic` the test queries too), and the test pairs."""
    train: dict[str, dict[str, float]] = {}
    counts: dict[tuple[str, str], int] = {}
    shown_query: dict[str, str] = {}
    test: list[JudgedPair] = []
    for pair in pairs:
        key = norm(pair.query)
        if not key:
            continue
        if is_test_query(pair.query):
            test.append(pair)
            if not test_traffic:
                continue
        query = shown_query.setdefault(key, pair.query)
        titles = train.setdefault(query, {})
        n = counts.get((query, pair.title), 0)
        titles[pair.title] = (titles.get(pair.title, 0.0) * n + pair.label) / (n + 1)
        counts[(query, pair.title)] = n + 1
    return train, test


def build_catalogue(train: dict[str, dict[str, float]], seed: int, promoted_brands: str = "hashed") -> JudgedQueries:
    if not train:
        raise DssmError("the judged set has no train query to simulate (all queries are test queries or empty)")
    titles = sorted({t for judged in train.values() for t in judged})
    title_ids = {t: i for i, t in enumerate(titles)}
    labels = [label for judged in train.values() for label in judged.values()]
    low, high = min(labels), max(labels)
    span = (high - low) or 1.0
    # Popularity rank is a seeded shuffle of the queries: the head is not alphabetical.
    queries = sorted(train)
    np.random.default_rng(seed).shuffle(queries)
    width = max(len(train[q]) for q in queries)
    judged = np.full((len(queries), width), -1, dtype=np.int64)
    relevance = np.full((len(queries), width), -np.inf)
    for qi, query in enumerate(queries):
        for j, (title, label) in enumerate(sorted(train[query].items())):
            judged[qi, j] = title_ids[title]
            relevance[qi, j] = (label - low) / span

    is_promoted = promotion_rule(train, promoted_brands)

    def fragment(title: str, shown: str) -> str:
        return f'"doc_id":"{_doc_id(title)}","title":{orjson.dumps(shown).decode()}'

    return JudgedQueries(
        queries=queries,
        title_json=[fragment(t, t) for t in titles],
        title_json_dirty=[fragment(t, _dirty_title(t)) for t in titles],
        doc_json=[f'"doc_id":"{_doc_id(t)}"' for t in titles],
        titles=titles,
        judged=judged,
        relevance=relevance,
        promoted=np.array([is_promoted(t) for t in titles]),
    )


_UNICODE_SPACES = ["\u00a0", "\u2009", "\u3000"]


def _dirty_query(query: str, rng: np.random.Generator, dirt: DirtRates) -> str:
    u = rng.random(4)
    if u[0] < dirt.mixed_case:
        style = int(rng.integers(3))
        if style == 0:
            query = query.upper()
        elif style == 1:
            query = query.title()
        else:
            flips = rng.random(len(query)) < 0.3
            query = "".join(c.upper() if f else c for c, f in zip(query, flips, strict=True))
    if u[1] < dirt.extra_spaces:
        query = "  " + query.replace(" ", "   ") + " "
    if u[2] < dirt.unicode_space and " " in query:
        query = query.replace(" ", _UNICODE_SPACES[int(rng.integers(3))], 1)
    if u[3] < dirt.empty_query:
        query = " " * int(rng.integers(3))
    return query


def _malform(line: str, rng: np.random.Generator) -> str:
    kind = int(rng.integers(4))
    if kind == 0:  # truncated JSON, as when a writer dies mid-line
        return line[: int(rng.integers(1, len(line) - 1))]
    record = orjson.loads(line)
    if kind == 1:
        del record[["query", "results", "user_id", "ts"][int(rng.integers(4))]]
    elif kind == 2:
        record["results"][0]["position"] = str(record["results"][0]["position"])
    else:
        record["clicks"] = {"position": 1}
    return orjson.dumps(record).decode()


class _ShardWriter:
    """Formats impressions as JSON lines, adding per-line dirt (duplicates, malformed lines)."""

    def __init__(
        self,
        cat: JudgedQueries,
        cfg: SimulationConfig,
        shard: int,
        rng: np.random.Generator,
        emit: Callable[[str], None],
    ):
        self.cat, self.cfg, self.shard, self.rng, self.emit = cat, cfg, shard, rng, emit
        self.prefix = cfg.span()[3]
        self.counter = 0
        self.lines = 0

    def write(
        self,
        ts: np.ndarray,
        users: np.ndarray,
        sessions: np.ndarray,
        query_ids: np.ndarray,
        shown: np.ndarray,
        clicked: np.ndarray,
        dwell: np.ndarray,
        dirty_titles: np.ndarray,
        queries: list[str] | None = None,
    ) -> None:
        cat, dirt, rng, version = self.cat, self.cfg.dirt, self.rng, self.cfg.log_format
        stamps = np.datetime_as_string(ts.astype("datetime64[ms]"), unit="ms")
        per_line = rng.random((len(ts), 2))
        for i in range(len(ts)):
            row = shown[i]
            results = []
            for pos in range(row.shape[0]):
                tid = row[pos]
                if tid < 0:
                    break
                if version == 2:  # titles live in the catalogue: no per-line title dirt to show
                    frag = cat.doc_json[tid]
                else:
                    frag = cat.title_json_dirty[tid] if dirty_titles[i, pos] else cat.title_json[tid]
                results.append(f'{{"position":{pos + 1},{frag}}}')
            clicks = [f'{{"position":{p + 1},"dwell_ms":{int(dwell[i, p])}}}' for p in np.flatnonzero(clicked[i])]
            query = queries[i] if queries is not None else _dirty_query(cat.queries[query_ids[i]], rng, dirt)
            line = (
                f'{{"v":{version},"impression_id":"{self.prefix}{self.shard:04x}-{self.counter:08x}",'
                f'"ts":"{stamps[i]}Z","user_id":"u{users[i]:08d}","session_id":"s{sessions[i]:012x}",'
                f'"query":{orjson.dumps(query).decode()},"results":[{",".join(results)}],'
                f'"clicks":[{",".join(clicks)}]}}'
            )
            self.counter += 1
            if per_line[i, 0] < dirt.malformed:
                line = _malform(line, rng)
            self.emit(line)
            self.lines += 1
            if per_line[i, 1] < dirt.duplicate:
                self.emit(line)
                self.lines += 1


def ranker_errors(cat: JudgedQueries, model: ClickModel, seed: int) -> np.ndarray:
    """The ranker's persistent score error per (query, judged title), (Q, L): N(0, ranker_bias²),
    the same in every shard (its own generator, so the other draws do not change with it)."""
    if model.ranker_bias == 0:
        return np.zeros(cat.judged.shape)
    return model.ranker_bias * np.random.default_rng([seed, 0xB1A5]).standard_normal(cat.judged.shape)


def attractiveness(grade: np.ndarray, model: ClickModel) -> np.ndarray:
    """Click probability of an examined title of `grade` (its label scaled to [0, 1])."""
    return model.attract_min + (model.attract_max - model.attract_min) * (4.0**grade - 1.0) / 3.0


def _rank_and_click(
    cat: JudgedQueries,
    model: ClickModel,
    rng: np.random.Generator,
    query_ids: np.ndarray,
    click_all: bool = False,
    errors: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shown title ids (B, page), click flags and dwell times, vectorised over a chunk; `errors`:
    the ranker's persistent error per (query, judged title) (`ranker_errors`)."""
    n = len(query_ids)
    filler = rng.integers(0, len(cat.title_json), (n, model.filler))
    ids = np.concatenate([cat.judged[query_ids], filler], axis=1)
    rel = np.concatenate([cat.relevance[query_ids], np.zeros((n, model.filler))], axis=1)
    score = rel + model.ranker_noise * rng.standard_normal(rel.shape)
    if errors is not None:
        score[:, : errors.shape[1]] += errors[query_ids]
    if model.promotion:
        score += model.promotion * cat.promoted[ids]  # padding (-1) keeps its -inf score
    order = np.argsort(-score, axis=1, kind="stable")[:, : model.page_size]
    shown = np.take_along_axis(ids, order, axis=1)
    shown_rel = np.take_along_axis(rel, order, axis=1)
    present = np.isfinite(shown_rel)
    shown[~present] = -1
    # Absent slots sort last (score -inf), so every row's shown titles are a prefix.
    grade = np.clip(shown_rel, 0.0, 1.0)
    attract = attractiveness(grade, model)
    examine = np.arange(1, shown.shape[1] + 1, dtype=float) ** -model.eta
    clicked = present & (click_all | (rng.random(shown.shape) < examine * attract))
    median = model.dwell_base_ms + model.dwell_gain_ms * grade
    dwell = np.exp(np.log(median) + 0.9 * rng.standard_normal(shown.shape))
    if click_all:
        dwell = rng.uniform(150, 1500, shown.shape)
    return shown, clicked, dwell


def simulate_shard(cat: JudgedQueries, cfg: SimulationConfig, shard: int, path: Path) -> dict[str, int]:
    """Write one shard's lines to `path`; returns its counts."""
    shards = cfg.shard_count()
    total = cfg.impressions // shards + (1 if shard < cfg.impressions % shards else 0)
    start_ms, length_ms, day_seed, _ = cfg.span()
    rng = np.random.default_rng([cfg.seed, shard, *day_seed])
    model, dirt = cfg.model, cfg.dirt
    errors = ranker_errors(cat, model, cfg.seed) if model.ranker_bias else None
    popularity = np.arange(1, len(cat.queries) + 1, dtype=float) ** -model.zipf_exponent
    days_on = (start_ms - START_MS) // 86_400_000 if cfg.day else 0
    drift = round(model.drift * len(cat.queries) * days_on)
    cdf = np.cumsum(popularity / popularity.sum())
    users = max(1_000, cfg.impressions // 25)
    span_ms = length_ms / shards
    t0 = start_ms + shard * span_ms
    step_ms = span_ms / max(total, 1)

    # gzip level 1 (fast) and mtime 0, so that reruns are byte-identical.
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=1, mtime=0) if cfg.gzip else raw as stream,
        io.TextIOWrapper(stream, encoding="utf-8", newline="\n") as out,
    ):
        writer = _ShardWriter(cat, cfg, shard, rng, lambda line: out.write(line + "\n"))
        made = bots = 0
        session = shard << 36
        while made < total:
            n = min(CHUNK, total - made)
            mean_burst = sum(dirt.bot_burst) / 2
            bursts = rng.integers(
                dirt.bot_burst[0], dirt.bot_burst[1] + 1, rng.binomial(n, dirt.bot_impressions / mean_burst)
            )
            bursts = bursts[np.cumsum(bursts) <= n]  # a chunk too small for a burst has none
            n_bot = int(bursts.sum())
            n_human = n - n_bot
            # Humans: sessions of 1+ consecutive impressions by one user on the global clock.
            sizes = 1 + rng.geometric(0.5, n_human)
            starts = np.zeros(n_human, dtype=bool)
            starts[np.minimum(np.cumsum(sizes) - sizes, n_human - 1)] = True
            session_ids = session + np.cumsum(starts)
            session = int(session_ids[-1]) + 1 if n_human else session
            user_ids = rng.integers(0, users, int(starts.sum()))[np.cumsum(starts) - 1] if n_human else np.zeros(0, int)
            ts = (t0 + (made + np.arange(n_human)) * step_ms + rng.uniform(0, step_ms, n_human)).astype(np.int64)
            query_ids = np.minimum(np.searchsorted(cdf, rng.random(n_human)), len(cdf) - 1)
            query_ids = (query_ids + drift) % len(cdf)  # popularity rank -> the query holding it today
            shown, clicked, dwell = _rank_and_click(cat, model, rng, query_ids, errors=errors)
            writer.write(
                ts, user_ids, session_ids, query_ids, shown, clicked, dwell, rng.random(shown.shape) < dirt.dirty_title
            )
            # Bots: bursts of uniform queries ~1.5 s apart by one user id, clicking everything.
            for size in bursts:
                bot_user = np.full(size, users + rng.integers(0, users))  # ids no human has
                bot_ts = (ts[0] if n_human else int(t0)) + np.cumsum(rng.uniform(500, 2500, size)).astype(np.int64)
                bot_queries = rng.integers(0, len(cat.queries), size)
                shown_b, clicked_b, dwell_b = _rank_and_click(cat, model, rng, bot_queries, True, errors)
                writer.write(
                    bot_ts,
                    bot_user,
                    np.full(size, session),
                    bot_queries,
                    shown_b,
                    clicked_b,
                    dwell_b,
                    np.zeros(shown_b.shape, dtype=bool),
                    [cat.queries[q] for q in bot_queries],
                )
                session += 1
                bots += int(size)
            made += n
    return {"impressions": total, "bot_impressions": bots, "lines": writer.lines}


def _shard_job(args: tuple[JudgedQueries, SimulationConfig, int, Path]) -> dict[str, int]:
    return simulate_shard(*args)


def write_test_pairs(test: list[JudgedPair], path: Path) -> None:
    table = pa.table(
        {
            "row": [p.row for p in test],
            "query": [p.query for p in test],
            "query_norm": [norm(p.query) for p in test],
            "title": [p.title for p in test],
            "label": [p.label for p in test],
        },
        schema=TEST_PAIRS,
    )
    pq.write_table(table, path)


def simulate(
    pairs: list[JudgedPair],
    out: Path,
    cfg: SimulationConfig,
    source: dict[str, Any],
    progress: Callable[[int], None] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Write `out/logs/part-*.jsonl[.gz]`, `out/test_pairs.parquet` and the manifest, atomically.

    `source` describes the judged set (path, sha256, columns); with the same source and config
    an existing output is kept as it is.
    """
    if cfg.impressions < 1:
        raise DssmError(f"--impressions must be positive, got {cfg.impressions}")
    check_choices(cfg)  # log_format, model.promoted_brands
    cfg.span()  # a bad day fails here
    params = {
        "impressions": cfg.impressions,
        "seed": cfg.seed,
        "shards": cfg.shard_count(),
        "gzip": cfg.gzip,
        **({"log_format": cfg.log_format} if cfg.log_format != 1 else {}),  # v1 outputs keep their input key
        **({"day": cfg.day} if cfg.day else {}),
        **({"test_traffic": True} if cfg.test_traffic else {}),  # earlier outputs keep their input key
        # without drift, outputs keep their input key
        "click_model": {k: v for k, v in asdict(cfg.model).items() if k != "drift" or v},
        "dirt": asdict(cfg.dirt),
    }

    def build(tmp: Path) -> dict[str, Any]:
        train, test = split_judgments(pairs, cfg.test_traffic)
        cat = build_catalogue(train, cfg.seed, cfg.model.promoted_brands)
        shards = cfg.shard_count()
        suffix = ".jsonl.gz" if cfg.gzip else ".jsonl"
        (tmp / "logs").mkdir()
        jobs = [(cat, cfg, s, tmp / "logs" / f"part-{s:05d}{suffix}") for s in range(shards)]
        workers = min(shards, cfg.workers or usable_cpus())
        totals = {"impressions": 0, "bot_impressions": 0, "lines": 0}
        with multiprocessing.get_context("spawn").Pool(workers) if workers > 1 else nullcontext() as pool:
            for counts in pool.imap(_shard_job, jobs) if pool else map(_shard_job, jobs):
                totals = {k: totals[k] + counts[k] for k in totals}
                if progress:
                    progress(counts["impressions"])
        write_test_pairs(test, tmp / "test_pairs.parquet")
        if cfg.log_format == 2:
            write_catalogue(cat, tmp / CATALOGUE_FILE)
        test_queries = len({norm(p.query) for p in test})
        return {
            "format": f"dssm.impressions/{cfg.log_format}",
            "counts": {
                **totals,
                "train_queries": len(cat.queries) - (test_queries if cfg.test_traffic else 0),
                "train_titles": len(cat.title_json),
                "test_queries": test_queries,
                **({"test_queries_simulated": test_queries} if cfg.test_traffic else {}),
                "test_pairs": len(test),
            },
        }

    # The column spec is a parameter: the same file read with other columns is another judged set.
    params |= {"spec": source.get("spec")}
    return publish(out, "simulate", code_fingerprint(__name__), {"judgments": source}, params, build, force)


def write_catalogue(cat: JudgedQueries, path: Path) -> None:
    """The catalogue side table of a v2 log: every title's doc id and title."""
    table = pa.table({"doc_id": [_doc_id(t) for t in cat.titles], "title": cat.titles}, schema=CATALOGUE)
    pq.write_table(table, path)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm simulate`'s options: SimulationConfig's fields (the click model's without a prefix)."""
    from core.judgments import add_judgment_options
    from core.options import add_config_options

    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--force", action="store_true", help="recompute even if the output is up to date")
    p.add_argument(
        "--judgments", type=Path, help="judged set (CSV/TSV or a .zip of one); default: the embedded catalogue"
    )
    add_judgment_options(p)
    add_config_options(p.add_argument_group("simulation"), SimulationConfig, flatten=["model"])


def command(args: argparse.Namespace) -> None:
    """`dssm simulate`."""
    from tqdm import tqdm

    from core.judgments import DEFAULT_CATALOGUE, resolve_judged_set, spec_from_args
    from core.options import config_from_options

    cfg = config_from_options(SimulationConfig, args)
    judged = resolve_judged_set(args.judgments, spec_from_args(args), DEFAULT_CATALOGUE)
    out = args.out / partition_name(cfg.day) if cfg.day else args.out
    with tqdm(total=cfg.impressions, unit="imp", unit_scale=True, desc="simulate", disable=None) as bar:
        m = simulate(judged.pairs(), out, cfg, judged.describe(), progress=bar.update, force=args.force)
    c = m["counts"]
    print(
        f"simulated {c['impressions']:,} impressions ({c['lines']:,} lines) of {c['train_queries']:,} train queries "
        f"-> {out / 'logs'}; {c['test_pairs']:,} held-out test pairs -> {out / 'test_pairs.parquet'}"
    )
