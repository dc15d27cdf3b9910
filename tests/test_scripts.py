"""Smoke tests of the scripts beside the product: benchmarks/, reproductions/, studies/ and infra/scale-out/.

Each Python script answers `--help` (run as README says, `python FOLDER/NAME.py` from the repository
root) with exit 0 and its usage line, without doing any work: a script whose imports broke (a moved
or deleted helper) fails here. Shell scripts are syntax-checked (`bash -n`). The scripts are found by
glob, so a new one is covered without editing this file.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from core.artifacts import PROJECT_PACKAGES

ROOT = Path(__file__).resolve().parents[1]
SCRIPT_DIRS = ("benchmarks", "reproductions", "studies")
NOT_PRODUCT = (*SCRIPT_DIRS, "scripts_common")  # what the product packages must never import


def scripts() -> list[Path]:
    """Python scripts of the script folders and shell or Python scripts of infra/scale-out/."""
    found = [p for d in SCRIPT_DIRS for p in (ROOT / d).glob("*.py") if not p.name.startswith("_")]
    found += [p for d in SCRIPT_DIRS for p in (ROOT / d).rglob("*.sh")]
    found += [p for p in (ROOT / "infra" / "scale-out").rglob("*") if p.suffix in (".py", ".sh")]
    return sorted(found)


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_folder_of_scripts_has_scripts():
    """The glob sees the scripts (a renamed folder would leave the smoke test with nothing to run)."""
    assert {p.parent.name for p in scripts()} >= set(SCRIPT_DIRS)


@pytest.mark.parametrize("script", scripts(), ids=relative)
def test_a_script_runs_its_harmless_mode(script: Path):
    """`python SCRIPT --help` exits 0 with its usage line; `bash -n SCRIPT` (syntax only) exits 0."""
    if script.suffix == ".sh":
        result = subprocess.run(["bash", "-n", relative(script)], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return
    result = subprocess.run(
        [sys.executable, relative(script), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f"usage: {script.name}"), result.stdout[:500]


def test_the_product_never_imports_the_scripts():
    """The product packages (whose source makes up the code fingerprints) import nothing from the
    scripts' folders or their shared module: the scripts use the product, never the other way."""
    offenders = []
    for package in PROJECT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                offenders += [f"{relative(path)}: {n}" for n in names if n.split(".")[0] in NOT_PRODUCT]
    assert not offenders
