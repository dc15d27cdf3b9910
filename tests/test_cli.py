"""The `dssm` command as a user runs it: help text, one-line errors, non-zero exits."""

import subprocess
import sys

import pytest

from dssm.cli import build_parser, main


def test_every_subcommand_has_help(capsys):
    parser = build_parser()
    commands = ["simulate", "clean", "propensity", "paraphrase", "vocab", "negatives", "train", "evaluate", "sts"]
    commands += ["index", "search", "analyze", "run"]
    commands += ["schedule", "stack"]
    for command in commands:
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args([command, "--help"])
        assert exit_.value.code == 0
        shown = capsys.readouterr().out
        assert "usage: dssm " + command in shown
        # the eighth probe of issue 63 (low): index's help named mlflow's spark_udf, which unpickles; it never ran it
        assert "spark_udf" not in shown


def test_simulate_help_lists_the_judged_set_options(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--help"])
    out = capsys.readouterr().out
    for option in ["--query-col", "--title-col", "--label-col", "--encoding", "--impressions"]:
        assert option in out
    # generated from SimulationConfig's fields: the click model's without a prefix, the dirt's with one
    generated = ["--no-gzip", "--log-format {1,2}", "--eta", "--promoted-brands {hashed,weakest}", "--dirt.malformed"]
    for option in generated:
        assert option in out


def test_user_errors_are_one_line_with_status_2(spark, tmp_path, capsys):
    (tmp_path / "j.csv").write_text("a,b\n1,2\n")
    assert main(["simulate", "--judgments", str(tmp_path / "j.csv"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "missing column(s) search_term, product_title, relevance" in err
    assert main(["vocab", "--clean", str(tmp_path / "missing"), "--out", str(tmp_path / "v")]) == 2
    assert "run `dssm clean` first" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,said",
    [
        (["analyze", "--model", "m.pt", "--out", "a", "--topic-cells", "0"], "--topic-cells must be at least 1, got 0"),
        (["analyze", "--model", "m.pt", "--out", "a", "--top", "0"], "--top must be at least 1, got 0"),
        (["search", "drill", "-k", "0"], "-k must be at least 1, got 0"),
        (["sts", "--out", "s", "--baselines", "minilm,bm25"], "unknown STS baseline(s) bm25; choose minilm"),
    ],
    ids=["analyze-topic-cells", "analyze-top", "search-k", "sts-baselines"],
)
def test_settings_flags_refuse_bad_values_before_anything_loads(tmp_path, monkeypatch, capsys, argv, said):
    """The settings flags come from each command's settings dataclass; a bad value is one line, status 2,
    before a model, an index or a data set is read (none of those named here exists)."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dssm {argv[0]}: error: {said}"
    assert list(tmp_path.iterdir()) == []


def test_stack_up_flags_are_its_config_fields():
    from pathlib import Path

    from infra.stack import StackConfig, config_from_args

    argv = ["stack", "up", "--dir", "s", "--prefect-port", "4300", "--worker-cores", "1"]
    argv += ["--database", "postgresql://x/d"]
    cfg = config_from_args(build_parser(argv).parse_args(argv))
    assert cfg == StackConfig(root=Path("s"), prefect_port=4300, worker_cores=1, database="postgresql://x/d")


@pytest.mark.integration  # more than one process
def test_clean_on_garbage_exits_non_zero_with_one_line(tmp_path):
    bad = tmp_path / "garbage.jsonl"
    bad.write_text("this is not a log\n" * 5)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dssm.cli",
            "clean",
            "--input",
            str(bad),
            "--out",
            str(tmp_path / "o"),
            "--master",
            "local[1]",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("dssm clean: error")]
    assert errors == [errors[0]] and "no usable impression" in errors[0] and "invalid_json 5" in errors[0]
    assert "Traceback" not in proc.stderr and "at org.apache" not in proc.stderr
    assert not (tmp_path / "o").exists()
