"""Shared fixtures: one real Spark session per test session, and one small pipeline run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(os.environ.get("DSSM_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
HOME_DEPOT = SHARED_DATA / "homedepot-search-relevance" / "train.csv.zip"


@pytest.fixture(scope="session")
def spark():
    from jobs.spark import get_spark

    session = get_spark("local[2]", "dssm-tests", {"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "2g"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def home_depot() -> Path:
    if not HOME_DEPOT.exists():
        pytest.skip(f"Home Depot judgments not found at {HOME_DEPOT} (../shared/data is absent)")
    return HOME_DEPOT


@pytest.fixture(scope="session")
def default_pairs():
    from dssm.judgments import read_judgments
    from jobs.catalogue import DEFAULT_CATALOGUE

    return read_judgments(DEFAULT_CATALOGUE)


@pytest.fixture(scope="session")
def pipeline(spark, default_pairs, tmp_path_factory) -> dict[str, Path]:
    """simulate -> clean -> vocab -> negatives on 20k impressions of the embedded catalogue."""
    from jobs.clean import clean
    from jobs.negatives import NegativesConfig, negatives
    from jobs.simulate import SimulationConfig, simulate
    from jobs.vocab import vocab

    work = tmp_path_factory.mktemp("pipeline")
    simulate(
        default_pairs,
        work / "simulate",
        SimulationConfig(impressions=20_000, shards=2, workers=1),
        {"path": "default", "sha256": "default"},
    )
    clean(spark, str(work / "simulate"), work / "clean")
    vocab(spark, work / "clean", work / "vocab")
    negatives(spark, work / "clean", work / "negatives", NegativesConfig(shards=3))
    return {stage: work / stage for stage in ("simulate", "clean", "vocab", "negatives")}
