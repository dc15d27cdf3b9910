"""docs/architecture.md's "Adding a stage", followed literally in a scratch copy of the tree: the worked
example's folder, one pipeline entry, one run-config field and the doc rows add a stage that the pipeline,
layering and docs-table tests accept, with four files changed outside its folder."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEFT_OUT = shutil.ignore_patterns(".git", ".venv", "work", "bench-work", "*.egg-info", "__pycache__", ".ruff_cache")

FOLDER = {
    "__init__.py": '"""The dedupe stage: the training rows without repeated (query, title) pairs."""\n',
    "config.py": '''"""The dedupe stage's settings."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import DssmError


@dataclass(frozen=True)
class DedupeConfig:
    max_repeats: int = 0  # training rows kept per (query, clicked title); 0: all (the stage does not run)


def check_config(cfg: DedupeConfig) -> None:
    if cfg.max_repeats < 0:
        raise DssmError(f"dedupe.max_repeats must be >= 0, got {cfg.max_repeats}")
''',
    "stage.py": '''"""The dedupe stage (stages/dedupe/job.py)."""

from __future__ import annotations

from pathlib import Path

from core.stage import RunContext, StageOutput, run_data_stage
from stages.dedupe.config import DedupeConfig


def run(ctx: RunContext, settings: DedupeConfig, rows: StageOutput) -> StageOutput:
    from stages.dedupe.job import dedupe

    out = ctx.layout.output("dedupe")
    return run_data_stage("dedupe", rows.path, out, lambda: dedupe(Path(rows.path), out, settings, ctx.force))
''',
    "job.py": '''"""The training rows with at most `max_repeats` rows per (query, clicked title)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from core.artifacts import code_fingerprint, publish
from stages.dedupe.config import DedupeConfig, check_config


def dedupe(rows: Path, out: Path, cfg: DedupeConfig, force: bool = False) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_config(cfg)

    def build(tmp: Path) -> dict[str, Any]:
        kept = 0
        for split in ("train", "valid"):
            (tmp / split).mkdir()
            for part in sorted((rows / split).glob("*.parquet")):
                frame = pq.read_table(part).to_pandas()
                frame = frame.groupby(["query", "title"], sort=False).head(cfg.max_repeats)
                pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp / split / part.name)
                kept += len(frame)
        return {"counts": {"rows": kept}}

    inputs = {"rows": {"path": str(rows)}}
    return publish(out, "dedupe", code_fingerprint(__name__), inputs, asdict(cfg), build, force)
''',
}

ENTRY = """    Stage(
        "dedupe",
        "stages.dedupe.stage",
        "the training rows with at most max_repeats rows per (query, clicked title)",
        section="dedupe",
        reads=(TrainingRows(),),
        when=lambda ctx: ctx.cfg.dedupe.max_repeats > 0,
        unless="dedupe.max_repeats=0",
        optional=True,
        trains_on=True,
    ),
"""
TABLE_ROW = (
    "| dedupe | `stages/dedupe/job.py` (pyarrow) | the training rows (`TrainingRows()`) | `train/`, `valid/` "
    "with at most `dedupe.max_repeats` rows per (query, clicked title) |\n"
)
LAYOUT_ROW = "  dedupe/       the training rows, at most max_repeats per (query, clicked title)\n"


def insert_before(path: Path, marker: str, text: str) -> None:
    content = path.read_text()
    assert content.count(marker) >= 1, f"{path}: {marker!r} not found (the recipe no longer fits the tree)"
    path.write_text(content.replace(marker, text + marker, 1))


def digests(root: Path) -> dict[str, str]:
    files = (p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_the_recipe_adds_a_stage_with_four_files_outside_its_folder(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(ROOT, tree, ignore=LEFT_OUT)
    before = digests(tree)

    folder = tree / "stages" / "dedupe"  # 1. the folder
    folder.mkdir()
    for name, text in FOLDER.items():
        (folder / name).write_text(text)
    insert_before(tree / "flows" / "pipeline.py", '    Stage(\n        "train",\n', ENTRY)  # 2. one entry
    config = tree / "flows" / "config.py"  # 3. one import and one field
    insert_before(config, "from stages.evaluate.config import", "from stages.dedupe.config import DedupeConfig\n")
    line = "    dedupe: DedupeConfig = field(default_factory=DedupeConfig)\n"
    insert_before(config, "    train: TrainConfig = ", line)
    doc = tree / "docs" / "architecture.md"  # 4. the doc rows, then the key tables
    insert_before(doc, "| train | ", TABLE_ROW)
    insert_before(doc, "  train/ ", LAYOUT_ROW)
    regenerate = [sys.executable, "-m", "core.options", "docs/flows.md"]
    keys = subprocess.run(regenerate, cwd=tree, capture_output=True, text=True)
    assert keys.stdout == "docs/flows.md: keys tables regenerated\n", keys.stderr  # exit 1: a table changed

    after = digests(tree)
    changed = sorted(p for p in after if before.get(p) != after[p] and not p.startswith("stages/dedupe/"))
    assert changed == ["docs/architecture.md", "docs/flows.md", "flows/config.py", "flows/pipeline.py"]
    docs = "tests/test_options.py::test_the_docs_key_tables_are_generated_from_the_fields"
    held = ["tests/test_pipeline.py", "tests/test_layering.py", docs]  # what holds the tree to PIPELINE
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *held, "-k", "not earlier_flow_run"],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    describe = [sys.executable, "-c", "from flows.pipeline import describe; print(describe())"]
    help_text = subprocess.run(describe, cwd=tree, capture_output=True, text=True).stdout
    assert "  dedupe     the training rows with at most" in help_text and "skip=[dedupe]" in help_text
