"""The retrain flow's one run config: defaults < YAML < flags < KEY=VALUE, typed, unknown keys refused,
editable as the flow's parameter; and the encoder registry as the single list of encoders."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.errors import DssmError
from dssm.cli import build_parser
from flows.config import RunConfig, config_from_args, load_run_config

ROOT = Path(__file__).resolve().parents[1]


def run_args(*argv: str):
    return build_parser(["run", *argv]).parse_args(["run", *argv])


def test_defaults_then_yaml_then_flags_then_key_value(tmp_path):
    yaml = tmp_path / "run.yaml"
    yaml.write_text("negatives:\n  seed: 5\n  n: 2\ntrain:\n  epochs: 3\nsimulate:\n  impressions: 1000\n")
    cfg = config_from_args(run_args("--config", str(yaml), "-n", "6", "negatives.seed=7", "train.models=lstm,rnn"))
    assert cfg.negatives.seed == 7  # KEY=VALUE beats the file
    assert cfg.negatives.n == 6  # a flag given beats the file
    assert cfg.train.epochs == 3 and cfg.simulate.impressions == 1000  # the file beats the defaults
    assert cfg.train.models == ["lstm", "rnn"] and cfg.negatives.valid_fraction == 0.1  # untouched: defaults
    # a flag not given leaves the file's value alone
    assert config_from_args(run_args("--config", str(yaml))).negatives.n == 2


def test_every_stage_option_is_a_key(tmp_path):
    cfg = load_run_config(
        overrides=[
            "negatives.valid_fraction=0.2",
            "negatives.shards=4",
            "clean.bot_max_per_minute=30",
            "vocab.min_count=3",
            "simulate.model.eta=1.5",
            "judgments.spec.encoding=utf-8",
            "train.epochs=2",
            "train.optim.lr=0.05",
            "train.model.hidden=[200, 100]",
            "evaluate.baselines=bm25,ulm",
            "skip=[analyze,index]",
        ]
    )
    assert (cfg.negatives.valid_fraction, cfg.negatives.shards, cfg.clean.bot_max_per_minute) == (0.2, 4, 30)
    assert cfg.vocab.min_count == 3 and cfg.simulate.model.eta == 1.5 and cfg.judgments.spec.encoding == "utf-8"
    assert (cfg.train.epochs, cfg.train.optim.lr, cfg.train.model.hidden) == (2, 0.05, [200, 100])  # YAML lists
    assert cfg.evaluate.baselines == ["bm25", "ulm"]
    assert cfg.skip == ["analyze", "index"]


@pytest.mark.parametrize(
    "override,names",
    [("analyze=false", "skip=[analyze]"), ("index_champion=false", "skip=[index]"), ("skip=[train]", "mine, teacher")],
)
def test_a_retired_switch_fails_naming_skip(override, names):
    """`analyze` and `index_champion` switched a stage off before `skip` did it for every optional stage."""
    from core.errors import DssmError
    from flows.config import load_run_config

    with pytest.raises(DssmError, match=re.escape(names)):
        load_run_config(None, [override])


def test_the_no_stage_flags_name_the_stage_in_skip():
    import argparse

    from flows.config import add_run_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    cfg = config_from_args(parser.parse_args(["--no-index", "skip=[mine]", "--no-analyze"]))
    assert cfg.skip == ["mine", "index", "analyze"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["negatives.sede=7"], "unknown key negatives.sede"),
        (["negatives.seed=seven"], "cannot read 'seven' as int"),
        (["train.optim.lrr=1"], "unknown key train.optim.lrr"),
        (["train.overrides=epochs=2"], "unknown key train.overrides"),
        (["train.optim.name=sgd"], "train.optim.name: 'sgd' is not one of auto, nesterov, adam, adamw"),
        (["train.mlflow_uri=sqlite:///x.db"], "unknown key train.mlflow_uri"),  # the flow fills in a run's plumbing
        (["train.models=lstm,transformer"], "unknown encoder"),
        (["train.per_encoder.minilm=[data.vocab=/v]"], "unknown key train.per_encoder.minilm.data.vocab"),
        (["train.per_encoder.bert=[epochs=2]"], "unknown encoder.s. bert"),
        (["train.per_encoder.minilm=[optim.name=nesterov]"], "would wreck the pretrained weights"),
        (["evaluate.baselines=bm25,google"], "unknown baseline"),
        (["gate.trend_nights=-1"], "trend_nights >= 0"),
        (["judge.keep_nights=-1"], "keep_nights >= 0"),
        (["evaluate.gate_metric=ndcg@10"], "evaluate.gate_metric is now gate.metric"),
        (["gate.metric=ndcg@3"], "gate.metric: .ndcg@3. is not one of"),
        (["negatives=3"], "expected a section"),
        (["index.kind=ivf"], "index.kind: .ivf. is not one of auto, flat, hnsw"),
        (["index.catalogue=/no/such/titles.parquet"], "index.catalogue /no/such/titles.parquet: not found"),
        (["catalogue=/titles.parquet"], "catalogue is now index.catalogue"),  # the stage's own key, since issue 75
        (["window_days=2", "run_date=yesterday"], "run_date must be a date YYYY-MM-DD, got 'yesterday'"),
        (["window_days=-1"], "window_days must be >= 0"),
    ],
)
def test_bad_keys_and_values_are_one_clear_error(overrides, message):
    with pytest.raises(DssmError, match=message):
        load_run_config(overrides=overrides)


def test_the_flow_takes_the_config_as_one_typed_parameter_the_ui_can_edit():
    from prefect.utilities.callables import parameter_schema

    from flows.retrain import retrain

    schema = parameter_schema(retrain).model_dump()
    definitions = schema["definitions"]
    assert schema["properties"]["config"]["default"]["negatives"]["seed"] == 13
    assert {"seed", "n", "valid_fraction", "shards"} <= set(definitions["NegativesConfig"]["properties"])
    # a deployment's parameters are JSON: the absolute, plain-dict form round-trips
    cfg = load_run_config(overrides=["workdir=rel/work", "negatives.seed=9"]).absolute()
    assert Path(cfg.workdir).is_absolute() and RunConfig(**{}) != cfg
    assert load_run_config(as_yaml(cfg.to_dict())).negatives.seed == 9


def test_a_deployment_parameter_with_an_unknown_or_bad_key_fails_the_flow_run_at_once():
    """Prefect validates a deployment's `config` with pydantic, past `dssm run`'s loader: an unknown key
    (such as the former train.overrides) is refused there, a bad training setting by the flow itself."""
    from prefect.exceptions import ParameterTypeError

    from flows.retrain import retrain

    with pytest.raises(ParameterTypeError, match="config.train.overrides"):
        retrain.validate_parameters({"config": {"train": {"overrides": ["epochs=10"]}}})
    with pytest.raises(ParameterTypeError, match="config.negatives.sede"):
        retrain.validate_parameters({"config": {"negatives": {"sede": 7}}})
    bad = {"config": {"train": {"optim": {"name": "adam", "table_updates": "rows"}}, "workdir": "unused"}}
    config = retrain.validate_parameters(bad)["config"]
    with pytest.raises(DssmError, match="table_updates=rows needs optim.name=nesterov"):
        retrain.fn(config)


def as_yaml(d: dict) -> Path:
    """Write the dict as YAML and return its path (the deployment's parameter, read back as a config file)."""
    import tempfile

    import yaml

    handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    yaml.safe_dump(d, handle)
    handle.close()
    return Path(handle.name)


def test_the_encoder_registry_is_the_one_list():
    from modeling.config import load_config
    from modeling.encoders import ENCODERS
    from stages.analyze.lstm import RECURRENT

    encoders_section = (ROOT / "docs" / "training.md").read_text().split("## Encoders")[1].split("\n## ")[0]
    documented = re.findall(r"^\| `(\w+)` \|", encoders_section, flags=re.M)
    assert documented == list(ENCODERS)  # docs/training.md's encoder table, in registry order
    train_help = build_parser(["train"])._subparsers._group_actions[0].choices["train"].format_help()
    assert all(name in " ".join(train_help.split()) for name in ENCODERS)
    assert set(RECURRENT) <= set(ENCODERS)
    for name in ENCODERS:
        load_config(None, [f"model.encoder={name}"])
    with pytest.raises(DssmError, match="choose one of"):
        load_config(None, ["model.encoder=transformer"])


def test_a_window_ends_on_the_run_date_and_defaults_to_today_in_utc():
    from datetime import UTC, datetime

    assert load_run_config(overrides=["window_days=3", "run_date=2026-03-01"]).window() == [
        "2026-02-27",
        "2026-02-28",
        "2026-03-01",
    ]
    assert load_run_config(overrides=["window_days=1"]).window() == [datetime.now(UTC).date().isoformat()]
    assert load_run_config().window() == []  # not windowed: all logs are one input


def test_per_encoder_keys_reach_one_encoders_training_config_only():
    per_encoder = "train.per_encoder.minilm=[epochs=1,data.batch_size=64]"
    cfg = load_run_config(overrides=["train.models=[lstm,minilm]", "train.epochs=10", per_encoder])
    lstm, minilm = cfg.train.for_encoder("lstm"), cfg.train.for_encoder("minilm")
    assert (lstm.epochs, lstm.data.batch_size, lstm.model.encoder) == (10, 256, "lstm")
    assert (minilm.epochs, minilm.data.batch_size, minilm.model.encoder) == (1, 64, "minilm")


def test_per_encoder_keys_of_a_device_apply_when_the_model_trains_there():
    entries = ["train.per_encoder.minilm=[epochs=1,data.batch_size=64]", "train.per_encoder.minilm@cuda=[epochs=3]"]
    cfg = load_run_config(overrides=["train.models=[lstm,minilm]", *entries])
    on_cpu, on_gpu = cfg.train.for_encoder("minilm"), cfg.train.for_encoder("minilm", "cuda")
    assert (on_cpu.epochs, on_cpu.data.batch_size) == (1, 64)
    assert (on_gpu.epochs, on_gpu.data.batch_size) == (3, 64)  # over minilm's own entry
    assert cfg.train.for_encoder("lstm", "cuda").epochs == 5
    with pytest.raises(DssmError, match="minilm@tpu"):
        load_run_config(overrides=["train.per_encoder.minilm@tpu=[epochs=3]"])
    with pytest.raises(DssmError, match="unknown encoder"):
        load_run_config(overrides=["train.per_encoder.bert@cuda=[epochs=3]"])
    search = load_run_config(ROOT / "configs" / "homedepot_search.yaml").train.for_encoder("minilm", "cuda")
    assert (search.model.train_layers, search.data.negatives_per_row, search.optim.decay) == (6, 0, "linear")


def test_the_train_section_is_the_recipe_and_each_run_adds_its_plumbing():
    from modeling.config import TrainJob, TrainRecipe
    from stages.train.config import TrainConfig

    recipe, plumbing = set(TrainRecipe().flat()), set(TrainJob().flat()) - set(TrainRecipe().flat())
    assert plumbing == {"data.negatives", "data.vocab", "out", "mlflow_uri", "experiment", "dataset"}
    assert recipe <= set(TrainConfig().flat()) and not plumbing & set(TrainConfig().flat())
    cfg = load_run_config(overrides=["train.optim.lr=0.05", "train.per_encoder.minilm=[data.batch_size=32]"])
    own = cfg.train.for_encoder("minilm")
    run = TrainJob.of(own, "/n", "/v", mlflow_uri="sqlite:///s.db", experiment="e", dataset="d")
    given = run.flat()
    assert {key: given[key] for key in recipe} == own.flat()  # every recipe value, as the section resolved it
    assert [given[key] for key in sorted(plumbing)] == ["/n", "/v", "d", "e", "sqlite:///s.db", ""]  # out: the default
    assert (run.optim.lr, run.data.batch_size, run.model.encoder) == (0.05, 32, "minilm")


def test_the_committed_run_configs_load():
    """configs/ (make table4's chosen configs) and prefect.yaml's deployment parameter are valid run configs."""
    import yaml

    files = sorted((ROOT / "configs").rglob("*.yaml"))
    assert files
    encoders = {load_run_config(f).train.model.encoder for f in files}
    assert encoders >= {"lstm", "rnn", "dssm"}
    for deployment in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]:
        cfg = load_run_config(as_yaml(deployment["parameters"]["config"]))
        assert cfg.train.epochs == 10 and cfg.train.loss.pair_weight == "log_clicks"


def test_a_retrieval_gate_turns_the_evaluations_retrieval_on():
    """The gate compares what the evaluation measured: the flow settles that between the sections, so the
    evaluate stage reads its own section only."""
    from flows.config import load_run_config

    assert load_run_config(None, ["evaluate.retrieval=false"]).evaluate.retrieval is True  # the gate's default metric
    assert load_run_config(None, ["evaluate.retrieval=false", "gate.metric=ndcg@10"]).evaluate.retrieval is False


def test_a_run_config_is_checked_whole_before_any_stage_with_short_errors(tmp_path):
    """Issue 74's config probe: a key twice in a section is refused (YAML keeps the last, silently); an
    absurd number is refused when the config is read, naming its range (it used to fail after simulate and
    clean ran, or write 22,799 empty shard files); an error shows a value's start, not 91 million
    characters of it; a file that is not UTF-8 is named."""
    from core.errors import DssmError
    from flows.config import load_run_config

    twice = tmp_path / "twice.yaml"
    twice.write_text("negatives:\n  shards: 4\n  seed: 7\n  shards: 8\n")
    with pytest.raises(DssmError, match=r"twice.yaml: key 'shards' appears twice in one section \(lines 2 and 4\)"):
        load_run_config(twice)
    for key, value, what in [
        ("simulate.shards", "1000000", "0..4,096"),
        ("negatives.shards", "0", "1..4,096"),
        ("train.model.ncell", "100000000", "1..8,192"),
        ("train.data.batch_size", "0", "1..10,000,000"),
        ("negatives.valid_fraction", "1.5", "0..0.9"),
    ]:
        with pytest.raises(DssmError, match=rf"config {key}: \d+(\.\d+)? is outside {what}"):
            load_run_config(None, [f"{key}={value}"])
    with pytest.raises(DssmError, match="cannot read 'nan' as float"):
        load_run_config(None, ["train.optim.lr=nan"])
    huge = tmp_path / "huge.yaml"
    huge.write_text("simulate:\n  shards: [" + ", ".join(["1"] * 200_000) + "]\n")
    with pytest.raises(DssmError) as raised:
        load_run_config(huge)
    assert len(str(raised.value)) < 300 and "characters)" in str(raised.value)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("judgments:\n  path: caf\xe9.csv\n".encode("latin-1"))
    with pytest.raises(DssmError, match=r"latin.yaml: not UTF-8 text \(byte 22: invalid continuation byte\)"):
        load_run_config(latin)
