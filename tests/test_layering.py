"""docs/architecture.md's layering, held to the code: imports between the project's packages point
down only, and the run config loads without the heavy libraries."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first; a package may import packages of lower layers only (docs/architecture.md draws this).
LAYERS: list[set[str]] = [
    {"core"},
    {"modeling"},
    {"scoring"},
    {"jobs"},
    {"evaluation", "retrieval"},
    {"analysis"},
    {"flows", "infra"},
    {"dssm"},
]
LAYER_OF = {package: i for i, layer in enumerate(LAYERS) for package in layer}


def imported_packages(path: Path) -> set[str]:
    """The project's top-level packages a module imports, at import time or inside functions; not
    those under `if TYPE_CHECKING:`, which name a type for the checker and never run."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        found |= {n.split(".")[0] for n in names} & set(LAYER_OF)
    return found


def test_every_package_has_a_layer():
    """...and is a project package: its code is in the stages' code fingerprints (core/artifacts.py)."""
    from core.artifacts import PROJECT_PACKAGES

    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    scripts = {"benchmarks", "reproductions", "studies"}  # entry points above every layer, never imported by them
    assert packages - scripts == set(LAYER_OF) == set(PROJECT_PACKAGES)


def test_imports_point_down_only():
    upward = []
    for package, layer in LAYER_OF.items():
        for module in sorted((ROOT / package).rglob("*.py")):
            for imported in imported_packages(module) - {package}:
                if LAYER_OF[imported] >= layer:
                    upward.append(f"{module.relative_to(ROOT)} imports {imported}")
    assert not upward, "imports that do not point down (docs/architecture.md):\n" + "\n".join(upward)


def test_the_run_config_and_every_settings_module_load_without_spark_mlflow_or_torch():
    """`dssm run --help`, the Prefect UI's parameter form and a config check must not pay for them; nor
    must a stage's or command's settings (each package's config.py, each stage's under jobs/)."""
    settings = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in ROOT.glob("*/config.py"))
    settings += sorted(f"jobs.{p.parent.name}.config" for p in (ROOT / "jobs").glob("*/config.py"))
    assert {"analysis.config", "evaluation.config", "retrieval.config", "jobs.clean.config"} <= set(settings)
    code = (
        f"import sys, flows.config, flows.pipeline, flows.run_command, {', '.join(settings)}; "
        "print(sorted(m for m in ('pyspark', 'mlflow', 'torch', 'pandas', 'prefect') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _readme_layout() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Layout")
    return text[text.index("```\n", start) : text.index("\n```", text.index("```\n", start) + 4)]


def test_the_readme_layout_lists_every_package_stage_and_script():
    """README's layout block is written by hand: it names every package, every stage package of jobs/,
    every script of the script folders and every encoder, so a new one cannot drift out of it."""
    from modeling.encoders import ENCODERS

    layout = _readme_layout()
    named = {line.split()[0] for line in layout.splitlines() if line and not line.startswith(" " * 4)}
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    stages = {p.parent.name for p in (ROOT / "jobs").glob("*/__init__.py")}
    assert {f"{p}/" for p in packages} <= named
    assert {f"{s}/" for s in stages} <= named
    scripts = [p.name for d in ("benchmarks", "reproductions", "studies") for p in (ROOT / d).glob("[!_]*.py")]
    assert [s for s in scripts if s != "__init__.py" and s not in layout] == []
    assert all(e in layout for e in ENCODERS)


def test_the_studies_index_links_every_study_and_names_every_study_script():
    index = (ROOT / "docs" / "studies" / "README.md").read_text()
    pages = [p.name for p in (ROOT / "docs" / "studies").glob("*.md") if p.name != "README.md"]
    assert [p for p in pages if f"]({p})" not in index] == []
    scripts = [p.name for p in (ROOT / "studies").glob("[!_]*.py")]
    assert [s for s in scripts if s not in index] == []
