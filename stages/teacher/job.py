"""`dssm teacher`: lists of hard candidates per train query, scored by a teacher, for distillation.

In-batch titles are mostly unrelated to the query, so a teacher has little to say about them; the
literature distils on hard candidates (Margin-MSE, Hofstätter et al. 2020; TAS-Balanced; RocketQA's
denoised hard negatives). For each train query this stage takes
- the candidates: the top `depth` titles of each `sources` ranker over the clean stage's title pool:
  `bm25`, `minilm` (the bundled all-MiniLM-L6-v2), `index` (the model of the index an earlier run
  left, e.g. last night's champion; skipped, with a message, when there is none yet) and
  `checkpoint:PATH` (any trained model, such as a fine-tuned transformer), and every title clicked
  for the query;
- the teacher: the `scorers` (the same names), each score standardised over the list and mixed by
  `weights` (equal by default), the z-score fusion `dssm search` serves;
- the targets: softmax(fused / `temperature`) over the list, a per-list normalisation, so teacher and
  student never share a score scale. A clicked title is never pushed down: its fused score is raised
  to at least the best unclicked candidate's before the softmax (the clicks stay positives).
The lists go into the `shown` and `relevance` columns of one train row per query (the `dssm
negatives` schema that `loss.listwise` reads), so `loss.listwise=λ` trains on (1 − λ)·eq. (5) +
λ·CE(teacher, student): the KL from the teacher's list distribution to the student's, plus the
teacher's entropy, a constant. Every other column, the sampled negatives and valid/ stay as they
came. The output is a `dssm negatives` output (like `dssm mine`'s), so training takes it as is.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from core.artifacts import code_fingerprint, content_sha256, publish, require_manifest, sha256_file
from core.errors import DssmError
from core.schemas import NEGATIVES, read_title_pool, title_pool
from stages.teacher.config import CHECKPOINT, TeacherConfig, check_config

log = logging.getLogger(__name__)


class Rankers:
    """The title pool and the scorers over it, each built once: BM25 (bm25s), MiniLM, an index's model,
    trained checkpoints. A dense scorer embeds a title once (vectors kept by title)."""

    def __init__(self, titles: list[str], index_dir: Path | None):
        self.titles, self.index_dir = titles, index_dir
        self.row = {t: i for i, t in enumerate(titles)}
        self._bm25 = None
        self._embedders: dict[str, Any] = {}
        self._vectors: dict[str, dict[str, np.ndarray]] = {}

    @property
    def bm25(self):
        if self._bm25 is None:
            from scoring.bm25 import CatalogueBM25

            self._bm25 = CatalogueBM25(self.titles)
        return self._bm25

    def available(self, name: str) -> bool:
        return name != "index" or self.index_dir is not None

    def embedder(self, name: str):
        if name not in self._embedders:
            from scoring.neural import MiniLMEmbedder, TwoTowerEmbedder

            if name == "minilm":
                self._embedders[name] = MiniLMEmbedder()
            elif name == "index":
                from scoring.retriever import Retriever

                self._embedders[name] = Retriever.load(self.index_dir).embedder
            else:
                self._embedders[name] = TwoTowerEmbedder(name.removeprefix(CHECKPOINT))
        return self._embedders[name]

    def title_vectors(self, name: str, titles: list[str]) -> np.ndarray:
        from scoring.retriever import unit_rows

        known = self._vectors.setdefault(name, {})
        todo = list(dict.fromkeys(t for t in titles if t not in known))
        if todo:
            known.update(zip(todo, unit_rows(self.embedder(name).embed(todo, "doc")), strict=True))
        return np.stack([known[t] for t in titles]) if titles else np.zeros((0, 1), np.float32)

    def query_vectors(self, name: str, queries: list[str]) -> np.ndarray:
        from scoring.retriever import unit_rows

        return unit_rows(self.embedder(name).embed(queries, "query"))

    def top(self, name: str, queries: list[str], depth: int) -> list[list[str]]:
        """Each query's best `depth` titles of the pool under ranker `name`."""
        if name == "bm25":
            from scoring.bm25 import matching

            return [[self.titles[i] for i in matching(self.bm25.scores(q), depth)] for q in queries]
        import faiss

        vectors = self.title_vectors(name, self.titles)
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
        _, ids = index.search(self.query_vectors(name, queries), min(depth, len(self.titles)))
        return [[self.titles[i] for i in row if i >= 0] for row in ids]

    def scores(self, name: str, queries: list[str], lists: list[list[str]]) -> list[np.ndarray]:
        """Scorer `name`'s score of every title of each query's list."""
        if name == "bm25":
            return [
                self.bm25.scores(q)[[self.row[t] for t in titles]] for q, titles in zip(queries, lists, strict=True)
            ]
        q_vectors = self.query_vectors(name, queries)
        flat = self.title_vectors(name, [t for titles in lists for t in titles])
        out, start = [], 0
        for v, titles in zip(q_vectors, lists, strict=True):
            out.append(flat[start : start + len(titles)] @ v)
            start += len(titles)
        return out


def targets(scores: list[np.ndarray], weights: list[float], clicked: np.ndarray, temperature: float) -> np.ndarray:
    """One list's teacher distribution: Σ w·z(score) (`dssm search`'s z-score fusion), clicked titles
    raised to the best unclicked one's fused score, softmax(· / temperature)."""
    from scoring.fusion import RetrievalFusion, fuse_scores

    fused = fuse_scores(scores, RetrievalFusion("zscore", 0, tuple(weights)))
    if clicked.any() and (~clicked).any():
        fused[clicked] = np.maximum(fused[clicked], fused[~clicked].max())
    logits = fused / temperature
    p = np.exp(logits - logits.max())
    return p / p.sum()


def teacher(
    negatives_dir: Path,
    titles_dir: Path,
    index_dir: Path | None,
    out: Path,
    cfg: TeacherConfig,
    force: bool = False,
) -> dict[str, Any]:
    """Write `negatives_dir` with one teacher list per train query into `out` (valid/ as is)."""
    check_config(cfg)
    if not cfg.scorers:
        raise DssmError("teacher: no scorers (teacher.scorers=[bm25,minilm] or the like)")
    upstream = require_manifest(negatives_dir, "negatives")
    titles_dir = title_pool(titles_dir)
    pool = read_title_pool(titles_dir)  # before the build: a wrong --titles fails at once, naming the path
    inputs = {k: v for k, v in upstream.get("inputs", {}).items() if k == "clean"}
    inputs["negatives"] = {"path": str(negatives_dir), "sha256": upstream["content_sha256"]}
    inputs["titles"] = {"path": str(titles_dir), "sha256": content_sha256(Path(titles_dir))}
    uses_index = "index" in cfg.scorers or "index" in cfg.sources
    if uses_index and index_dir is not None:
        inputs["index"] = {"path": str(index_dir), "sha256": content_sha256(Path(index_dir))}
    for scorer in dict.fromkeys([*cfg.scorers, *cfg.sources]):
        if scorer.startswith(CHECKPOINT):
            path = Path(scorer.removeprefix(CHECKPOINT))
            path = path / "last.pt" if path.is_dir() else path
            if not path.is_file():
                raise DssmError(f"teacher: {scorer}: no checkpoint there")
            inputs[scorer] = {"path": str(path), "sha256": sha256_file(path)}

    def build(tmp: Path) -> dict[str, Any]:
        started = time.perf_counter()
        rankers = Rankers(pool, index_dir if uses_index else None)
        scorers = [s for s in cfg.scorers if rankers.available(s)]
        weights = [w for s, w in zip(cfg.scorers, cfg.weights or [1.0] * len(cfg.scorers), strict=True) if s in scorers]
        sources = [s for s in cfg.sources if rankers.available(s)]
        for name in {*cfg.scorers, *cfg.sources} - {*scorers, *sources}:
            log.info("teacher: %s left out: no index from an earlier run yet", name)
        if not scorers:
            raise DssmError("teacher: none of the scorers is available (index: no index from an earlier run yet)")
        train_files = sorted((negatives_dir / "train").glob("*.parquet"))
        tables = [pq.read_table(f) for f in train_files]
        clicked: dict[str, set[str]] = {}  # train and valid queries are apart (split by query): train rows suffice
        for t in (t.select(["query", "positive"]).to_pydict() for t in tables):
            for q, p in zip(t["query"], t["positive"], strict=True):
                clicked.setdefault(q, set()).add(p)
        if int(upstream["params"].get("list_size") or 0):
            log.warning("teacher: %s carries impression lists (list_size > 0); the teacher's replace them",
                        negatives_dir)  # fmt: skip
        queries = sorted({q for t in tables for q in t.column("query").to_pylist()})
        tops = [rankers.top(source, queries, cfg.depth) for source in sources]
        lists = [
            list(dict.fromkeys([*sorted(clicked[q] & rankers.row.keys()), *(t for top in tops for t in top[i])]))
            for i, q in enumerate(queries)
        ]
        scored = [rankers.scores(name, queries, lists) for name in scorers]
        by_query = {}
        for i, (q, titles) in enumerate(zip(queries, lists, strict=True)):
            if not titles:  # no candidate and no click in the pool: nothing to teach for this query
                continue
            mask = np.array([t in clicked[q] for t in titles])
            p = targets([s[i] for s in scored], weights, mask, cfg.temperature)
            by_query[q] = (titles, p.tolist())
        (tmp / "train").mkdir(parents=True)
        counts = {"train_rows": 0, "lists": 0, "listed_titles": 0, "clicked_in_lists": 0}
        listed: set[str] = set()  # across shards: each query's list on one row only
        for path, table in zip(train_files, tables, strict=True):
            written = with_lists(table, by_query, listed)
            pq.write_table(written, tmp / "train" / path.name)
            counts["train_rows"] += table.num_rows
        for titles, _ in by_query.values():
            counts["lists"] += 1
            counts["listed_titles"] += len(titles)
        counts["clicked_in_lists"] = sum(len(clicked[q] & set(titles)) for q, (titles, _) in by_query.items())
        shutil.copytree(negatives_dir / "valid", tmp / "valid")
        counts["valid_rows"] = pq.ParquetDataset(tmp / "valid").read(columns=["query"]).num_rows
        log.info(
            "teacher (%s over %s candidates): %d lists, %.1f titles each, in %.0fs",
            "+".join(scorers),
            "+".join(sources),
            counts["lists"],
            counts["listed_titles"] / max(counts["lists"], 1),
            time.perf_counter() - started,
        )
        return {"counts": counts, "outputs": {"train": "train/", "valid": "valid/"}, "used": scorers + sources}

    width = int(upstream["params"].get("list_size") or 0)
    params = upstream["params"] | {"teacher": asdict(cfg), "list_size": max(width, cfg.depth * len(cfg.sources))}
    return publish(out, "negatives", code_fingerprint(__name__), inputs, params, build, force, upstream=[upstream])


def with_lists(table: pa.Table, by_query: dict[str, tuple[list[str], list[float]]], seen: set[str]) -> pa.Table:
    """`table` with the teacher list of each query not in `seen` on its first row (`shown`, `relevance`),
    none on the others; `seen` gains the queries listed here."""
    rows = table.to_pydict()
    shown, relevance = [], []
    for q in rows["query"]:
        if q in seen or q not in by_query:
            shown.append([])
            relevance.append([])
        else:
            seen.add(q)
            shown.append(by_query[q][0])
            relevance.append(by_query[q][1])
    return pa.Table.from_pydict({**rows, "shown": shown, "relevance": relevance}, schema=NEGATIVES)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`dssm teacher`'s options."""
    from core.options import add_config_options

    p.add_argument("--negatives", type=Path, required=True, help="a `dssm negatives` (or `dssm mine`) output")
    p.add_argument("--titles", type=Path, required=True, help="the title pool: a `dssm clean` output's titles/")
    p.add_argument("--index", type=Path, help="a `dssm index` output: its model is the `index` ranker")
    p.add_argument("--out", type=Path, required=True, help="output directory (replaced atomically)")
    p.add_argument("--force", action="store_true", help="score again even when --out is up to date")
    add_config_options(p, TeacherConfig)


def command(args: argparse.Namespace) -> None:
    """`dssm teacher`."""
    from core.options import config_from_options

    cfg = config_from_options(TeacherConfig, args)
    m = teacher(args.negatives, args.titles, args.index, args.out, cfg, args.force)
    c = m["counts"]
    print(f"{c['lists']:,} teacher lists ({c['listed_titles'] / max(c['lists'], 1):.1f} titles each) -> {args.out}")
