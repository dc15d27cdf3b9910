"""The teacher stage (stages/teacher/job.py): each train query's hard candidates and clicks, scored by a
teacher, as listwise targets on one row per query; clicks never taught as negatives."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import tiny_model

from core.errors import DssmError
from stages.teacher.config import TeacherConfig, check_config
from stages.teacher.job import targets, teacher


def test_targets_standardise_each_scorer_over_the_list_and_never_rank_a_click_below_a_candidate():
    bm25, cos = np.array([0.0, 4.0, 2.0, 6.0]), np.array([0.1, 0.9, 0.5, 0.3])
    clicked = np.array([True, False, False, False])
    p = targets([bm25, cos], [1.0, 1.0], clicked, temperature=1.0)
    z = lambda x: (x - x.mean()) / x.std()  # noqa: E731
    fused = z(bm25) + z(cos)
    fused[0] = max(fused[0], fused[1:].max())  # the clicked title, raised to the best candidate's score
    expected = np.exp(fused - fused.max()) / np.exp(fused - fused.max()).sum()
    np.testing.assert_allclose(p, expected)
    assert p.sum() == pytest.approx(1.0) and p[0] == pytest.approx(p[1:].max())
    # scale-free: the same list on another scale is the same distribution; a lower temperature sharpens it
    np.testing.assert_allclose(targets([100 * bm25, cos - 7], [1.0, 1.0], clicked, 1.0), p)
    sharp = targets([bm25, cos], [1.0, 1.0], clicked, temperature=0.25)
    assert sharp.max() > p.max()


def test_the_teacher_stage_lists_candidates_and_clicks_per_train_query(tiny_data, tmp_path):
    model = tiny_model(tiny_data, tmp_path / "model", "epochs=2") / "last.pt"
    train = pq.read_table(tiny_data / "negatives" / "train")
    valid = pq.read_table(tiny_data / "negatives" / "valid")
    pool = sorted({t for table in (train, valid) for c in ("positive", "negatives") for t in _flat(table.column(c))})
    (tmp_path / "titles").mkdir()
    pq.write_table(pa.table({"title": pool}), tmp_path / "titles" / "part-00000.parquet")
    cfg = TeacherConfig(scorers=["bm25", f"checkpoint:{model}"], sources=["bm25", f"checkpoint:{model}"], depth=3)
    out = tmp_path / "teacher"
    manifest = teacher(tiny_data / "negatives", tmp_path / "titles", None, out, cfg)
    assert manifest["stage"] == "negatives" and manifest["params"]["list_size"] == 6
    written = pq.read_table(out / "train").to_pylist()
    assert len(written) == train.num_rows
    clicked: dict[str, set[str]] = {}  # `dssm negatives` splits by query: a train query's clicks are its train rows
    for row in train.to_pylist():
        clicked.setdefault(row["query"], set()).add(row["positive"])
    listed = [r for r in written if r["shown"]]
    assert len(listed) == len({r["query"] for r in written}) == manifest["counts"]["lists"]  # one row per query
    for row in listed:
        shown, p = row["shown"], np.array(row["relevance"])
        assert len(set(shown)) == len(shown) and p.sum() == pytest.approx(1.0)
        clicks = [i for i, t in enumerate(shown) if t in clicked[row["query"]]]
        assert {shown[i] for i in clicks} == clicked[row["query"]]  # every click of the query is in its list
        others = [p[i] for i in range(len(shown)) if i not in clicks]
        assert not others or min(p[clicks]) >= max(others) - 1e-12  # never below an unclicked candidate
        assert len(shown) - len(clicks) <= 2 * cfg.depth
    # the other columns, and valid/, as they came
    keep = ["query", "positive", "negatives", "clicks"]
    assert [{k: r[k] for k in keep} for r in written] == [{k: r[k] for k in keep} for r in train.to_pylist()]
    assert pq.read_table(out / "valid").equals(valid)
    assert json.loads((out / "manifest.json").read_text())["inputs"][f"checkpoint:{model}"]["sha256"]
    # up to date: a second call is skipped
    assert teacher(tiny_data / "negatives", tmp_path / "titles", None, out, cfg)["skipped"]


def test_a_teacher_config_names_known_rankers():
    with pytest.raises(DssmError, match="unknown ranker"):
        check_config(TeacherConfig(scorers=["bm42"]))
    with pytest.raises(DssmError, match="2 weights for 1 scorers"):
        check_config(TeacherConfig(scorers=["bm25"], weights=[1.0, 2.0]))


def _flat(column) -> list[str]:
    values = column.to_pylist()
    return [t for v in values for t in (v if isinstance(v, list) else [v])]


def test_the_title_pool_may_be_given_as_the_clean_output_and_anything_else_is_named(tiny_data, tmp_path):
    """Issue 63's probe: `dssm teacher --titles CLEAN_DIR` (the clean output, not its titles/) failed with a
    bare Arrow error naming no path. A clean output is read as its titles/; a folder that holds no title
    pool is refused naming it."""
    from core.errors import DssmError
    from core.schemas import read_title_pool

    clean = tmp_path / "clean"
    (clean / "titles").mkdir(parents=True)
    pq.write_table(pa.table({"title": ["cordless drill", "claw hammer"]}), clean / "titles" / "part-0.parquet")
    (clean / "manifest.json").write_text("{}")
    assert read_title_pool(clean) == read_title_pool(clean / "titles") == ["cordless drill", "claw hammer"]
    cfg = TeacherConfig(scorers=["bm25"], sources=["bm25"], depth=2)
    manifest = teacher(tiny_data / "negatives", clean, None, tmp_path / "teacher", cfg)
    assert manifest["inputs"]["titles"]["path"] == str(clean / "titles")
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "notes.txt").write_text("not parquet")
    for wrong in (garbage, tmp_path / "missing"):
        with pytest.raises(DssmError, match=f"{wrong}: not"):
            teacher(tiny_data / "negatives", wrong, None, tmp_path / "t2", cfg)
