"""Position bias from the logs alone: EM under the position-based model recovers the simulator's
examination curve rank^-eta."""

import numpy as np
import pytest

from stages.propensity.job import Cells, estimate


def test_em_recovers_a_known_examination_curve_from_pbm_clicks():
    rng = np.random.default_rng(0)
    theta = np.array([1.0, 0.7, 0.5, 0.35, 0.25, 0.2])
    pairs, shown = 400, 60
    gamma = rng.uniform(0.05, 0.9, pairs)
    pair = np.repeat(np.arange(pairs), shown)
    rank = rng.integers(1, len(theta) + 1, len(pair))  # each pair shown at several ranks
    clicks = rng.random(len(pair)) < theta[rank - 1] * gamma[pair]
    cells = Cells(pair=pair, rank=rank, shown=np.ones(len(pair), np.int64), clicks=clicks.astype(np.int64))
    curve = estimate(cells, max_rank=len(theta))
    assert curve["ranks"] == [1, 2, 3, 4, 5, 6] and curve["converged"]
    np.testing.assert_allclose(curve["examination"], theta, rtol=0.08)
    # the raw click rate per rank mixes in relevance; the estimate does not
    assert curve["click_rate_per_rank"][0] < 0.6


@pytest.mark.parametrize("eta", [1.0, 1.5])
def test_the_curve_estimated_from_clean_impressions_matches_the_simulators_truth(spark, default_pairs, tmp_path, eta):
    from stages.clean.job import clean
    from stages.propensity.job import PLOT_FILE, propensity, read_curve
    from stages.simulate.config import ClickModel, SimulationConfig
    from stages.simulate.job import simulate

    cfg = SimulationConfig(impressions=40_000, shards=1, workers=1, log_format=2, model=ClickModel(eta=eta))
    simulate(default_pairs, tmp_path / "sim", cfg, {"path": "default", "sha256": "default"})
    clean(spark, str(tmp_path / "sim"), tmp_path / "clean")
    manifest = propensity(spark, tmp_path / "clean", tmp_path / "propensity")
    curve = read_curve(tmp_path / "propensity")
    truth = {rank: rank**-eta for rank in range(1, 6)}
    estimated = dict(zip(curve["ranks"], curve["examination"], strict=True))
    errors = {rank: estimated[rank] / truth[rank] - 1 for rank in truth}
    assert all(abs(e) <= 0.10 for e in errors.values()), errors
    assert curve["simulated_eta"] == eta and curve["impressions"] == manifest["counts"]["impressions"]
    assert (tmp_path / "propensity" / PLOT_FILE).stat().st_size > 10_000
    # the uncorrected click rate per rank falls faster than examination: relevance is ranked first
    assert curve["click_rate_per_rank"][4] / curve["click_rate_per_rank"][0] < estimated[5]


def test_a_clean_without_impressions_is_faster_and_what_needs_them_says_so(spark, pipeline, tmp_path):
    from core.errors import DssmError
    from core.layout import Layout
    from core.stage import RunContext, StageOutput
    from stages.clean.config import CleanConfig
    from stages.clean.job import clean
    from stages.negatives.config import NegativesConfig
    from stages.negatives.job import negatives
    from stages.propensity.job import propensity
    from stages.propensity.stage import run as propensity_stage

    out = tmp_path / "clean"
    manifest = clean(spark, str(pipeline["simulate"]), out, CleanConfig(impressions=False))
    assert "impressions" not in manifest["outputs"] and not (out / "impressions").exists()
    assert manifest["counts"]["kept"] == read_counts(pipeline["clean"])["kept"]
    with pytest.raises(DssmError, match="no impressions"):
        propensity(spark, out, tmp_path / "propensity")
    for needs in (NegativesConfig(skip_above=0.5), NegativesConfig(debias=True), NegativesConfig(list_size=10)):
        with pytest.raises(DssmError, match="skip_above, debias and list_size need the impressions"):
            negatives(spark, out, tmp_path / "negatives", needs)
    from flows.config import RunConfig

    ctx = RunContext(RunConfig(), Layout(tmp_path), None, "", None, [], 1)
    cleaned = StageOutput("clean", str(out), manifest["content_sha256"], False, 0.0)
    assert propensity_stage(ctx, ctx.cfg.propensity, cleaned) is None  # the flow goes on


def read_counts(path):
    from core.artifacts import read_manifest

    return read_manifest(path)["counts"]


def test_logs_without_a_click_get_a_clear_error_not_a_flat_curve(spark, pipeline, tmp_path):
    """Issue 63's probe: from impressions with no click, EM returned its starting point, a flat curve, and
    `dssm propensity` wrote it as if measured. It now refuses, naming the impressions, and writes nothing."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from core.artifacts import read_manifest, write_manifest
    from core.errors import DssmError
    from stages.propensity.job import propensity

    clean = tmp_path / "clean"
    shutil.copytree(pipeline["clean"], clean)
    for path in sorted((clean / "impressions").rglob("*.parquet")):
        table = pq.read_table(path)
        clicked = table.schema.field("clicked")
        no_clicks = pa.array([[False] * len(r) for r in table.column("clicked").to_pylist()], clicked.type)
        table = table.set_column(table.schema.get_field_index("clicked"), clicked, no_clicks)
        pq.write_table(table, path)
    manifest = read_manifest(pipeline["clean"])
    kept = {k: v for k, v in manifest.items() if k not in ("created_at", "content_sha256", "files", "file_sha256")}
    write_manifest(clean, kept)
    with pytest.raises(DssmError, match=r"impressions .* hold no click"):
        propensity(spark, clean, tmp_path / "propensity")
    assert not (tmp_path / "propensity").exists()
