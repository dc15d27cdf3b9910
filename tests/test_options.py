"""Command options generated from the config dataclasses (core/options.py): one commented field is
one flag, with its help, type, choices and default, read back into the same config as YAML keys and
KEY=VALUE overrides are."""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from dataclasses import dataclass, field
from typing import Literal

import pydantic
import pytest

from core.config import apply, parse_overrides
from core.errors import DssmError
from core.options import add_config_options, config_from_options, field_help
from dssm.cli import build_parser, main
from stages.clean.config import CleanConfig
from stages.index.config import KINDS, IndexConfig
from stages.negatives.config import LIST_TARGETS, NegativesConfig
from stages.paraphrase.config import ParaphraseConfig
from stages.propensity.config import PropensityConfig
from stages.simulate.config import PROMOTED_BRANDS, ClickModel, DirtRates, SimulationConfig
from stages.vocab.config import VocabConfig

# command: (its config dataclass, the sections whose fields have no prefix, the options it requires)
CONVERTED: dict[str, tuple[type, set[str], list[str]]] = {
    "simulate": (SimulationConfig, {"model"}, ["--out", "o"]),
    "clean": (CleanConfig, set(), ["--input", "raw", "--out", "o"]),
    "propensity": (PropensityConfig, set(), ["--clean", "c", "--out", "o"]),
    "paraphrase": (ParaphraseConfig, set(), ["--input", "pairs.tsv", "--out", "o"]),
    "vocab": (VocabConfig, set(), ["--clean", "c", "--out", "o"]),
    "negatives": (NegativesConfig, set(), ["--clean", "c", "--out", "o"]),
    "index": (IndexConfig, set(), ["--model", "models:/m@champion", "--titles", "t", "--out", "o"]),
}

# Keys of a section that its command takes otherwise: the flow's index.catalogue is `dssm index --titles`.
NOT_FLAGS = {"index": {"catalogue"}}

# Every flag these commands had when their options were written by hand: none may go away.
HAND_WRITTEN = {
    "simulate": "--out --force --judgments --query-col --title-col --label-col --encoding --impressions --seed "
    "--shards --workers --no-gzip --log-format --eta --ranker-noise --ranker-bias --promotion --promoted-brands --day",
    "clean": "--input --out --catalogue --master --force --bot-max-per-minute --bot-min-impressions "
    "--bot-min-click-rate --no-impressions --max-malformed-rate",
    "propensity": "--clean --out --max-rank --min-shown --iterations --tolerance --master --force",
    "paraphrase": "--input --out --format --min-score --master --force",
    "vocab": "--clean --out --min-count --max-size --word-min-count --word-max-size --master --force",
    "negatives": "--clean --out -n --seed --valid-fraction --shards --skip-above --debias --propensity "
    "--min-propensity --list-size --list-targets --prior-clicks --prior-skips --master --force",
    "index": "--model --titles --out --mlflow-uri --kind --hnsw-m --ef-construction --ef-search --no-register "
    "--master --force",
}


def leaf_keys(cls: type, prefix: str = "") -> list[str]:
    """Every field of `cls` as a dotted key, nested sections' fields included."""
    keys = []
    for f in dataclasses.fields(cls):
        value = getattr(cls(), f.name)
        if dataclasses.is_dataclass(value):
            keys += leaf_keys(type(value), f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def expected_flag(key: str, flatten: set[str]) -> str:
    """`--section.field-name`; a flattened section's fields without it; a one-letter field `-n`."""
    *sections, name = key.split(".")
    shown = [part for i, part in enumerate(sections) if ".".join(sections[: i + 1]) not in flatten]
    name = name.replace("_", "-")
    return f"-{name}" if not shown and len(name) == 1 else "--" + ".".join([*shown, name])


def help_text(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        build_parser([command]).parse_args([command, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def has_flag(text: str, flag: str) -> bool:
    return re.search(rf"(?<![\w.-]){re.escape(flag)}(?![\w.-])", text) is not None


def parse(command: str, *flags: str) -> argparse.Namespace:
    required = CONVERTED[command][2]
    return build_parser([command]).parse_args([command, *required, *flags])


@pytest.mark.parametrize("command", sorted(CONVERTED))
def test_every_config_field_is_a_flag_and_every_old_flag_remains(command, capsys):
    cls, flatten, _ = CONVERTED[command]
    text = help_text(command, capsys)
    keys = [key for key in leaf_keys(cls) if key not in NOT_FLAGS.get(command, set())]
    missing = [key for key in keys if not has_flag(text, expected_flag(key, flatten))]
    assert not missing, f"dssm {command} --help lacks a flag for {missing}"
    removed = [flag for flag in HAND_WRITTEN[command].split() if not has_flag(text, flag)]
    assert not removed, f"dssm {command} lost {removed}"


@pytest.mark.parametrize("command", sorted(CONVERTED))
def test_no_flag_given_is_the_default_config(command):
    cls = CONVERTED[command][0]
    assert config_from_options(cls, parse(command)) == cls()


@pytest.mark.parametrize(
    ("command", "flags", "values"),
    [
        (
            "simulate",
            ["--impressions", "10_000_000", "--no-gzip", "--log-format", "2", "--eta", "0.5"]
            + ["--promoted-brands", "weakest", "--dirt.bot-burst", "10,20", "--day", "2026-02-03"],
            {"impressions": "10_000_000", "gzip": "false", "log_format": "2", "day": "2026-02-03"}
            | {"model": {"eta": "0.5", "promoted_brands": "weakest"}, "dirt": {"bot_burst": "10,20"}},
        ),
        (
            "clean",
            ["--no-impressions", "--bot-min-click-rate", "0.5"],
            {"impressions": "no", "bot_min_click_rate": ".5"},
        ),
        ("propensity", ["--max-rank", "5", "--tolerance", "1e-5"], {"max_rank": "5", "tolerance": "0.00001"}),
        ("paraphrase", ["--format", "stsb", "--min-score", "4"], {"format": "stsb", "min_score": "4"}),
        ("vocab", ["--max-size", "1_000", "--word-min-count", "3"], {"max_size": "1000", "word_min_count": "3"}),
        (
            "negatives",
            ["-n", "0", "--debias", "--list-size", "5", "--list-targets", "map", "--skip-above", "0.5"],
            {"n": "0", "debias": "true", "list_size": "5", "list_targets": "map", "skip_above": "0.5"},
        ),
        (
            "index",
            ["--kind", "hnsw", "--hnsw-m", "16", "--flat-max", "10"],
            {"kind": "hnsw", "hnsw_m": 16, "flat_max": 10},
        ),
    ],
)
def test_flags_give_the_config_that_the_same_keys_give(command, flags, values):
    cls = CONVERTED[command][0]
    from_flags = config_from_options(cls, parse(command, *flags))
    assert from_flags == apply(cls(), values)
    assert from_flags != cls()


def test_simulate_flags_keep_their_old_meaning():
    cfg = config_from_options(SimulationConfig, parse("simulate", "--impressions", "10_000_000", "--no-gzip"))
    assert (cfg.impressions, cfg.gzip, cfg.model) == (10_000_000, False, ClickModel())
    assert config_from_options(SimulationConfig, parse("simulate", "--ranker-noise", "0.1")).model.ranker_noise == 0.1
    assert config_from_options(SimulationConfig, parse("simulate")).gzip is True
    assert config_from_options(NegativesConfig, parse("negatives", "--debias")).debias is True
    assert config_from_options(CleanConfig, parse("clean", "--no-impressions")).impressions is False
    args = parse("negatives", "-n", "2", "--propensity", "p")
    assert (
        config_from_options(NegativesConfig, args).n == 2 and str(args.propensity) == "p"
    )  # not a field: hand-written


def test_a_field_comment_is_its_flag_help(capsys):
    helps = field_help(NegativesConfig)
    assert helps["n"].startswith("negatives per pair")
    text = " ".join(help_text("negatives", capsys).split())
    assert f"-n N {helps['n']} (default: 4)" in text
    assert f"{helps['debias']} (default: off)" in text
    # a comment block above a field, lines joined
    assert field_help(ClickModel)["ranker_bias"].startswith("std of the ranker's persistent error per (query, title):")
    assert "the same mistakes on every impression, so clicks" in field_help(ClickModel)["ranker_bias"]
    for cls in [*(c for c, _, _ in CONVERTED.values()), ClickModel, DirtRates]:
        fields = [f.name for f in dataclasses.fields(cls) if not dataclasses.is_dataclass(getattr(cls(), f.name))]
        undocumented = [name for name in fields if not field_help(cls).get(name)]
        assert not undocumented, f"{cls.__name__}: no comment (no --help) on {undocumented}"


@dataclass(frozen=True)
class Layer:
    hidden: list[int] = field(default_factory=lambda: [128])  # units per hidden layer
    act: Literal["relu", "tanh"] = "relu"  # activation


@dataclass(frozen=True)
class Small:
    # how many
    # things to make
    count: int = 1
    pair: tuple[int, int] = (1, 2)
    tags: list[str] = field(default_factory=list)  # free labels
    verbose: bool = False  # say more
    model: Layer = field(default_factory=Layer)


def test_help_comes_from_inline_comments_and_comment_blocks_above():
    assert field_help(Small) == {
        "count": "how many things to make",
        "pair": "",
        "tags": "free labels",
        "verbose": "say more",
        "model": "",
    }
    p = argparse.ArgumentParser()
    add_config_options(p, Small)
    text = " ".join(p.format_help().split())
    assert "--count COUNT how many things to make (default: 1)" in text
    assert "--verbose, --no-verbose say more (default: off)" in text
    assert "--model.act {relu,tanh} activation (default: relu)" in text
    assert "--model.hidden HIDDEN units per hidden layer (default: 128)" in text


@pytest.mark.parametrize(
    ("argv", "allowed"),
    [
        (["negatives", "--clean", "c", "--out", "o", "--list-targets", "ranked"], "ratio, map"),
        (["simulate", "--out", "o", "--log-format", "3"], "1, 2"),
        (["simulate", "--out", "o", "--promoted-brands", "strongest"], "hashed, weakest"),
        (["index", "--model", "m", "--titles", "t", "--out", "o", "--kind", "ivf"], "auto, flat, hnsw"),
        (["paraphrase", "--input", "i", "--out", "o", "--format", "csv"], "pairs, sts, stsb, sick"),
    ],
)
def test_a_literal_field_rejects_other_values_in_one_line(argv, allowed, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith(f"dssm {argv[0]}: error: argument")
    assert f"is not one of {allowed}" in errors[0] and "Traceback" not in errors[0]


def test_a_literal_field_rejects_other_values_from_yaml_and_overrides():
    with pytest.raises(DssmError, match="config list_targets: 'ranked' is not one of ratio, map"):
        apply(NegativesConfig(), {"list_targets": "ranked"})
    with pytest.raises(DssmError, match="config model.promoted_brands: 'strongest' is not one of hashed, weakest"):
        apply(SimulationConfig(), parse_overrides(["model.promoted_brands=strongest"]))
    with pytest.raises(DssmError, match="config log_format: 3 is not one of 1, 2"):
        apply(SimulationConfig(), {"log_format": 3})  # YAML gives an int
    assert apply(SimulationConfig(), {"log_format": 2}).log_format == 2
    assert apply(IndexConfig(), parse_overrides(["kind=flat"])).kind == "flat"


def test_the_old_constants_are_the_literals_values():
    from core.sentence_pairs import FORMATS
    from stages.clean.rawlog import FORMAT_VERSIONS

    def choices(cls: type, name: str) -> tuple:
        return typing.get_args(typing.get_type_hints(cls)[name])

    assert choices(NegativesConfig, "list_targets") == LIST_TARGETS == ("ratio", "map")
    assert choices(IndexConfig, "kind") == KINDS == ("auto", "flat", "hnsw")
    assert choices(ClickModel, "promoted_brands") == PROMOTED_BRANDS == ("hashed", "weakest")
    assert choices(SimulationConfig, "log_format") == FORMAT_VERSIONS
    assert choices(ParaphraseConfig, "format") == FORMATS


@pytest.mark.parametrize("cls", [SimulationConfig, CleanConfig, NegativesConfig, IndexConfig, ParaphraseConfig])
def test_configs_stay_pydantic_types(cls):
    """Prefect builds the retrain flow's parameter form from them (flows/config.py's RunConfig)."""
    schema = pydantic.TypeAdapter(cls).json_schema()
    assert schema["title"] == cls.__name__
    assert pydantic.TypeAdapter(cls).validate_python(dataclasses.asdict(cls())) == cls()


def test_yaml_lists_on_the_command_line():
    overrides = ["model.hidden=[300, 200]", "tags=[a, 'b c']", "pair=[3, 4]", "model.act=tanh"]
    cfg = apply(Small(), parse_overrides(overrides))
    assert cfg.model.hidden == [300, 200] and cfg.tags == ["a", "b c"] and cfg.pair == (3, 4)
    assert cfg.model.act == "tanh"
    assert apply(Small(), parse_overrides(["model.hidden=300,200", "tags=a,b"])) == apply(
        Small(), {"model": {"hidden": [300, 200]}, "tags": ["a", "b"]}
    )
    assert apply(Small(), parse_overrides(["model.hidden=[]"])).model.hidden == []
    with pytest.raises(DssmError, match="model.hidden"):
        apply(Small(), parse_overrides(["model.hidden=[300, x]"]))
    p = argparse.ArgumentParser()
    add_config_options(p, Small)
    args = p.parse_args(["--model.hidden", "[300, 200]", "--pair", "5,6"])
    assert config_from_options(Small, args) == Small(pair=(5, 6), model=Layer(hidden=[300, 200]))


def test_the_docs_key_tables_are_generated_from_the_fields():
    """The key tables of docs/flows.md, training.md, analysis.md and retrieval.md are what `python -m core.options`
    writes."""
    from pathlib import Path

    from core.options import render_docs

    docs = Path(__file__).resolve().parents[1] / "docs"
    for page in ("flows.md", "training.md", "analysis.md", "retrieval.md"):
        text = (docs / page).read_text()
        assert "<!-- keys: " in text
        assert render_docs(text) == text, f"docs/{page} is stale: run python -m core.options docs/{page}"
