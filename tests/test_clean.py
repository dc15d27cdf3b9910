import gzip
import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from core.artifacts import content_sha256, read_manifest
from core.errors import DssmError
from stages.clean.config import CleanConfig
from stages.clean.job import clean


def test_counts_reconcile_and_every_reject_has_a_reason(pipeline):
    manifest = read_manifest(pipeline["clean"])
    c = manifest["counts"]
    assert c["lines_read"] == c["kept"] + c["rejected"]
    assert c["rejected"] == sum(c["rejected_by_reason"].values())
    rejects = pq.read_table(pipeline["clean"] / "rejects").to_pylist()
    assert len(rejects) == c["rejected"]
    sim = read_manifest(pipeline["simulate"])["counts"]
    assert c["lines_read"] == sim["lines"]
    by_reason = c["rejected_by_reason"]
    # Every simulated bot line is dropped, and (almost) nothing else is taken for a bot.
    assert sim["bot_impressions"] * 0.95 <= by_reason["bot_user"] <= sim["bot_impressions"] * 1.05
    assert by_reason["duplicate_event"] > 0 and by_reason["empty_query"] > 0
    for row in rejects:
        assert row["reason"]
        if row["reason"] in {"invalid_json", "missing_field", "wrong_type"}:
            assert row["raw"] is not None


def test_pairs_are_normalised_and_counted(pipeline):
    pairs = pq.read_table(pipeline["clean"] / "pairs").to_pylist()
    assert pairs
    for p in pairs:
        assert p["query"] == " ".join(p["query"].lower().split()) != ""
        assert p["title"] == " ".join(p["title"].lower().split())
        assert 0 < p["clicks"] <= p["impressions"]
    titles = {t["title"] for t in pq.read_table(pipeline["clean"] / "titles").to_pylist()}
    assert {p["title"] for p in pairs} <= titles


def test_rerun_is_a_no_op_and_force_rewrites_identical_bytes(spark, pipeline, tmp_path):
    from core.spark import LazySpark

    out = tmp_path / "clean"  # a copy: the session's pipeline is read by other tests meanwhile (make test's workers)
    shutil.copytree(pipeline["clean"], out)
    before = read_manifest(out)
    lazy = LazySpark()
    assert clean(lazy, str(pipeline["simulate"]), out) == before | {"skipped": True}
    assert lazy._session is None  # up to date: no session was asked for (the flow starts no JVM)
    again = clean(spark, str(pipeline["simulate"]), out, force=True)
    assert again["content_sha256"] == before["content_sha256"]
    assert content_sha256(out) == before["content_sha256"]


def _write_lines(path, lines):
    with gzip.open(path, "wt") as handle:
        handle.write("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "lines,message",
    [
        (["garbage", "more garbage {", "[]"], "no usable impression"),
        ([], "no lines|empty"),
    ],
)
def test_bad_input_fails_cleanly_and_keeps_the_previous_output(spark, tmp_path, pipeline, lines, message):
    out = tmp_path / "out"
    clean(spark, str(pipeline["simulate"]), out)
    before = content_sha256(out)
    bad = tmp_path / "bad.jsonl.gz"
    _write_lines(bad, lines) if lines else bad.write_bytes(b"")
    with pytest.raises(DssmError, match=message):
        clean(spark, str(bad), out)
    assert content_sha256(out) == before
    assert not list(tmp_path.glob(".out.tmp-*"))


def test_missing_input_is_a_clear_error(spark, tmp_path):
    with pytest.raises(DssmError, match="not found"):
        clean(spark, str(tmp_path / "nope"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_mostly_malformed_input_is_refused(spark, tmp_path, pipeline):
    good = gzip.open(next((pipeline["simulate"] / "logs").glob("part-*")), "rt").read().splitlines()[:10]
    bad = tmp_path / "mixed.jsonl.gz"
    _write_lines(bad, good + ["{oops"] * 20)
    with pytest.raises(DssmError, match="malformed"):
        clean(spark, str(bad), tmp_path / "out")


def test_rules_drop_duplicates_bots_and_empty_queries(spark, tmp_path):
    def imp(i, user, ts, query="drill", clicks=()):
        return json.dumps(
            {
                "v": 1,
                "impression_id": f"i{i}",
                "ts": ts,
                "user_id": user,
                "query": query,
                "results": [{"position": 1, "title": "A Drill"}, {"position": 2, "title": "B Saw"}],
                "clicks": [{"position": p, "dwell_ms": 10} for p in clicks],
            }
        )

    lines = [imp(0, "u1", "2026-01-01T00:00:00Z", clicks=[1])]
    lines.append(lines[0])  # duplicate event
    lines.append(imp(1, "u2", "2026-01-01T00:10:00Z", query="   "))  # empty query
    lines += [imp(10 + k, "bot", f"2026-01-01T01:00:{k:02d}Z", clicks=[1, 2]) for k in range(25)]  # burst
    # 21 impressions in 21 s across a minute boundary (20 + 1 by calendar minute): a bot by the sliding window
    lines += [imp(200 + k, "bot2", f"2026-01-01T03:{(40 + k) // 60:02d}:{(40 + k) % 60:02d}Z") for k in range(21)]
    # 20 in every 60 s, for three minutes: at the limit, not over it
    lines += [imp(300 + k, "busy", f"2026-01-01T04:{k // 20:02d}:{k % 20 * 3:02d}Z") for k in range(60)]
    lines += [imp(100 + k, "u3", f"2026-01-0{1 + k}T02:00:00Z", query="Saw", clicks=[2]) for k in range(3)]
    src = tmp_path / "log.jsonl.gz"
    _write_lines(src, lines)
    m = clean(spark, str(src), tmp_path / "out")
    assert m["counts"]["rejected_by_reason"] == {"bot_user": 25 + 21, "duplicate_event": 1, "empty_query": 1}
    assert m["counts"]["kept"] == 4 + 60
    pairs = {
        (p["query"], p["title"]): (p["clicks"], p["impressions"])
        for p in pq.read_table(tmp_path / "out" / "pairs").to_pylist()
    }
    assert pairs == {("drill", "a drill"): (1, 61), ("saw", "b saw"): (3, 3)}  # busy: 60 shown, none clicked


def test_invalid_utf8_and_out_of_range_lines_are_quarantined_not_fatal(spark, tmp_path, pipeline):
    good = gzip.open(next((pipeline["simulate"] / "logs").glob("part-*")), "rt").read().splitlines()[:50]
    record = json.loads(good[0])
    record["impression_id"] = "huge-position"
    record["results"][0]["position"] = 2**31
    raw = [g.encode() for g in good] + [good[1].encode().replace(b'"query":"', b'"query":"\xe9', 1)]
    raw.append(json.dumps(record).encode())
    src = tmp_path / "logs" / "day1"  # a subdirectory: files below --input are read too
    src.mkdir(parents=True)
    with gzip.open(src / "part-0.jsonl.gz", "wb") as handle:
        handle.write(b"\n".join(raw) + b"\n")
    m = clean(spark, str(tmp_path / "logs"), tmp_path / "out")
    c = m["counts"]
    assert c["lines_read"] == 52 == c["kept"] + c["rejected"]
    assert c["rejected_by_reason"]["invalid_utf8"] == 1 and c["rejected_by_reason"]["bad_value"] == 1
    rejects = pq.read_table(tmp_path / "out" / "rejects").to_pylist()
    assert {r["reason"] for r in rejects} >= {"invalid_utf8", "bad_value"}
    assert any("\\xe9" in (r["raw"] or "") for r in rejects)  # the line is kept, its bad byte escaped


def test_a_local_driver_listens_on_loopback_only(spark):
    assert spark.conf.get("spark.driver.bindAddress") == "127.0.0.1"
    assert spark.conf.get("spark.driver.host") == "127.0.0.1"


def test_a_truncated_gzip_input_is_named_in_the_error(spark, tmp_path, pipeline):
    logs = tmp_path / "logs"
    shutil.copytree(pipeline["simulate"] / "logs", logs)
    victim = sorted(logs.glob("part-*"))[-1]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.raises(DssmError, match=f"{victim.name}: a damaged or truncated file .*; repair it"):
        clean(spark, str(logs), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_truncated_bz2_or_a_damaged_parquet_file_is_named_in_the_error(spark, tmp_path, pipeline):
    """Issue 51, finding 7: both failed with a bare PythonException that named no file."""
    import bz2

    logs = tmp_path / "bz2"
    logs.mkdir()
    for part in sorted((pipeline["simulate"] / "logs").glob("part-*"))[:2]:
        (logs / f"{part.name}.bz2").write_bytes(bz2.compress(gzip.decompress(part.read_bytes())))
    victim = sorted(logs.iterdir())[-1]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.raises(DssmError, match=rf"{re.escape(str(victim))}: a damaged or truncated file \(EOFError: "):
        clean(spark, str(logs), tmp_path / "out-bz2")
    from benchmarks._parquet_twin import twin

    tables = tmp_path / "parquet"
    tables.mkdir()
    rows, _ = twin(iter(gzip.decompress(part.read_bytes()).splitlines()), "impression_rows")
    for name in ("a", "b"):
        pq.write_table(rows, tables / f"{name}.parquet", row_group_size=200, compression="none")
    damaged = bytearray((tables / "b.parquet").read_bytes())
    quarter = len(damaged) // 4
    damaged[quarter : 2 * quarter] = b"\xff" * quarter  # pages in the middle: the footer still reads
    (tables / "b.parquet").write_bytes(bytes(damaged))
    with pytest.raises(DssmError, match=rf"{re.escape(str(tables / 'b.parquet'))}: a damaged or truncated file"):
        clean(spark, str(tables), tmp_path / "out-parquet")
    assert not (tmp_path / "out-bz2").exists() and not (tmp_path / "out-parquet").exists()


def test_v2_logs_with_a_catalogue_clean_to_the_same_rows_as_v1_and_unknown_docs_are_quarantined(spark, tmp_path):
    from core.judgments import DEFAULT_CATALOGUE, read_judgments
    from stages.simulate.config import SimulationConfig
    from stages.simulate.job import simulate

    pairs = read_judgments(DEFAULT_CATALOGUE)
    outputs = {}
    for version in (1, 2):
        sim = tmp_path / f"sim{version}"
        cfg = SimulationConfig(impressions=5_000, shards=1, workers=1, log_format=version)
        simulate(pairs, sim, cfg, {"path": "default", "sha256": "default"})
        outputs[version] = clean(spark, str(sim), tmp_path / f"clean{version}")
    assert (tmp_path / "sim2" / "catalogue.parquet").is_file() and not (
        tmp_path / "sim1" / "catalogue.parquet"
    ).exists()
    v1 = gzip.open(next((tmp_path / "sim1" / "logs").glob("part-*")), "rt").read()
    v2 = gzip.open(next((tmp_path / "sim2" / "logs").glob("part-*")), "rt").read()
    assert '"title"' in v1 and '"title"' not in v2 and len(v2) < 0.7 * len(v1)  # ids instead of titles
    assert outputs[1]["counts"] == outputs[2]["counts"]
    assert outputs[2]["inputs"]["catalogue"]["path"] == str(tmp_path / "sim2" / "catalogue.parquet")
    for dataset in ("pairs", "titles"):
        assert pq.read_table(tmp_path / "clean1" / dataset).equals(pq.read_table(tmp_path / "clean2" / dataset))

    # one input mixing both formats, line by line: v1 lines are counted by title, v2 by title id, and
    # the same (query, title) from both is one pair
    mixed_lines = [a if i % 2 else b for i, (a, b) in enumerate(zip(v1.splitlines(), v2.splitlines(), strict=True))]
    (tmp_path / "both").mkdir()
    (tmp_path / "both" / "log.jsonl").write_text("\n".join(mixed_lines) + "\n")
    catalogue = str(tmp_path / "sim2" / "catalogue.parquet")
    both = clean(spark, str(tmp_path / "both"), tmp_path / "clean-both", CleanConfig(catalogue=catalogue))
    assert both["counts"] == outputs[1]["counts"]
    for dataset in ("pairs", "titles"):
        assert pq.read_table(tmp_path / "clean-both" / dataset).equals(pq.read_table(tmp_path / "clean1" / dataset))

    # a doc id the catalogue lacks: that line is quarantined with its reason, the rest kept, counts reconcile
    record = json.loads(v2.splitlines()[0])
    record["impression_id"], record["results"][0]["doc_id"] = "unknown-doc", "d000000000000"
    logs = tmp_path / "mixed"
    shutil.copytree(tmp_path / "sim2" / "logs", logs)
    (logs / "extra.jsonl").write_text(json.dumps(record) + "\n")
    m = clean(
        spark, str(logs), tmp_path / "clean-mixed", CleanConfig(catalogue=str(tmp_path / "sim2" / "catalogue.parquet"))
    )
    c = m["counts"]
    assert c["rejected_by_reason"]["unknown_doc"] == 1 and c["lines_read"] == c["kept"] + c["rejected"]
    assert c["kept"] == outputs[2]["counts"]["kept"]
    rejects = pq.read_table(tmp_path / "clean-mixed" / "rejects").to_pylist()
    assert [r["detail"] for r in rejects if r["reason"] == "unknown_doc"] == ["doc_id d000000000000"]


@pytest.fixture(scope="module")
def v2_log(default_pairs, tmp_path_factory):
    """A small v2 log and its catalogue side table."""
    from stages.simulate.config import SimulationConfig
    from stages.simulate.job import simulate

    sim = tmp_path_factory.mktemp("v2") / "sim"
    cfg = SimulationConfig(impressions=2_000, shards=1, workers=1, log_format=2)
    simulate(default_pairs, sim, cfg, {"path": "default", "sha256": "default"})
    return sim


def test_a_v2_catalogue_with_repeated_doc_ids_is_refused_naming_them(spark, tmp_path, v2_log):
    """Which title a document with two rows has cannot be told: the catalogue is refused, naming the
    repeated doc ids and their row counts (it used to be read silently, the last row winning)."""
    import pyarrow as pa

    table = pq.read_table(v2_log / "catalogue.parquet")
    again = table.slice(0, 50).set_column(1, "title", pa.array([f"another title {i}" for i in range(50)]))
    bad = tmp_path / "catalogue.parquet"
    pq.write_table(pa.concat_tables([table, again.cast(table.schema)]), bad)
    first = table.column("doc_id")[0].as_py()
    message = rf"{re.escape(str(bad))}: 50 doc ids have more than one row: {first} \(2 rows\).* and 40 more"
    with pytest.raises(DssmError, match=message):
        clean(spark, str(v2_log), tmp_path / "out", CleanConfig(catalogue=str(bad)))
    assert not (tmp_path / "out").exists()


def test_a_v2_catalogue_with_a_null_title_is_refused_naming_the_file(spark, tmp_path, v2_log):
    """A null title used to fail with a bare AttributeError naming no file."""
    import pyarrow as pa

    table = pq.read_table(v2_log / "catalogue.parquet")
    titles = table.column("title").to_pylist()
    titles[3] = None
    bad = tmp_path / "catalogue.parquet"
    pq.write_table(table.set_column(1, pa.field("title", pa.string()), pa.array(titles)), bad)
    doc = table.column("doc_id")[3].as_py()
    message = rf"{re.escape(str(bad))}: 1 of {table.num_rows} rows have a null title: row 3 \(doc id {doc}\)"
    with pytest.raises(DssmError, match=message):
        clean(spark, str(v2_log), tmp_path / "out", CleanConfig(catalogue=str(bad)))
    assert not (tmp_path / "out").exists()


def test_impressions_keep_every_kept_line_in_rank_order_and_add_up_to_the_title_counts(pipeline):
    impressions = pq.read_table(pipeline["clean"] / "impressions")
    counts = read_manifest(pipeline["clean"])["counts"]
    assert impressions.num_rows == counts["kept"] and read_manifest(pipeline["clean"])["outputs"]["impressions"]
    rows = impressions.to_pylist()
    assert len({r["impression_id"] for r in rows}) == len(rows)  # duplicates were dropped
    assert all(r["positions"] == sorted(r["positions"]) for r in rows)
    assert all(len(r["titles"]) == len(r["positions"]) == len(r["clicked"]) == len(r["dwell_ms"]) for r in rows)
    assert all((d > 0) == c for r in rows for c, d in zip(r["clicked"], r["dwell_ms"], strict=True))
    titles = pq.read_table(pipeline["clean"] / "titles")
    assert sum(len(r["titles"]) for r in rows) == sum(titles.column("impressions").to_pylist())
    assert sum(sum(r["clicked"]) for r in rows) == sum(titles.column("clicks").to_pylist())


def _bad_records(record: dict) -> list[dict]:
    """A well-formed v2 record broken in the ways a Parquet row can be (docs/raw-log-format.md)."""
    import copy

    def broken(name: str, **changes) -> dict:
        r = copy.deepcopy(record) | {"impression_id": f"bad-{name}"} | changes
        return {k: v for k, v in r.items() if v != "<absent>"}

    shown = record["results"]
    first = shown[0]
    return [
        broken("no-ts", ts=None),  # missing_field
        broken("no-query", query="<absent>"),  # missing_field
        broken("ts", ts="yesterday"),  # bad_value (text timestamps only)
        broken("local-ts", ts="2026-01-01T00:00:05"),  # kept: local time, as in JSON
        broken("v3", v=3),  # unsupported_version (impression rows only)
        broken("pos0", results=[first | {"position": 0}], clicks=[]),  # bad_value
        broken("big", results=[first | {"position": 2**31}], clicks=[]),  # bad_value
        broken("twice", results=[first, first], clicks=[]),  # bad_value: a repeated position
        broken("unshown", clicks=[{"position": 99}]),  # bad_value (impression rows only)
        broken("dwell", clicks=[{"position": first["position"], "dwell_ms": -5}]),  # bad_value
        broken("no-pos", results=[{"doc_id": first["doc_id"]}], clicks=[]),  # wrong_type
        broken("none", results=[]),  # bad_value (impression rows only)
        broken("doc", results=[first | {"doc_id": "d000000000000"}], clicks=[]),  # unknown_doc
    ]


def _outputs(path) -> dict:
    """What a clean output holds, source files and `raw` left out (their bytes differ by format)."""
    impressions = sorted(pq.read_table(path / "impressions").to_pylist(), key=lambda r: r["impression_id"])
    rejects = pq.read_table(path / "rejects").to_pylist()
    return {
        "pairs": pq.read_table(path / "pairs"),
        "titles": pq.read_table(path / "titles"),
        "impressions": impressions,
        "rejects": sorted((r["reason"], r["detail"] or "", r["impression_id"] or "") for r in rejects),
        "counts": {k: v for k, v in read_manifest(path)["counts"].items() if k != "rows_read"},
    }


def test_a_parquet_table_in_either_shape_cleans_to_the_rows_of_its_json_twin(spark, tmp_path, v2_log):
    """The same log as JSON lines and as a Parquet table (impression rows read through `dssm run`'s
    config with renamed columns; result rows under dt= partitions, by a file:// URI) gives the same pairs, titles,
    impressions and rejects; a bad row gets the reason a JSON line gets, `raw` holds the row."""
    import pyarrow as pa

    from benchmarks._parquet_twin import twin
    from core.layout import Layout
    from core.stage import RunContext
    from flows.config import load_run_config
    from stages.clean.stage import run as clean_stage

    lines = gzip.open(next((v2_log / "logs").glob("part-*")), "rb").read().splitlines()
    first = json.loads(lines[0])
    lines += [json.dumps(r).encode() for r in _bad_records(first)]
    catalogue = str(v2_log / "catalogue.parquet")
    cfg = CleanConfig(catalogue=catalogue)

    def json_clean(name, kept):
        (tmp_path / name).mkdir()
        (tmp_path / name / "log.jsonl").write_bytes(b"\n".join(kept) + b"\n")
        clean(spark, str(tmp_path / name), tmp_path / f"clean-{name}", cfg)
        return _outputs(tmp_path / f"clean-{name}")

    # impression rows, text timestamps, columns renamed (a nested field too), read as the flow reads --logs
    table, kept = twin(iter(lines), "impression_rows", ts="string")
    assert 0 < len(lines) - len(kept) < 20  # the simulator's malformed JSON: no table holds it
    results = table.column("results").combine_chunks()
    entries = results.values
    renamed = pa.StructArray.from_arrays(
        [entries.field("position"), entries.field("doc_id"), entries.field("title")],
        names=["position", "product_id", "title"],
    )
    table = table.rename_columns(["v", "impression_id", "event_time", "user_id", "search_terms", "shown", "clicks"])
    table = table.set_column(5, "shown", pa.ListArray.from_arrays(results.offsets, renamed))
    (tmp_path / "rows").mkdir()
    pq.write_table(table.slice(0, 1000), tmp_path / "rows" / "a.parquet")
    pq.write_table(table.slice(1000), tmp_path / "rows" / "b.parquet")
    run = load_run_config(
        overrides=[
            f"workdir={tmp_path / 'run'}",
            f"logs={tmp_path / 'rows'}",
            f"clean.catalogue={catalogue}",
            "clean.columns={ts: event_time, query: search_terms, results: shown, results.doc_id: product_id}",
        ]
    )
    stage = clean_stage(RunContext(run, Layout(tmp_path / "run"), None, "", None, [], 1), run.clean, None)
    parquet = _outputs(Path(stage.path))
    reference = json_clean("json-rows", kept)
    assert parquet == reference
    reasons = reference["counts"]["rejected_by_reason"]
    assert {"missing_field", "bad_value", "wrong_type", "unsupported_version", "unknown_doc"} <= set(reasons)
    raw = [json.loads(r["raw"]) for r in pq.read_table(Path(stage.path) / "rejects").to_pylist() if r["raw"]]
    (v3,) = [r for r in raw if r["impression_id"] == "bad-v3"]
    assert v3["v"] == 3 and v3["search_terms"] == first["query"] and v3["shown"][0]["product_id"]
    assert read_manifest(Path(stage.path))["input"] == {"format": "parquet", "shape": "impression_rows"}

    # result rows, timestamps typed, in dt= partitions; one impression whose rows disagree on the query
    table, kept = twin(iter(lines), "result_rows")
    ids = table.column("impression_id").to_pylist()
    cut = ids.index(ids[len(ids) // 2])
    for day, part in (("2026-01-01", table.slice(0, cut)), ("2026-01-02", table.slice(cut))):
        (tmp_path / "results" / f"dt={day}").mkdir(parents=True)
        pq.write_table(part, tmp_path / "results" / f"dt={day}" / "part-0.parquet")
    # as a file:// URI, which is how a windowed run hands each day's partition over
    m = clean(spark, (tmp_path / "results").as_uri(), tmp_path / "clean-results", cfg)
    assert m["counts"]["rows_read"] == table.num_rows and m["input"]["shape"] == "result_rows"
    assert _outputs(tmp_path / "clean-results") == json_clean("json-results", kept)

    # a directory of both formats is refused, naming one file of each
    shutil.copy(tmp_path / "json-rows" / "log.jsonl", tmp_path / "rows")
    with pytest.raises(
        DssmError, match=r"mixes Parquet and other files: 2 Parquet .* and 1 others \(e.g. .*log.jsonl\)"
    ):
        clean(spark, str(tmp_path / "rows"), tmp_path / "clean-mixed", cfg)


def _everything(path: Path) -> dict:
    """A clean output in full: every dataset's rows (impressions in id order: their files follow the
    input's split) and the counts."""
    out = {d: pq.read_table(path / d) for d in ("pairs", "titles", "rejects")}
    out["impressions"] = pq.read_table(path / "impressions").sort_by("impression_id")
    return out | {"counts": read_manifest(path)["counts"], "input": read_manifest(path)["input"]}


def test_file_tasks_read_what_sparks_readers_read(spark, tmp_path, v2_log):
    """Local files are parsed by one Python task per file (stages/clean/filetasks.py), not through the JVM:
    the same rows, rejects (their source and raw line included) and counts as Spark's readers give,
    for JSON lines split by \\n, \\r\\n and \\r, a byte-order mark, blank and malformed lines, gzip and
    bz2, and a Parquet table whose files differ in their columns."""
    import bz2

    from benchmarks._parquet_twin import twin

    lines = gzip.open(next((v2_log / "logs").glob("part-*")), "rb").read().splitlines()
    bad = [json.dumps(r).encode() for r in _bad_records(json.loads(lines[0]))]
    logs = tmp_path / "logs"
    logs.mkdir()
    # Spark packs larger files first; the larger file is first by name too, so both read it first
    (logs / "a.jsonl").write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(lines[:1500] + [lines[3], b"", b"{oops"] + bad))
    (logs / "b.jsonl.bz2").write_bytes(bz2.compress(b"\r".join(lines[1500:1600]) + b"\n\n" + lines[1600] + b"\n"))
    with gzip.open(logs / "c.jsonl.gz", "wb") as handle:
        handle.write(b"\n".join(lines[1601:]))  # no final newline
    cfg = CleanConfig(catalogue=str(v2_log / "catalogue.parquet"))
    tasks = clean(spark, str(logs), tmp_path / "tasks", cfg)
    spark_read = clean(spark, str(logs), tmp_path / "spark", CleanConfig(**{**cfg.__dict__, "reader": "spark"}))
    assert tasks["counts"] == spark_read["counts"] and tasks["counts"]["lines_read"] == len(lines) + len(bad) + 4
    assert _everything(tmp_path / "tasks") == _everything(tmp_path / "spark")
    assert {"invalid_json", "empty_line", "duplicate_event"} <= set(tasks["counts"]["rejected_by_reason"])

    table, _ = twin(iter(lines + bad), "impression_rows")
    (tmp_path / "table").mkdir()
    pq.write_table(table.slice(0, 1200), tmp_path / "table" / "a.parquet")
    pq.write_table(table.slice(1200).drop_columns(["v"]), tmp_path / "table" / "b.parquet")
    tasks = clean(spark, str(tmp_path / "table"), tmp_path / "tasks-table", cfg)
    spark_read = clean(
        spark, str(tmp_path / "table"), tmp_path / "spark-table", CleanConfig(**{**cfg.__dict__, "reader": "spark"})
    )
    assert _everything(tmp_path / "tasks-table") == _everything(tmp_path / "spark-table")
    # a v column in one file only: the other file's rows take the table's version, as the rows of a table
    # without v do (issue 51: they were all rejected, missing_field: v); only the records without ts or query
    # are missing a field
    assert tasks["counts"]["rejected_by_reason"]["missing_field"] == 2
    assert tasks["input"] == {"format": "parquet", "shape": "impression_rows"}


def test_a_uri_input_is_fingerprinted_so_an_unchanged_rerun_is_a_no_op(spark, tmp_path, v2_log):
    """A `file://` (or `hdfs://`, `s3a://`) input is fingerprinted through Hadoop's FileSystem, as a
    windowed run's days are: a rerun over the same files is skipped, a rewritten file is cleaned
    again (it used to be cleaned on every run)."""
    shutil.copytree(v2_log, tmp_path / "sim")
    uri = (tmp_path / "sim").as_uri()  # a `dssm simulate` output: its logs/ are read
    cfg = CleanConfig(catalogue=str(v2_log / "catalogue.parquet"))
    first = clean(spark, uri, tmp_path / "out", cfg)
    assert first["inputs"]["raw"]["path"] == f"{uri}/logs" and first["inputs"]["raw"]["sha256"]
    assert clean(spark, uri, tmp_path / "out", cfg) == first | {"skipped": True}
    part = next((tmp_path / "sim" / "logs").glob("part-*"))
    part.write_bytes(part.read_bytes() + gzip.compress(b"{}\n"))  # one more (malformed) line
    again = clean(spark, uri, tmp_path / "out", cfg)
    assert not again["skipped"]
    assert again["counts"]["lines_read"] == first["counts"]["lines_read"] + 1, (again["counts"], first["counts"])
    with pytest.raises(DssmError, match="raw log input not found"):
        clean(spark, (tmp_path / "nowhere").as_uri(), tmp_path / "out", cfg)


def test_small_files_share_parse_tasks_and_clean_to_the_rows_of_one_file(spark, pipeline, tmp_path):
    """Issue 51: a thousand small files were a thousand tasks and impressions/ files (853 s). Now a run of
    them shares a task: 300 ten-line files clean to the rows of the same lines in one file, into one
    impressions/ file."""
    from stages.clean.filetasks import file_groups

    assert file_groups([10] * 300, task_bytes=750) == [list(range(i, i + 75)) for i in range(0, 300, 75)]
    assert file_groups([100, 5, 5, 100], task_bytes=50) == [[0], [1, 2], [3]]  # a large file alone
    lines = gzip.open(next((pipeline["simulate"] / "logs").glob("part-*")), "rb").read().splitlines()[:3_000]
    one, many = tmp_path / "one", tmp_path / "many"
    one.mkdir()
    many.mkdir()
    (one / "all.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    for i in range(300):
        (many / f"part-{i:04d}.jsonl").write_bytes(b"\n".join(lines[i * 10 : i * 10 + 10]) + b"\n")
    whole = clean(spark, str(one), tmp_path / "clean-one")
    split = clean(spark, str(many), tmp_path / "clean-many")
    assert split["counts"] == whole["counts"]
    for dataset in ("pairs", "titles"):
        assert pq.read_table(tmp_path / "clean-many" / dataset).equals(pq.read_table(tmp_path / "clean-one" / dataset))
    assert len(list((tmp_path / "clean-many" / "impressions").glob("*.parquet"))) == 1  # 300 files, one task
