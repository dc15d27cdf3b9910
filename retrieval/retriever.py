"""Answer a query from the whole catalogue: the query tower's vector against a `dssm index` output.

An index directory is self-contained (retrieval/index.py writes it): `titles.faiss` (unit title
vectors, inner product = cosine), `embeddings/` (the titles in index order), and `model/` (the slim
checkpoint, plus `fusion.json` when the indexed model is a hybrid, with `bm25/`: a bm25s index of the
same titles); its manifest.json holds each file's sha256, checked at load. A hybrid's candidates
are the index's top `depth` and BM25's top `depth`; it fuses their scores as its `RetrievalFusion`
says (retrieval/fusion.py: z-scores, reciprocal ranks, or the re-ranking's cos + w·BM25 for a hybrid
saved before) and returns the best k (docs/retrieval.md).

`RetrieverModel` is the same as an MLflow pyfunc (the `retriever` model logged beside each indexed
model version): a DataFrame with a `query` column in, one row per (query, rank) out.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

from core.artifacts import require_manifest
from core.errors import DssmError
from core.text import capped_query, checked_texts
from retrieval.bm25 import best
from retrieval.fusion import RetrievalFusion, fuse_candidates, ranked, union

if TYPE_CHECKING:
    import faiss

INDEX_FILE = "titles.faiss"
SIGNATURE = ModelSignature(
    inputs=Schema([ColSpec("string", "query")]),
    outputs=Schema(
        [ColSpec("string", "query"), ColSpec("long", "rank"), ColSpec("string", "title"), ColSpec("double", "score")]
    ),
    params=ParamSchema([ParamSpec("k", "long", 10)]),
)


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


class Retriever:
    """An index, its titles and the model's query tower (and a hybrid's BM25 and weight); `search`
    answers in milliseconds. `Retriever.load(dir)` reads a `dssm index` output."""

    def __init__(
        self, index, titles: list[str], embedder, fusion: dict[str, Any] | None = None, model=None, lexical=None
    ):
        """`fusion`: a hybrid's weight and BM25 statistics; `lexical`: a CatalogueBM25 of the same
        titles whose top `depth` join the candidates (a hybrid only)."""
        from evaluation.lexical import BM25

        if len(titles) != index.ntotal:
            raise DssmError(f"{len(titles)} titles but {index.ntotal} vectors in the index")
        self.index, self.titles, self.embedder, self.model = index, titles, embedder, model or {}
        self.bm25 = BM25.from_dict(fusion["bm25"]) if fusion else None
        self.weight = fusion["weight"] if fusion else 0.0
        self.fusion = RetrievalFusion.from_dict(fusion.get("retrieval")) if fusion else None
        self.lexical = lexical if fusion else None

    @classmethod
    def load(cls, index_dir: Path | str, ef_search: int | None = None) -> Retriever:
        from evaluation.neural import TwoTowerEmbedder

        path = Path(index_dir)
        if not (path / INDEX_FILE).is_file():
            raise DssmError(f"{path}: no index here ({INDEX_FILE} missing); run `dssm index` or `dssm run` first")
        # every file against the manifest's sha256: one copied from another index (or another model's
        # checkpoint) would answer with a mix of two models, and a same-size corruption passes a size check
        require_manifest(path, "index", content=True)
        index = read_faiss(path / INDEX_FILE)
        if ef_search and hasattr(index, "hnsw"):
            index.hnsw.efSearch = ef_search
        from retrieval.bm25 import CatalogueBM25

        fusion = path / "model" / "fusion.json"
        titles = read_titles(path)
        return cls(
            index,
            titles,
            TwoTowerEmbedder(path / "model" / "model.pt"),
            json.loads(fusion.read_text()) if fusion.is_file() else None,
            json.loads((path / "model.json").read_text()),
            CatalogueBM25.load(path / "bm25", titles) if (path / "bm25").is_dir() else None,
        )

    def search(self, queries: list[str], k: int = 10) -> list[list[Hit]]:
        """The top k titles per query, best first. A hybrid fuses its candidates (the index's top
        `depth`, and BM25's top `depth` when it has `lexical`) as retrieval/fusion.py says. A query
        is read to its first MAX_QUERY_WORDS words (core/text.py); a null or empty one is refused."""
        if k < 1:
            raise DssmError(f"k must be at least 1, got {k}")
        read = [capped_query(q) for q in checked_texts(queries, "query")]
        depth = min(max(k, self.fusion.depth if self.fusion else k), self.index.ntotal)
        vectors = unit_rows(self.embedder.embed(read, "query"))
        scores, ids = self.index.search(vectors, depth)
        out = []
        for query, vector, row_scores, row_ids in zip(read, vectors, scores, ids, strict=True):
            keep = row_ids >= 0
            row_ids, found = row_ids[keep].astype(np.int64), row_scores[keep].astype(np.float64)
            if self.fusion is not None:
                row_ids, found = self._fused(query, vector, row_ids, found, depth, k)
            else:
                row_ids, found = row_ids[:k], found[:k]
            hits = zip(row_ids, found, strict=True)
            out.append([Hit(r + 1, self.titles[i], float(score)) for r, (i, score) in enumerate(hits)])
        return out

    def _fused(
        self, query: str, vector: np.ndarray, ids: np.ndarray, cos: np.ndarray, depth: int, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        if self.lexical is not None:
            lexical_scores = self.lexical.scores(query)
            top = best(lexical_scores, depth)
            candidates = union(ids, top, lexical_scores[top])
            extra = candidates[len(ids) :]
            if len(extra):  # their cosines from the index's stored unit vectors
                cos = np.concatenate([cos, self.index.reconstruct_batch(extra) @ vector])
            ids, bm25 = candidates, lexical_scores[candidates]
        else:  # an index without BM25's titles: its own candidates, scored by the fusion's BM25
            bm25 = self.bm25.score([query] * len(ids), [self.titles[i] for i in ids])
        if self.fusion.method == "rescore":  # the re-ranking weight is on the hand-written BM25's scale
            bm25 = self.bm25.score([query] * len(ids), [self.titles[i] for i in ids])
        return ranked(ids, fuse_candidates(cos, bm25, self.fusion, self.weight), k)


class RetrieverModel(mlflow.pyfunc.PythonModel):
    """The pyfunc `retriever`: queries in, their top k titles out (params {"k": 10})."""

    def load_context(self, context) -> None:
        self.retriever = Retriever.load(context.artifacts["index"])

    def predict(self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        if "query" not in model_input.columns:
            raise MlflowException.invalid_parameter_value("the retriever needs a `query` column")
        k = int((params or {}).get("k", 10))
        if k < 1:
            raise MlflowException.invalid_parameter_value(f"k must be at least 1, got {k}")
        try:  # a DssmError would be a 500 from `mlflow models serve`; this is the caller's input: a 400
            queries = checked_texts(model_input["query"].tolist(), "query")
        except DssmError as e:
            raise MlflowException.invalid_parameter_value(str(e)) from None
        rows = [
            (q, hit.rank, hit.title, hit.score)
            for q, hits in zip(queries, self.retriever.search(queries, k), strict=True)
            for hit in hits
        ]
        return pd.DataFrame(rows, columns=["query", "rank", "title", "score"])


def log_retriever(index_dir: Path, registered_name: str | None) -> tuple[str, str | None]:
    """Log the index directory as a pyfunc `retriever` into the active run (and register it);
    returns (model URI, registered version)."""
    from evaluation.registry import ROOT, pinned_requirements

    info = mlflow.pyfunc.log_model(
        name="retriever",
        python_model=RetrieverModel(),
        artifacts={"index": str(index_dir)},
        code_paths=[str(ROOT / p) for p in ("core", "modeling", "evaluation", "retrieval")],
        signature=SIGNATURE,
        input_example=pd.DataFrame({"query": ["cordless drill"]}),
        pip_requirements=pinned_requirements("faiss-cpu"),
        registered_model_name=registered_name,
    )
    version = str(info.registered_model_version) if registered_name and info.registered_model_version else None
    return info.model_uri, version
