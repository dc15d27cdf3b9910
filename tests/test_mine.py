"""`dssm mine`: mined negatives replace a share of the sampled ones, filtered as false negatives."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import tiny_model

from core.artifacts import content_sha256, write_manifest
from core.errors import DssmError
from stages.mine.config import MineConfig
from stages.mine.job import mine


def rows(directory: Path) -> list[dict]:
    return pq.read_table(directory).to_pylist()


def pool(tiny_data: Path, path: Path) -> list[str]:
    """Every title of the tiny negatives, as a `dssm clean` titles/ directory."""
    every = rows(tiny_data / "negatives" / "train") + rows(tiny_data / "negatives" / "valid")
    titles = sorted({t for r in every for t in [r["positive"], *r["negatives"]]})
    path.mkdir(parents=True)
    pq.write_table(pa.table({"title": titles}), path / "part-00000.parquet")
    return titles


def clicked(directory: Path) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in rows(directory / "train") + rows(directory / "valid"):
        out.setdefault(r["query"], set()).add(r["positive"])
    return out


def test_bm25_mining_replaces_the_asked_share_with_ranked_titles_never_clicked_for_the_query(tiny_data, tmp_path):
    from scoring.bm25 import CatalogueBM25

    titles = pool(tiny_data, tmp_path / "titles")
    cfg = MineConfig(hard=0.5, source="bm25", min_rank=2, max_rank=30)
    manifest = mine(tiny_data / "negatives", tmp_path / "titles", None, tmp_path / "mined", cfg)
    before, after = rows(tiny_data / "negatives" / "train"), rows(tmp_path / "mined" / "train")
    assert len(after) == len(before) == manifest["counts"]["train_rows"]
    assert rows(tmp_path / "mined" / "valid") == rows(tiny_data / "negatives" / "valid")  # validation as sampled
    bm25, was_clicked = CatalogueBM25(titles), clicked(tiny_data / "negatives")
    mined = 0
    for old, new in zip(before, after, strict=True):
        assert (new["query"], new["positive"], len(new["negatives"])) == (old["query"], old["positive"], 4)
        window = {titles[i] for i in bm25.search(new["query"], 30)[0][1:]}
        hard = [t for t in new["negatives"] if t not in old["negatives"]]
        assert len(hard) <= 2 and set(hard) <= window and not set(new["negatives"]) & was_clicked[new["query"]]
        assert (
            len(set(new["negatives"])) == 4
            and new["negatives"][len(hard) :] == [t for t in old["negatives"] if t not in hard][: 4 - len(hard)]
        )
        mined += len(hard)
    assert mined == manifest["counts"]["mined_negatives"] > len(before)  # most rows got two
    # a `dssm negatives` output for the trainer; mining is a pure function of its inputs
    on_disk = json.loads((tmp_path / "mined" / "manifest.json").read_text())
    assert on_disk["stage"] == "negatives" and on_disk["params"]["n"] == 4 and on_disk["params"]["mine"]["hard"] == 0.5
    again = mine(tiny_data / "negatives", tmp_path / "titles", None, tmp_path / "again", cfg)
    assert content_sha256(tmp_path / "again") == content_sha256(tmp_path / "mined") and not again["skipped"]
    assert mine(tiny_data / "negatives", tmp_path / "titles", None, tmp_path / "mined", cfg)["skipped"]


def fake_index(tmp_path: Path, checkpoint: Path, titles: list[str]) -> Path:
    """A `dssm index` output's layout built by hand: the checkpoint's title vectors in a flat index."""
    from scoring.neural import TwoTowerEmbedder
    from scoring.retriever import INDEX_FILE, unit_rows

    out = tmp_path / "index"
    (out / "embeddings").mkdir(parents=True)
    (out / "model").mkdir()
    vectors = unit_rows(TwoTowerEmbedder(checkpoint).embed(titles, "doc"))
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(out / INDEX_FILE))
    pq.write_table(pa.table({"title": titles}), out / "embeddings" / "part-00000.parquet")
    shutil.copy(checkpoint, out / "model" / "model.pt")
    (out / "model.json").write_text(json.dumps({"uri": str(checkpoint)}))
    write_manifest(out, {"stage": "index"})
    return out


def test_index_mining_keeps_titles_below_the_margin_of_the_positive(tiny_data, tmp_path):
    from scoring.neural import TwoTowerEmbedder

    titles = pool(tiny_data, tmp_path / "titles")
    checkpoint = tiny_model(tiny_data, tmp_path / "model", "epochs=2") / "last.pt"
    index = fake_index(tmp_path, checkpoint, titles)
    cfg = MineConfig(hard=0.5, source="index", min_rank=1, max_rank=40, relative_margin=0.3)
    manifest = mine(tiny_data / "negatives", tmp_path / "titles", index, tmp_path / "mined", cfg)
    assert manifest["source_used"] == "index" and "index" in manifest["inputs"]
    assert manifest["counts"]["dropped_margin"] > 0 and manifest["counts"]["mined_negatives"] > 0
    embedder = TwoTowerEmbedder(checkpoint)
    before = rows(tiny_data / "negatives" / "train")
    for old, new in zip(before, rows(tmp_path / "mined" / "train"), strict=True):
        hard = [t for t in new["negatives"] if t not in old["negatives"]]
        if not hard:
            continue
        q = embedder.embed([new["query"]], "query")[0]
        vectors = embedder.embed([new["positive"], *hard], "doc")
        cos = vectors @ q / np.linalg.norm(vectors, axis=1) / np.linalg.norm(q)
        assert (cos[1:] <= 0.7 * cos[0] + 1e-5).all()


def test_mining_refuses_settings_it_cannot_honour(tiny_data, tmp_path):
    pool(tiny_data, tmp_path / "titles")
    for bad in (MineConfig(hard=0.0), MineConfig(hard=0.5, min_rank=20, max_rank=10)):
        with pytest.raises(DssmError, match="need 0 < hard"):
            mine(tiny_data / "negatives", tmp_path / "titles", None, tmp_path / "mined", bad)
