"""A window over date-partitioned logs (stages/clean/window.py): days without logs and partitions that
cannot be read are left out and listed, not fatal; partitions are listed and fingerprinted on the
log root's Hadoop file system (stages/clean/hadoopfs.py), a `file://` URI here."""

import json
import logging
import os
import shutil

import pytest

from core.dates import window_dates
from core.errors import DssmError
from stages.clean.config import CleanConfig
from stages.clean.hadoopfs import HadoopPath, fingerprint
from stages.clean.window import clean_window, day_logs, partitions
from stages.simulate.config import SimulationConfig
from stages.simulate.job import simulate


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

    with caplog.at_level(logging.WARNING, logger="stages.clean.window"):
        m = clean_window(spark, root.as_uri(), dates, days, out, CleanConfig())
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
    m = clean_window(spark, root.as_uri(), dates, days, out, CleanConfig())
    assert m["window"]["why_missing"]["2026-01-02"] == "dt=2026-01-02 holds only empty files"
    assert m["counts"]["days_cleaned"] == 0  # the two days with logs were cached

    # the empty day's logs land: it is cleaned and summed in, alone
    shutil.rmtree(root / "dt=2026-01-02")
    shutil.copytree(root / "dt=2026-01-01", root / "dt=2026-01-02")
    m = clean_window(spark, root.as_uri(), dates, days, out, CleanConfig())
    assert list(m["window"]["days"]) == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert m["window"]["missing"] == ["2026-01-04"] and m["counts"]["days_cleaned"] == 1


def test_the_time_splits_test_day_is_cleaned_but_left_out_of_the_windows_sums(spark, log_root, tmp_path):
    """judge.split=time (issue 63): the test day is cleaned for the judge alone; the window's pairs, titles
    and impressions, which training reads, are the other days'. A window whose only day with logs is the
    test day (a first night) holds nothing out: the judge then grades that night on the query split. A
    later night whose only day with logs is the kept set's test day has nothing to train on: a clear error."""
    import pyarrow.parquet as pq

    days, out, dates = tmp_path / "days", tmp_path / "clean", window_dates("2026-01-03", 3)
    m = clean_window(spark, log_root.as_uri(), dates, days, out, CleanConfig(), hold_out="2026-01-03")
    assert list(m["window"]["days"]) == ["2026-01-01"] and m["counts"]["days"] == 1
    assert m["held_out"]["date"] == "2026-01-03" and m["held_out"]["path"] == str(days / "dt=2026-01-03")
    assert m["counts"]["days_cleaned"] == 2  # the test day is cleaned all the same
    first = json.loads((days / "dt=2026-01-01" / "manifest.json").read_text())
    assert m["counts"]["lines_read"] == first["counts"]["lines_read"]
    clicked = pq.read_table(out / "pairs").column("clicks").to_pylist()
    assert sum(clicked) == sum(pq.read_table(days / "dt=2026-01-01" / "pairs").column("clicks").to_pylist())
    assert pq.read_table(out / "impressions").num_rows == pq.read_table(days / "dt=2026-01-01" / "impressions").num_rows

    only_test_day = clean_window(spark, log_root.as_uri(), ["2026-01-03"], days, tmp_path / "c2", CleanConfig(),
                                 hold_out="2026-01-03")  # fmt: skip
    assert "held_out" not in only_test_day and list(only_test_day["window"]["days"]) == ["2026-01-03"]
    # a later night whose only day with logs is the kept set's test day: nothing training may read
    with pytest.raises(DssmError, match="logs on 2026-01-03 alone, the test day of the evaluation set in use"):
        clean_window(spark, log_root.as_uri(), window_dates("2026-01-04", 2), days, tmp_path / "c3", CleanConfig(),
                     hold_out="2026-01-03")  # fmt: skip


def test_a_window_without_any_logs_names_each_day_and_why(spark, tmp_path):
    root = tmp_path / "logs"
    (root / "dt=2026-01-02").mkdir(parents=True)
    message = r"no logs in the window 2026-01-01\.\.2026-01-02 \(no partition dt=2026-01-01; dt=2026-01-02 is an empty"
    with pytest.raises(DssmError, match=message):
        clean_window(spark, root, window_dates("2026-01-02", 2), tmp_path / "days", tmp_path / "clean", CleanConfig())
    assert not (tmp_path / "clean").exists()


def test_partitions_are_listed_and_fingerprinted_alike_by_relative_path_and_file_uri(spark, log_root, tmp_path):
    """The window's listing and fingerprints go through the Hadoop FileSystem, so a relative path (qualified
    against the working directory, as Spark qualifies it) and a `file://` URI name the same files; a
    fingerprint holds while a partition is untouched and moves when a file is rewritten."""
    root = tmp_path / "logs"
    shutil.copytree(log_root, root)
    by_uri, bad = partitions(spark, root.as_uri())
    by_relative, _ = partitions(spark, os.path.relpath(root))
    assert list(by_uri) == list(by_relative) == ["2026-01-01", "2026-01-03"] and bad == {}

    def listed(partition: HadoopPath) -> tuple[str, list[str], str]:
        logs, files = day_logs(partition)
        return logs.qualified, [f.name for f in files], fingerprint(files)

    day = listed(by_uri["2026-01-01"])
    assert listed(by_relative["2026-01-01"]) == day
    assert day[0] == f"file:{root}/dt=2026-01-01/logs"  # a simulate output's logs/, qualified
    assert day[1] == sorted(p.name for p in (root / "dt=2026-01-01" / "logs").iterdir())  # no manifest, no test pairs
    assert listed(by_uri["2026-01-03"])[2] != day[2]
    assert listed(partitions(spark, root.as_uri())[0]["2026-01-01"]) == day  # listed again, unchanged

    # rewritten with other bytes of the same length, later: the new modification time tells
    part = root / "dt=2026-01-01" / "logs" / day[1][0]
    before = part.stat()
    data = part.read_bytes()
    part.write_bytes(data[::-1])
    os.utime(part, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert part.stat().st_size == before.st_size and listed(by_uri["2026-01-01"])[2] != day[2]


def test_a_log_root_that_is_not_there_is_a_clear_error(spark, tmp_path):
    with pytest.raises(DssmError, match=r"log root not found: file:.*/nowhere \(expected dt=YYYY-MM-DD partitions"):
        partitions(spark, (tmp_path / "nowhere").as_uri())
    (tmp_path / "file").write_text("x")
    with pytest.raises(DssmError, match="log root is not a directory"):
        partitions(spark, str(tmp_path / "file"))
