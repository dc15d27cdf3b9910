"""Answer a query from the whole catalogue: the query tower's vector against a `dssm index` output.

An index directory is self-contained (stages/index/job.py writes it): `titles.faiss` (unit title
vectors, inner product = cosine), `embeddings/` (the titles in index order), and `model/` (the slim
checkpoint, plus `fusion.json` when the indexed model is a hybrid, with `bm25/`: a bm25s index of the
same titles, and for each dense partner, MiniLM or another trained model, `component-I.faiss`: its
vectors of the same titles; a trained partner's checkpoint is `model/component-I.pt`); its
manifest.json holds each file's sha256, checked at load. A hybrid's candidates are every
component's top `depth`; it fuses their scores as its `RetrievalFusion` says (scoring/fusion.py:
z-scores, reciprocal ranks, or the re-ranking's s_0 + Σ w_i·s_i for a hybrid saved before) and returns
the best k (docs/retrieval.md).

scoring/serving.py serves it as an MLflow pyfunc (`RetrieverModel`, the `retriever` model logged beside
each indexed model version).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from core.artifacts import require_manifest
from core.errors import DssmError
from core.text import capped_query, checked_texts
from scoring.bm25 import matching
from scoring.fusion import RetrievalFusion, fuse_query

if TYPE_CHECKING:
    import faiss

INDEX_FILE = "titles.faiss"


@dataclass(frozen=True)
class Hit:
    rank: int
    title: str
    score: float


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """float32 rows scaled to length 1 (an all-zero row stays zero), so inner product is cosine."""
    v = np.ascontiguousarray(vectors, dtype=np.float32)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def read_faiss(path: Path) -> faiss.Index:
    """The faiss index in `path`; a damaged file raises DssmError naming it (faiss's own message is a
    C++ assertion from its reader)."""
    import faiss

    try:
        return faiss.read_index(str(path))
    except RuntimeError as e:
        found = re.search(r"\.cpp:\d+: (?:Error: '[^']*' failed: )?(.*)", str(e))
        reason = found.group(1) if found else (str(e).splitlines() or [type(e).__name__])[0]
        if reason.startswith("read error"):  # "read error in PATH: 777 != 1600 (Success)"
            reason = "it ends early: truncated?"
        raise DssmError(
            f"{path}: not a readable faiss index ({reason}); rebuild the index with `dssm index --force` "
            f"(or `dssm run --force`)"
        ) from None


def read_titles(index_dir: Path) -> list[str]:
    """The titles of an index, in index order (the embeddings' part files in name order)."""
    import pyarrow.parquet as pq

    parts = sorted((Path(index_dir) / "embeddings").glob("part-*.parquet"))
    return [t for p in parts for t in pq.read_table(p, columns=["title"]).column("title").to_pylist()]


def component_index_file(position: int) -> str:
    """The faiss index of a hybrid's dense partner at `position` of its fusion.json's components."""
    return f"component-{position}.faiss"


class Retriever:
    """An index, its titles and the model's query tower (and a hybrid's other scorers: BM25, MiniLM,
    trained partners, each dense one with its own index of the same titles); `search` answers in
    milliseconds. `Retriever.load(dir)` reads a `dssm index` output."""

    def __init__(
        self,
        index,
        titles: list[str],
        embedder,
        fusion: dict[str, Any] | None = None,
        model=None,
        lexical=None,
        partner_indexes: dict[int, Any] | None = None,
        files: dict[str, Path] | None = None,
    ):
        """`fusion`: a hybrid's fusion.json (scoring/hybrid.py); `lexical`: a CatalogueBM25 of the
        same titles whose top `depth` join the candidates; `partner_indexes`: each dense partner's
        index (by component position); `files`: trained partners' checkpoints by file name."""
        from scoring.hybrid import fusion_components, load_components

        if len(titles) != index.ntotal:
            raise DssmError(f"{len(titles)} titles but {index.ntotal} vectors in the index")
        self.index, self.titles, self.embedder, self.model = index, titles, embedder, model or {}
        self.fusion = RetrievalFusion.from_dict(fusion.get("retrieval")) if fusion else None
        self.components: dict[str, Any] = {}
        self.kinds: list[str] = []
        self.weights: list[float] = []
        self.partner_indexes = partner_indexes or {}
        if fusion:
            described, self.weights = fusion_components(fusion)
            # what users type is neither kept in memory nor added to the MiniLM store on disk
            self.components = load_components(fusion, embedder, files or {}, remember=False)
            self.kinds = [c["kind"] for c in described]
            for position, kind in enumerate(self.kinds):
                if kind in ("minilm", "checkpoint") and position not in self.partner_indexes:
                    raise DssmError(f"{described[position]['name']}: no index of its vectors beside the model's")
        self.lexical = lexical if fusion else None

    @classmethod
    def load(cls, index_dir: Path | str, ef_search: int | None = None) -> Retriever:
        from scoring.bm25 import CatalogueBM25
        from scoring.neural import TwoTowerEmbedder

        path = Path(index_dir)
        if not (path / INDEX_FILE).is_file():
            raise DssmError(f"{path}: no index here ({INDEX_FILE} missing); run `dssm index` or `dssm run` first")
        # every file against the manifest's sha256: one copied from another index (or another model's
        # checkpoint) would answer with a mix of two models, and a same-size corruption passes a size check
        require_manifest(path, "index", content=True)
        index = read_faiss(path / INDEX_FILE)
        partners = {}
        for file in sorted(path.glob("component-*.faiss")):  # component_index_file(I)
            partners[int(file.stem.split("-")[1])] = read_faiss(file)
        for found in (index, *partners.values()):
            if ef_search and hasattr(found, "hnsw"):
                found.hnsw.efSearch = ef_search
        fusion = path / "model" / "fusion.json"
        titles = read_titles(path)
        return cls(
            index,
            titles,
            TwoTowerEmbedder(path / "model" / "model.pt"),
            json.loads(fusion.read_text()) if fusion.is_file() else None,
            json.loads((path / "model.json").read_text()),
            CatalogueBM25.load(path / "bm25", titles) if (path / "bm25").is_dir() else None,
            partners,
            {p.name: p for p in (path / "model").glob("component-*.pt")},
        )

    def warm(self) -> None:
        """Load what loads lazily (MiniLM's model, a tower's compiled graph) by answering one query."""
        self.search(["warm up"], 1)

    def search(self, queries: list[str], k: int = 10) -> list[list[Hit]]:
        """The top k titles per query, best first. A hybrid fuses its candidates (each dense
        component's top `depth` from its index, and BM25's top `depth` when it has `lexical`) as
        scoring/fusion.py says; they do not depend on k, so a k above them returns them all. A query
        is read to its first MAX_QUERY_WORDS words (core/text.py); a null or empty one is refused.
        Every dense component embeds and searches all the queries in one call."""
        if k < 1:
            raise DssmError(f"k must be at least 1, got {k}")
        read = [capped_query(q) for q in checked_texts(queries, "query")]
        # a hybrid's candidates are each component's top `depth` whatever k is: its top 10 never depends on k
        depth = min(self.fusion.depth if self.fusion else k, self.index.ntotal)
        vectors = unit_rows(self.embedder.embed(read, "query"))
        scores, ids = self.index.search(vectors, depth)
        if self.fusion is not None:
            dense = {0: (vectors, ids)}  # each dense component's query vectors and top ids, by position
            for p, name in enumerate(self.components):
                if self.kinds[p] in ("minilm", "checkpoint"):
                    partner = unit_rows(self.components[name].embed(read, "query"))
                    dense[p] = (partner, self.partner_indexes[p].search(partner, depth)[1])
            return [self._fused(q, query, dense, depth, k) for q, query in enumerate(read)]
        out = []
        for row_scores, row_ids in zip(scores, ids, strict=True):
            keep = row_ids >= 0
            hits = zip(row_ids[keep][:k], row_scores[keep][:k], strict=True)
            out.append([Hit(r + 1, self.titles[i], float(score)) for r, (i, score) in enumerate(hits)])
        return out

    def _fused(
        self, q: int, query: str, dense: dict[int, tuple[np.ndarray, np.ndarray]], depth: int, k: int
    ) -> list[Hit]:
        """Query q's hits: every component's top `depth` (a dense one's from `dense`: its query vectors and
        top ids, by position), each candidate scored by every component."""
        names = list(self.components)
        lexical_scores = self.lexical.scores(query) if self.lexical is not None else None
        tops = []
        for position, kind in enumerate(self.kinds):
            if kind == "bm25":
                if lexical_scores is None:  # an index without BM25's titles: the other components' candidates
                    row = np.zeros(0, np.int64)
                else:
                    row = matching(lexical_scores, depth)
            else:
                row = dense[position][1][q]
            tops.append(row[row >= 0].astype(np.int64))

        def score(position: int, candidates: np.ndarray) -> np.ndarray:
            kind = self.kinds[position]
            if kind == "bm25":
                if lexical_scores is not None and self.fusion.method != "rescore":
                    return lexical_scores[candidates]
                # the re-ranking weight is on the hand-written BM25's scale
                return self.components[names[position]].score([query] * len(candidates), self._titles(candidates))
            index = self.index if kind == "model" else self.partner_indexes[position]
            return index.reconstruct_batch(candidates) @ dense[position][0][q]

        found, fused = fuse_query(tops, score, self.fusion, k, self.weights, depth)
        return [Hit(r + 1, self.titles[i], float(s)) for r, (i, s) in enumerate(zip(found, fused, strict=True))]

    def _titles(self, ids: np.ndarray) -> list[str]:
        return [self.titles[i] for i in ids]
