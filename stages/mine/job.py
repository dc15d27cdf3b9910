"""`dssm mine`: hard negatives for the training rows, mined from an index of an earlier model (or BM25).

A random pool title is an easy negative: the model learns little from it, and in a whole catalogue
the titles it must push down are near misses that look like the query (docs/retrieval.md). Mining
replaces a share (`hard`) of each train row's sampled negatives with titles that a ranker puts high
for the row's query:
- `source=index`: the titles of an earlier run's `dssm index` output (last night's champion in a
  nightly run: ANCE's refresh across nights at no extra cost), ranked by that model's cosine;
- `source=bm25`: the same titles ranked by BM25 (DPR's negatives); `index` falls back to it where
  no index exists yet (a first run), and says so.
Candidates come from ranks `min_rank`..`max_rank` (1-based, inclusive): the very top holds the
titles most likely to be unlabelled positives (Facebook's EBR found the hardest ranks alone no
better than random). Filtered as false negatives (RocketQA; sentence-transformers'
`mine_hard_negatives`): a title ever clicked for the query (in train or validation rows), the
row's positive, and with `source=index` a title whose cosine is above (1 − relative_margin) × the
positive's. Each row takes its `round(hard · n)` survivors in the order of a hash of (seed, query,
positive, title), so mining is a pure function of its inputs; its random negatives fill the rest.
Validation rows stay as sampled, so the validation loss compares runs with and without mining.

Mining is one vector search (or BM25 ranking) per distinct query plus a pass over the rows, not a
data-parallel scan: it runs in the driver with pyarrow and faiss, shard by shard.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from core.artifacts import code_fingerprint, content_sha256, publish, require_manifest
from core.config import check_choices
from core.errors import DssmError
from core.schemas import NEGATIVES, read_title_pool, title_pool
from stages.mine.config import MineConfig

log = logging.getLogger(__name__)


@dataclass
class Ranker:
    """Ranked title ids per query from an index (with its model) or from BM25 over the same titles."""

    titles: list[str]
    source: str
    retriever: Any = None  # a scoring.retriever.Retriever (source=index)
    bm25: Any = None  # a scoring.bm25.CatalogueBM25 (source=bm25)
    query_vectors: dict[str, np.ndarray] = field(default_factory=dict)  # filled by `top`, read by the margin

    def top(self, queries: list[str], depth: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(title ids, cosines or None) of each query's best `depth` titles, best first."""
        if self.retriever is not None:
            from scoring.retriever import unit_rows

            vectors = unit_rows(self.retriever.embedder.embed(queries, "query"))
            self.query_vectors = dict(zip(queries, vectors, strict=True))
            cos, ids = self.retriever.index.search(vectors, depth)
            return ids, cos
        return np.stack([self.bm25.search(q, depth)[0] for q in queries]), None

    def positive_cosines(self, queries: list[str], positives: list[str]) -> np.ndarray:
        """cos(query, positive) of each row under the index's model (queries as `top` embedded them)."""
        from scoring.retriever import unit_rows

        titles = unit_rows(self.retriever.embedder.embed(positives, "doc"))
        return np.einsum("ij,ij->i", np.stack([self.query_vectors[q] for q in queries]), titles)


def open_ranker(index_dir: Path | None, titles_dir: Path, source: str) -> Ranker:
    """The ranker `source` asks for; `index` without an index directory falls back to BM25 over the
    clean stage's title pool."""
    from scoring.bm25 import CatalogueBM25

    if source == "index" and index_dir is not None:
        from scoring.retriever import Retriever

        retriever = Retriever.load(index_dir)
        return Ranker(retriever.titles, "index", retriever=retriever)
    if source == "index":
        log.info("mine: no index from an earlier run yet; mining with BM25 over the title pool")
    if index_dir is not None:
        from scoring.retriever import read_titles

        titles = read_titles(index_dir)
    else:
        titles = read_title_pool(titles_dir)
    return Ranker(titles, "bm25", bm25=CatalogueBM25(titles))


def _order(seed: int, query: str, positive: str, title: str) -> bytes:
    return hashlib.blake2b(f"{seed}\x1f{query}\x1f{positive}\x1f{title}".encode(), digest_size=8).digest()


def mine_rows(
    table: pa.Table, ranked: dict[str, list[str]], clicked: dict[str, set[str]], cfg: MineConfig, n: int, margin_ok
) -> tuple[pa.Table, dict[str, int]]:
    """`table`'s rows with up to round(hard · n) negatives replaced by mined titles; `ranked` holds
    each query's candidates (the rank window), `margin_ok(i, title)` the margin filter of row i."""
    hard = max(0, min(n, round(cfg.hard * n)))
    rows = table.to_pydict()
    counts = {"rows": 0, "rows_mined": 0, "mined_negatives": 0, "dropped_clicked": 0, "dropped_margin": 0}
    out_negatives = []
    for i, (query, positive, negatives) in enumerate(
        zip(rows["query"], rows["positive"], rows["negatives"], strict=True)
    ):
        counts["rows"] += 1
        candidates = []
        for title in ranked.get(query, ()):
            if title == positive or title in clicked[query]:
                counts["dropped_clicked"] += 1
            elif not margin_ok(i, title):
                counts["dropped_margin"] += 1
            else:
                candidates.append(title)
        chosen = sorted(candidates, key=lambda t: _order(cfg.seed, query, positive, t))[:hard]
        rest = [t for t in negatives if t not in chosen][: n - len(chosen)]
        out_negatives.append(chosen + rest)
        counts["rows_mined"] += bool(chosen)
        counts["mined_negatives"] += len(chosen)
    columns = {**rows, "negatives": out_negatives}
    return pa.Table.from_pydict(columns, schema=NEGATIVES), counts


def mine(
    negatives_dir: Path,
    titles_dir: Path,
    index_dir: Path | None,
    out: Path,
    cfg: MineConfig = MineConfig(),
    force: bool = False,
) -> dict[str, Any]:
    """Write `negatives_dir`'s rows with mined negatives into `out` (train/ mined, valid/ as is)."""
    upstream = require_manifest(negatives_dir, "negatives")
    titles_dir = title_pool(titles_dir)
    check_choices(cfg)
    if not 0 < cfg.hard <= 1 or not 1 <= cfg.min_rank <= cfg.max_rank or not 0 <= cfg.relative_margin < 1:
        raise DssmError("need 0 < hard <= 1, 1 <= min_rank <= max_rank and 0 <= relative_margin < 1")
    n = int(upstream["params"]["n"])
    if n == 0:
        raise DssmError(f"{negatives_dir} has no negatives per row (n=0): nothing to replace")
    # The output is a `dssm negatives` output in every way the trainer reads one (its stage, params and
    # clean input), so training, `dssm evaluate --hybrid-dev` and a second round of mining take it as is.
    inputs = {k: v for k, v in upstream.get("inputs", {}).items() if k == "clean"}
    inputs["negatives"] = {"path": str(negatives_dir), "sha256": upstream["content_sha256"]}
    if cfg.source == "index" and index_dir is not None:
        inputs["index"] = {"path": str(index_dir), "sha256": content_sha256(Path(index_dir))}
    else:
        inputs["titles"] = {"path": str(titles_dir), "sha256": content_sha256(Path(titles_dir))}

    def build(tmp: Path) -> dict[str, Any]:
        ranker = open_ranker(index_dir, titles_dir, cfg.source)
        train_files = sorted((negatives_dir / "train").glob("*.parquet"))
        valid = pq.read_table(negatives_dir / "valid", columns=["query", "positive"]).to_pydict()
        tables = [pq.read_table(f) for f in train_files]
        clicked: dict[str, set[str]] = {}
        for t in [*(t.select(["query", "positive"]).to_pydict() for t in tables), valid]:
            for q, p in zip(t["query"], t["positive"], strict=True):
                clicked.setdefault(q, set()).add(p)
        queries = sorted({q for t in tables for q in t.column("query").to_pylist()})
        ids, cos = ranker.top(queries, min(cfg.max_rank, len(ranker.titles)))
        window = slice(cfg.min_rank - 1, cfg.max_rank)
        ranked = {q: [ranker.titles[j] for j in row[window] if j >= 0] for q, row in zip(queries, ids, strict=True)}
        cosine = (
            {
                q: dict(zip(ranked[q], c[window][: len(ranked[q])], strict=True))
                for q, c in zip(queries, cos, strict=True)
            }
            if cos is not None and cfg.relative_margin > 0
            else None
        )
        totals: dict[str, int] = {}
        (tmp / "train").mkdir(parents=True)
        for path, table in zip(train_files, tables, strict=True):
            margin_ok = _margin_filter(table, ranker, cosine, cfg.relative_margin)
            mined, counts = mine_rows(table, ranked, clicked, cfg, n, margin_ok)
            pq.write_table(mined, tmp / "train" / path.name)
            totals = {k: totals.get(k, 0) + v for k, v in counts.items()}
        shutil.copytree(negatives_dir / "valid", tmp / "valid")
        totals["train_rows"], totals["valid_rows"] = totals.pop("rows"), len(valid["query"])
        totals["queries_ranked"] = len(queries)
        log.info(
            "mine (%s): %d of %d train rows got %d mined negatives (dropped: %d clicked, %d by margin)",
            ranker.source,
            totals["rows_mined"],
            totals["train_rows"],
            totals["mined_negatives"],
            totals["dropped_clicked"],
            totals["dropped_margin"],
        )
        return {"counts": totals, "outputs": {"train": "train/", "valid": "valid/"}, "source_used": ranker.source}

    params = upstream["params"] | {"mine": asdict(cfg)}
    return publish(out, "negatives", code_fingerprint(__name__), inputs, params, build, force, upstream=[upstream])


def _margin_filter(table: pa.Table, ranker: Ranker, cosine: dict[str, dict[str, float]] | None, margin: float):
    """margin_ok(row, title): the title's cosine is at most (1 − margin) × the row's positive's."""
    if cosine is None:
        return lambda i, title: True
    queries, positives = table.column("query").to_pylist(), table.column("positive").to_pylist()
    bound = (1 - margin) * ranker.positive_cosines(queries, positives)
    return lambda i, title: cosine[queries[i]][title] <= bound[i]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm mine`'s options."""
    from core.options import add_config_options

    p.add_argument("--negatives", type=Path, required=True, help="a `dssm negatives` output")
    p.add_argument("--titles", type=Path, help="the title pool for BM25 (a `dssm clean` output's titles/)")
    p.add_argument("--index", type=Path, help="a `dssm index` output: its titles and model rank the candidates")
    p.add_argument("--out", type=Path, required=True, help="output directory (replaced atomically)")
    p.add_argument("--force", action="store_true", help="mine again even when --out is up to date")
    add_config_options(p, MineConfig)


def command(args: argparse.Namespace) -> None:
    """`dssm mine`."""
    from core.options import config_from_options

    cfg = config_from_options(MineConfig, args)
    if args.index is None and args.titles is None:
        raise DssmError("give --index (an earlier model's index) or --titles (a title pool for BM25)")
    m = mine(args.negatives, args.titles, args.index, args.out, cfg, args.force)
    c = m["counts"]
    mined = f"{c['rows_mined']:,} of {c['train_rows']:,} train rows got {c['mined_negatives']:,} mined negatives"
    print(f"{mined} -> {args.out}")
