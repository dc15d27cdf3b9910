"""A window over date-partitioned logs (jobs/window.py): days without logs and partitions that
cannot be read are left out and listed, not fatal."""

import logging
import shutil

import pytest

from core.errors import DssmError
from jobs.clean import CleanConfig
from jobs.simulate import SimulationConfig, simulate
from jobs.window import clean_window, window_dates


@pytest.fixture(scope="module")
def log_root(default_pairs, tmp_path_factory):
    """Two days of simulated logs, as `dssm simulate --day` appends them to a log root."""
    root = tmp_path_factory.mktemp("window") / "logs"
    for day in ("2026-01-01", "2026-01-03"):
        cfg = SimulationConfig(impressions=1_000, shards=1, workers=1, day=day)
        simulate(default_pairs, root / f"dt={day}", cfg, {"path": "default", "sha256": "default"})
    return root


def test_an_empty_day_is_a_day_without_logs_and_bad_partition_names_are_listed(spark, log_root, tmp_path, caplog):
    """An empty `dt=DAY/` used to fail the whole night ("raw log input is an empty directory"), and
    `dt=2026-13-40`, `dt=2026-2-2` were dropped without a word."""
    root = tmp_path / "logs"
    shutil.copytree(log_root, root)
    (root / "dt=2026-01-02").mkdir()  # the day's shipper made the directory, then wrote nothing
    (root / "dt=2026-13-40").mkdir()
    shutil.copytree(root / "dt=2026-01-01", root / "dt=2026-2-2")
    days, out = tmp_path / "days", tmp_path / "clean"
    dates = window_dates("2026-01-04", 4)

    with caplog.at_level(logging.WARNING, logger="jobs.window"):
        m = clean_window(spark, root, dates, days, out, CleanConfig())
    window = m["window"]
    assert list(window["days"]) == ["2026-01-01", "2026-01-03"] and m["counts"]["days"] == 2
    assert window["missing"] == ["2026-01-02", "2026-01-04"]
    assert window["why_missing"] == {
        "2026-01-02": "dt=2026-01-02 is an empty directory",
        "2026-01-04": "no partition dt=2026-01-04",
    }
    assert window["bad_partitions"] == {
        "dt=2026-13-40": "not a date (month must be in 1..12)",
        "dt=2026-2-2": "not a dt=YYYY-MM-DD name",
    }
    warned = caplog.text
    assert "dt=2026-13-40 is not read: not a date" in warned and "dt=2026-2-2 is not read" in warned
    assert "day 2026-01-02 left out (dt=2026-01-02 is an empty directory)" in warned
    assert m["counts"]["lines_read"] == m["counts"]["kept"] + m["counts"]["rejected"]

    # a day of only empty files is a day without logs too; the manifest follows what changed
    (root / "dt=2026-01-02" / "part-00000.jsonl").write_text("")
    m = clean_window(spark, root, dates, days, out, CleanConfig())
    assert m["window"]["why_missing"]["2026-01-02"] == "dt=2026-01-02 holds only empty files"
    assert m["counts"]["days_cleaned"] == 0  # the two days with logs were cached

    # the empty day's logs land: it is cleaned and summed in, alone
    shutil.rmtree(root / "dt=2026-01-02")
    shutil.copytree(root / "dt=2026-01-01", root / "dt=2026-01-02")
    m = clean_window(spark, root, dates, days, out, CleanConfig())
    assert list(m["window"]["days"]) == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert m["window"]["missing"] == ["2026-01-04"] and m["counts"]["days_cleaned"] == 1


def test_a_window_without_any_logs_names_each_day_and_why(spark, tmp_path):
    root = tmp_path / "logs"
    (root / "dt=2026-01-02").mkdir(parents=True)
    message = r"no logs in the window 2026-01-01\.\.2026-01-02 \(no partition dt=2026-01-01; dt=2026-01-02 is an empty"
    with pytest.raises(DssmError, match=message):
        clean_window(spark, root, window_dates("2026-01-02", 2), tmp_path / "days", tmp_path / "clean", CleanConfig())
    assert not (tmp_path / "clean").exists()
