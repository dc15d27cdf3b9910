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


def test_the_run_config_loads_without_spark_mlflow_or_torch():
    """`dssm run --help`, the Prefect UI's parameter form and a config check must not pay for them."""
    code = (
        "import sys, flows.config, flows.pipeline, flows.run_command; "
        "print(sorted(m for m in ('pyspark', 'mlflow', 'torch', 'pandas', 'prefect') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
