"""The pipeline as one declarative list: the flow, the progress total, `dssm run --help` and
docs/architecture.md follow PIPELINE; a stage can read what an earlier run left (real Prefect flow runs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from core.layout import Layout
from core.stage import RunContext, StageOutput, run_data_stage
from flows.config import RunConfig, load_run_config
from flows.pipeline import PIPELINE, Earlier, Stage, TrainingRows, _read, check, describe, planned, walk

ROOT = Path(__file__).resolve().parents[1]


def stage_table(doc: Path) -> list[str]:
    """The first column of the first table whose header starts `| stage |`."""
    lines = doc.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| stage |"))
    names = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        names.append(line.split("|")[1].strip())
    return names


def test_the_architecture_doc_lists_the_pipelines_stages_in_order():
    assert stage_table(ROOT / "docs" / "architecture.md") == [s.name for s in PIPELINE]


def test_every_stage_has_a_layout_name_and_the_help_lists_them_in_order():
    layout = Layout("w")
    text = describe()
    positions = [text.index(f"  {s.name} ") for s in PIPELINE]
    assert positions == sorted(positions)
    for s in PIPELINE:
        output = layout.train("lstm") if s.each else layout.output(s.name)
        assert output.parent in (layout.workdir, layout.workdir / s.name), s.name
    # older work dirs' names are kept; a stage with no Layout property writes WORKDIR/NAME
    assert (layout.output("mine"), layout.output("evaluate"), layout.output("new")) == (
        layout.mine,
        layout.evaluate,
        layout.workdir / "new",
    )


def context(tmp_path: Path, *overrides: str) -> RunContext:
    cfg = load_run_config(overrides=[f"workdir={tmp_path}", *overrides])
    return RunContext(cfg, Layout(tmp_path), None, "", None, cfg.window(), 1)


def test_the_progress_total_counts_what_will_run(tmp_path):
    """One task per stage that runs and per item of an `each` stage: a stage whose `when` finds nothing to do
    and a skipped optional one count none. Derived from PIPELINE's flags, so that a new stage leaves it be."""
    simulated = context(tmp_path)
    idle = [s.name for s in PIPELINE if not s.when(simulated)]  # nothing to do with the default settings
    assert planned(PIPELINE, simulated) == len(PIPELINE) - len(idle)
    grader = next(s for s in PIPELINE if s.judges)
    assert grader.name in idle  # simulated logs come with their judged set
    assert planned(PIPELINE, context(tmp_path, "mine.hard=0.25", "teacher.scorers=[bm25,minilm]")) == planned(
        PIPELINE, simulated
    ) + len({"mine", "teacher"} & set(idle))
    fanned = context(tmp_path, "train.models=[lstm, rnn]")  # two models: one more task per `each` stage
    assert planned(PIPELINE, fanned) == planned(PIPELINE, simulated) + sum(1 for s in PIPELINE if s.each)
    # ingested logs without judgments: nothing simulated, the judged set graded from their clicks
    ingest = context(tmp_path, f"logs={tmp_path}")
    assert grader.runs(ingest) and not PIPELINE[0].runs(ingest)
    judged = context(tmp_path, f"logs={tmp_path}", f"judgments.path={tmp_path}")
    assert not grader.runs(judged)
    # `skip` switches optional stages off, and only those
    optional = [s.name for s in PIPELINE if s.optional]
    off = context(tmp_path, f"skip=[{','.join(optional)}]")
    assert planned(PIPELINE, off) == planned(PIPELINE, simulated) - len(set(optional) - set(idle))
    required = next(s.name for s in PIPELINE if not s.optional)
    with pytest.raises(Exception, match=f"{required} cannot be skipped; the optional stages: {', '.join(optional)}"):
        context(tmp_path, f"skip=[{required}]")


def test_the_models_train_on_the_last_stage_marked_trains_on_that_ran(tmp_path):
    """train (and any stage that refines the rows it is given) reads TrainingRows(): the output of the last
    stage marked `trains_on` that ran (the teacher's lists when the teacher ran, else the mined negatives,
    else the sampled ones)."""
    assert any(s.trains_models for s in PIPELINE if TrainingRows() in s.reads)  # what the models train on
    rows = [s.name for s in PIPELINE if s.trains_on]
    ctx = context(tmp_path)
    ran = {name: StageOutput(name, f"/{name}", name, False, 0.0) for name in rows}
    for last in range(len(rows), 0, -1):  # each in turn did not run: the one before it is read
        assert _read(TrainingRows(), ran, ctx, PIPELINE).stage == rows[last - 1]
        ran[rows[last - 1]] = None
    assert _read(TrainingRows(), ran, ctx, PIPELINE) is None
    with pytest.raises(ValueError, match="no stage before it is trains_on"):
        check((Stage("a", lambda ctx: None, "", reads=(TrainingRows(),)),))


def test_a_stage_reads_only_earlier_stages_or_what_an_earlier_run_left():
    def noop(ctx):
        return None

    with pytest.raises(ValueError, match="does not run before it"):
        check((Stage("a", noop, "", reads=("b",)), Stage("b", noop, "")))
    with pytest.raises(ValueError, match="which is no stage"):
        check((Stage("a", noop, "", reads=(Earlier("nothing"),)),))
    with pytest.raises(ValueError, match="no one output directory"):
        check((Stage("a", noop, "", reads=(Earlier("train"),)), Stage("train", noop, "", each=lambda ctx: [])))
    check((Stage("a", noop, "", reads=(Earlier("index"),)), Stage("index", noop, "")))  # last run's, before this run's


def test_the_stages_that_talk_to_services_retry():
    """Spark (a cluster) and MLflow (a server) may be away for a moment; simulate, train (resumes from its
    checkpoint instead) and analyze do not retry."""
    retried = {"clean", "propensity", "judge", "vocab", "negatives", "evaluate", "register", "gate", "index"}
    assert {s.name for s in PIPELINE if s.retried} == retried


# Two toy stages: `mine` runs first and reads the index an earlier run left; `index` then rebuilds it.
def _index(ctx: RunContext) -> StageOutput:
    from core.artifacts import publish

    run = len(list(ctx.layout.workdir.glob("mined-*")))

    def build(tmp: Path) -> dict:
        (tmp / "titles.txt").write_text(f"index of run {run}\n")
        return {"counts": {"run": run}}

    return run_data_stage("index", "toy", ctx.layout.index, lambda: publish(ctx.layout.index, "index", "code",
                                                                            {}, {"run": run}, build))  # fmt: skip


def _mine(ctx: RunContext, earlier_index: StageOutput | None) -> StageOutput | None:
    run = len(list(ctx.layout.workdir.glob("mined-*")))
    seen = "none" if earlier_index is None else f"{earlier_index.sha256} {earlier_index.skipped}"
    (ctx.layout.workdir / f"mined-{run}").write_text(seen)
    return None


TOY = (
    Stage("mine", _mine, "reads last run's index", reads=(Earlier("index"),)),
    Stage("index", _index, "rebuilds the index"),
)


def test_a_stage_gets_the_output_an_earlier_flow_run_left(tmp_path):
    from prefect import flow

    @flow(name="toy-pipeline")
    def toy(workdir: str) -> str:
        ctx = RunContext(RunConfig(workdir=workdir), Layout(workdir), None, "", None, [], 1)
        outputs = walk(TOY, ctx, lambda stage, out: None, __import__("logging").getLogger("test"))
        return outputs["index"].sha256

    first = toy(str(tmp_path))
    assert (tmp_path / "mined-0").read_text() == "none"  # the first run: no index yet
    second = toy(str(tmp_path))
    assert (tmp_path / "mined-1").read_text() == f"{first} True"  # the first run's index, as it left it
    assert second != first and re.fullmatch(r"[0-9a-f]{64}", second)
